"""The actor (and the frozen reference): log-probs of responses, and the policy update.

``train_epochs`` is the update loop the actor and the critic share.

The update walks mini-batches of ``global_batch_size`` prompts (times ``n`` samples, split over
the ranks) in micro-batches of ``micro_batch_size_per_device_for_update``, accumulating
gradients, then clips and steps once per mini-batch. The loss of each micro-batch is divided by
the token (or sequence) count of the WHOLE mini-batch across ranks, so the accumulated gradient
is the exact token-mean of the mini-batch however it is split.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist

from easyr1.algorithms.kl import kl_estimate
from easyr1.algorithms.losses import POLICY_LOSSES, aggregate
from easyr1.config import ActorConfig, AlgorithmConfig, CriticConfig
from easyr1.experience import Experience, concat
from easyr1.models.lora import reference_mode
from easyr1.workers import ulysses
from easyr1.workers.batching import fixed, micro_batches, sequence_lengths
from easyr1.workers.logprobs import token_logprobs
from easyr1.workers.optim import build_optimizer, build_scheduler


class NonFiniteLoss(RuntimeError):
    """The loss became NaN or inf: the update is stopped before it can corrupt the weights."""


def split(exp: Experience, size: int, dynamic: bool, packed: bool) -> list[list[int]]:
    """``exp``'s micro-batches (``batching.micro_batches``)."""
    return micro_batches(sequence_lengths(exp.prompt_ids, exp.response_ids), size, dynamic=dynamic, packed=packed)


@torch.no_grad()
def compute_log_probs(
    model: torch.nn.Module,
    exp: Experience,
    *,
    micro_batch_size: int,
    dynamic_batching: bool,
    padding_free: bool,
    temperature: float,
    pad_id: int,
    device: torch.device,
    shard: ulysses.Shard | None = None,
) -> torch.Tensor:
    """[B, R] log-probs of the sampled response tokens under ``model`` (zeros on padding); with a
    Ulysses ``shard``, computed over the group's pooled samples."""
    model.eval()
    pooled, mine = pool(exp, shard)
    out = torch.zeros(pooled.response_mask.shape, dtype=torch.float32)
    for rows in split(pooled, micro_batch_size, dynamic_batching, padding_free):
        micro = pooled.select(rows)
        logp, _ = token_logprobs(
            model, micro, temperature=temperature, pad_id=pad_id, device=device, packed=padding_free, shard=shard
        )
        out[rows] = logp.cpu() * micro.response_mask
    return out[mine, : exp.response_mask.shape[1]]


def pool(exp: Experience, shard: ulysses.Shard | None, mini_batch: int | None = None) -> tuple[Experience, list[int]]:
    """The samples of ``exp``'s Ulysses group (every rank of it gets the same), and which rows of
    them are this rank's; without a group, ``exp`` itself. With ``mini_batch`` (rows per rank), the
    pooled rows come in runs of every rank's i-th mini-batch, so that the group's i-th mini-batch is
    the union of theirs, as under data parallelism."""
    if shard is None:
        return exp, list(range(len(exp)))
    parts = ulysses.pool([exp], shard)
    offsets = [sum(len(part) for part in parts[:r]) for r in range(len(parts))]
    chunk = mini_batch or max(len(part) for part in parts)
    order = [
        (r, i)
        for start in range(0, max(len(part) for part in parts), chunk)
        for r, part in enumerate(parts)
        for i in range(start, min(start + chunk, len(part)))
    ]
    pooled = concat(parts).select([offsets[r] + i for r, i in order])
    return pooled, [k for k, (r, _) in enumerate(order) if r == shard.rank]


@dataclass
class Counts:
    """Valid tokens and sequences of a whole mini-batch, over all ranks: the loss denominators."""

    tokens: float
    seqs: float


def global_counts(exp: Experience, copies: int = 1) -> Counts:
    """``copies``: how many ranks hold each sample (a Ulysses group's size)."""
    counts = torch.tensor([exp.response_mask.sum().item(), float(len(exp))], dtype=torch.float64)
    if dist.is_initialized():
        dist.all_reduce(counts)
    return Counts(tokens=float(counts[0]) / copies, seqs=float(counts[1]) / copies)


