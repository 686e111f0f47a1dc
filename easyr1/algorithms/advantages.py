"""Advantage estimators: pure tensor functions over right-padded ``[B, T]`` responses.

Every estimator returns ``(advantages, returns)``, both ``[B, T]`` and zero outside
``response_mask``. The signatures differ by what an estimator needs, so ``estimate`` dispatches
on the name (see ``OUTCOME_ESTIMATORS``):

- ``grpo``, ``rloo``, ``grpo_passk``: ``fn(scores [B], response_mask, group [B])``; group
  statistics are local because all samples of a prompt live on one rank. ``returns`` equals
  ``advantages`` (no critic reads them).
- ``remax``: ``fn(scores, baseline_scores, response_mask)`` with the greedy rollout's scores.
- ``reinforce_plus_plus``: ``fn(token_rewards [B, T], response_mask, gamma)``.
- ``gae``: ``fn(token_rewards, values, response_mask, gamma, lam)``.

The last two whiten over every valid token of every rank (one all-reduce), so a run on N ranks
computes the same numbers as one process holding the whole batch.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import Tensor

from easyr1.algorithms.config import AlgorithmConfig

# The estimators that read one scalar score per sample plus the prompt ids.
OUTCOME_ESTIMATORS = frozenset({"grpo", "rloo", "grpo_passk"})

_WHITEN_EPS = 1e-8


def global_sum(values: Tensor, process_group: dist.ProcessGroup | None = None) -> Tensor:
    """Sum ``values`` over the ranks of ``process_group`` (the world when None).

    Without an initialised process group it returns ``values`` unchanged, so the same code runs
    in one process and under ``torch.distributed``.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return values
    values = values.clone()
    dist.all_reduce(values, op=dist.ReduceOp.SUM, group=process_group)
    return values


def _as_bool(mask: Tensor) -> Tensor:
    return mask if mask.dtype == torch.bool else mask != 0


def _broadcast(per_sample: Tensor, response_mask: Tensor) -> Tensor:
    """Per-sample values ``[B]`` -> ``[B, T]`` on the valid tokens, 0 elsewhere."""
    mask = _as_bool(response_mask)
    return torch.where(mask, per_sample.unsqueeze(-1), 0.0)


class _Groups:
    """Per-group count, mean and unbiased std of ``scores``, indexed back to samples."""

    def __init__(self, scores: Tensor, group: Tensor) -> None:
        _, self.index = torch.unique(group, return_inverse=True)
        n_groups = int(self.index.max()) + 1 if self.index.numel() else 0
        zeros = scores.new_zeros(n_groups)
        self.count = zeros.index_add(0, self.index, torch.ones_like(scores))
        self.mean = zeros.index_add(0, self.index, scores) / self.count
        centred = (scores - self.mean[self.index]) ** 2
        # Bessel's correction, like torch.std; groups of one get std 0 (their advantage is 0).
        self.std = (zeros.index_add(0, self.index, centred) / (self.count - 1).clamp(min=1)).sqrt()

    def of(self, stat: Tensor) -> Tensor:
        return stat[self.index]


def grpo(
    scores: Tensor, response_mask: Tensor, group: Tensor, eps: float = 1e-6, norm_by_std: bool = True
) -> tuple[Tensor, Tensor]:
    """GRPO: ``(r - mean_group) / (std_group + eps)``.

    ``std_group`` is the unbiased (Bessel-corrected) standard deviation, as ``torch.std`` and
    veRL/EasyR1 compute it, so the advantages of a group have unbiased std ``std/(std+eps)`` ~ 1.
    ``norm_by_std=False`` is Dr. GRPO (Liu et al. 2025): only the mean is subtracted, because
    dividing by the std over-weights prompts that are almost always right or wrong.
    A group of one sample has no baseline and gets advantage 0.
    """
    scores = scores.float()
    g = _Groups(scores, group)
    adv = scores - g.of(g.mean)
    if norm_by_std:
        adv = adv / (g.of(g.std) + eps)
    adv = torch.where(g.of(g.count) > 1, adv, torch.zeros_like(adv))
    adv = _broadcast(adv, response_mask)
    return adv, adv


