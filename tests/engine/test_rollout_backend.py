"""Rollout backends on CPU: the actor -> rollout weight hand-over (bucketing, names, tied and LoRA
weights) on FSDP2 over gloo with 1 and 2 ranks, the backend choice, the vLLM backend's pure parts
(prompt form, TP groups, result assembly), and HFRollout against ``hf.generate``.

vLLM itself cannot be installed on these CPU machines: ``VLLMRollout``'s engine calls (LLM,
sleep/wake_up, load_weights, generate) are checked only on the GPU host.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from PIL import Image
from safetensors.torch import load_file
from torch import nn

import easyr1.rollout.backend as rollout_pkg
import easyr1.rollout.hf as rollout_hf
from easyr1.config import ConfigError, PPOConfig
from easyr1.distributed.ports import free_port
from easyr1.models.loading import load_model, load_processor, load_tokenizer
from easyr1.models.lora import folded, lora_layers
from easyr1.models.structure import fsdp_modules
from easyr1.rollout.backend import build_rollout, choose_backend
from easyr1.rollout.base import SamplingParams
from easyr1.rollout.hf import HFRollout, generate
from easyr1.rollout.vllm import (
    assemble,
    check_tensor_parallel,
    collapse_image_tokens,
    gather_in_group,
    new_tp_group,
    set_vllm_env,
    tp_groups,
    vllm_prompt,
)
from easyr1.workers.config import FSDPConfig
from easyr1.workers.fsdp import gathered, parallelize
from easyr1.workers.sync import full_weights, weight_buckets
from tests.trainer_utils import end_rank

FP32 = FSDPConfig(torch_dtype="fp32", mp_param_dtype="fp32")


def _reference(model: nn.Module) -> dict[str, torch.Tensor]:
    """The unsharded model's Hugging Face state dict, without the tied lm_head (as vLLM takes it)."""
    assert model.config.get_text_config().tie_word_embeddings  # every tiny family ties, as the real ones
    return {k: v.detach().clone() for k, v in model.state_dict().items() if k != "lm_head.weight"}


def _shard(model: nn.Module) -> nn.Module:
    return parallelize(model, FP32, trainable=True, device=torch.device("cpu"))


def _lora(path: Path) -> nn.Module:
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)  # init_lora_weights=False draws A and B both: the adapter is not a no-op
    config = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False)
    return get_peft_model(load_model(path), config)


def _bucket_report(model: nn.Module, reference: dict[str, torch.Tensor], limit: int) -> dict[str, Any]:
    """What the tests check about ``weight_buckets(model, bf16, limit)`` against ``reference``."""
    buckets = list(weight_buckets(model, torch.bfloat16, limit))
    names = [name for bucket in buckets for name, _ in bucket]
    flat = {name: t for bucket in buckets for name, t in bucket}
    sizes = [(len(b), sum(t.numel() * t.element_size() for _, t in b)) for b in buckets]
    return {
        "names": names,
        "reference_names": sorted(reference),
        "buckets": len(buckets),
        "within_limit": all(size <= limit or count == 1 for count, size in sizes),
        "oversized_alone": all(count == 1 for count, size in sizes if size > limit),
        "any_oversized": any(size > limit for _, size in sizes),
        "dtypes": sorted({str(t.dtype) for t in flat.values()}),
        "shapes_equal": all(flat[k].shape == reference[k].shape for k in reference if k in flat),
        "values_equal": all(
            torch.equal(flat[k], reference[k].to(torch.bfloat16)) for k in reference if k in flat
        ),
    }


def _limit(reference: dict[str, torch.Tensor]) -> int:
    """Just under the largest bf16 tensor: that one must travel alone, the rest in several buckets."""
    return max(t.numel() for t in reference.values()) * 2 - 2


# ------------------------------------------------------------------ one rank, in this process


@pytest.fixture
def one_rank():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("arch", ["qwen2", "qwen2_5_vl"])
def test_buckets_match_the_state_dict(arch: str, tiny_model, one_rank) -> None:
    path = tiny_model(arch)
    model = load_model(path)
    reference = _reference(model)
    if arch == "qwen2":  # a text model's folder stores exactly these names (a VLM's, the pre-v5 ones)
        assert sorted(load_file(str(path / "model.safetensors"))) == sorted(reference)
    report = _bucket_report(_shard(model), reference, _limit(reference))
    assert len(report["names"]) == len(set(report["names"]))
    assert sorted(report["names"]) == report["reference_names"]  # lm_head (tied) left out, no prefixes
    assert "lm_head.weight" not in report["names"]
    assert report["dtypes"] == ["torch.bfloat16"]
    assert report["shapes_equal"] and report["values_equal"]
    assert report["buckets"] > 2 and report["within_limit"]
    assert report["any_oversized"] and report["oversized_alone"]


