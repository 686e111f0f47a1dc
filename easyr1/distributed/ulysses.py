"""Ulysses sequence parallelism (``worker.{actor,critic}.ulysses_size``): long sequences split
across a group of ranks.

The ranks of a group (``ulysses_size`` consecutive ranks) pool their samples and run each packed
micro-batch together: every rank embeds the whole row (for Qwen-VL, the vision tower encodes every
image of it), then the language model's blocks see only the rank's ``1/size`` slice of the row.
Around attention, an all-to-all trades the sequence split for a head split, so each rank attends
over the whole row for ``heads/size`` heads, and a second all-to-all trades back. Outputs at the
response positions are summed over the group (each position lives on exactly one rank), so every
rank of the group computes the same loss; the backward pass then sends each rank the gradient of
its own slice only, and the sum of the group's gradients is the gradient of the one sequence-long
computation. Activation memory per rank falls by ``size``; the weights stay sharded by FSDP as
before.

Only packed rows are split (``padding_free`` must be on), so the row is padded at its end to a
multiple of ``size`` by one extra sequence of pad tokens that attends to itself only.

This module holds the groups and the collectives; the pre-hook that slices a row on its way into
the language model is ``easyr1.models.ulysses``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

_GROUPS: dict[int, Any] = {}


@dataclass(frozen=True)
class Shard:
    """This rank's place in its sequence-parallel group."""

    group: Any  # the ProcessGroup
    rank: int
    size: int

    def bounds(self, length: int) -> tuple[int, int]:
        """The slice of a row of ``length`` tokens (a multiple of ``size``) this rank keeps."""
        part = length // self.size
        return self.rank * part, (self.rank + 1) * part


def shard_for(size: int) -> Shard | None:
    """This rank's group of ``size`` consecutive ranks (created once, collectively, on first use;
    every rank must call it), or None for ``size`` 1."""
    if size == 1:
        return None
    world, rank = dist.get_world_size(), dist.get_rank()
    if world % size:
        raise ValueError(f"ulysses_size={size} must divide the {world} ranks")
    if size not in _GROUPS:
        groups = [dist.new_group(list(range(start, start + size))) for start in range(0, world, size)]
        _GROUPS[size] = groups[rank // size]
    return Shard(_GROUPS[size], rank % size, size)


class _AllToAll(torch.autograd.Function):
    """``[1, H, S/n, D]`` (sequence split) <-> ``[1, H/n, S, D]`` (head split) over the group."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, shard: Shard, to_heads: bool) -> Tensor:
        ctx.shard, ctx.to_heads = shard, to_heads
        return _exchange(x, shard, to_heads)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        return _exchange(grad.contiguous(), ctx.shard, not ctx.to_heads), None, None


def _exchange(x: Tensor, shard: Shard, to_heads: bool) -> Tensor:
    n = shard.size
    if to_heads:  # [1, H, s, D] -> [1, H/n, n*s, D]: head chunk j goes to rank j
        _, heads, seq, dim = x.shape
        send = x.reshape(n, heads // n, seq, dim).contiguous()
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=shard.group)  # recv[j]: rank j's sequence part
        return recv.permute(1, 0, 2, 3).reshape(1, heads // n, n * seq, dim)
    _, heads, seq, dim = x.shape  # [1, H/n, S, D] -> [1, H, S/n, D]: sequence part j goes to rank j
    send = x.reshape(heads, n, seq // n, dim).permute(1, 0, 2, 3).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=shard.group)  # recv[j]: rank j's heads
    return recv.reshape(1, n * heads, seq // n, dim)


def heads_to_sequence(x: Tensor, shard: Shard) -> Tensor:
    """A rank's slice of the sequence for all heads -> the whole sequence for its heads."""
    return _AllToAll.apply(x, shard, True)


def sequence_to_heads(x: Tensor, shard: Shard) -> Tensor:
    return _AllToAll.apply(x, shard, False)


class _SumOverGroup(torch.autograd.Function):
    """Forward: the sum over the group. Backward: the gradient unchanged, since every rank of the
    group computes the same loss from the sum and each rank's part feeds it once."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, shard: Shard) -> Tensor:
        out = x.clone()
        dist.all_reduce(out, group=shard.group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return grad, None


def owned(positions: Tensor, shard: Shard, length: int) -> tuple[Tensor, Tensor]:
    """Of ``[N]`` row positions, which lie in this rank's slice, and their indices within it."""
    start, end = shard.bounds(length)
    mine = (positions >= start) & (positions < end)
    return mine, positions[mine] - start


def gather_outputs(local: Tensor, mine: Tensor, shard: Shard) -> Tensor:
    """``[n_mine, ...]`` outputs of this rank's positions -> ``[N, ...]`` outputs of all, on every rank."""
    full = local.new_zeros((mine.numel(),) + local.shape[1:])
    full = full.index_put((mine,), local)
    return _SumOverGroup.apply(full, shard)


def pad_to(length: int, shard: Shard) -> int:
    return -length % shard.size


def pool(items: Sequence[Any], shard: Shard) -> list[Any]:
    """Every rank's ``items`` of the group, in rank order."""
    out: list[Any] = [None] * shard.size
    dist.all_gather_object(out, list(items), group=shard.group)
    return [item for part in out for item in part]
