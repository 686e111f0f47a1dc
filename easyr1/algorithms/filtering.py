"""DAPO's dynamic sampling (online filtering): drop prompt groups that carry no learning signal,
and keep generating until the batch is full.

A group whose samples all score the same (all right, all wrong) has zero advantage under every
group-baseline estimator, so it only dilutes the batch. EasyR1's rule (``ray_trainer.py``,
``_make_batch_data``): a group is kept when the mean of its ``algorithm.filter_key`` score lies
strictly between ``filter_low`` and ``filter_high``; generation goes on, ``data.mini_rollout_batch_size``
prompts at a time, until ``data.rollout_batch_size`` groups are kept, and fails after
``trainer.max_try_make_batch`` tries (<= 0: no limit). The batch is the first
``rollout_batch_size`` kept groups. Functions here are pure; the trainer supplies the generation
(``draw``) and the count exchange between ranks (``all_counts``), and moves the groups that
``split_groups`` assigns to another rank than the one that generated them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from easyr1.config import ConfigError

G = TypeVar("G")


class BatchFillError(RuntimeError):
    """Too few groups survived the filter within ``trainer.max_try_make_batch`` tries."""


def keep_group(scores: Sequence[Mapping[str, float]], key: str, low: float, high: float) -> bool:
    """Whether a group's mean ``key`` score lies strictly inside ``(low, high)``."""
    try:
        values = [float(s[key]) for s in scores]
    except KeyError:
        found = ", ".join(sorted(scores[0])) if scores else "none"
        message = f"algorithm.filter_key={key!r} is not a score of the reward function (it returns: {found})"
        raise ConfigError(message) from None
    mean = sum(values) / len(values)
    return low < mean < high


@dataclass
class FilledBatch(Generic[G]):
    kept: list[G]  # this rank's kept groups of every round, in order
    counts: list[list[int]]  # counts[round][rank]: how many groups each rank kept in that round

    @property
    def tries(self) -> int:
        return len(self.counts)

    @property
    def total_kept(self) -> int:
        return sum(map(sum, self.counts))


def fill_batch(
    draw: Callable[[], list[G]],
    keep: Callable[[G], bool],
    target: int,
    max_tries: int,
    all_counts: Callable[[int], list[int]] = lambda n: [n],
) -> FilledBatch[G]:
    """Call ``draw`` (one round of this rank's groups) until ``target`` groups pass ``keep`` on all
    ranks together.

    ``all_counts`` turns this rank's kept count of a round into every rank's (an all-gather; in
    one process, ``[n]``), so all ranks see the same total and stop after the same round.
    """
    kept: list[G] = []
    counts: list[list[int]] = []
    while sum(map(sum, counts)) < target:
        if 0 < max_tries <= len(counts):
            raise BatchFillError(
                f"only {sum(map(sum, counts))} of data.rollout_batch_size={target} groups passed the online "
                f"filter in trainer.max_try_make_batch={max_tries} tries: widen algorithm.filter_low/filter_high, "
                "raise the limit (<= 0: none), or check the data and reward"
            )
        fresh = [group for group in draw() if keep(group)]
        kept += fresh
        counts.append(all_counts(len(fresh)))
    return FilledBatch(kept=kept, counts=counts)


def batch_layout(counts: Sequence[Sequence[int]], target: int) -> list[tuple[int, int]]:
    """The batch as ``(rank, index into that rank's kept groups)``: the first ``target`` kept
    groups in the global order, which is round by round and, within a round, rank 0 first."""
    layout: list[tuple[int, int]] = []
    seen = [0] * len(counts[0]) if counts else []
    for round_counts in counts:
        for rank, n in enumerate(round_counts):
            layout += [(rank, seen[rank] + i) for i in range(n)]
            seen[rank] += n
    return layout[:target]


def split_groups(origins: Sequence[int], world: int) -> list[list[int]]:
    """Which of the batch's groups each rank trains on: ``len(origins) // world`` each.

    ``origins[i]`` is the rank that generated group i. A rank keeps its own groups first (in
    order, up to its share), so without filtering nothing moves between ranks; the surplus of
    some ranks fills the others' shortfall, in rank order. Groups are never split.
    """
    per_rank = len(origins) // world
    own: list[list[int]] = [[] for _ in range(world)]
    for index, rank in enumerate(origins):
        own[rank].append(index)
    surplus = [index for rank in range(world) for index in own[rank][per_rank:]]
    shares = [own[rank][:per_rank] for rank in range(world)]
    for share in shares:
        missing = per_rank - len(share)
        share += surplus[:missing]
        del surplus[:missing]
    return shares