def test_untied_lm_head_is_handed_over(tiny_model, one_rank) -> None:
    model = load_model(tiny_model("qwen2"))
    model.lm_head.weight = nn.Parameter(model.lm_head.weight.detach().clone() * 2)  # untie
    expected = model.lm_head.weight.detach().clone()
    weights = dict(full_weights(_shard(model), torch.float32))
    assert torch.equal(weights["lm_head.weight"], expected)
    assert not torch.equal(weights["model.embed_tokens.weight"], expected)


def test_lora_merge_equals_peft_merge_and_unload(tiny_model, one_rank) -> None:
    model = _lora(tiny_model("qwen2"))
    merged = copy.deepcopy(model).merge_and_unload().state_dict()
    merged.pop("lm_head.weight")  # tied
    weights = dict(full_weights(_shard(model), torch.float32))
    assert sorted(weights) == sorted(merged)
    assert not any("lora" in name or "base_layer" in name for name in weights)
    for name, tensor in merged.items():
        torch.testing.assert_close(weights[name], tensor, rtol=0, atol=1e-6, msg=name)
    base = load_model(tiny_model("qwen2")).state_dict()
    assert not torch.equal(
        weights["model.layers.0.mlp.up_proj.weight"], base["model.layers.0.mlp.up_proj.weight"]
    )


def test_hf_rollout_equals_generate(tiny_model, one_rank) -> None:
    path = tiny_model("qwen2")
    tokenizer = load_tokenizer(path)
    prompts = [
        {"input_ids": torch.tensor(tokenizer(text)["input_ids"]), "multi_modal_inputs": {}}
        for text in ("1+1=", "two plus three is")
    ]
    params = SamplingParams(n=2, temperature=0.8, max_tokens=6, logprobs=True)
    model = _shard(load_model(path))
    eos = model.generation_config.eos_token_id
    eos_ids = [eos] if isinstance(eos, int) else list(eos)

    engine = HFRollout(model, FP32, pad_id=tokenizer.pad_token_id, eos_ids=eos_ids)
    assert engine.prepare(1) == {}
    got = engine.generate(prompts, params, seed=11)
    engine.release()
    torch.manual_seed(11)
    with gathered(model, FP32):
        model.eval()
        want = generate(model, prompts, params, pad_id=tokenizer.pad_token_id, eos_ids=eos_ids)
    assert got.prompt_index == want.prompt_index == [0, 0, 1, 1]
    assert got.finished == want.finished
    for field in ("prompt_ids", "response_ids", "logprobs"):
        assert all(torch.equal(a, b) for a, b in zip(getattr(got, field), getattr(want, field), strict=True))