def rloo(scores: Tensor, response_mask: Tensor, group: Tensor) -> tuple[Tensor, Tensor]:
    """RLOO (Ahmadian et al. 2024): ``r_i - mean_{j != i} r_j = n/(n-1) * (r_i - mean)``.

    The baseline leaves the sample itself out, so it is independent of the sample and the
    gradient estimate stays unbiased. Groups of one sample get advantage 0.
    """
    scores = scores.float()
    g = _Groups(scores, group)
    n = g.of(g.count)
    adv = n / (n - 1).clamp(min=1) * (scores - g.of(g.mean))
    adv = torch.where(n > 1, adv, torch.zeros_like(adv))
    adv = _broadcast(adv, response_mask)
    return adv, adv


def grpo_passk(
    scores: Tensor, response_mask: Tensor, group: Tensor, eps: float = 1e-6, norm_by_std: bool = True
) -> tuple[Tensor, Tensor]:
    """Pass@k advantage with k = group size: leave-one-out of the group maximum.

    Sample i gets ``max(group) - max(group without i)`` (Tang et al. 2025, "Optimizing Language
    Models for Inference Time Objectives using Reinforcement Learning"): the best sample gets
    ``best - second best`` and every other sample 0 (removing it does not change the maximum).
    Ties for the best give 0 to all. As in GRPO the result is divided by the group's unbiased
    std + eps unless ``norm_by_std=False``. Groups of one sample get 0.
    """
    scores = scores.float()
    g = _Groups(scores, group)
    n_groups = g.count.numel()
    neg_inf = torch.full((n_groups,), float("-inf"), dtype=scores.dtype, device=scores.device)
    best = neg_inf.scatter_reduce(0, g.index, scores, reduce="amax")
    is_best = scores == g.of(best)
    n_best = g.count.new_zeros(n_groups).index_add(0, g.index, is_best.to(scores.dtype))
    below_best = torch.where(is_best, torch.full_like(scores, float("-inf")), scores)
    second = neg_inf.scatter_reduce(0, g.index, below_best, reduce="amax")
    second = torch.where(n_best > 1, best, second)
    gap = g.of(best - torch.where(g.count > 1, second, best))
    if norm_by_std:
        gap = gap / (g.of(g.std) + eps)
    adv = torch.where(is_best, gap, torch.zeros_like(gap))
    adv = _broadcast(adv, response_mask)
    return adv, adv


def remax(scores: Tensor, baseline_scores: Tensor, response_mask: Tensor) -> tuple[Tensor, Tensor]:
    """ReMax (Li et al. 2023): ``r - r_greedy``, the greedy rollout's score as the baseline.

    ``returns`` is the sample's own score on every token (the outcome return with gamma = 1).
    """
    scores = scores.float()
    adv = _broadcast(scores - baseline_scores.float(), response_mask)
    return adv, _broadcast(scores, response_mask)


def whiten(values: Tensor, response_mask: Tensor, process_group: dist.ProcessGroup | None = None) -> Tensor:
    """``(x - mean) / sqrt(var + 1e-8)`` over the valid tokens of all ranks; 0 outside the mask.

    One all-reduce of (sum, sum of squares, count) in float64: the float64 accumulation keeps the
    one-pass variance exact enough and makes 1-rank and N-rank results agree to float32 precision.
    The variance is unbiased (divides by count - 1).
    """
    mask = _as_bool(response_mask)
    x = torch.where(mask, values, 0.0).double()
    stats = torch.stack([x.sum(), (x * x).sum(), mask.sum().double()])
    total, total_sq, count = global_sum(stats, process_group).unbind()
    mean = total / count.clamp(min=1)
    var = (total_sq - count * mean * mean).clamp(min=0) / (count - 1).clamp(min=1)
    out = ((x - mean) * torch.rsqrt(var + _WHITEN_EPS)).to(values.dtype)
    return torch.where(mask, out, 0.0)