def train_epochs(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    exp: Experience,
    micro_loss: Callable[[Experience, list[int], Counts], tuple[torch.Tensor, dict[str, Any]]],
    config: ActorConfig | CriticConfig,
    *,
    mini_batch: int,
    name: str,
    step: int,
    shard: ulysses.Shard | None = None,
) -> dict[str, float]:
    """``config.ppo_epochs`` passes over ``exp`` in mini-batches of ``mini_batch`` rows, accumulating
    the gradients of micro-batches (``config.micro_batch_size_per_device_for_update`` rows, or a
    token budget under ``config.dynamic_batching``), then clipping (``config.max_grad_norm``) and
    stepping once per mini-batch; the LR schedule steps once.

    With a Ulysses ``shard``, ``exp`` and ``mini_batch`` are the group's, which every rank of it
    holds. ``micro_loss(micro, rows, counts)`` returns the micro-batch's share of the mini-batch loss
    (divided by the mini-batch's global ``counts``) and its metrics, already prefixed with
    ``name/``; ``rows`` are the micro-batch's rows within its mini-batch.
    Returns the mean of each metric over micro-batches, plus ``name/grad_norm`` and ``name/lr``
    (the rate this update used).
    """
    epochs, micro_batch, max_grad_norm = config.ppo_epochs, config.micro_batch_size_per_device_for_update, config.max_grad_norm
    lr = optimizer.param_groups[0]["lr"]
    world = dist.get_world_size() if dist.is_initialized() else 1
    model.train()
    sums: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for _ in range(epochs):
        for mini_rows in fixed(len(exp), mini_batch):
            mini = exp.select(mini_rows)
            totals = global_counts(mini, shard.size if shard is not None else 1)
            for micro_rows in split(mini, micro_batch, config.dynamic_batching, config.padding_free):
                loss, metrics = micro_loss(mini.select(micro_rows), micro_rows, totals)
                if not torch.isfinite(loss):
                    raise NonFiniteLoss(f"step {step}: the {name} loss is {loss.item()} (NaN/inf); stopping the run")
                (loss * world).backward()  # FSDP averages gradients over ranks; the loss is already global
                for key, value in metrics.items():
                    sums[key] += float(value)
                    counts[key] += 1
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
            grad_norm = float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)
            if not math.isfinite(grad_norm):
                raise NonFiniteLoss(f"step {step}: the {name} gradient norm is {grad_norm}; stopping the run")
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            sums[f"{name}/grad_norm"] += grad_norm
            counts[f"{name}/grad_norm"] += 1
    scheduler.step()
    return {**{key: sums[key] / counts[key] for key in sums}, f"{name}/lr": lr}


