"""A step's metrics over the ranks: each rank sums what it saw, the sums are all-reduced, and the
means follow from them (EasyR1's ``reward/*``, ``val/*`` and ``*response_length/*`` metrics), so a
mean is over every sample of the batch, whichever rank held it."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist

from easyr1.distributed.simulated import simulated_ranks
from easyr1.telemetry import max_over_ranks


def all_reduce_sums(sums: dict[str, float]) -> dict[str, float]:
    """Sums over the ranks. Their keys may differ (a rank without validation rows, a reward that
    returns a key for some inputs only): every rank reduces the union, a key it lacks counting 0."""
    if not dist.is_initialized():
        return sums
    names: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(names, sorted(sums))
    keys = sorted(set().union(*names))
    if not keys:
        return {}
    t = torch.tensor([sums.get(k, 0.0) for k in keys], dtype=torch.float64)
    dist.all_reduce(t)
    if simulated_ranks() is not None:  # the fake group leaves rank 0's own: N ranks as rank 0 did
        t *= dist.get_world_size()
    return dict(zip(keys, t.tolist(), strict=True))


def score_sums(scores: Iterable[dict[str, float]], prefix: str) -> dict[str, float]:
    """Each score key's sum under ``prefix`` and, under ``_n/`` + that name, how many inputs had it:
    a key's mean is over the inputs that returned it, as EasyR1 averages its reward metrics."""
    sums: dict[str, float] = defaultdict(float)
    for score in scores:
        for key, value in score.items():
            sums[f"{prefix}{key}"] += value
            sums[f"_n/{prefix}{key}"] += 1
    return sums


def score_means(totals: dict[str, float], prefix: str) -> dict[str, float]:
    """The means of the ``score_sums`` keys under ``prefix`` in ``totals`` (summed over ranks)."""
    return {k: v / totals[f"_n/{k}"] for k, v in totals.items() if k.startswith(prefix)}


def length_sums(lengths: list[int], max_len: int, prefix: str) -> tuple[dict[str, float], dict[str, float]]:
    """Response lengths as sums (``mean``, ``clip_ratio``), for all_reduce_sums, and extremes
    (``max``, ``neg_min``), for max_over_ranks: a rank without samples leaves the others'."""
    sums = {
        f"{prefix}mean": float(sum(lengths)),
        f"{prefix}clip_ratio": float(sum(n >= max_len for n in lengths)),
    }
    return sums, {
        f"{prefix}max": float(max(lengths, default=0)),
        f"{prefix}neg_min": -float(min(lengths, default=max_len)),
    }


def length_means(totals: dict[str, float], extremes: dict[str, float], prefix: str) -> dict[str, float]:
    """The ``length_sums`` values, reduced over the ranks, as metrics: means over ``_samples``."""
    samples = max(totals["_samples"], 1.0)
    return {
        f"{prefix}mean": totals[f"{prefix}mean"] / samples,
        f"{prefix}clip_ratio": totals[f"{prefix}clip_ratio"] / samples,
        f"{prefix}max": extremes[f"{prefix}max"],
        f"{prefix}min": -extremes[f"{prefix}neg_min"],
    }


def sample_metrics(
    scores: list[dict[str, float]],
    response_lengths: list[int],
    response_mask: torch.Tensor,
    old_logp: torch.Tensor | None,
    rollout_logp: torch.Tensor | None,
    max_len: int,
) -> dict[str, float]:
    """A training step's metrics of its samples: ``reward/*`` are means over ``scores``,
    ``response_length/*`` over the samples of the batch, and with the rollout's own log-probs
    (``worker.rollout.calculate_log_probs``) ``rollout/*`` compare them with ``old_logp`` per token."""
    sums = score_sums(scores, "reward/")
    lengths, extremes = length_sums(response_lengths, max_len, "response_length/")
    sums.update(lengths)
    mask = response_mask
    if rollout_logp is not None:
        assert old_logp is not None
        diff = (old_logp - rollout_logp).abs() * mask
        sums["rollout/logp_diff_mean"] = float(diff.sum())
        ratio = torch.exp(old_logp - rollout_logp) * mask
        sums["rollout/ratio_mean"] = float(ratio.sum())
        extremes.update({"rollout/ratio_max": float(ratio.max()), "rollout/logp_diff_max": float(diff.max())})
    totals = all_reduce_sums({**sums, "_samples": float(len(response_lengths)), "_tokens": float(mask.sum())})
    out = score_means(totals, "reward/")
    out.update(
        {
            key: value / max(totals["_tokens"], 1.0)
            for key, value in totals.items()
            if key.startswith("rollout/")
        }
    )
    extremes = max_over_ranks(extremes)
    out.update({key: value for key, value in extremes.items() if key.startswith("rollout/")})
    return {**out, **length_means(totals, extremes, "response_length/")}


def val_metrics(scores: list[dict[str, float]], lengths: list[int], max_len: int) -> dict[str, float]:
    """EasyR1's validation metrics: ``val/{score}_reward`` for each key of the reward's dicts,
    ``val/reward_score`` (the overall score's mean, which picks the best checkpoint) and
    ``val_response_length/*``; means over the whole validation set."""
    sums, extremes = length_sums(lengths, max_len, "val_response_length/")
    totals = all_reduce_sums({**score_sums(scores, "val/"), **sums, "_samples": float(len(lengths))})
    out = {f"{key}_reward": value for key, value in score_means(totals, "val/").items()}
    out["val/reward_score"] = out["val/overall_reward"]
    return {**out, **length_means(totals, max_over_ranks(extremes), "val_response_length/")}
