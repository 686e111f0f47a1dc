"""Global statistics give the same numbers on 1 rank and on 2 gloo ranks holding an uneven split
of the same batch (rank 0: 3 samples, rank 1: 5)."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from easyr1.algorithms.advantages import gae, global_sum, reinforce_plus_plus
from easyr1.algorithms.kl import apply_kl_penalty
from easyr1.algorithms.losses import aggregate, ppo_clip_loss
from easyr1.distributed.ports import free_port

B, T, WORLD = 8, 6, 2
SHARDS = [slice(0, 3), slice(3, 8)]
MICRO = 2  # micro-batch size: rank 0 runs micro-batches of 2 + 1 samples, rank 1 of 2 + 2 + 1
CFG = SimpleNamespace(
    clip_ratio_low=0.2, clip_ratio_high=0.3, clip_ratio_dual=3.0, tau_positive=1.0, tau_negative=1.05
)


def _batch() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    lengths = torch.tensor([6, 5, 6, 1, 2, 3, 1, 2])  # rank 0 holds most of the tokens
    mask = (torch.arange(T) < lengths.unsqueeze(-1)).float()
    old = -torch.rand(B, T, generator=gen) * 3
    return {
        "mask": mask,
        "rewards": torch.randn(B, T, generator=gen) * mask,
        "values": torch.randn(B, T, generator=gen),
        "old": old,
        "logp": old + 0.3 * torch.randn(B, T, generator=gen),
        "ref": old + 0.3 * torch.randn(B, T, generator=gen),
        "adv": torch.randn(B, 1, generator=gen).expand(B, T).contiguous(),
    }


def _policy_gradients(batch: dict[str, torch.Tensor], mode: str, count: float, world: int) -> torch.Tensor:
    """Accumulate micro-batch gradients of a shared parameter, as the actor update does."""
    shift = torch.zeros(T, requires_grad=True)  # stands in for the model's parameters
    for start in range(0, batch["mask"].shape[0], MICRO):
        mb = {k: v[start : start + MICRO] for k, v in batch.items()}
        loss_mat, _ = ppo_clip_loss(mb["old"], mb["logp"] + shift, mb["adv"], mb["mask"], CFG)
        key = "global_tokens" if mode == "token" else "global_seqs"
        (aggregate(loss_mat, mb["mask"], mode, **{key: count}) * world).backward()
    grad = shift.grad
    if world > 1:
        grad = global_sum(grad) / world  # what FSDP's gradient averaging does
    return grad


def _compute(batch: dict[str, torch.Tensor], world: int) -> dict[str, torch.Tensor]:
    mask = batch["mask"]
    out = {}
    out["rpp_adv"], out["rpp_ret"] = reinforce_plus_plus(batch["rewards"], mask, gamma=0.9)
    out["gae_adv"], out["gae_ret"] = gae(batch["rewards"], batch["values"], mask, gamma=0.95, lam=0.9)
    _, out["mean_kl"] = apply_kl_penalty(
        batch["rewards"], batch["logp"], batch["ref"], mask, coef=0.1, kind="low_var_kl"
    )
    tokens = global_sum(mask.sum())
    seqs = global_sum((mask.sum(-1) > 0).sum().float())
    out["grad_token"] = _policy_gradients(batch, "token", tokens.item(), world)
    out["grad_seq"] = _policy_gradients(batch, "seq", seqs.item(), world)
    return out


def _worker(rank: int, port: int, out_dir: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        shard = {k: v[SHARDS[rank]] for k, v in _batch().items()}
        torch.save(_compute(shard, WORLD), Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_two_ranks_match_one_rank(tmp_path: Path) -> None:
    assert not dist.is_initialized()
    reference = _compute(_batch(), world=1)
    # A forkserver that has imported torch once forks both ranks: ~4 s instead of ~10 s of two
    # concurrent torch imports, and it is a fresh process, so forking it is safe.
    mp.get_context("forkserver").set_forkserver_preload(["torch", "easyr1.algorithms"])
    mp.start_processes(_worker, args=(free_port(), str(tmp_path)), nprocs=WORLD, start_method="forkserver")
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]

    for key in ("rpp_adv", "rpp_ret", "gae_adv", "gae_ret"):
        merged = torch.cat([r[key] for r in ranks])
        torch.testing.assert_close(merged, reference[key], rtol=0, atol=1e-6, msg=key)
    for key in ("mean_kl", "grad_token", "grad_seq"):
        for r in ranks:
            torch.testing.assert_close(r[key], reference[key], rtol=0, atol=1e-6, msg=key)

    # The split is uneven enough that per-rank statistics would NOT have matched.
    shards = [{k: v[part] for k, v in _batch().items()} for part in SHARDS]
    local = reinforce_plus_plus(shards[0]["rewards"], shards[0]["mask"], gamma=0.9)[0]
    assert not torch.allclose(local, reference["rpp_adv"][SHARDS[0]], atol=1e-3)
    local_means = [_policy_gradients(s, "token", s["mask"].sum().item(), world=1) for s in shards]
    assert not torch.allclose(sum(local_means) / WORLD, reference["grad_token"], atol=1e-3)