class Actor:
    """Owns the sharded policy, its optimizer and LR schedule."""

    def __init__(
        self,
        model: torch.nn.Module,
        config: ActorConfig,
        algorithm: AlgorithmConfig,
        *,
        samples_per_prompt: int,
        max_response_length: int,
        temperature: float,
        pad_id: int,
        total_steps: int,
        device: torch.device,
    ):
        self.model, self.config, self.algorithm = model, config, algorithm
        self.temperature, self.pad_id, self.device = temperature, pad_id, device
        self.max_response_length = max_response_length
        world = dist.get_world_size() if dist.is_initialized() else 1
        self.mini_batch_per_rank = max(1, config.global_batch_size * samples_per_prompt // world)
        self.shard = ulysses.shard_for(config.ulysses_size)
        params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = build_optimizer(params, config.optim)
        self.scheduler = build_scheduler(self.optimizer, config.optim, total_steps)
        self.policy_loss: Callable[..., Any] = POLICY_LOSSES[config.loss_type]
        # On-policy updates: (rows, log-probs) of their forward passes.
        self._fresh_logp: list[tuple[list[int], torch.Tensor]] = []

    def log_probs(self, exp: Experience) -> torch.Tensor:
        return self._log_probs(self.model, exp)

    def ref_log_probs(self, exp: Experience, ref_model: torch.nn.Module | None) -> torch.Tensor:
        """The reference policy's log-probs: ``ref_model``'s, or without one this LoRA actor's with
        its adapters off."""
        if ref_model is not None:
            return self._log_probs(ref_model, exp)
        with reference_mode(self.model):
            return self._log_probs(self.model, exp)

    def _log_probs(self, model: torch.nn.Module, exp: Experience) -> torch.Tensor:
        """[B, R] log-probs under ``model``: the actor, or the reference, which follows the actor's
        micro-batching (as in EasyR1)."""
        return compute_log_probs(
            model,
            exp,
            micro_batch_size=self.config.micro_batch_size_per_device_for_experience,
            dynamic_batching=self.config.dynamic_batching,
            padding_free=self.config.padding_free,
            temperature=self.temperature,
            pad_id=self.pad_id,
            device=self.device,
            shard=self.shard,
        )

    def _aggregate(self, loss_mat: torch.Tensor, mask: torch.Tensor, totals: Counts | None = None) -> torch.Tensor:
        """The configured aggregation: over the whole mini-batch given its ``totals``, else over ``mask``."""
        if totals is None:
            return aggregate(loss_mat, mask, self.config.loss_avg_mode, max_len=self.max_response_length)
        return aggregate(
            loss_mat, mask, self.config.loss_avg_mode, global_tokens=totals.tokens, global_seqs=totals.seqs,
            max_len=self.max_response_length,
        )

    def _micro_loss(self, micro: Experience, rows: list[int], totals: Counts) -> tuple[torch.Tensor, dict[str, Any]]:
        """Policy loss [+ KL loss] [- entropy bonus] of one micro-batch, as a share of the mini-batch's."""
        use_kl = self.algorithm.use_kl_loss and not self.algorithm.disable_kl and micro.ref_logp is not None
        mask = micro.response_mask.to(self.device)
        logp, entropy = token_logprobs(
            self.model, micro, temperature=self.temperature, pad_id=self.pad_id, device=self.device,
            packed=self.config.padding_free, shard=self.shard,
        )
        if micro.old_logp is None:  # on-policy: the policy has not moved yet, so old == current
            self._fresh_logp.append((rows, logp.detach().cpu() * micro.response_mask))
            old_logp = logp.detach()
        else:
            old_logp = micro.old_logp.to(self.device)
        loss_mat, metrics = self.policy_loss(old_logp, logp, micro.advantages.to(self.device), mask, self.config)
        loss = self._aggregate(loss_mat, mask, totals)
        metrics = {f"actor/{k}": v for k, v in metrics.items()}
        metrics["actor/pg_loss"] = self._aggregate(loss_mat.detach(), mask)
        if use_kl:
            kl_mat = kl_estimate(logp, micro.ref_logp.to(self.device), self.algorithm.kl_penalty)
            loss = loss + self.algorithm.kl_coef * self._aggregate(kl_mat, mask, totals)
            metrics["actor/kl_loss"] = self._aggregate(kl_mat.detach(), mask)
        if self.config.entropy_coeff != 0.0:
            # The bonus rewards spread-out next-token distributions, aggregated like the policy loss.
            loss = loss - self.config.entropy_coeff * self._aggregate(entropy, mask, totals)
        entropy = entropy.detach()
        metrics["actor/entropy"] = (entropy * mask).sum() / mask.sum().clamp(min=1)
        return loss, metrics

    def on_policy(self, rows: int) -> bool:
        """Whether an update of ``rows`` samples per rank is one optimizer step in one epoch: then
        every micro-batch sees the weights that sampled it, and the old log-probs can come from
        the update's own forward pass instead of a separate pass (as TRL and veRL do)."""
        return self.config.ppo_epochs == 1 and rows <= self.mini_batch_per_rank

    def update(self, exp: Experience, step: int) -> dict[str, float]:
        """PPO epochs over mini-batches; returns the mean of each metric over micro-batches.

        Without ``exp.old_logp`` the update must be ``on_policy``; it then fills ``exp.old_logp``
        with the log-probs of its own forward pass (before any weight changed).
        """
        assert exp.advantages is not None
        fresh = exp.old_logp is None
        if fresh and not self.on_policy(len(exp)):
            raise ValueError("an update without old log-probs must be on-policy (one epoch, one mini-batch)")
        self._fresh_logp = []
        pooled, mine = pool(exp, self.shard, self.mini_batch_per_rank)
        copies = self.shard.size if self.shard is not None else 1
        metrics = train_epochs(
            self.model, self.optimizer, self.scheduler, pooled, self._micro_loss, self.config,
            mini_batch=self.mini_batch_per_rank * copies, name="actor", step=step, shard=self.shard,
        )
        if fresh:  # one epoch of one mini-batch: its rows are the pooled samples'
            old_logp = torch.zeros(pooled.response_mask.shape, dtype=torch.float32)
            for rows, logp in self._fresh_logp:
                old_logp[rows, : logp.shape[1]] = logp
            exp.old_logp = old_logp[mine, : exp.response_mask.shape[1]]
        return metrics
