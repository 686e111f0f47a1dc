"""KL divergence to the reference policy: per-token estimators, coefficient controllers, and
the KL penalty folded into token rewards.

The estimators follow Schulman's "Approximating KL Divergence" note, with ``x = logp - ref_logp``
for a token sampled from the current policy:
``kl`` (k1) ``x``, unbiased but can be negative; ``abs`` ``|x|``; ``mse`` (k2) ``x^2 / 2``;
``low_var_kl`` (k3) ``exp(-x) + x - 1`` >= 0, unbiased with low variance; ``full`` the exact
``sum_v p_v (log p_v - log q_v)`` from full ``[B, T, V]`` log-prob tensors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from easyr1.algorithms.advantages import global_sum


def _k1(logp: Tensor, ref_logp: Tensor) -> Tensor:
    return logp - ref_logp


def _abs(logp: Tensor, ref_logp: Tensor) -> Tensor:
    return (logp - ref_logp).abs()


def _k2(logp: Tensor, ref_logp: Tensor) -> Tensor:
    return 0.5 * (logp - ref_logp).square()


def _k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """``exp(ref - logp) - (ref - logp) - 1``, clamped to [-10, 10].

    The log-ratio is clamped to [-20, 20] before ``exp`` so a huge ratio yields a finite value and
    a zero (not NaN) gradient once the output clamp is active.
    """
    log_ratio = (ref_logp - logp).clamp(-20.0, 20.0)
    return (log_ratio.exp() - log_ratio - 1).clamp(-10.0, 10.0)


def _full(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Exact KL(p || q) per position from log-probs over the vocabulary ``[..., V]``."""
    return F.kl_div(ref_logp, logp, reduction="none", log_target=True).sum(-1)


KL_ESTIMATORS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "kl": _k1,
    "k1": _k1,
    "abs": _abs,
    "mse": _k2,
    "k2": _k2,
    "low_var_kl": _k3,
    "k3": _k3,
    "full": _full,
}


def kl_estimate(logp: Tensor, ref_logp: Tensor, kind: str) -> Tensor:
    """Per-token KL estimate ``[B, T]`` (``full`` takes ``[B, T, V]`` log-probs)."""
    try:
        estimator = KL_ESTIMATORS[kind]
    except KeyError:
        raise ValueError(f"unknown KL estimator {kind!r}; choose one of {sorted(KL_ESTIMATORS)}") from None
    return estimator(logp, ref_logp)


class FixedKLController:
    """A constant KL coefficient."""

    def __init__(self, coef: float) -> None:
        self.value = coef

    def update(self, current_kl: float, n_steps: int) -> None:
        """Nothing to adapt; present so the trainer treats both controllers alike."""


class AdaptiveKLController:
    """Proportional controller of Ziegler et al. 2019 ("Fine-Tuning Language Models from Human
    Preferences"): ``coef *= 1 + clip(kl / target - 1, -0.2, 0.2) * n_steps / horizon``.

    The coefficient grows while the measured KL exceeds the target and shrinks below it; the
    clipped error bounds how fast it can move on a single noisy measurement.
    """

    def __init__(self, init_coef: float, target: float, horizon: float) -> None:
        self.value = init_coef
        self.target = target
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        error = min(max(float(current_kl) / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon


KLController = FixedKLController | AdaptiveKLController


class _KLSettings(Protocol):
    kl_type: str
    kl_coef: float
    kl_target: float
    kl_horizon: float


def make_kl_controller(algorithm_config: _KLSettings) -> KLController:
    """The controller named by ``algorithm.kl_type`` (``fixed`` or ``adaptive``)."""
    if algorithm_config.kl_type == "fixed":
        return FixedKLController(algorithm_config.kl_coef)
    if algorithm_config.kl_type == "adaptive":
        return AdaptiveKLController(
            algorithm_config.kl_coef, algorithm_config.kl_target, algorithm_config.kl_horizon
        )
    raise ValueError(f"unknown algorithm.kl_type {algorithm_config.kl_type!r}; choose fixed or adaptive")


def apply_kl_penalty(
    token_rewards: Tensor,
    logp: Tensor,
    ref_logp: Tensor,
    response_mask: Tensor,
    coef: float,
    kind: str,
    process_group: dist.ProcessGroup | None = None,
) -> tuple[Tensor, Tensor]:
    """KL in the reward: ``r_t - coef * kl_t`` on valid tokens (0 elsewhere), and the mean KL.

    ``mean_kl`` is the mean over sequences of each sequence's token-mean KL, over all ranks of
    ``process_group`` (the world when ``torch.distributed`` is initialised), so every rank feeds
    the same number to an adaptive controller. Sequences without valid tokens are not counted.
    """
    mask = response_mask if response_mask.dtype == torch.bool else response_mask != 0
    kl = torch.where(mask, kl_estimate(logp, ref_logp, kind).float(), 0.0)
    penalized = torch.where(mask, token_rewards.float() - coef * kl, 0.0)
    tokens = mask.sum(-1)
    seq_kl = kl.sum(-1) / tokens.clamp(min=1)
    stats = torch.stack([seq_kl.sum().double(), (tokens > 0).sum().double()])
    total, n_seqs = global_sum(stats, process_group).unbind()
    return penalized, (total / n_seqs.clamp(min=1)).float()
