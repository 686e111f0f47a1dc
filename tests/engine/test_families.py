"""Every text family trains: tiny Qwen3 and Llama-3 models run GRPO steps on 2 CPU ranks.

The families differ where a shared engine can go wrong: the chat template (Qwen's ``<|im_start|>``
turns; Llama-3's header tokens after one ``<|begin_of_text|>``), the stop tokens (Llama-3 stops at
``<|eot_id|>`` and at ``<|end_of_text|>``), the pad token (Llama-3 has none and pads with
``<|eot_id|>``, one of its stop tokens; Qwen pads with ``<|endoftext|>``, also a stop token) and the
output head (Llama-3's is a matrix of its own, Qwen3's tiny model ties it to the embedding).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from transformers import GenerationConfig

from easyr1.data.config import DataConfig
from easyr1.data.dataset import RLDataset
from easyr1.experience import Experience
from easyr1.export import merge_checkpoint
from easyr1.models.attention import use_packed_attention
from easyr1.models.inputs import pad
from easyr1.models.loading import load_model, load_tokenizer
from easyr1.workers.logprobs import install_scoring_head, token_logprobs
from tests.trainer_utils import read_metrics, run_train, tiny_config

REPO = Path(__file__).resolve().parents[2]
FAMILIES = ("qwen3", "llama")
# A one-turn prompt as each family's real chat template renders it ({} is the user's text).
PROMPT_FORMAT = {
    "qwen3": "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n",
    "llama": (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n{}"
        "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    ),
}
STOPS = {"qwen3": ("<|im_end|>", "<|endoftext|>"), "llama": ("<|eot_id|>", "<|end_of_text|>")}
MAX_RESPONSE = 12  # tiny_config's data.max_response_length


def _dataset(data: Path, tokenizer: Any) -> RLDataset:
    """The arithmetic task's training prompts as the trainer reads them (the family's chat template)."""
    config = DataConfig(
        train_files=f"{data}@train", prompt_key="problem", answer_key="answer", max_prompt_length=256
    )
    return RLDataset(config.train_files, tokenizer, None, config)


def stop_ids(path: Path) -> list[int]:
    """The ids generation stops at, as the rollout reads them (generation_config.json)."""
    eos = GenerationConfig.from_pretrained(path).eos_token_id
    return [eos] if isinstance(eos, int) else list(eos)


def teach_to_stop(path: Path, data: Path, out: Path, steps: int = 40) -> Path:
    """A copy of the model at ``path`` trained briefly to answer "The answer is N." and then stop,
    with each of its stop tokens in turn: a random tiny model almost never samples a stop token, so
    without this no response would end at one."""
    torch.manual_seed(0)
    tokenizer, model = load_tokenizer(path), load_model(path)
    stops = stop_ids(path)
    dataset = _dataset(data, tokenizer)
    seqs, starts = [], []
    for i in range(len(dataset)):
        item = dataset[i]
        answer = tokenizer(f"The answer is {item['ground_truth']}.", add_special_tokens=False)["input_ids"]
        seqs.append(torch.cat([item["input_ids"], torch.tensor(answer + [stops[i % len(stops)]])]))
        starts.append(item["input_ids"].numel())
    input_ids, attention_mask = pad(seqs, tokenizer.pad_token_id, side="right")
    labels = torch.full_like(input_ids, -100)
    for row, (seq, start) in enumerate(zip(seqs, starts, strict=True)):
        labels[row, start : seq.numel()] = seq[start:]
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    model.train()
    for _ in range(steps):
        model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    shutil.copytree(path, out)  # tokenizer and generation config unchanged
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def stopping_model(
    tiny_model: Callable[[str], Path], arithmetic: Path, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str], Path]:
    """Factory: stopping_model("llama") -> a tiny model of that family taught to stop (cached)."""
    root = tmp_path_factory.mktemp("stopping")
    built: dict[str, Path] = {}

    def get(arch: str) -> Path:
        if arch not in built:
            built[arch] = teach_to_stop(tiny_model(arch), arithmetic, root / arch)
        return built[arch]

    return get


@pytest.mark.parametrize("arch", FAMILIES)
def test_prompts_take_the_family_template(
    tiny_model: Callable[[str], Path], arithmetic: Path, arch: str
) -> None:
    """The dataset's prompt is the family's chat turn, tokenized with no second bos (the template
    writes Llama-3's; encoding must not add one)."""
    path = tiny_model(arch)
    tokenizer = load_tokenizer(path)
    dataset = _dataset(arithmetic, tokenizer)
    item = dataset[0]
    problem = dataset.data[item["index"]]["problem"]
    assert item["prompt"] == PROMPT_FORMAT[arch].format(problem)
    ids = item["input_ids"].tolist()
    assert ids == tokenizer(item["prompt"], add_special_tokens=False)["input_ids"]
    bos = tokenizer.convert_tokens_to_ids("<|begin_of_text|>" if arch == "llama" else "<|endoftext|>")
    assert ids.count(bos) == (1 if arch == "llama" else 0)


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("arch", FAMILIES)
def test_pads_never_reach_scores_or_gradients(
    tiny_model: Callable[[str], Path], arithmetic: Path, arch: str, packed: bool
) -> None:
    """Responses that end at the family's stop tokens, batched with its pad token (for Llama-3 the
    same id as its first stop token): the engine's log-probs, entropies and their gradient equal
    those of each sequence run alone, without any padding. So padding changes no score and adds
    nothing to the loss, and the stop token ending each response is scored where it stands."""
    path = tiny_model(arch)
    tokenizer = load_tokenizer(path)
    stops = stop_ids(path)
    assert tokenizer.pad_token_id in stops  # what makes the case worth testing for both families
    dataset = _dataset(arithmetic, tokenizer)
    gen = torch.Generator().manual_seed(0)
    lengths = [5, 1, 9, 3]
    prompts = [dataset[i]["input_ids"] for i in range(len(lengths))]
    responses = [
        torch.cat([torch.randint(10, 500, (n - 1,), generator=gen), torch.tensor([stops[row % len(stops)]])])
        for row, n in enumerate(lengths)
    ]
    mask = torch.zeros(len(lengths), max(lengths))
    for row, n in enumerate(lengths):
        mask[row, :n] = 1
    exp = Experience(prompts, responses, [{}] * len(lengths), torch.arange(len(lengths)), mask)
    assert (
        len({p.numel() + r.numel() for p, r in zip(prompts, responses, strict=True)}) > 1
    )  # rows of several lengths

    model = load_model(path)
    install_scoring_head(model)
    if packed:
        use_packed_attention(model)
    logp, entropy = token_logprobs(
        model, exp, temperature=0.7, pad_id=tokenizer.pad_token_id, device=torch.device("cpu"), packed=packed
    )
    ((logp + 0.3 * entropy) * mask).sum().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()

    total = torch.zeros(())
    for row, (prompt, response) in enumerate(zip(prompts, responses, strict=True)):
        logits = model(input_ids=torch.cat([prompt, response])[None]).logits[0].float() / 0.7
        log_p = torch.log_softmax(logits[prompt.numel() - 1 : -1], dim=-1)
        want_logp = log_p.gather(-1, response[:, None]).squeeze(-1)
        want_entropy = -(log_p.exp() * log_p).sum(-1)
        torch.testing.assert_close(logp[row, : response.numel()], want_logp, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(entropy[row, : response.numel()], want_entropy, rtol=1e-5, atol=1e-5)
        total = total + (want_logp + 0.3 * want_entropy).sum()
    total.backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, rtol=1e-4, atol=1e-5, msg=name)


# Scores differ between any two different responses, so every group has advantages to learn from;
# each call's inputs are appended to $FAMILY_LOG as one JSON line.
REWARD_THAT_LOGS = """
import json
import os
import zlib

REWARD_TYPE = "batch"


def compute_score(reward_inputs):
    with open(os.environ["FAMILY_LOG"], "a") as log:
        log.write(json.dumps([[x["response"], x["response_length"]] for x in reward_inputs]) + "\\n")
    return [{"overall": zlib.crc32(x["response"].encode()) % 97 / 97.0} for x in reward_inputs]
"""


@pytest.mark.parametrize("arch", FAMILIES)
def test_family_trains_with_grpo_and_its_checkpoint_reloads(
    stopping_model: Callable[[str], Path],
    arithmetic: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    arch: str,
) -> None:
    """Two GRPO steps of a model that stops on its own: finite metrics and a real update, the family's
    prompts, responses cut at its stop tokens, and a checkpoint that merges and loads as the family's."""
    path = stopping_model(arch)
    reward, log = tmp_path / "logged.py", tmp_path / "responses.jsonl"
    reward.write_text(REWARD_THAT_LOGS)
    monkeypatch.setenv("FAMILY_LOG", str(log))  # the run's reward workers inherit it
    run_dir = tmp_path / "run"
    config = tiny_config(path, arithmetic, run_dir)
    done = run_train(
        config,
        tmp_path,
        f"worker.reward.reward_function={reward}:compute_score",
        "worker.reward.skip_special_tokens=false",  # the reward sees the stop token as text
        "data.val_batch_size=2",  # validation scores one prompt per call: its log lines hold one response
        "trainer.val_before_train=false",
        "trainer.save_freq=2",
        "worker.rollout.calculate_log_probs=true",  # for rollout/logp_diff_max below
    )
    assert done.returncode == 0, done.stderr[-3000:]

    steps = read_metrics(run_dir)
    assert [m["step"] for m in steps] == [1, 2]
    for step in steps:
        bad = {k: v for k, v in step.items() if isinstance(v, float) and not math.isfinite(v)}
        assert not bad, f"step {step['step']}: {bad}"
        assert step["actor/grad_norm"] > 0  # the update had something to learn from
        # The actor re-scores exactly what the rollout sampled: the rollout's left padding and the
        # actor's packing agree on where every sequence starts and ends.
        assert step["rollout/logp_diff_max"] < 1e-4

    # The family's chat turn reached the model.
    pattern = re.compile(re.escape(PROMPT_FORMAT[arch]).replace(re.escape("{}"), ".+"), re.DOTALL)
    generations = [json.loads(line) for line in (run_dir / "generations.jsonl").read_text().splitlines()]
    assert generations and all(pattern.fullmatch(g["prompt"]) for g in generations), generations[0]["prompt"]

    # Responses end at the first stop token, whichever of the family's it is, and hold nothing after it.
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    train = [entry for call in calls if len(call) == 4 for entry in call]  # 2 prompts x 2 samples per rank
    assert len(train) == 2 * 8
    ended = {stop: 0 for stop in STOPS[arch]}
    for text, length in (entry for call in calls for entry in call):
        found = re.findall("|".join(map(re.escape, STOPS[arch])), text)
        assert len(found) <= 1 and all(text.endswith(stop) for stop in found), text
        assert found or length == MAX_RESPONSE, text  # no stop token: cut at the length limit
        for stop in found:
            ended[stop] += 1
    assert all(ended.values()), ended  # both of Llama-3's stop tokens, and both of Qwen's, end responses
    # The update's token mask covers exactly the sampled tokens, stop token included, no padding.
    lengths = [length for _, length in train]
    assert sum(s["response_length/mean"] for s in steps) / 2 == pytest.approx(sum(lengths) / len(lengths))
    assert max(s["response_length/max"] for s in steps) == max(lengths)
    assert min(s["response_length/min"] for s in steps) == min(lengths)

    # The checkpoint merges into a model that loads as the family's own, with its head tied or not.
    merged = merge_checkpoint(run_dir / "global_step_2" / "actor", tmp_path / "merged")
    before, after = load_model(path), load_model(merged)
    assert type(after) is type(before)
    tied = before.get_output_embeddings().weight is before.get_input_embeddings().weight
    assert tied == (arch != "llama")
    assert (after.get_output_embeddings().weight is after.get_input_embeddings().weight) == tied
    trained = after.state_dict()
    assert trained.keys() == before.state_dict().keys()
    assert not torch.equal(trained["lm_head.weight"], before.state_dict()["lm_head.weight"])
    if not tied:  # the untied head trained as a matrix of its own
        assert not torch.equal(trained["lm_head.weight"], trained["model.embed_tokens.weight"])
    assert stop_ids(merged) == stop_ids(path)
    assert load_tokenizer(merged).chat_template == load_tokenizer(path).chat_template


R1_DISTILL = REPO / "examples" / "deepseek_r1_distill_qwen_1_5b_math_grpo.yaml"


def test_r1_distill_example_resolves_and_its_tiny_twin_trains(
    tiny_model: Callable[[str], Path], arithmetic: Path, tmp_path: Path
) -> None:
    """The DeepSeek-R1-Distill-Qwen example passes ``easyr1 config``'s checks as written; then, with
    a tiny Qwen2 (its architecture) and small shapes, it trains a step on 2 CPU ranks."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    resolved = subprocess.run(
        [sys.executable, "-m", "easyr1.cli", "config", f"config={R1_DISTILL}"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert resolved.returncode == 0, resolved.stderr[-2000:]
    config = yaml.safe_load(resolved.stdout)
    assert config["worker"]["actor"]["model"]["model_path"] == "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B"
    assert config["worker"]["reward"]["reward_function_kwargs"] == {"format_weight": 0.0}

    overrides = [  # the twin's model and data, small batches and lengths, 2 CPU ranks, one step
        f"worker.actor.model.model_path={tiny_model('qwen2')}",
        f"data.train_files={arithmetic}@train",
        f"data.val_files={arithmetic}@test",
        "data.max_prompt_length=256",
        "data.max_response_length=8",
        "data.rollout_batch_size=4",
        "data.min_pixels=null",
        "data.max_pixels=null",
        "worker.actor.global_batch_size=2",
        "worker.actor.micro_batch_size_per_device_for_update=2",
        "worker.actor.micro_batch_size_per_device_for_experience=4",
        "worker.actor.fsdp.torch_dtype=null",
        "worker.rollout.n=2",
        "trainer.n_gpus_per_node=2",
        "trainer.max_steps=1",
        "trainer.val_before_train=false",
        "trainer.val_freq=-1",
        "trainer.save_freq=-1",
        "trainer.logger=[file]",
        f"trainer.save_checkpoint_path={tmp_path / 'run'}",
    ]
    done = subprocess.run(
        [sys.executable, "-m", "easyr1.cli", "train", f"config={R1_DISTILL}", *overrides],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    [record] = read_metrics(tmp_path / "run")
    assert record["step"] == 1 and math.isfinite(record["actor/pg_loss"])
