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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

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


def slice_inputs(module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
    """Forward pre-hook of the language model: keep this rank's slice of the row (token ids or
    embeddings, rotary positions, Qwen3-VL's deepstack features)."""
    shard: Shard | None = kwargs.get("packed_shard")
    if shard is None:
        return args, kwargs
    if args:  # the token-classification (critic) classes pass the ids by position
        (kwargs["input_ids"],), args = args, ()
    tokens = kwargs["inputs_embeds"] if kwargs.get("inputs_embeds") is not None else kwargs["input_ids"]
    start, end = shard.bounds(tokens.shape[1])
    visual = kwargs.get("visual_pos_masks")
    if kwargs.get("deepstack_visual_embeds") is not None:  # one row per visual token of the row
        first, last = int(visual[:, :start].sum()), int(visual[:, :end].sum())
        kwargs["deepstack_visual_embeds"] = [embeds[first:last] for embeds in kwargs["deepstack_visual_embeds"]]
    for name in ("input_ids", "inputs_embeds", "visual_pos_masks"):
        if kwargs.get(name) is not None:
            kwargs[name] = kwargs[name][:, start:end]
    kwargs["position_ids"] = kwargs["position_ids"][..., start:end]
    return args, kwargs


def language_model(model: torch.nn.Module) -> torch.nn.Module:
    """The decoder stack whose inputs ``slice_inputs`` cuts (a Qwen-VL model's text model)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    inner = base.model
    return getattr(inner, "language_model", inner)


def enable(model: torch.nn.Module, size: int) -> None:
    """Let ``model`` run rows split over groups of ``size`` ranks (call before sharding)."""
    text = getattr(model.config, "text_config", None) or model.config
    if text.num_attention_heads % size:
        raise ValueError(f"the model's {text.num_attention_heads} attention heads do not split over {size} ranks")
    language_model(model).register_forward_pre_hook(slice_inputs, with_kwargs=True)


def pad_to(length: int, shard: Shard) -> int:
    return -length % shard.size


def pool(items: Sequence[Any], shard: Shard) -> list[Any]:
    """Every rank's ``items`` of the group, in rank order."""
    out: list[Any] = [None] * shard.size
    dist.all_gather_object(out, list(items), group=shard.group)
    return [item for part in out for item in part]
