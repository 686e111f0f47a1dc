"""Policy and value losses as per-token matrices, and their aggregation.

(Log-probs and entropies come from ``easyr1.workers.logprobs``, which never forms full logits.)

A policy loss is ``fn(old_logp, logp, advantages, response_mask, cfg) -> (loss_mat, metrics)``:
``loss_mat`` is ``[B, T]`` and exactly 0 outside ``response_mask`` (padding never reaches the
loss or its gradient, whatever values it holds); ``metrics`` are scalar tensors, means over the
valid tokens of the inputs. ``cfg`` needs ``clip_ratio_low``, ``clip_ratio_high``,
``clip_ratio_dual``, ``tau_positive``, ``tau_negative`` (an ``ActorConfig`` has them).
All losses report ``ppo_kl``, the mean of ``old_logp - logp`` (the k1 estimate of
KL(old || new)). ``aggregate`` turns a loss matrix into the scalar to back-propagate.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch
from torch import Tensor

_LOG_RATIO_LIMIT = 20.0  # exp(20) ~ 5e8: beyond any useful ratio, and exp stays finite


class PolicyLossConfig(Protocol):
    clip_ratio_low: float
    clip_ratio_high: float
    clip_ratio_dual: float
    tau_positive: float
    tau_negative: float


PolicyLoss = Callable[[Tensor, Tensor, Tensor, Tensor, PolicyLossConfig], tuple[Tensor, dict[str, Tensor]]]


# ---------------------------------------------------------------------------------- aggregation

# EasyR1's ``loss_avg_mode`` names, and veRL's long names.
AGGREGATION_MODES = {
    "token": "token-mean",
    "seq": "seq-mean-token-mean",
    "token-mean": "token-mean",
    "seq-mean-token-mean": "seq-mean-token-mean",
    "seq-mean-token-sum": "seq-mean-token-sum",
    "seq-mean-token-sum-norm": "seq-mean-token-sum-norm",
}


def aggregate(
    loss_mat: Tensor,
    mask: Tensor,
    mode: str,
    global_tokens: float | None = None,
    global_seqs: float | None = None,
    max_len: int | None = None,
) -> Tensor:
    """Reduce a ``[B, T]`` loss matrix to a scalar.

    Modes (``token`` and ``seq`` are EasyR1's names for the first two):

    - ``token-mean``: sum over valid tokens / number of valid tokens (DAPO).
    - ``seq-mean-token-mean``: mean over sequences of each sequence's token mean (GRPO paper).
    - ``seq-mean-token-sum``: mean over sequences of each sequence's token sum.
    - ``seq-mean-token-sum-norm``: mean over sequences of token sum / ``max_len`` (Dr. GRPO's
      constant normaliser; pass ``data.max_response_length``, since a micro-batch may be padded
      shorter; defaults to ``T``).

    Only sequences with at least one valid token count as sequences.

    Gradient-accumulation contract: by default the denominators are local, which gives the
    exact mean only when the whole mini-batch is one micro-batch on one rank. To get the exact
    mini-batch mean, pass ``global_tokens`` (token-mean: the number of valid tokens of the whole
    mini-batch, summed over all its micro-batches and all ranks) or ``global_seqs`` (the seq-*
    modes: the number of sequences with a valid token, counted the same way). Each micro-batch
    then returns its *sum* divided by that global count, so the gradients summed over the
    micro-batches and ranks equal the gradient of the global mean. FSDP/DDP *average* gradients
    over the data-parallel ranks, so the caller multiplies the returned loss by the world size
    (data-parallel size) before ``backward``.
    """
    try:
        mode = AGGREGATION_MODES[mode]
    except KeyError:
        choices = sorted(AGGREGATION_MODES)
        raise ValueError(f"unknown loss aggregation mode {mode!r}; choose one of {choices}") from None
    valid = mask if mask.dtype == torch.bool else mask != 0
    masked = torch.where(valid, loss_mat, 0.0)
    if mode == "token-mean":
        denominator = global_tokens if global_tokens is not None else valid.sum().clamp(min=1)
        return masked.sum() / denominator
    tokens = valid.sum(-1)
    seq_sums = masked.sum(-1)
    if mode == "seq-mean-token-mean":
        per_seq = seq_sums / tokens.clamp(min=1)
    elif mode == "seq-mean-token-sum":
        per_seq = seq_sums
    else:
        per_seq = seq_sums / (max_len if max_len is not None else loss_mat.shape[-1])
    denominator = global_seqs if global_seqs is not None else (tokens > 0).sum().clamp(min=1)
    return per_seq.sum() / denominator


# ---------------------------------------------------------------------------------- helpers


def _valid(mask: Tensor) -> Tensor:
    return mask if mask.dtype == torch.bool else mask != 0


def _masked_mean(values: Tensor, valid: Tensor) -> Tensor:
    return torch.where(valid, values.float(), 0.0).sum() / valid.sum().clamp(min=1)


def _prepare(
    old_logp: Tensor, logp: Tensor, advantages: Tensor, response_mask: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Zero the padded positions of every input first: NaN/inf there would otherwise leak into
    gradients through ``0 * inf``, even when the output is masked afterwards."""
    valid = _valid(response_mask)
    return (
        torch.where(valid, old_logp, 0.0),
        torch.where(valid, logp, 0.0),
        torch.where(valid, advantages, 0.0),
        valid,
    )


def _clipped_surrogate(
    ratio: Tensor, advantages: Tensor, low: float, high: float, valid: Tensor
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO's pessimistic surrogate ``max(-A r, -A clip(r, 1-low, 1+high))`` and clip fractions.

    The clip binds (the clipped branch is strictly larger) when A > 0 and r > 1 + high, or when
    A < 0 and r < 1 - low: these are ``pg_clipfrac_higher`` and ``pg_clipfrac_lower``.
    """
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - low, 1.0 + high)
    loss = torch.maximum(unclipped, clipped)
    binds = clipped > unclipped
    metrics = {
        "pg_clipfrac_higher": _masked_mean(binds & (advantages > 0), valid),
        "pg_clipfrac_lower": _masked_mean(binds & (advantages < 0), valid),
    }
    return loss, metrics


def _sequence_log_ratio(log_ratio: Tensor, valid: Tensor) -> Tensor:
    """Mean of the token log-ratios of each sequence ``[B, 1]`` (GSPO's length-normalised ratio)."""
    return (log_ratio.sum(-1) / valid.sum(-1).clamp(min=1)).unsqueeze(-1)


# ---------------------------------------------------------------------------------- policy losses


def ppo_clip_loss(
    old_logp: Tensor, logp: Tensor, advantages: Tensor, response_mask: Tensor, cfg: PolicyLossConfig
) -> tuple[Tensor, dict[str, Tensor]]:
    """``default``: PPO clip with asymmetric bounds and dual clip, per token.

    ``r = exp(logp - old_logp)`` is clipped to ``[1 - clip_ratio_low, 1 + clip_ratio_high]`` (a
    larger high bound is DAPO's clip-higher). Dual clip (Ye et al. 2020): for A < 0 the loss is
    capped at ``clip_ratio_dual * |A|``, so a token whose ratio exploded cannot dominate.
    """
    old_logp, logp, advantages, valid = _prepare(old_logp, logp, advantages, response_mask)
    log_ratio = (logp - old_logp).clamp(-_LOG_RATIO_LIMIT, _LOG_RATIO_LIMIT)
    ratio = log_ratio.exp()
    loss, metrics = _clipped_surrogate(ratio, advantages, cfg.clip_ratio_low, cfg.clip_ratio_high, valid)
    cap = -advantages * cfg.clip_ratio_dual
    dual = (advantages < 0) & (loss > cap)
    loss = torch.where(dual, cap, loss)
    metrics["pg_clipfrac_dual"] = _masked_mean(dual, valid)
    metrics["ppo_kl"] = _masked_mean(-log_ratio.detach(), valid)
    return torch.where(valid, loss, 0.0), metrics


def gspo_loss(
    old_logp: Tensor, logp: Tensor, advantages: Tensor, response_mask: Tensor, cfg: PolicyLossConfig
) -> tuple[Tensor, dict[str, Tensor]]:
    """``gspo`` (Zheng et al. 2025, "Group Sequence Policy Optimization").

    One ratio per sequence, ``s = exp(mean_t(logp_t - old_logp_t))``, clipped to
    ``[1 - clip_ratio_low, 1 + clip_ratio_high]`` and applied to every token, so a sequence is
    kept or clipped as a whole. Each token's loss depends on all tokens of its sequence.
    """
    old_logp, logp, advantages, valid = _prepare(old_logp, logp, advantages, response_mask)
    seq_log_ratio = _sequence_log_ratio(logp - old_logp, valid).clamp(-_LOG_RATIO_LIMIT, _LOG_RATIO_LIMIT)
    ratio = seq_log_ratio.exp().expand_as(logp)
    loss, metrics = _clipped_surrogate(ratio, advantages, cfg.clip_ratio_low, cfg.clip_ratio_high, valid)
    metrics["ppo_kl"] = _masked_mean((old_logp - logp).detach(), valid)
    return torch.where(valid, loss, 0.0), metrics


def gspo_token_loss(
    old_logp: Tensor, logp: Tensor, advantages: Tensor, response_mask: Tensor, cfg: PolicyLossConfig
) -> tuple[Tensor, dict[str, Tensor]]:
    """``gspo_token``: GSPO-token, for advantages that vary along a sequence.

    ``r_t = sg[s] * exp(logp_t - sg[logp_t])``: the value equals the sequence ratio ``s`` of
    ``gspo`` (so clipping still acts per sequence), but the gradient of token t's loss flows only
    through ``logp_t``, weighted by its own advantage.
    """
    old_logp, logp, advantages, valid = _prepare(old_logp, logp, advantages, response_mask)
    seq_log_ratio = _sequence_log_ratio(logp - old_logp, valid).clamp(-_LOG_RATIO_LIMIT, _LOG_RATIO_LIMIT)
    ratio = (seq_log_ratio.detach() + logp - logp.detach()).exp()
    loss, metrics = _clipped_surrogate(ratio, advantages, cfg.clip_ratio_low, cfg.clip_ratio_high, valid)
    metrics["ppo_kl"] = _masked_mean((old_logp - logp).detach(), valid)
    return torch.where(valid, loss, 0.0), metrics


def cispo_loss(
    old_logp: Tensor, logp: Tensor, advantages: Tensor, response_mask: Tensor, cfg: PolicyLossConfig
) -> tuple[Tensor, dict[str, Tensor]]:
    """``cispo`` (MiniMax-M1, 2025): clip the importance weight, never the gradient.

    ``loss_t = -sg[min(r_t, 1 + clip_ratio_high)] * A_t * logp_t``. As in MiniMax-M1 the weight
    is bounded above only (their lower bound is set out of reach; ``clip_ratio_low`` is not
    used), and since the weight carries no gradient every token, clipped or not, still
    contributes ``-w_t * A_t * grad(logp_t)``.
    """
    old_logp, logp, advantages, valid = _prepare(old_logp, logp, advantages, response_mask)
    log_ratio = (logp - old_logp).detach().clamp(-_LOG_RATIO_LIMIT, _LOG_RATIO_LIMIT)
    ratio = log_ratio.exp()
    weight = ratio.clamp(max=1.0 + cfg.clip_ratio_high)
    loss = -weight * advantages * logp
    metrics = {
        "pg_clipfrac_higher": _masked_mean(ratio > 1.0 + cfg.clip_ratio_high, valid),
        "ppo_kl": _masked_mean(-log_ratio, valid),
    }
    return torch.where(valid, loss, 0.0), metrics


def sapo_loss(
    old_logp: Tensor, logp: Tensor, advantages: Tensor, response_mask: Tensor, cfg: PolicyLossConfig
) -> tuple[Tensor, dict[str, Tensor]]:
    """``sapo``: Soft Adaptive Policy Optimization (Gao et al. 2025, arXiv:2511.20347).

    A smooth gate replaces the hard clip: ``loss_t = -f(r_t) * A_t`` with token ratio ``r_t`` and
    ``f(r) = (4 / tau) * sigmoid(tau * (r - 1))``, ``tau = tau_positive`` where A > 0 and
    ``tau_negative`` otherwise. Its gradient is ``-4 s (1 - s) * r * A * grad(logp)`` with
    ``s = sigmoid(tau (r - 1))``: exactly the plain policy gradient at r = 1, fading smoothly as
    the ratio leaves 1 (faster for the larger tau). ``pg_gate_weight`` reports the mean of
    ``4 s (1 - s)``.
    """
    old_logp, logp, advantages, valid = _prepare(old_logp, logp, advantages, response_mask)
    log_ratio = (logp - old_logp).clamp(-_LOG_RATIO_LIMIT, _LOG_RATIO_LIMIT)
    tau = torch.where(advantages > 0, cfg.tau_positive, cfg.tau_negative).to(logp.dtype)
    gate = torch.sigmoid(tau * (log_ratio.exp() - 1.0))
    loss = -(4.0 / tau) * gate * advantages
    gate = gate.detach()
    metrics = {
        "pg_gate_weight": _masked_mean(4.0 * gate * (1.0 - gate), valid),
        "ppo_kl": _masked_mean(-log_ratio.detach(), valid),
    }
    return torch.where(valid, loss, 0.0), metrics


POLICY_LOSSES: dict[str, PolicyLoss] = {
    "default": ppo_clip_loss,
    "gspo": gspo_loss,
    "gspo_token": gspo_token_loss,
    "cispo": cispo_loss,
    "sapo": sapo_loss,
}


# ---------------------------------------------------------------------------------- value loss


def value_loss(
    values: Tensor, old_values: Tensor, returns: Tensor, response_mask: Tensor, cliprange_value: float
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped value loss ``0.5 * max((v - R)^2, (v_clip - R)^2)``, with
    ``v_clip = old_v + clip(v - old_v, -cliprange_value, cliprange_value)``.

    ``vf_clipfrac`` is the fraction of valid tokens where the clipped term is the larger one.
    """
    valid = _valid(response_mask)
    values = torch.where(valid, values, 0.0)
    old_values = torch.where(valid, old_values, 0.0)
    returns = torch.where(valid, returns, 0.0)
    clipped_values = old_values + (values - old_values).clamp(-cliprange_value, cliprange_value)
    unclipped_err = (values - returns).square()
    clipped_err = (clipped_values - returns).square()
    loss = 0.5 * torch.maximum(unclipped_err, clipped_err)
    metrics = {"vf_clipfrac": _masked_mean(clipped_err > unclipped_err, valid)}
    return torch.where(valid, loss, 0.0), metrics
