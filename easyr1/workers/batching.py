"""Micro-batches: which rows of a rank's samples go through the model together.

Micro-batches are right-padded to their longest sequence. With EasyR1's ``dynamic_batching``
the rows are sorted by length and cut into runs whose padded size (rows x longest row) stays
within ``micro_batch_size`` x the rank's longest sequence, the budget EasyR1 gives, so short
samples share a pass instead of being padded to a long one. Every rank runs the same number of
micro-batches (FSDP all-gathers in each forward, so a rank with one pass more would wait
forever): the count is the largest any rank needs, and a rank that needs fewer splits its
costliest runs. The loss is divided by the mini-batch's global token count, so how rows are
grouped changes no result beyond float rounding.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist


def fixed(n: int, size: int) -> list[list[int]]:
    """Runs of ``size`` consecutive rows."""
    return [list(range(i, min(n, i + size))) for i in range(0, n, size)]


def _runs(order: list[int], lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Greedy runs over rows sorted longest first: a run grows while rows x its first row's length fits."""
    runs: list[list[int]] = []
    for row in order:
        if runs and (len(runs[-1]) + 1) * lengths[runs[-1][0]] <= budget:
            runs[-1].append(row)
        else:
            runs.append([row])
    return runs


def _exactly(order: list[int], lengths: Sequence[int], count: int) -> list[list[int]]:
    """``count`` runs (1 <= count <= rows) whose costliest padded size is as small as the greedy cut allows."""
    low, high = max(lengths[r] for r in order), len(order) * max(lengths[r] for r in order)
    while low < high:  # the smallest budget whose greedy cut needs at most ``count`` runs
        mid = (low + high) // 2
        if len(_runs(order, lengths, mid)) <= count:
            high = mid
        else:
            low = mid + 1
    runs = _runs(order, lengths, low)
    while len(runs) < count:  # halve the costliest run that has two rows or more
        index = max((i for i, run in enumerate(runs) if len(run) > 1), key=lambda i: (len(runs[i]) * lengths[runs[i][0]], i))
        run = runs.pop(index)
        runs[index:index] = [run[: len(run) // 2], run[len(run) // 2 :]]
    return runs


def micro_batches(lengths: Sequence[int], size: int, *, dynamic: bool) -> list[list[int]]:
    """Row indices of each micro-batch of rows with these sequence ``lengths`` (prompt + response).

    Every rank must call this at the same point with the same number of rows (dynamic batching
    agrees on the count with one all-reduce).
    """
    n = len(lengths)
    if not dynamic or n == 0:
        return fixed(n, size)
    order = sorted(range(n), key=lambda r: (-lengths[r], r))
    count = len(_runs(order, lengths, size * max(lengths)))
    if dist.is_initialized() and dist.get_world_size() > 1:
        agreed = torch.tensor([count], dtype=torch.long)
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
        count = int(agreed)
    if count > n:
        raise ValueError(f"another rank needs {count} micro-batches, more than this rank's {n} rows")
    return _exactly(order, lengths, count)


def sequence_lengths(prompt_ids: Sequence[torch.Tensor], response_ids: Sequence[torch.Tensor]) -> list[int]:
    return [int(p.numel()) + int(r.numel()) for p, r in zip(prompt_ids, response_ids, strict=True)]
