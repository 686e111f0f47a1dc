"""Padding-free training: micro-batches packed into one row give the padded run's log-probs,
entropies and gradients (fp32, 2 CPU ranks under FSDP2, gradient checkpointing on), for text and
every Qwen-VL architecture (mixed image and text rows), with dynamic batching on and off; the
critic's values too; and dynamic batching then budgets real tokens."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from PIL import Image

from easyr1.distributed.ports import free_port
from easyr1.experience import Experience
from easyr1.models.attention import PACKED, use_packed_attention
from easyr1.models.loading import load_model, load_processor, load_value_model
from easyr1.models.tiny import VISION_ARCHS
from easyr1.workers.batching import micro_batches
from easyr1.workers.config import FSDPConfig
from easyr1.workers.fsdp import parallelize
from easyr1.workers.logprobs import install_scoring_head, token_logprobs
from easyr1.workers.update import split
from tests.trainer_utils import end_rank, start_rank

FP32 = FSDPConfig(torch_dtype="fp32", mp_param_dtype="fp32")
PROMPT_LENGTHS = ([5, 3, 7, 4, 6], [2, 8, 4, 3, 5])  # per rank; response lengths below
RESPONSE_LENGTHS = ([6, 2, 9, 4, 1], [3, 7, 5, 8, 2])


def _experience(path: Path, rank: int, vision: bool) -> Experience:
    """Five samples of random tokens; for a VL model, rows 0 and 2 carry one image each."""
    gen = torch.Generator().manual_seed(rank)
    prompts, mm = [], []
    for row, n in enumerate(PROMPT_LENGTHS[rank]):
        ids = torch.randint(1, 200, (n,), generator=gen)
        if vision and row in (0, 2):
            processor = load_processor(path)
            size = (56, 56) if row == 0 else (84, 56)
            text = processor.apply_chat_template(
                [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "count"}]}],
                tokenize=False,
            )
            encoded = processor(
                text=[text], images=[Image.new("RGB", size, (200, 30 * row, 30))], return_tensors="pt"
            )
            ids = torch.cat([encoded["input_ids"][0], ids])
            mm.append({k: encoded[k] for k in ("pixel_values", "image_grid_thw")})
        else:
            mm.append({})
        prompts.append(ids)
    responses = [torch.randint(1, 200, (n,), generator=gen) for n in RESPONSE_LENGTHS[rank]]
    mask = torch.zeros(len(responses), max(RESPONSE_LENGTHS[rank]))
    for row, r in enumerate(responses):
        mask[row, : r.numel()] = 1
    return Experience(prompts, responses, mm, torch.arange(len(prompts)), mask)


def _actor_pass(path: Path, exp: Experience, packed: bool, dynamic: bool) -> dict[str, torch.Tensor]:
    """Log-probs, entropies and every parameter's full gradient of one backward over ``exp``'s
    micro-batches of (up to) 2 rows."""
    model = load_model(path)
    install_scoring_head(model)
    if packed:
        use_packed_attention(model)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = parallelize(model, FP32, trainable=True, device=torch.device("cpu"))
    model.train()
    logp, entropy = torch.zeros(exp.response_mask.shape), torch.zeros(exp.response_mask.shape)
    for rows in split(exp, 2, dynamic, packed):
        micro = exp.select(rows)
        lp, ent = token_logprobs(
            model, micro, temperature=0.8, pad_id=0, device=torch.device("cpu"), packed=packed
        )
        ((lp + 0.3 * ent) * micro.response_mask).sum().backward()
        logp[rows], entropy[rows] = (lp * micro.response_mask).detach(), (ent * micro.response_mask).detach()
    out = {"logp": logp, "entropy": entropy}
    out.update({f"grad/{n}": p.grad.full_tensor() for n, p in model.named_parameters() if p.grad is not None})
    return out


def _critic_pass(path: Path, exp: Experience, packed: bool) -> dict[str, torch.Tensor]:
    from easyr1.workers.config import CriticConfig
    from easyr1.workers.critic import Critic

    torch.manual_seed(0)  # the value head starts random: the same in both runs
    model = load_value_model(path)
    if packed:
        use_packed_attention(model)
    model = parallelize(model, FP32, trainable=True, device=torch.device("cpu"))
    config = CriticConfig(padding_free=packed, micro_batch_size_per_device_for_experience=2, fsdp=FP32)
    critic = Critic(model, config, samples_per_prompt=1, pad_id=0, total_steps=1, device=torch.device("cpu"))
    values = critic.values(exp)
    (critic._forward(exp) * exp.response_mask).sum().backward()
    out = {"values": values}
    out.update({f"grad/{n}": p.grad.full_tensor() for n, p in model.named_parameters() if p.grad is not None})
    return out


def _worker(rank: int, port: int, path: str, arch: str, out_dir: str) -> None:
    start_rank(rank, port, 2)
    try:
        exp = _experience(Path(path), rank, arch in VISION_ARCHS)
        results = {
            f"{mode}-{dynamic}": _actor_pass(Path(path), exp, mode == "packed", dynamic)
            for mode in ("padded", "packed")
            for dynamic in (False, True)
        }
        if arch not in VISION_ARCHS:  # the critic (GAE) takes text models
            results.update(
                {
                    f"critic-{mode}": _critic_pass(Path(path), exp, mode == "packed")
                    for mode in ("padded", "packed")
                }
            )
        torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()
    end_rank()


@pytest.mark.parametrize("arch", ["qwen2", *VISION_ARCHS])
def test_packed_equals_padded_on_two_ranks(
    tiny_model: Callable[[str], Path], arch: str, tmp_path: Path
) -> None:
    path = tiny_model(arch)
    mp.get_context("forkserver").set_forkserver_preload(["torch", "transformers", "easyr1.workers.fsdp"])
    mp.start_processes(
        _worker, args=(free_port(), str(path), arch, str(tmp_path)), nprocs=2, start_method="forkserver"
    )
    for rank in range(2):
        results = torch.load(tmp_path / f"rank{rank}.pt")
        reference = results["padded-False"]
        for run in ("padded-True", "packed-False", "packed-True"):
            assert results[run].keys() == reference.keys(), run
            for key, want in reference.items():
                torch.testing.assert_close(
                    results[run][key], want, rtol=1e-5, atol=1e-5, msg=f"rank {rank} {run} {key}"
                )
        if arch not in VISION_ARCHS:
            packed, padded = results["critic-packed"], results["critic-padded"]
            for key, want in padded.items():
                torch.testing.assert_close(
                    packed[key], want, rtol=1e-5, atol=1e-5, msg=f"rank {rank} critic {key}"
                )


def test_packed_dynamic_batching_counts_real_tokens() -> None:
    """Padded runs pay for their longest row in every slot, packed runs only for real tokens, so
    packing needs fewer micro-batches under the same budget (2 x 40 tokens)."""
    lengths = [40, 35, 35, 5, 5, 5, 5]
    padded = micro_batches(lengths, 2, dynamic=True)
    packed = micro_batches(lengths, 2, dynamic=True, packed=True)
    assert sorted(r for run in packed for r in run) == list(range(len(lengths)))
    assert len(packed) < len(padded)
    assert all(sum(lengths[r] for r in run) <= 2 * max(lengths) for run in packed)


def test_packed_attention_leaves_padded_forwards_and_the_vision_tower_alone(
    tiny_model: Callable[[str], Path],
) -> None:
    """Switched to ``PACKED``, a model's padded forward (generation, the rollout) is unchanged, and a
    Qwen-VL model's vision tower keeps SDPA."""
    path = tiny_model("qwen2_5_vl")
    model = load_model(path)
    ids = torch.randint(1, 200, (2, 7))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding, as in generation
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask).logits
        use_packed_attention(model)
        got = model(input_ids=ids, attention_mask=mask).logits
    assert model.config.text_config._attn_implementation == PACKED
    assert model.config.vision_config._attn_implementation == "sdpa"
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_saved_config_does_not_name_the_packed_attention(
    tiny_model: Callable[[str], Path], tmp_path: Path
) -> None:
    """A checkpoint must load in a process that never registered ``PACKED`` (merging, vLLM)."""
    model = load_model(tiny_model("qwen2_5_vl"))
    use_packed_attention(model)
    model.save_pretrained(tmp_path)
    assert PACKED not in (tmp_path / "config.json").read_text()
