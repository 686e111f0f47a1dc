"""KL estimators, controllers and the in-reward penalty on hand-computed numbers."""

from __future__ import annotations

import math

import pytest
import torch

from easyr1.algorithms.config import AlgorithmConfig
from easyr1.algorithms.kl import (
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    kl_estimate,
    make_kl_controller,
)

# logp - ref = log 2 and -log 2.
LOGP = [math.log(0.5), math.log(0.25)]
REF = [math.log(0.25), math.log(0.5)]


@pytest.mark.parametrize(
    "kind, expected",
    [
        ("kl", [math.log(2), -math.log(2)]),
        ("k1", [math.log(2), -math.log(2)]),
        ("abs", [math.log(2), math.log(2)]),
        ("mse", [0.5 * math.log(2) ** 2] * 2),
        ("k2", [0.5 * math.log(2) ** 2] * 2),
        ("low_var_kl", [0.5 + math.log(2) - 1, 2 - math.log(2) - 1]),  # exp(-x) + x - 1
        ("k3", [0.5 + math.log(2) - 1, 2 - math.log(2) - 1]),
    ],
)
def test_token_estimators(kind: str, expected: list[float]) -> None:
    got = kl_estimate(torch.tensor([LOGP]), torch.tensor([REF]), kind)
    assert got[0].tolist() == pytest.approx(expected, abs=1e-6)


def test_k1_can_be_negative_k3_cannot() -> None:
    gen = torch.Generator().manual_seed(0)
    logp, ref = -torch.rand(64, 32, generator=gen) * 5, -torch.rand(64, 32, generator=gen) * 5
    assert (kl_estimate(logp, ref, "kl") < 0).any()
    assert (kl_estimate(logp, ref, "low_var_kl") >= 0).all()


def test_k3_is_clamped_and_has_finite_gradients() -> None:
    logp = torch.tensor([0.0, 0.0], requires_grad=True)
    k3 = kl_estimate(logp, torch.tensor([100.0, -100.0]), "low_var_kl")
    assert k3.tolist() == pytest.approx([10.0, 10.0])
    k3.sum().backward()
    assert torch.isfinite(logp.grad).all()


def test_full_kl_from_distributions() -> None:
    p, q = [0.7, 0.2, 0.1], [0.3, 0.3, 0.4]
    expected = sum(pi * math.log(pi / qi) for pi, qi in zip(p, q, strict=True))
    logp = torch.tensor([[p, q]]).log()  # [B=1, T=2, V=3]
    ref = torch.tensor([[q, q]]).log()
    got = kl_estimate(logp, ref, "full")
    assert got.shape == (1, 2)
    assert got[0].tolist() == pytest.approx([expected, 0.0], abs=1e-6)


def test_registry_names_match_config_and_unknown_kind_fails() -> None:
    from typing import get_args, get_type_hints

    assert set(get_args(get_type_hints(AlgorithmConfig)["kl_penalty"])) <= set(KL_ESTIMATORS)
    with pytest.raises(ValueError, match="low_var_kl"):
        kl_estimate(torch.zeros(1), torch.zeros(1), "k4")


def test_adaptive_controller_moves_toward_target() -> None:
    ctl = AdaptiveKLController(init_coef=0.1, target=0.1, horizon=100)
    ctl.update(current_kl=0.5, n_steps=10)  # error 4 clipped to 0.2
    assert ctl.value == pytest.approx(0.1 * (1 + 0.2 * 10 / 100))
    high = ctl.value
    ctl.update(current_kl=0.09, n_steps=10)  # error -0.1
    assert ctl.value == pytest.approx(high * (1 - 0.1 * 10 / 100))
    ctl.update(current_kl=0.1, n_steps=10)
    assert ctl.value == pytest.approx(high * (1 - 0.1 * 10 / 100))


def test_fixed_controller_and_factory() -> None:
    fixed = FixedKLController(0.05)
    fixed.update(10.0, 100)
    assert fixed.value == 0.05
    assert isinstance(make_kl_controller(AlgorithmConfig(kl_coef=0.2)), FixedKLController)
    config = AlgorithmConfig(kl_type="adaptive", kl_coef=0.2, kl_target=1.0, kl_horizon=50)
    adaptive = make_kl_controller(config)
    assert isinstance(adaptive, AdaptiveKLController) and adaptive.value == 0.2 and adaptive.horizon == 50


def test_kl_penalty_in_reward() -> None:
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0], [0.0, 0.0, 0.0]])
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -1.0, 9.0], [0.0, 0.0, 0.0]])
    ref = torch.tensor([[-1.5, -1.0, -0.5], [-0.5, -2.0, 0.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [0, 0, 0]])  # the last row has no response
    penalized, mean_kl = apply_kl_penalty(rewards, logp, ref, mask, coef=0.1, kind="kl")
    # k1 per token: row 0 [0.5, -1, 0], row 1 [-0.5, 1] (+ padding)
    assert penalized[0].tolist() == pytest.approx([-0.05, 0.1, 1.0])
    assert penalized[1].tolist() == pytest.approx([0.05, 1.9, 0.0])
    assert penalized[2].tolist() == [0.0, 0.0, 0.0]
    # mean over the two non-empty sequences of their token means: (-0.5/3 + 0.5/2) / 2
    assert mean_kl.item() == pytest.approx((-0.5 / 3 + 0.5 / 2) / 2)