def test_hf_rollout_folds_lora_into_the_gathered_weights_only(tiny_model, one_rank) -> None:
    """The HF rollout of a LoRA actor generates with each adapter folded into its gathered base
    weight: the same tokens and (fp32) log-probs as the unfolded peft model, the shards that training
    updates bit-for-bit unchanged, and a second rollout the same as the first (nothing folded twice)."""
    path = tiny_model("qwen2")
    tokenizer = load_tokenizer(path)
    prompts = [
        {"input_ids": torch.tensor(tokenizer(text)["input_ids"]), "multi_modal_inputs": {}}
        for text in ("1+1=", "9 - 4 =")
    ]
    params = SamplingParams(n=2, temperature=0.9, max_tokens=6, logprobs=True)
    model = _shard(_lora(path))
    eos = model.generation_config.eos_token_id
    eos_ids = [eos] if isinstance(eos, int) else list(eos)
    shards = {name: p.to_local().clone() for name, p in model.named_parameters()}

    torch.manual_seed(5)
    with gathered(model, FP32):  # the peft model as it is: base, A and B products in every layer
        model.eval()
        want = generate(model, prompts, params, pad_id=tokenizer.pad_token_id, eos_ids=eos_ids)
    engine = HFRollout(model, FP32, pad_id=tokenizer.pad_token_id, eos_ids=eos_ids)
    first, second = engine.generate(prompts, params, seed=5), engine.generate(prompts, params, seed=5)
    for got in (first, second):
        assert all(torch.equal(a, b) for a, b in zip(got.response_ids, want.response_ids, strict=True))
        for a, b in zip(got.logprobs, want.logprobs, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    for name, p in model.named_parameters():
        assert torch.equal(p.to_local(), shards[name]), name
    assert not any(layer.merged for layer in lora_layers(model).values())
    with (
        gathered(model, FP32),
        folded(model),
    ):  # what the rollout ran: W + B @ A * scaling, in the gathered buffer
        for name, layer in lora_layers(model).items():
            assert layer.merged, name
            full = shards[f"{name}.base_layer.weight"]
            delta = layer.lora_B["default"].weight @ layer.lora_A["default"].weight * layer.scaling["default"]
            torch.testing.assert_close(layer.base_layer.weight, full + delta, rtol=0, atol=1e-6)
            assert not torch.equal(layer.base_layer.weight, full), name


def test_gathered_generate_equals_the_plain_model_and_restores_fsdp(tiny_model, one_rank) -> None:
    """``gathered`` sets FSDP's hooks aside for generate (same tokens and log-probs as the plain
    model) and puts them back (a training forward and backward works after it)."""
    path = tiny_model("qwen2")
    tokenizer = load_tokenizer(path)
    prompts = [{"input_ids": torch.tensor(tokenizer("1 + 2 =")["input_ids"]), "multi_modal_inputs": {}}]
    params = SamplingParams(n=2, temperature=1.0, max_tokens=6, logprobs=True)
    plain, model = load_model(path), _shard(load_model(path))
    hook_counts = [(len(m._forward_pre_hooks), len(m._forward_hooks)) for m in fsdp_modules(model)]
    torch.manual_seed(3)
    with gathered(model, FP32):
        model.eval()
        assert all(not m._forward_pre_hooks and not m._forward_hooks for m in fsdp_modules(model))
        got = generate(model, prompts, params, pad_id=tokenizer.pad_token_id, eos_ids=[])
    torch.manual_seed(3)
    want = generate(plain.eval(), prompts, params, pad_id=tokenizer.pad_token_id, eos_ids=[])
    assert all(torch.equal(a, b) for a, b in zip(got.response_ids, want.response_ids, strict=True))
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(got.logprobs, want.logprobs, strict=True))
    assert [(len(m._forward_pre_hooks), len(m._forward_hooks)) for m in fsdp_modules(model)] == hook_counts
    model.train()
    model(input_ids=torch.tensor([[1, 2, 3]])).logits.sum().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_simulated_ranks_decode_a_few_steps_and_keep_every_response_whole(
    tiny_model, one_rank, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under simulated ranks the HF rollout decodes ``DECODE_STEPS`` steps and continues each response
    with its last token and log-prob to the length limit (no EOS: a row that had not ended goes on),
    so every later phase sees full-length responses; the decoded steps are those of a full decode."""
    from easyr1.distributed.simulated import DECODE_STEPS, SIMULATED_RANKS_ENV

    path = tiny_model("qwen2")
    tokenizer = load_tokenizer(path)
    prompts = [{"input_ids": torch.tensor(tokenizer("1 + 2 =")["input_ids"]), "multi_modal_inputs": {}}]
    params = SamplingParams(n=3, temperature=1.0, max_tokens=DECODE_STEPS + 9, logprobs=True)
    plain = load_model(path).eval()
    torch.manual_seed(5)
    full = generate(plain, prompts, params, pad_id=tokenizer.pad_token_id, eos_ids=[])
    torch.manual_seed(5)
    fast = generate(
        plain, prompts, params, pad_id=tokenizer.pad_token_id, eos_ids=[], decode_steps=DECODE_STEPS
    )
    for whole, cut, logp in zip(full.response_ids, fast.response_ids, fast.logprobs, strict=True):
        assert len(cut) == len(whole) == DECODE_STEPS + 9
        assert torch.equal(cut[:DECODE_STEPS], whole[:DECODE_STEPS])
        assert torch.equal(cut[DECODE_STEPS:], cut[DECODE_STEPS - 1].expand(9))
        assert torch.equal(logp[DECODE_STEPS:], logp[DECODE_STEPS - 1].expand(9))
    assert fast.finished == [False] * 3

    # build_rollout sets it for a simulated rank only.
    config = PPOConfig()
    config.worker.actor.model.model_path = str(path)

    class Ctx:
        rank, world, local_rank = 0, 1, 0

    model = _shard(load_model(path))
    assert build_rollout(config, model, tokenizer, Ctx()).decode_steps is None
    monkeypatch.setenv(SIMULATED_RANKS_ENV, "4")
    assert build_rollout(config, model, tokenizer, Ctx()).decode_steps == DECODE_STEPS


@pytest.mark.parametrize(
    "sampling", [dict(temperature=0.7, top_k=5, top_p=0.9), dict(temperature=0.0)], ids=["sampled", "greedy"]
)
def test_hf_log_probs_are_of_the_raw_logits_and_ignore_checkpoint_defaults(
    tiny_model, sampling: dict[str, Any]
) -> None:
    """The recorded log-probs are log_softmax(logits / temperature) of the model's own forward pass
    over the generated sequences (no truncation, no suppression: what the actor recomputes), and a
    sampling default in the checkpoint's generation_config changes nothing."""
    path = tiny_model("qwen2")
    tokenizer, model = load_tokenizer(path), load_model(path).eval()
    prompts = [
        {"input_ids": torch.tensor(tokenizer(text)["input_ids"]), "multi_modal_inputs": {}}
        for text in ("1 + 2 =", "7")
    ]
    params = SamplingParams(n=2, max_tokens=5, ignore_eos=True, logprobs=True, **sampling)
    torch.manual_seed(5)
    got = generate(model, prompts, params, pad_id=tokenizer.pad_token_id, eos_ids=[tokenizer.eos_token_id])
    scale = 1.0 if params.greedy else params.temperature
    for prompt, response, logp in zip(got.prompt_ids, got.response_ids, got.logprobs, strict=True):
        assert len(response) == 5
        logits = model(input_ids=torch.cat([prompt, response])[None]).logits[0].float() / scale
        want = torch.log_softmax(logits, -1)[len(prompt) - 1 : -1].gather(-1, response[:, None]).squeeze(-1)
        assert torch.allclose(logp, want, atol=1e-5)
    model.generation_config.repetition_penalty = 3.0
    torch.manual_seed(5)
    again = generate(model, prompts, params, pad_id=tokenizer.pad_token_id, eos_ids=[tokenizer.eos_token_id])
    assert all(torch.equal(a, b) for a, b in zip(got.response_ids, again.response_ids, strict=True))
    # Not asking for log-probs (worker.rollout.calculate_log_probs' default) samples the same tokens.
    torch.manual_seed(5)
    unasked = generate(
        model,
        prompts,
        dataclasses.replace(params, logprobs=False),
        pad_id=tokenizer.pad_token_id,
        eos_ids=[tokenizer.eos_token_id],
    )
    assert unasked.logprobs is None
    assert all(torch.equal(a, b) for a, b in zip(got.response_ids, unasked.response_ids, strict=True))


def test_build_rollout_on_cpu_is_hf(tiny_model, one_rank) -> None:
    path = tiny_model("qwen2")
    config = PPOConfig()
    config.worker.actor.model.model_path = str(path)
    model = _shard(load_model(path))

    class Ctx:
        rank, world, local_rank = 0, 1, 0

    engine = build_rollout(config, model, load_tokenizer(path), Ctx())
    assert isinstance(engine, HFRollout)


# ------------------------------------------------------------------ two ranks


def _two_rank_worker(rank: int, port: int, paths: dict[str, str]) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), HF_HUB_OFFLINE="1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    results: dict[str, Any] = {}
    try:
        path = Path(paths["qwen2"])
        model = load_model(path)
        reference = _reference(model)
        results["buckets"] = _bucket_report(_shard(model), reference, _limit(reference))
        lora = _lora(path)
        merged = copy.deepcopy(lora).merge_and_unload().state_dict()
        weights = dict(full_weights(_shard(lora), torch.float32))
        results["lora_close"] = all(torch.allclose(weights[k], merged[k], rtol=0, atol=1e-6) for k in weights)
        results["lora_names"] = sorted(weights) == sorted(k for k in merged if k != "lm_head.weight")
        results["tp2"] = gather_in_group(([f"prompt of {rank}"], [rank]), new_tp_group(2, 2, rank))
        results["tp1"] = gather_in_group("alone", new_tp_group(2, 1, rank))
    finally:
        dist.destroy_process_group()
    (Path(paths["out"]) / f"rank{rank}.json").write_text(json.dumps(results))
    end_rank()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory, tiny_model) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("sync")
    paths = {"qwen2": str(tiny_model("qwen2")), "out": str(out)}
    # spawn, not fork: this process already runs torch's threads and a gloo group (one_rank), and
    # a forked child can inherit a held lock and hang (it did, once, in a CI run).
    mp.start_processes(_two_rank_worker, args=(free_port(), paths), nprocs=2, join=True, start_method="spawn")
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.parametrize("rank", [0, 1])
def test_two_rank_buckets(two_ranks: list[dict[str, Any]], rank: int) -> None:
    report = two_ranks[rank]["buckets"]
    assert report["names"] == two_ranks[0]["buckets"]["names"]  # the same order on every rank
    assert sorted(report["names"]) == report["reference_names"]
    assert report["shapes_equal"] and report["values_equal"] and report["within_limit"]
    assert report["oversized_alone"] and report["dtypes"] == ["torch.bfloat16"]


