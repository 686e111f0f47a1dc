"""Micro-batches: fixed runs, and EasyR1's dynamic batching (rows sorted by length under a token
budget, the same count on every rank), which changes no result of an update."""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from easyr1.distributed.ports import free_port
from easyr1.experience import Experience
from easyr1.workers.batching import fixed, micro_batches
from easyr1.workers.config import ActorConfig, FSDPConfig
from tests.trainer_utils import sharded_actor


def _padded(batches: list[list[int]], lengths: list[int]) -> int:
    return sum(len(rows) * max(lengths[r] for r in rows) for rows in batches)


def test_fixed_runs_in_order() -> None:
    assert micro_batches([5, 1, 9, 2, 2], 2, dynamic=False) == fixed(5, 2) == [[0, 1], [2, 3], [4]]


def test_dynamic_batches_cover_every_row_within_the_budget_in_fewer_passes() -> None:
    rng = random.Random(0)
    for _ in range(50):
        lengths = [
            rng.choice([rng.randint(10, 40), rng.randint(200, 800)]) for _ in range(rng.randint(1, 40))
        ]
        size = rng.randint(1, 8)
        batches = micro_batches(lengths, size, dynamic=True)
        assert sorted(r for rows in batches for r in rows) == list(range(len(lengths)))
        assert all(rows for rows in batches)
        budget = size * max(lengths)
        assert all(len(rows) * max(lengths[r] for r in rows) <= budget for rows in batches)
        assert len(batches) <= len(fixed(len(lengths), size))


def test_short_rows_share_a_pass() -> None:
    # Two long rows and six short ones with a budget of two long rows: 2 passes, not 4.
    lengths = [500, 20, 20, 500, 20, 20, 20, 20]
    batches = micro_batches(lengths, 2, dynamic=True)
    assert len(batches) == 2 and sorted(map(sorted, batches)) == [[0, 3], [1, 2, 4, 5, 6, 7]]
    assert _padded(batches, lengths) == 1120 < _padded(fixed(8, 2), lengths) == 2080


def _rank_counts(rank: int, port: int, out: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        # Rank 0: uniform long rows (4 passes of 2); rank 1: one long row, the rest short (2 passes alone).
        lengths = [400] * 8 if rank == 0 else [400] + [30] * 7
        batches = micro_batches(lengths, 2, dynamic=True)
        out[rank] = (len(batches), sorted(r for rows in batches for r in rows))
    finally:
        dist.destroy_process_group()


def test_every_rank_runs_the_same_number_of_micro_batches() -> None:
    out = mp.Manager().dict()
    mp.spawn(_rank_counts, args=(free_port(), out), nprocs=2)
    assert out[0] == out[1] == (4, list(range(8)))


def test_dynamic_batching_leaves_the_update_unchanged(
    tiny_model: Callable[[str], Path], one_rank: None
) -> None:
    fsdp = FSDPConfig(torch_dtype="fp32", mp_param_dtype="fp32")
    lengths = [2, 9, 3, 8, 2, 7]
    weights, filled = [], []
    for dynamic in (False, True):
        config = ActorConfig(
            global_batch_size=6, micro_batch_size_per_device_for_update=2, dynamic_batching=dynamic, fsdp=fsdp
        )
        model, actor = sharded_actor(tiny_model("qwen2"), config, max_response_length=9)
        torch.manual_seed(1)
        mask = torch.zeros(len(lengths), max(lengths))
        for row, n in enumerate(lengths):
            mask[row, :n] = 1
        exp = Experience(
            prompt_ids=[torch.randint(1, 200, (5,)) for _ in lengths],
            response_ids=[torch.randint(1, 200, (n,)) for n in lengths],
            multi_modal_inputs=[{} for _ in lengths],
            group=torch.zeros(len(lengths), dtype=torch.long),
            response_mask=mask,
            advantages=torch.linspace(-1, 1, len(lengths))[:, None] * mask,
        )
        actor.update(exp, step=1)  # on-policy: fills exp.old_logp in row order
        filled.append(exp.old_logp)
        weights.append({k: v.full_tensor().clone() for k, v in model.state_dict().items()})
    assert torch.allclose(filled[0], filled[1], atol=1e-6)
    for key in weights[0]:
        assert torch.allclose(weights[0][key], weights[1][key], atol=1e-6), key
