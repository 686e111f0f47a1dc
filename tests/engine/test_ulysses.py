"""Ulysses sequence parallelism: two ranks splitting every packed row between them give one rank's
log-probs, entropies, loss and gradients (fp32, CPU), for text and every Qwen-VL architecture;
an actor update and the critic's values match too."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from easyr1.distributed import ulysses
from easyr1.distributed.ports import free_port
from easyr1.experience import Experience, concat
from easyr1.models.attention import use_packed_attention
from easyr1.models.loading import load_model, load_value_model
from easyr1.models.tiny import VISION_ARCHS
from easyr1.models.ulysses import enable
from easyr1.workers.config import ActorConfig, CriticConfig, OptimConfig
from easyr1.workers.critic import Critic
from easyr1.workers.fsdp import parallelize
from easyr1.workers.logprobs import install_scoring_head, token_logprobs
from tests.engine.test_padding_free import FP32, _experience
from tests.trainer_utils import end_rank, sharded_actor, start_rank


def _policy(path: Path, size: int) -> torch.nn.Module:
    model = load_model(path)
    install_scoring_head(model)
    use_packed_attention(model)
    if size > 1:
        enable(model, size)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return parallelize(model, FP32, trainable=True, device=torch.device("cpu"))


def _scores(path: Path, exp: Experience, size: int) -> dict[str, torch.Tensor]:
    """Log-probs, entropies, the loss and every full gradient of one packed pass over ``exp``
    (the whole batch: a Ulysses group holds its pooled samples)."""
    shard = ulysses.shard_for(size)
    model = _policy(path, size)
    model.train()
    logp, entropy = token_logprobs(
        model, exp, temperature=0.8, pad_id=0, device=torch.device("cpu"), packed=True, shard=shard
    )
    loss = ((logp - 0.3 * entropy) ** 2 * exp.response_mask).sum() / exp.response_mask.sum()
    (loss * dist.get_world_size()).backward()  # FSDP averages over ranks, as in the update
    out = {
        "logp": (logp * exp.response_mask).detach(),
        "entropy": (entropy * exp.response_mask).detach(),
        "loss": loss.detach(),
    }
    out.update({f"grad/{n}": p.grad.full_tensor() for n, p in model.named_parameters() if p.grad is not None})
    return out


LR = 1e-2
# Adam's first step is lr * g / (|g| + eps): lr times g's sign wherever |g| is well above eps (1e-8).
# A few coordinates have gradients of rounding size (a key bias along RoPE's slowest frequencies,
# where attention barely depends on it: |g| ~ 1e-9), and there the step follows the rounding of
# either run, up to lr apart. The update is compared where the one-rank step is above this share of lr.
ADAM_STEADY = 0.5


def _update(path: Path, exp: Experience, size: int) -> dict[str, torch.Tensor]:
    """Weights after one actor update of ``exp`` (this rank's samples) in micro-batches of 2."""
    config = ActorConfig(
        global_batch_size=10,
        micro_batch_size_per_device_for_update=2,
        ulysses_size=size,
        fsdp=FP32,
        optim=OptimConfig(lr=LR),
    )
    if size > 1:
        torch.manual_seed(0)
        model = _policy(path, size)
        from easyr1.algorithms.config import AlgorithmConfig
        from easyr1.workers.actor import Actor

        actor = Actor(
            model,
            config,
            AlgorithmConfig(disable_kl=True),
            samples_per_prompt=1,
            max_response_length=9,
            temperature=1.0,
            pad_id=0,
            total_steps=1,
            device=torch.device("cpu"),
        )
    else:
        model, actor = sharded_actor(path, config, max_response_length=9)
    exp.advantages = (
        (exp.response_lengths[:, None] - 4.0) / 4 * exp.response_mask
    )  # a sample's own, wherever it is
    metrics = actor.update(exp, step=1)
    out = {k: v.full_tensor().clone() for k, v in model.state_dict().items()}
    out["old_logp"] = exp.old_logp
    out["pg_loss"] = torch.tensor(metrics["actor/pg_loss"])
    out["grad_norm"] = torch.tensor(metrics["actor/grad_norm"])  # Adam's step hides the gradient's scale
    return out


def _values(path: Path, exp: Experience, size: int) -> torch.Tensor:
    torch.manual_seed(0)
    model = load_value_model(path)
    use_packed_attention(model)
    if size > 1:
        enable(model, size)
    model = parallelize(model, FP32, trainable=True, device=torch.device("cpu"))
    config = CriticConfig(
        padding_free=True, ulysses_size=size, micro_batch_size_per_device_for_experience=3, fsdp=FP32
    )
    return Critic(
        model, config, samples_per_prompt=1, pad_id=0, total_steps=1, device=torch.device("cpu")
    ).values(exp)


def _both_ranks(path: Path, vision: bool) -> Experience:
    return concat([_experience(path, rank, vision) for rank in range(2)])


def _worker(rank: int, port: int, path: str, arch: str, out_dir: str) -> None:
    start_rank(rank, port, 2)
    try:
        vision = arch in VISION_ARCHS
        results: dict[str, Any] = {"scores": _scores(Path(path), _both_ranks(Path(path), vision), 2)}
        if not vision:
            results["update"] = _update(Path(path), _experience(Path(path), rank, vision), 2)
            results["values"] = _values(Path(path), _experience(Path(path), rank, vision), 2)
        torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()
    end_rank()


@pytest.mark.parametrize("arch", ["qwen2", *VISION_ARCHS])
def test_two_ranks_of_one_group_equal_one_rank(
    tiny_model: Callable[[str], Path], one_rank: None, arch: str, tmp_path: Path
) -> None:
    path = tiny_model(arch)
    vision = arch in VISION_ARCHS
    start = load_model(path).state_dict()
    want = {"scores": _scores(path, _both_ranks(path, vision), 1)}
    if not vision:
        want["update"] = _update(path, _both_ranks(path, vision), 1)
        want["values"] = _values(path, _both_ranks(path, vision), 1)
    mp.get_context("forkserver").set_forkserver_preload(["torch", "transformers", "easyr1.workers.fsdp"])
    mp.start_processes(
        _worker, args=(free_port(), str(path), arch, str(tmp_path)), nprocs=2, start_method="forkserver"
    )
    for rank in range(2):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        for key, value in want["scores"].items():
            torch.testing.assert_close(
                got["scores"][key], value, rtol=1e-5, atol=1e-5, msg=f"rank {rank} {key}"
            )
        if not vision:
            rows = slice(5 * rank, 5 * rank + 5)  # this rank's samples of the pooled batch
            compared = total = 0
            for key, value in want["update"].items():
                mine = value[rows, : got["update"][key].shape[1]] if key == "old_logp" else value
                theirs = got["update"][key]
                if key in start:  # a weight: only where Adam's step is not the rounding's sign (above)
                    steady = (mine - start[key]).abs() > ADAM_STEADY * LR
                    compared, total = compared + int(steady.sum()), total + steady.numel()
                    mine, theirs = mine[steady], theirs[steady]
                torch.testing.assert_close(
                    theirs, mine, rtol=1e-5, atol=1e-5, msg=f"rank {rank} update {key}"
                )
            assert compared > 0.99 * total  # all but a few coordinates (5 of a layer's 32 key biases here)
            torch.testing.assert_close(
                got["values"], want["values"][rows, : got["values"].shape[1]], rtol=1e-5, atol=1e-5
            )


def test_split_rows_need_packing(tiny_model: Callable[[str], Path]) -> None:
    from easyr1.experience import scoring_batch

    exp = _experience(tiny_model("qwen2"), 0, False)
    shard = ulysses.Shard(group=None, rank=0, size=2)
    with pytest.raises(ValueError, match="padding_free"):
        scoring_batch(exp, 0, load_model(tiny_model("qwen2")), torch.device("cpu"), packed=False, shard=shard)


def test_a_ppo_run_with_ulysses_matches_one_without(
    tiny_model: Callable[[str], Path], arithmetic: Path, tmp_path: Path
) -> None:
    """`easyr1 train` on 2 ranks, actor and critic in one Ulysses group of 2, against the same run
    with data parallelism only: the same rollouts, and the same first update (its gradient norms; the
    per-micro-batch means, such as the losses, group samples differently)."""
    from tests.trainer_utils import read_metrics, run_train, tiny_config

    runs = {}
    for size in (1, 2):
        run_dir = tmp_path / f"ulysses{size}"
        config = tiny_config(tiny_model("qwen2"), arithmetic, run_dir)
        config["trainer"].update(max_steps=1, val_freq=-1, val_before_train=False)
        config["algorithm"].update(adv_estimator="gae", use_kl_loss=False)
        config["worker"]["critic"] = {
            "global_batch_size": 2,
            "padding_free": True,
            "ulysses_size": size,
            "model": {"model_path": str(tiny_model("qwen2"))},
            "fsdp": {"torch_dtype": "fp32", "mp_param_dtype": "fp32"},
        }
        config["worker"]["actor"]["ulysses_size"] = size
        done = run_train(config, tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
        runs[size] = read_metrics(run_dir)[-1]
    for key in ("reward/overall", "response_length/mean"):
        assert runs[2][key] == runs[1][key], key
    for key in ("actor/grad_norm", "critic/grad_norm"):
        assert runs[2][key] == pytest.approx(runs[1][key], rel=1e-4, abs=1e-6), key