def _discounted_returns(token_rewards: Tensor, mask: Tensor, gamma: float) -> Tensor:
    """Returns-to-go ``G_t = r_t + gamma * G_next`` over valid tokens; masked tokens are skipped."""
    running = token_rewards.new_zeros(token_rewards.shape[0])
    returns = torch.zeros_like(token_rewards)
    for t in reversed(range(token_rewards.shape[1])):
        step = token_rewards[:, t] + gamma * running
        running = torch.where(mask[:, t], step, running)
        returns[:, t] = torch.where(mask[:, t], step, 0.0)
    return returns


def reinforce_plus_plus(
    token_rewards: Tensor,
    response_mask: Tensor,
    gamma: float,
    process_group: dist.ProcessGroup | None = None,
) -> tuple[Tensor, Tensor]:
    """REINFORCE++ (Hu 2025): discounted returns-to-go, whitened over the global batch.

    The whitening statistics span every valid token of every rank of ``process_group`` (the
    world by default, when ``torch.distributed`` is initialised): the batch-level baseline is the
    point of the method, so it must not depend on how the batch was sharded.
    """
    mask = _as_bool(response_mask)
    rewards = torch.where(mask, token_rewards.float(), 0.0)
    returns = _discounted_returns(rewards, mask, gamma)
    return whiten(returns, mask, process_group), returns


def gae(
    token_rewards: Tensor,
    values: Tensor,
    response_mask: Tensor,
    gamma: float,
    lam: float,
    process_group: dist.ProcessGroup | None = None,
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016) for PPO with a critic.

    ``delta_t = r_t + gamma * V_next - V_t`` and ``A_t = delta_t + gamma * lam * A_next``, where
    "next" is the next valid token (0 after the last one: the response ends the episode).
    ``returns = A + V`` is the critic's target, taken before the advantages are whitened over all
    valid tokens of all ranks (as in ``reinforce_plus_plus``).
    """
    mask = _as_bool(response_mask)
    rewards = torch.where(mask, token_rewards.float(), 0.0)
    values = torch.where(mask, values.float(), 0.0)
    next_value = rewards.new_zeros(rewards.shape[0])
    next_adv = rewards.new_zeros(rewards.shape[0])
    adv = torch.zeros_like(rewards)
    for t in reversed(range(rewards.shape[1])):
        step = rewards[:, t] + gamma * next_value - values[:, t] + gamma * lam * next_adv
        m = mask[:, t]
        next_value = torch.where(m, values[:, t], next_value)
        next_adv = torch.where(m, step, next_adv)
        adv[:, t] = torch.where(m, step, 0.0)
    returns = adv + values
    return whiten(adv, mask, process_group), returns


ADVANTAGE_ESTIMATORS: dict[str, Callable[..., tuple[Tensor, Tensor]]] = {
    "grpo": grpo,
    "rloo": rloo,
    "grpo_passk": grpo_passk,
    "reinforce_plus_plus": reinforce_plus_plus,
    "remax": remax,
    "gae": gae,
}


def estimate(
    algo: AlgorithmConfig,
    token_rewards: Tensor,
    response_mask: Tensor,
    *,
    group: Tensor,
    baseline_scores: Tensor | None,
    values: Tensor | None,
) -> tuple[Tensor, Tensor]:
    """``(advantages, returns)`` by ``algo.adv_estimator``, each estimator given what it reads of
    the ``[B, T]`` token rewards (the outcome estimators: their sum per sample)."""
    name = algo.adv_estimator
    estimator = ADVANTAGE_ESTIMATORS[name]
    if name in ("grpo", "grpo_passk"):
        return estimator(
            token_rewards.sum(-1), response_mask, group, norm_by_std=algo.norm_adv_by_std_in_grpo
        )
    if name == "rloo":
        return estimator(token_rewards.sum(-1), response_mask, group)
    if name == "remax":
        return estimator(token_rewards.sum(-1), baseline_scores, response_mask)
    if name == "reinforce_plus_plus":
        return estimator(token_rewards, response_mask, algo.gamma)
    return estimator(token_rewards, values, response_mask, algo.gamma, algo.lam)  # gae
