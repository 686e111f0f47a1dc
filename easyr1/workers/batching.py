"""Micro-batches: which rows of a rank's samples go through the model together.

Micro-batches are right-padded to their longest sequence, or packed into one row (padding-free).
With EasyR1's ``dynamic_batching`` the rows are sorted by length and cut into runs whose size stays
within ``micro_batch_size`` x the rank's longest sequence, the budget EasyR1 gives, so short
samples share a pass: a padded run's size is rows x its longest row, a packed run's the sum of
its rows' lengths (real tokens only). Every rank runs the same number of
micro-batches (FSDP all-gathers in each forward, so a rank with one pass more would wait
forever): the count is the largest any rank needs, and a rank that needs fewer splits its
costliest runs. The loss is divided by the mini-batch's global token count, so how rows are
grouped changes no result beyond float rounding.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist


def fixed(n: int, size: int) -> list[list[int]]:
    """Runs of ``size`` consecutive rows."""
    return [list(range(i, min(n, i + size))) for i in range(0, n, size)]


def _cost(run: list[int], lengths: Sequence[int], packed: bool) -> int:
    """Tokens a run puts through the model (its rows are sorted longest first)."""
    return sum(lengths[r] for r in run) if packed else len(run) * lengths[run[0]]


def _runs(order: list[int], lengths: Sequence[int], budget: int, packed: bool) -> list[list[int]]:
    """Greedy runs over rows sorted longest first: a run grows while its cost fits the budget."""
    runs: list[list[int]] = []
    for row in order:
        if runs and _cost(runs[-1] + [row], lengths, packed) <= budget:
            runs[-1].append(row)
        else:
            runs.append([row])
    return runs


def _exactly(order: list[int], lengths: Sequence[int], count: int, packed: bool) -> list[list[int]]:
    """``count`` runs (1 <= count <= rows) whose costliest is as small as the greedy cut allows."""
    low, high = max(lengths[r] for r in order), len(order) * max(lengths[r] for r in order)
    while low < high:  # the smallest budget whose greedy cut needs at most ``count`` runs
        mid = (low + high) // 2
        if len(_runs(order, lengths, mid, packed)) <= count:
            high = mid
        else:
            low = mid + 1
    runs = _runs(order, lengths, low, packed)
    while len(runs) < count:  # halve the costliest run that has two rows or more
        index = max(
            (i for i, run in enumerate(runs) if len(run) > 1),
            key=lambda i: (_cost(runs[i], lengths, packed), i),
        )
        run = runs.pop(index)
        runs[index:index] = [run[: len(run) // 2], run[len(run) // 2 :]]
    return runs


def micro_batches(
    lengths: Sequence[int], size: int, *, dynamic: bool, packed: bool = False
) -> list[list[int]]:
    """Row indices of each micro-batch of rows with these sequence ``lengths`` (prompt + response);
    ``packed``: the micro-batches are packed rows, whose cost is their real tokens.

    Every rank must call this at the same point with the same number of rows (dynamic batching
    agrees on the count with one all-reduce).
    """
    n = len(lengths)
    if not dynamic or n == 0:
        return fixed(n, size)
    order = sorted(range(n), key=lambda r: (-lengths[r], r))
    count = len(_runs(order, lengths, size * max(lengths), packed))
    if dist.is_initialized() and dist.get_world_size() > 1:
        agreed = torch.tensor([count], dtype=torch.long)
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
        count = int(agreed)
    if count > n:
        raise ValueError(f"another rank needs {count} micro-batches, more than this rank's {n} rows")
    return _exactly(order, lengths, count, packed)


def sequence_lengths(prompt_ids: Sequence[torch.Tensor], response_ids: Sequence[torch.Tensor]) -> list[int]:
    return [int(p.numel()) + int(r.numel()) for p, r in zip(prompt_ids, response_ids, strict=True)]
