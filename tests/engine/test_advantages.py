"""Advantage estimators against values worked out with plain Python loops."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from easyr1.algorithms.advantages import (
    ADVANTAGE_ESTIMATORS,
    OUTCOME_ESTIMATORS,
    gae,
    grpo,
    grpo_passk,
    reinforce_plus_plus,
    remax,
    rloo,
)

# Interleaved, non-contiguous prompt ids; group 9 has one sample, group 4 has identical scores.
SCORES = [1.0, 0.0, 0.5, 1.0, 3.0, 0.0, 2.0, 7.0, 1.0, 1.0, -1.0]
GROUP = [5, 5, 2, 5, 2, 5, 2, 9, 4, 4, 2]
LENGTHS = [3, 1, 4, 2, 4, 3, 1, 2, 4, 2, 3]
T = 5


def _mask(lengths: list[int] = LENGTHS, width: int = T) -> torch.Tensor:
    return torch.tensor([[1.0 if t < n else 0.0 for t in range(width)] for n in lengths])


def _members(i: int) -> list[int]:
    return [j for j in range(len(GROUP)) if GROUP[j] == GROUP[i]]


def _check_broadcast(adv: torch.Tensor, per_sample: list[float], lengths: list[int] = LENGTHS) -> None:
    for i, n in enumerate(lengths):
        assert adv[i, :n].tolist() == pytest.approx([per_sample[i]] * n, abs=1e-5)
        assert adv[i, n:].abs().sum() == 0


def _inputs():
    return torch.tensor(SCORES), _mask(), torch.tensor(GROUP)


def test_grpo_matches_loop_and_is_standardised() -> None:
    eps = 1e-6
    expected = []
    for i, r in enumerate(SCORES):
        others = [SCORES[j] for j in _members(i)]
        if len(others) == 1:
            expected.append(0.0)
        else:
            expected.append((r - statistics.mean(others)) / (statistics.stdev(others) + eps))
    adv, returns = grpo(*_inputs(), eps=eps)
    _check_broadcast(adv, expected)
    assert torch.equal(adv, returns)
    for gid in (5, 2):
        values = [adv[j, 0].item() for j in range(len(GROUP)) if GROUP[j] == gid]
        assert statistics.mean(values) == pytest.approx(0.0, abs=1e-6)
        assert statistics.stdev(values) == pytest.approx(1.0, abs=1e-4)  # unbiased std, like torch.std
    assert adv[7].abs().sum() == 0  # group of one
    assert adv[8].abs().sum() == 0 and adv[9].abs().sum() == 0  # identical scores


def test_dr_grpo_skips_std_division() -> None:
    adv, _ = grpo(*_inputs(), norm_by_std=False)
    expected = [
        0.0 if len(_members(i)) == 1 else r - statistics.mean(SCORES[j] for j in _members(i))
        for i, r in enumerate(SCORES)
    ]
    _check_broadcast(adv, expected)


def test_rloo_leaves_the_sample_out() -> None:
    expected = []
    for i, r in enumerate(SCORES):
        others = [SCORES[j] for j in _members(i) if j != i]
        expected.append(r - sum(others) / len(others) if others else 0.0)
    adv, _ = rloo(*_inputs())
    _check_broadcast(adv, expected)


def test_passk_only_the_best_sample_is_nonzero() -> None:
    eps = 1e-6
    adv, _ = grpo_passk(*_inputs(), eps=eps)
    per_sample = adv[:, 0].tolist()
    # group 5: scores 1, 0, 1, 0 -> the best is tied: every advantage is 0.
    # group 2: scores 0.5, 3, 2, -1 -> only sample 4: (3 - 2) / stdev.
    g2 = [0.5, 3.0, 2.0, -1.0]
    expected = [0.0] * len(SCORES)
    expected[4] = (3.0 - 2.0) / (statistics.stdev(g2) + eps)
    _check_broadcast(adv, expected)
    assert sum(v != 0 for v in per_sample) == 1


def test_passk_is_leave_one_out_of_the_max() -> None:
    scores = torch.tensor([0.2, 0.9, 0.4, 0.1, 1.0, 0.0])
    group = torch.tensor([0, 0, 0, 1, 1, 1])
    adv, _ = grpo_passk(scores, torch.ones(6, 2), group, norm_by_std=False)
    values = scores.tolist()
    for i in range(6):
        members = [j for j in range(6) if group[j] == group[i]]
        loo = max(values[j] for j in members) - max(values[j] for j in members if j != i)
        assert adv[i, 0].item() == pytest.approx(loo, abs=1e-6)


def test_remax_subtracts_the_greedy_score() -> None:
    adv, returns = remax(torch.tensor([1.0, 0.0, 0.5]), torch.tensor([0.5, 0.5, 0.5]), _mask([2, 3, 1]))
    _check_broadcast(adv, [0.5, -0.5, 0.0], [2, 3, 1])
    _check_broadcast(returns, [1.0, 0.0, 0.5], [2, 3, 1])


def _whiten_loop(rows: list[list[float]]) -> list[list[float]]:
    flat = [v for row in rows for v in row]
    mean, var = statistics.mean(flat), statistics.variance(flat)
    return [[(v - mean) / math.sqrt(var + 1e-8) for v in row] for row in rows]


def test_reinforce_plus_plus_matches_loop() -> None:
    gamma = 0.9
    lengths = [3, 1, 4]
    rewards = [[0.0, -0.1, 1.0, 0.0], [2.0, 0.0, 0.0, 0.0], [0.3, 0.0, 0.0, -1.0]]
    returns_loop = []
    for row, n in zip(rewards, lengths, strict=True):
        out, running = [0.0] * n, 0.0
        for t in reversed(range(n)):
            running = row[t] + gamma * running
            out[t] = running
        returns_loop.append(out)
    token_rewards = torch.tensor(rewards)
    token_rewards[0, 3] = 50.0  # padding: must be ignored
    adv, returns = reinforce_plus_plus(token_rewards, _mask(lengths, 4), gamma)
    expected_adv = _whiten_loop(returns_loop)
    for i, n in enumerate(lengths):
        assert returns[i, :n].tolist() == pytest.approx(returns_loop[i], abs=1e-6)
        assert adv[i, :n].tolist() == pytest.approx(expected_adv[i], abs=1e-5)
        assert adv[i, n:].abs().sum() == 0 and returns[i, n:].abs().sum() == 0


def test_gae_hand_numbers() -> None:
    # gamma = lam = 1: A_1 = 1 - 0.2 = 0.8, A_0 = 0 + 0.2 - 0.5 + 0.8 = 0.5, returns = MC returns.
    _, returns = gae(torch.tensor([[0.0, 1.0]]), torch.tensor([[0.5, 0.2]]), torch.ones(1, 2), 1.0, 1.0)
    assert returns[0].tolist() == pytest.approx([1.0, 1.0])


def test_gae_matches_loop_and_ignores_padding() -> None:
    gamma, lam = 0.95, 0.8
    lengths = [3, 1, 4]
    rewards = [[0.0, 0.1, 1.0, 0.0], [-1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.2, 0.7]]
    values = [[0.3, 0.4, 0.6, 0.0], [0.1, 0.0, 0.0, 0.0], [0.5, -0.2, 0.1, 0.3]]
    adv_loop, ret_loop = [], []
    for r, v, n in zip(rewards, values, lengths, strict=True):
        adv_row, last = [0.0] * n, 0.0
        for t in reversed(range(n)):
            next_v = v[t + 1] if t + 1 < n else 0.0
            last = r[t] + gamma * next_v - v[t] + gamma * lam * last
            adv_row[t] = last
        adv_loop.append(adv_row)
        ret_loop.append([a + b for a, b in zip(adv_row, v[:n], strict=True)])
    mask = _mask(lengths, 4)
    adv, returns = gae(torch.tensor(rewards), torch.tensor(values), mask, gamma, lam)
    expected_adv = _whiten_loop(adv_loop)
    for i, n in enumerate(lengths):
        assert returns[i, :n].tolist() == pytest.approx(ret_loop[i], abs=1e-6)
        assert adv[i, :n].tolist() == pytest.approx(expected_adv[i], abs=1e-5)
    noisy_values = torch.tensor(values).masked_fill(mask == 0, 1e6)
    noisy_rewards = torch.tensor(rewards).masked_fill(mask == 0, float("nan"))
    adv2, returns2 = gae(noisy_rewards, noisy_values, mask, gamma, lam)
    assert torch.equal(adv, adv2) and torch.equal(returns, returns2)


@pytest.mark.parametrize("name", sorted(OUTCOME_ESTIMATORS))
def test_outcome_estimators_mask_padding(name: str) -> None:
    scores, mask, group = _inputs()
    mask = mask.bool()
    adv, _ = ADVANTAGE_ESTIMATORS[name](scores, mask, group)
    assert adv.shape == mask.shape and adv[~mask].abs().sum() == 0


def test_registry_names_match_config() -> None:
    from typing import get_args, get_type_hints

    from easyr1.algorithms.config import AlgorithmConfig

    names = set(get_args(get_type_hints(AlgorithmConfig)["adv_estimator"]))
    assert names == set(ADVANTAGE_ESTIMATORS)
    assert OUTCOME_ESTIMATORS <= names
