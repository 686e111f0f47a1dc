"""The update loop the actor and the critic share, their common set-up (``TrainedWorker``: the
optimizer, LR schedule, Ulysses group and mini-batch size), and the micro-batching and Ulysses
pooling both their passes use.

The update walks mini-batches of ``global_batch_size`` prompts (times ``n`` samples, split over
the ranks) in micro-batches of ``micro_batch_size_per_device_for_update``, accumulating
gradients, then clips and steps once per mini-batch. The loss of each micro-batch is divided by
the token (or sequence) count of the WHOLE mini-batch across ranks, so the accumulated gradient
is the exact token-mean of the mini-batch however it is split.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from easyr1.distributed import ulysses
from easyr1.experience import Experience, concat
from easyr1.workers.batching import fixed, micro_batches, sequence_lengths
from easyr1.workers.config import ActorConfig, CriticConfig
from easyr1.workers.optim import build_optimizer, build_scheduler


class NonFiniteLoss(RuntimeError):
    """The loss became NaN or inf: the update is stopped before it can corrupt the weights."""


def split(exp: Experience, size: int, dynamic: bool, packed: bool) -> list[list[int]]:
    """``exp``'s micro-batches (``batching.micro_batches``)."""
    return micro_batches(
        sequence_lengths(exp.prompt_ids, exp.response_ids), size, dynamic=dynamic, packed=packed
    )


def pool(
    exp: Experience, shard: ulysses.Shard | None, mini_batch: int | None = None
) -> tuple[Experience, list[int]]:
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
    epochs, micro_batch, max_grad_norm = (
        config.ppo_epochs,
        config.micro_batch_size_per_device_for_update,
        config.max_grad_norm,
    )
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
                    raise NonFiniteLoss(
                        f"step {step}: the {name} loss is {loss.item()} (NaN/inf); stopping the run"
                    )
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


class TrainedWorker(ABC):
    """A sharded model that ``train_epochs`` trains: its optimizer and LR schedule, its Ulysses
    group, and how many samples of a mini-batch each rank holds. The actor and the critic extend
    it with their passes and their ``_micro_loss``."""

    def __init__(
        self,
        model: torch.nn.Module,
        config: ActorConfig | CriticConfig,
        *,
        samples_per_prompt: int,
        total_steps: int,
    ):
        self.model = model
        world = dist.get_world_size() if dist.is_initialized() else 1
        self.mini_batch_per_rank = max(1, config.global_batch_size * samples_per_prompt // world)
        self.shard = ulysses.shard_for(config.ulysses_size)
        params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = build_optimizer(params, config.optim)
        self.scheduler = build_scheduler(self.optimizer, config.optim, total_steps)

    @abstractmethod
    def _micro_loss(
        self, micro: Experience, rows: list[int], totals: Counts
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """One micro-batch's share of the mini-batch loss, and its metrics (``train_epochs``)."""

    def _train(
        self, exp: Experience, config: ActorConfig | CriticConfig, name: str, step: int
    ) -> tuple[Experience, list[int], dict[str, float]]:
        """``train_epochs`` over ``exp`` pooled over the Ulysses group: the pooled samples, which of
        them are this rank's, and the update's metrics."""
        pooled, mine = pool(exp, self.shard, self.mini_batch_per_rank)
        copies = self.shard.size if self.shard is not None else 1
        metrics = train_epochs(
            self.model,
            self.optimizer,
            self.scheduler,
            pooled,
            self._micro_loss,
            config,
            mini_batch=self.mini_batch_per_rank * copies,
            name=name,
            step=step,
            shard=self.shard,
        )
        return pooled, mine, metrics