@pytest.mark.parametrize("rank", [0, 1])
def test_two_rank_lora_merge(two_ranks: list[dict[str, Any]], rank: int) -> None:
    assert two_ranks[rank]["lora_close"] and two_ranks[rank]["lora_names"]


@pytest.mark.parametrize("rank", [0, 1])
def test_tp_group_shares_prompts(two_ranks: list[dict[str, Any]], rank: int) -> None:
    assert two_ranks[rank]["tp2"] == [[["prompt of 0"], [0]], [["prompt of 1"], [1]]]
    assert two_ranks[rank]["tp1"] == ["alone"]


# ------------------------------------------------------------------ backend choice, TP layout


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU fallback")
def test_auto_is_hf_on_cpu(capsys) -> None:
    assert choose_backend("auto") == "hf"
    assert "rollout backend: hf (auto: no CUDA GPU)" in capsys.readouterr().out
    assert choose_backend("hf", rank=1) == "hf"
    assert capsys.readouterr().out == ""  # only rank 0 says it


@pytest.mark.skipif(rollout_pkg.vllm_import_error() is None, reason="vllm is installed here")
def test_vllm_without_vllm_says_how_to_install() -> None:
    with pytest.raises(ConfigError, match=r"worker\.rollout\.name='vllm'") as info:
        choose_backend("vllm")
    assert "pip install -e '.[gpu]'" in str(info.value)
    assert "vllm cannot be imported" in str(info.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message without a GPU")
def test_vllm_without_cuda_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    # The one stand-in of this file: vLLM cannot be installed on a CPU machine, so "it imports" is faked.
    monkeypatch.setattr(rollout_pkg, "vllm_import_error", lambda: None)
    with pytest.raises(ConfigError, match="CUDA GPU") as info:
        choose_backend("vllm")
    assert "pip install" not in str(info.value)


def test_tensor_parallel_must_divide_the_world() -> None:
    with pytest.raises(ConfigError, match=r"worker\.rollout\.tensor_parallel_size=2"):
        check_tensor_parallel(2, 3)
    with pytest.raises(ConfigError, match=r"worker\.rollout\.tensor_parallel_size=0"):
        check_tensor_parallel(0, 4)
    assert tp_groups(4, 2) == [[0, 1], [2, 3]]
    assert tp_groups(4, 1) == [[0], [1], [2], [3]]


def _vllm_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in for a GPU with vLLM (neither exists on this machine): the backend choice says vLLM."""
    monkeypatch.setattr(rollout_pkg, "_decide", lambda name: ("vllm", "stand-in: a GPU with vLLM"))


def test_the_tensor_parallel_size_is_checked_before_any_model_loads(
    tiny_model, arithmetic: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EasyR1's default tensor_parallel_size=2 on one GPU: once found out only when vLLM started,
    after the models had loaded."""
    from easyr1.config import from_tree
    from easyr1.trainer import Dist, Trainer
    from easyr1.workers import build
    from tests.trainer_utils import tiny_config

    _vllm_here(monkeypatch)

    def no_model(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a model loaded before the rollout's settings were checked")

    monkeypatch.setattr(build, "load_model", no_model)
    config = from_tree(tiny_config(tiny_model("qwen2"), arithmetic, tmp_path / "run"))
    assert config.worker.rollout.tensor_parallel_size == 2  # EasyR1's default
    with pytest.raises(
        ConfigError,
        match=r"worker\.rollout\.tensor_parallel_size=2 must be at least 1 and divide the 1 ranks",
    ):
        Trainer(config, Dist(0, 1, 0, torch.device("cpu")))


def test_vllm_media_limits_of_zero_are_sized_from_the_data(
    tiny_model, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EasyR1's limit_images/limit_videos of 0 mean "not set": the most one prompt holds (a video
    data set once failed after vLLM had started with "limit_videos=0: a prompt has 1 video(s)"); a
    limit below that is refused, and the Hugging Face rollout has no such limits."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from easyr1.data.config import DataConfig
    from easyr1.data.dataset import RLDataset
    from easyr1.rollout.backend import settle_rollout_with_data

    rows = [
        {
            "prompt": "<image><image> same?",
            "answer": "yes",
            "images": ["a.png", "b.png"],
            "videos": ["v.mp4"],
        },
        {"prompt": "<image> red?", "answer": "no", "images": ["c.png"], "videos": []},
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")
    data = RLDataset(
        str(tmp_path / "train.parquet"),
        load_tokenizer(tiny_model("qwen2")),
        None,
        DataConfig(filter_overlong_prompts=False),
    )
    assert data.most_media() == (2, 1)

    config = PPOConfig()
    config.worker.rollout.tensor_parallel_size = 1
    settle_rollout_with_data(config, 1, *data.most_media())  # on CPU: the Hugging Face rollout, left as it is
    assert (config.worker.rollout.limit_images, config.worker.rollout.limit_videos) == (0, 0)
    _vllm_here(monkeypatch)
    settle_rollout_with_data(config, 1, *data.most_media())
    assert (config.worker.rollout.limit_images, config.worker.rollout.limit_videos) == (2, 1)
    config.worker.rollout.limit_images = 1
    with pytest.raises(ConfigError, match=r"worker\.rollout\.limit_images=1: a prompt of the data holds 2"):
        settle_rollout_with_data(config, 1, *data.most_media())


def test_vllm_env_defaults_give_way_to_the_users(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's sampler, no usage statistics, and the V2 model runner on one GPU only, unless the user's environment says otherwise."""
    for key in ("VLLM_USE_FLASHINFER_SAMPLER", "VLLM_USE_V2_MODEL_RUNNER", "VLLM_NO_USAGE_STATS"):
        monkeypatch.setenv(key, "")  # so that monkeypatch restores it, then unset
        monkeypatch.delenv(key)
    env = set_vllm_env(2)
    assert env["VLLM_USE_FLASHINFER_SAMPLER"] == "0" and "VLLM_USE_V2_MODEL_RUNNER" not in env
    assert env["VLLM_NO_USAGE_STATS"] == "1"
    assert set_vllm_env(1)["VLLM_USE_V2_MODEL_RUNNER"] == "1"
    monkeypatch.setenv("VLLM_USE_FLASHINFER_SAMPLER", "1")
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    env = set_vllm_env(1)
    assert env["VLLM_USE_FLASHINFER_SAMPLER"] == "1" and env["VLLM_USE_V2_MODEL_RUNNER"] == "0"


# ------------------------------------------------------------------ vLLM prompts and results


def _images(n: int) -> list[Image.Image]:
    return [Image.new("RGB", (56, 56), (200, 30, 30)), Image.new("RGB", (84, 56), (30, 200, 30))][:n]


@pytest.mark.parametrize("n_images", [0, 1, 2])
def test_vllm_prompt_has_one_placeholder_per_image(tiny_model, n_images: int) -> None:
    """The processor expands each image's placeholder; vLLM wants the unexpanded ids, as the tokenizer makes them."""
    path = tiny_model("qwen2_5_vl")
    processor = load_processor(path)
    content = [{"type": "image"}] * n_images + [{"type": "text", "text": "How many shapes?"}]
    text = processor.apply_chat_template(
        [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
    )
    images = _images(n_images)
    expanded = processor(text=[text], images=images or None, return_tensors="pt")["input_ids"][0]
    image_token_id = load_model(path).config.image_token_id
    item = {"input_ids": expanded, "images": images}
    request = vllm_prompt(item, image_token_id)
    assert request["prompt_token_ids"] == processor.tokenizer(text)["input_ids"]
    assert request["prompt_token_ids"].count(image_token_id) == n_images
    if n_images:
        assert len(expanded) > len(request["prompt_token_ids"])
        assert request["multi_modal_data"] == {"image": images}
    else:
        assert "multi_modal_data" not in request
    with pytest.raises(ValueError, match="runs of image tokens"):
        collapse_image_tokens(expanded, image_token_id, n_images + 1)


def test_assemble_keeps_prompt_order_and_eos() -> None:
    prompts = [{"input_ids": torch.tensor([1, 2])}, {"input_ids": torch.tensor([3])}]
    samples = [
        [([5, 9], [-0.1, -0.2]), ([6, 7, 8], [-0.3, -0.4, -0.5])],
        [([9], [-0.6]), ([], [])],
    ]
    out = assemble(prompts, samples, SamplingParams(n=2, logprobs=True), eos_ids=[9])
    assert out.prompt_index == [0, 0, 1, 1]
    assert [p.tolist() for p in out.prompt_ids] == [[1, 2], [1, 2], [3], [3]]
    assert [r.tolist() for r in out.response_ids] == [[5, 9], [6, 7, 8], [9], []]
    assert out.finished == [True, False, True, False]
    assert out.logprobs[1].tolist() == pytest.approx([-0.3, -0.4, -0.5])
    ignoring = assemble(prompts, samples, SamplingParams(n=2, ignore_eos=True), eos_ids=[9])
    assert ignoring.finished == [False] * 4
    unasked = assemble(
        prompts, [[(ids, None) for ids, _ in per] for per in samples], SamplingParams(n=2), eos_ids=[9]
    )
    assert unasked.logprobs is None and [r.tolist() for r in unasked.response_ids] == [
        [5, 9],
        [6, 7, 8],
        [9],
        [],
    ]


def test_vllm_engine_arguments() -> None:
    """What vLLM is built with; videos are off for image models (vLLM would profile them through a
    processor that has no video part, which failed on the H200)."""
    from easyr1.rollout.config import RolloutConfig
    from easyr1.rollout.vllm import engine_kwargs

    cfg = RolloutConfig(tensor_parallel_size=1, gpu_memory_utilization=0.3, free_cache_engine=True)
    text = engine_kwargs(cfg, model_path="m", tokenizer_path="t", max_model_len=768, trust_remote_code=False)
    assert text["distributed_executor_backend"] == "external_launcher"
    assert text["logprobs_mode"] == "processed_logprobs" and text["enable_sleep_mode"]
    assert text["gpu_memory_utilization"] == 0.3 and text["max_model_len"] == 768
    assert "limit_mm_per_prompt" not in text
    assert text["compilation_config"] == {"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"}
    assert text["max_num_seqs"] is None  # vLLM's default unless worker.rollout.max_num_seqs says otherwise
    cfg.max_num_seqs = 64
    assert (
        engine_kwargs(cfg, model_path="m", tokenizer_path="t", max_model_len=768, trust_remote_code=False)[
            "max_num_seqs"
        ]
        == 64
    )
    image = engine_kwargs(
        RolloutConfig(limit_images=2, enforce_eager=True, free_cache_engine=False),
        model_path="m",
        tokenizer_path="t",
        max_model_len=768,
        trust_remote_code=False,
        multimodal=True,
    )
    assert image["limit_mm_per_prompt"] == {"image": 2, "video": 0} and "compilation_config" not in image
    assert not image["enable_sleep_mode"]  # an engine that stays awake needs no sleep-mode allocator
    with pytest.raises(ValueError, match="settled first"):  # "auto" is the trainer's to decide, never vLLM's
        engine_kwargs(
            RolloutConfig(), model_path="m", tokenizer_path="t", max_model_len=768, trust_remote_code=False
        )


def test_a_vllm_batch_that_cannot_hold_a_sequence_names_the_key() -> None:
    """Without chunked prefill vLLM's batch must hold a whole sequence; vLLM's own refusal (a
    validation error of its scheduler, met on the H200 with 16,384-token responses) names no key."""
    from easyr1.config import ConfigError
    from easyr1.rollout.config import RolloutConfig
    from easyr1.rollout.vllm import engine_kwargs

    cfg = RolloutConfig(free_cache_engine=True)  # max_num_batched_tokens 8192, EasyR1's default
    with pytest.raises(
        ConfigError, match="worker.rollout.max_num_batched_tokens=8192 is below the context of 16640"
    ):
        engine_kwargs(cfg, model_path="m", tokenizer_path="t", max_model_len=16640, trust_remote_code=False)
    cfg.enable_chunked_prefill = True  # then a sequence's prefill spans several batches
    assert (
        engine_kwargs(cfg, model_path="m", tokenizer_path="t", max_model_len=16640, trust_remote_code=False)[
            "max_model_len"
        ]
        == 16640
    )


def _vllm_run(*overrides: str) -> Any:
    from easyr1.config import load_config
    from easyr1.workloads import workload_config

    settings = {**workload_config("anchor", "vllm"), "worker.actor.model.model_path": "qwen2:1.5b"}
    return load_config([f"{k}={v}" for k, v in settings.items()] + list(overrides))


def test_vllm_stays_awake_where_the_memory_estimate_says_it_fits() -> None:
    """``free_cache_engine=auto`` (the default): the anchor's 1.5B run keeps vLLM's share through
    training on an H200 and sleeps on a 24 GiB GPU; true and false are obeyed as given; a model the
    estimator cannot size sleeps, and the reason says so."""
    from easyr1.rollout.backend import settle_free_cache_engine

    config = _vllm_run()
    assert config.worker.rollout.free_cache_engine == "auto"
    rollout, why = settle_free_cache_engine(config, 1, 139.8)
    assert rollout.free_cache_engine is False and why.startswith("free_cache_engine=auto: awake")
    assert "of 139.8 GiB" in why and rollout == dataclasses.replace(
        config.worker.rollout, free_cache_engine=False
    )
    rollout, why = settle_free_cache_engine(config, 1, 24.0)
    assert rollout.free_cache_engine is True and "asleep while training" in why
    assert (
        settle_free_cache_engine(_vllm_run("worker.rollout.free_cache_engine=true"), 1, 139.8)[
            0
        ].free_cache_engine
        is True
    )
    assert settle_free_cache_engine(_vllm_run("worker.rollout.free_cache_engine=false"), 1, 24.0) == (
        _vllm_run("worker.rollout.free_cache_engine=false").worker.rollout,
        "free_cache_engine=false",
    )
    rollout, why = settle_free_cache_engine(
        _vllm_run("worker.actor.model.model_path=no/such/folder"), 1, 139.8
    )
    assert rollout.free_cache_engine is True and "no memory estimate" in why


@pytest.mark.parametrize(
    "sampling",
    [dict(temperature=0.0), dict(temperature=0.9, top_k=20, top_p=0.95)],
    ids=["greedy", "sampled"],
)
def test_static_cache_decoding_equals_generate(tiny_model, sampling: dict[str, Any]) -> None:
    """Text decoders sample with a static cache (``decode.sample``): with left-padded prompts of
    different lengths and an EOS that ends some rows early, the tokens equal Hugging Face
    ``generate``'s with the same processors and seed, and the log-probs agree."""
    from easyr1.rollout.hf import _hf_generate, _processors

    path = tiny_model("qwen2")
    tokenizer, model = load_tokenizer(path), load_model(path).eval()
    prompts = [
        {"input_ids": torch.tensor(tokenizer(text)["input_ids"])}
        for text in ("1 + 2 =", "7", "what is nine minus four?")
    ]
    params = SamplingParams(n=2, max_tokens=12, logprobs=True, **sampling)
    order = [i for i in range(len(prompts)) for _ in range(params.n)]
    input_ids, mask = rollout_hf.pad(
        [prompts[i]["input_ids"] for i in order], tokenizer.pad_token_id, side="left"
    )
    # An EOS the model does produce, so that rows end at different steps.
    probe = _hf_generate(
        model,
        input_ids,
        mask,
        prompts,
        order,
        SamplingParams(max_tokens=3, temperature=0.0),
        [],
        tokenizer.pad_token_id,
        [],
    )
    eos_ids = [int(probe[0][0, 1])]
    processors = _processors(params, [], input_ids.shape[1], eos_ids, torch.device("cpu"))
    torch.manual_seed(7)
    want_tokens, want_logp = _hf_generate(
        model, input_ids, mask, prompts, order, params, processors, tokenizer.pad_token_id, eos_ids
    )
    torch.manual_seed(7)
    got_tokens, got_logp = rollout_hf.decode.sample(
        model,
        input_ids,
        mask,
        max_new_tokens=params.max_tokens,
        processors=processors,
        temperature=1.0 if params.greedy else params.temperature,
        greedy=params.greedy,
        eos_ids=eos_ids,
        pad_id=tokenizer.pad_token_id,
        cuda_graph=True,
        logprobs=True,  # no GPU here: the same loop, eagerly
    )
    ended = torch.isin(want_tokens, torch.tensor(eos_ids)).any(-1)
    assert ended.any() and not ended.all()  # the case this test is about
    width = want_tokens.shape[1]
    assert torch.equal(got_tokens[:, :width], want_tokens)
    assert (got_tokens[:, width:] == tokenizer.pad_token_id).all()  # rows that ended stay padded
    for row in range(len(order)):  # up to and including each row's EOS
        hits = torch.isin(want_tokens[row], torch.tensor(eos_ids)).nonzero()
        keep = int(hits[0]) + 1 if len(hits) else width
        assert torch.allclose(got_logp[row, :keep], want_logp[row, :keep], atol=1e-5)


@pytest.mark.parametrize("rope", [{"rope_type": "default"}, {"rope_type": "yarn", "factor": 4.0}])
def test_a_context_past_the_models_positions_is_refused_unless_rope_is_scaled(rope: dict[str, Any]) -> None:
    from transformers import Qwen2_5_VLConfig, Qwen2Config

    from easyr1.config import load_config
    from easyr1.rollout.backend import check_context

    config = load_config(
        ["data.max_prompt_length=1024", "data.max_response_length=3200", "worker.actor.model.model_path=m"]
    )
    for model_config in (
        Qwen2Config(max_position_embeddings=4096, rope_parameters={"rope_theta": 1e6, **rope}),
        Qwen2_5_VLConfig(
            text_config={"max_position_embeddings": 4096, "rope_parameters": {"rope_theta": 1e6, **rope}}
        ),
    ):
        if rope["rope_type"] != "default":
            check_context(config, model_config)  # scaled: vLLM too would take it
            continue
        with pytest.raises(
            ConfigError, match=r"= 4224 tokens is more than the model's max_position_embeddings of 4096 \(m\)"
        ):
            check_context(config, model_config)
        check_context(
            load_config(["data.max_prompt_length=896", "data.max_response_length=3200"]), model_config
        )


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_hf_rollout_block_by_block_generates_what_the_gathered_model_does(tiny_model, one_rank, lora) -> None:
    """``gather_full_model=false``: FSDP gathers each block at each decoding step instead of the whole
    model once, and puts the shards back after each; the tokens are the gathered rollout's (with LoRA
    its adapters run beside the base weights instead of folded into them: log-probs to rounding)."""
    path = tiny_model("qwen2")
    tokenizer = load_tokenizer(path)
    prompts = [{"input_ids": torch.tensor(tokenizer("1 + 2 =")["input_ids"]), "multi_modal_inputs": {}}]
    params = SamplingParams(n=2, temperature=1.0, max_tokens=6, logprobs=True)
    model = _shard(_lora(path) if lora else load_model(path))
    runs = {}
    for whole in (True, False):
        engine = HFRollout(model, FP32, pad_id=tokenizer.pad_token_id, eos_ids=[], gather_full_model=whole)
        runs[whole] = engine.generate(prompts, params, seed=5)
        # Nothing stays gathered: every FSDP unit holds its shards again.
        assert all(not m._get_fsdp_state()._fsdp_param_group.is_unsharded for m in fsdp_modules(model))
    got, want = runs[False], runs[True]
    assert all(torch.equal(a, b) for a, b in zip(got.response_ids, want.response_ids, strict=True))
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(got.logprobs, want.logprobs, strict=True))


def test_gather_full_model_auto_keeps_the_whole_model_unless_it_takes_half_the_gpu() -> None:
    from easyr1.memory import GIB, estimate, gathers_full_model
    from easyr1.models.architecture import Architecture

    config = PPOConfig()
    config.worker.rollout.name = "hf"
    arch = Architecture.load("qwen2:32b")  # 65 GB of bf16 weights
    assert gathers_full_model(config, arch, None)  # CPUs: no GPU size, always whole
    assert gathers_full_model(config, arch, 141.0) and not gathers_full_model(config, arch, 80.0)
    config.worker.rollout.gather_full_model = True
    assert gathers_full_model(config, arch, 80.0)
    config.worker.rollout.gather_full_model = "auto"
    blocks = estimate(config, arch, gpus=8, gpu_memory_gib=80.0).phases["rollout"]
    whole = estimate(config, arch, gpus=8, gpu_memory_gib=141.0).phases["rollout"]
    assert "gathered actor (compute dtype)" in whole and "gathered actor (compute dtype)" not in blocks
    assert sum(blocks.values()) < sum(whole.values()) - 55 * GIB
