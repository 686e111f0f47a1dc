"""Policy/value losses, aggregation and log-prob helpers against hand-computed numbers."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from easyr1.algorithms.losses import (
    POLICY_LOSSES,
    aggregate,
    cispo_loss,
    gspo_loss,
    gspo_token_loss,
    ppo_clip_loss,
    sapo_loss,
    value_loss,
)

CFG = SimpleNamespace(
    clip_ratio_low=0.2, clip_ratio_high=0.3, clip_ratio_dual=3.0, tau_positive=1.0, tau_negative=1.05
)


def _leaf(values: list) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32, requires_grad=True)


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


# ---------------------------------------------------------------------------- aggregation

LOSS = [[1.0, 2.0, 3.0, 99.0], [4.0, -7.0, 99.0, 99.0], [5.0, 5.0, 5.0, 5.0]]
MASK = [[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]]  # row 2 is an empty (all-padding) row


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token-mean", (1 + 2 + 3 + 4) / 4),
        ("token", (1 + 2 + 3 + 4) / 4),
        ("seq-mean-token-mean", (2.0 + 4.0) / 2),
        ("seq", (2.0 + 4.0) / 2),
        ("seq-mean-token-sum", (6.0 + 4.0) / 2),
        ("seq-mean-token-sum-norm", (6.0 / 4 + 4.0 / 4) / 2),
    ],
)
def test_aggregation_modes(mode: str, expected: float) -> None:
    assert aggregate(torch.tensor(LOSS), torch.tensor(MASK), mode).item() == pytest.approx(expected)


def test_aggregation_norm_uses_max_len_and_rejects_unknown_modes() -> None:
    got = aggregate(torch.tensor(LOSS), torch.tensor(MASK), "seq-mean-token-sum-norm", max_len=10)
    assert got.item() == pytest.approx((6.0 / 10 + 4.0 / 10) / 2)
    with pytest.raises(ValueError, match="seq-mean"):
        aggregate(torch.tensor(LOSS), torch.tensor(MASK), "sequence")


def test_global_denominators_make_micro_batches_add_up() -> None:
    loss, mask = torch.tensor(LOSS), torch.tensor(MASK)
    total = sum(aggregate(loss[i : i + 1], mask[i : i + 1], "token", global_tokens=4) for i in range(3))
    assert total.item() == pytest.approx(aggregate(loss, mask, "token").item())
    total = sum(aggregate(loss[i : i + 1], mask[i : i + 1], "seq", global_seqs=2) for i in range(3))
    assert total.item() == pytest.approx(aggregate(loss, mask, "seq").item())


# ---------------------------------------------------------------------------- PPO clip

# Regimes, with low 0.2 / high 0.3 / dual 3: ratio, advantage, expected loss, grad wrt logp.
PPO_CASES = [
    (1.5, 1.0, -1.3, 0.0),  # clipped above (clip-higher): no gradient
    (0.5, -1.0, 0.8, 0.0),  # clipped below
    (5.0, -1.0, 3.0, 0.0),  # dual clip caps -A * 5 = 5 at 3 * |A| = 3
    (1.1, 2.0, -2.2, -2.2),  # inside: loss -A r, gradient -A r
    (0.5, 1.0, -0.5, -0.5),  # A > 0 and ratio low: the unclipped branch is the pessimistic one
    (2.0, -1.0, 2.0, 2.0),  # A < 0, ratio high but under the dual cap
]


def test_ppo_clip_regimes_and_clip_fractions() -> None:
    old = [[0.0] * len(PPO_CASES) + [0.0]]
    logp = _leaf([[math.log(c[0]) for c in PPO_CASES] + [3.0]])
    adv = torch.tensor([[c[1] for c in PPO_CASES] + [1.0]])
    mask = torch.tensor([[1.0] * len(PPO_CASES) + [0.0]])
    loss, metrics = ppo_clip_loss(torch.tensor(old), logp, adv, mask, CFG)
    loss.sum().backward()
    assert loss[0].tolist() == pytest.approx([c[2] for c in PPO_CASES] + [0.0], abs=1e-5)
    assert logp.grad[0].tolist() == pytest.approx([c[3] for c in PPO_CASES] + [0.0], abs=1e-5)
    n = len(PPO_CASES)
    assert metrics["pg_clipfrac_higher"].item() == pytest.approx(1 / n)
    assert metrics["pg_clipfrac_lower"].item() == pytest.approx(1 / n)
    assert metrics["pg_clipfrac_dual"].item() == pytest.approx(1 / n)
    expected_kl = sum(-math.log(c[0]) for c in PPO_CASES) / n
    assert metrics["ppo_kl"].item() == pytest.approx(expected_kl, abs=1e-5)


def test_dual_clip_caps_negative_advantage_loss() -> None:
    gen = torch.Generator().manual_seed(0)
    old = torch.randn(8, 16, generator=gen)
    logp = old + 3 * torch.randn(8, 16, generator=gen)
    adv = torch.randn(8, 16, generator=gen)
    loss, _ = ppo_clip_loss(old, logp, adv, torch.ones(8, 16), CFG)
    negative = adv < 0
    assert torch.all(loss[negative] <= CFG.clip_ratio_dual * adv[negative].abs() + 1e-6)
    assert torch.any(torch.isclose(loss[negative], CFG.clip_ratio_dual * adv[negative].abs()))


# ---------------------------------------------------------------------------- GSPO


def _gspo_inputs():
    old = torch.tensor([[-1.0, -2.0, -0.5, 0.0], [-0.3, -0.7, 0.0, 0.0]])
    delta = [[0.02, -0.01, 0.05, 0.0], [0.3, 0.4, 0.0, 0.0]]
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    return old, delta, mask


def test_gspo_ratio_is_one_per_sequence() -> None:
    old, delta, mask = _gspo_inputs()
    adv = torch.tensor([[1.0] * 4, [-2.0] * 4])
    loss, metrics = gspo_loss(old, old + torch.tensor(delta), adv, mask, CFG)
    s0 = math.exp((0.02 - 0.01 + 0.05) / 3)  # inside [0.8, 1.3]
    s1 = math.exp((0.3 + 0.4) / 2)  # 1.42 > 1.3, A < 0: the unclipped branch is the larger
    assert loss[0, :3].tolist() == pytest.approx([-s0] * 3, abs=1e-6)
    assert loss[1, :2].tolist() == pytest.approx([2 * s1] * 2, abs=1e-6)
    assert loss[0, 3] == 0 and loss[1, 2:].abs().sum() == 0
    clipped, _ = gspo_loss(old, old + torch.tensor(delta), adv.abs(), mask, CFG)
    assert clipped[1, :2].tolist() == pytest.approx([-2 * 1.3] * 2, abs=1e-6)
    assert metrics["pg_clipfrac_higher"].item() == 0.0


def test_gspo_token_equals_gspo_in_value_but_not_in_gradient() -> None:
    old, delta, mask = _gspo_inputs()
    adv = torch.tensor([[1.0, -0.5, 2.0, 9.0], [0.3, 0.3, 9.0, 9.0]])  # varies along the sequence
    logp_seq = (old + torch.tensor(delta)).requires_grad_(True)
    logp_tok = (old + torch.tensor(delta)).requires_grad_(True)
    loss_seq, _ = gspo_loss(old, logp_seq, adv, mask, CFG)
    loss_tok, _ = gspo_token_loss(old, logp_tok, adv, mask, CFG)
    assert torch.allclose(loss_seq, loss_tok)
    loss_seq.sum().backward()
    loss_tok.sum().backward()
    s0 = math.exp((0.02 - 0.01 + 0.05) / 3)
    a0 = [1.0, -0.5, 2.0]
    # GSPO: d/d logp_t of sum_k -A_k s = -s * sum(A) / |y|, the same for every token.
    assert logp_seq.grad[0, :3].tolist() == pytest.approx([-s0 * sum(a0) / 3] * 3, abs=1e-6)
    # GSPO-token: token t's own advantage only.
    assert logp_tok.grad[0, :3].tolist() == pytest.approx([-s0 * a for a in a0], abs=1e-6)
    for grad in (logp_seq.grad, logp_tok.grad):
        assert grad[0, 3] == 0 and grad[1, 2:].abs().sum() == 0


# ---------------------------------------------------------------------------- CISPO and SAPO


def test_cispo_weight_carries_no_gradient() -> None:
    ratios, advs = [1.1, 2.0, 0.5, 1.0], [1.0, 2.0, -1.0, -0.5]
    old = torch.tensor([[-1.0, -0.5, -2.0, -0.2]])
    logp = (old + torch.tensor([[math.log(r) for r in ratios]])).requires_grad_(True)
    loss, metrics = cispo_loss(old, logp, torch.tensor([advs]), torch.ones(1, 4), CFG)
    loss.sum().backward()
    weights = [min(r, 1.3) for r in ratios]  # upper bound only: 0.5 is not raised to 0.8
    assert logp.grad[0].tolist() == pytest.approx(
        [-w * a for w, a in zip(weights, advs, strict=True)], abs=1e-6
    )
    expected = [-w * a * lp for w, a, lp in zip(weights, advs, logp[0].tolist(), strict=True)]
    assert loss[0].tolist() == pytest.approx(expected, abs=1e-6)
    assert metrics["pg_clipfrac_higher"].item() == pytest.approx(0.25)


def test_sapo_soft_gate_value_and_gradient() -> None:
    ratios, advs = [1.0, 1.5, 0.6, 1.2], [1.0, 2.0, -1.0, -0.5]
    old = torch.zeros(1, 4)
    logp = torch.tensor([[math.log(r) for r in ratios]]).requires_grad_(True)
    loss, metrics = sapo_loss(old, logp, torch.tensor([advs]), torch.ones(1, 4), CFG)
    loss.sum().backward()
    for t, (r, a) in enumerate(zip(ratios, advs, strict=True)):
        tau = CFG.tau_positive if a > 0 else CFG.tau_negative
        s = _sigmoid(tau * (r - 1))
        assert loss[0, t].item() == pytest.approx(-(4 / tau) * s * a, abs=1e-6)
        assert logp.grad[0, t].item() == pytest.approx(-4 * s * (1 - s) * r * a, abs=1e-6)
    assert logp.grad[0, 0].item() == pytest.approx(-1.0)  # r = 1: the plain policy gradient
    assert 0 < metrics["pg_gate_weight"].item() < 1


# ---------------------------------------------------------------------------- masks


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
def test_padding_changes_nothing(name: str) -> None:
    gen = torch.Generator().manual_seed(1)
    old = -torch.rand(3, 6, generator=gen)
    logp_values = old + 0.1 * torch.randn(3, 6, generator=gen)
    adv = torch.randn(3, 1, generator=gen).expand(3, 6).clone()
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    results = []
    for pad in (0.0, float("inf"), -1e4):
        noisy = [x.masked_fill(~mask, pad) for x in (old, logp_values, adv)]
        logp = noisy[1].requires_grad_(True)
        loss, metrics = POLICY_LOSSES[name](noisy[0], logp, noisy[2], mask, CFG)
        aggregate(loss, mask, "token").backward()
        results.append((loss.detach(), logp.grad, metrics))
    base_loss, base_grad, base_metrics = results[0]
    assert torch.all(base_loss[~mask] == 0) and torch.all(base_grad[~mask] == 0)
    for loss, grad, metrics in results[1:]:
        assert torch.equal(loss, base_loss) and torch.equal(grad, base_grad)
        for key, value in base_metrics.items():
            assert torch.equal(metrics[key], value), key


def test_registry_names_match_config() -> None:
    from typing import get_args, get_type_hints

    from easyr1.workers.config import ActorConfig

    assert set(get_args(get_type_hints(ActorConfig)["loss_type"])) == set(POLICY_LOSSES)


# ---------------------------------------------------------------------------- value loss


def test_clipped_value_loss() -> None:
    values = _leaf([[1.0, 0.0, 2.0, 7.0]])
    old = torch.tensor([[0.0, 0.0, 1.9, 0.0]])
    returns = torch.tensor([[0.0, 1.0, 3.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    loss, metrics = value_loss(values, old, returns, mask, cliprange_value=0.5)
    loss.sum().backward()
    # token 0: v=1 clipped to 0.5: max(1, 0.25) -> 0.5 * 1; token 1: v=0 unclipped: 0.5 * 1;
    # token 2: v=2, clip 1.9+0.1 (inside): 0.5 * 1; token 3 is padding.
    assert loss[0].tolist() == pytest.approx([0.5, 0.5, 0.5, 0.0])
    values_clip = _leaf([[0.0, 1.0]])
    old2, returns2 = torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 0.0]])
    loss2, metrics2 = value_loss(values_clip, old2, returns2, torch.ones(1, 2), 0.5)
    # token 0: v=0 from old 1 -> clipped to 0.5: max(0, 0.25) = 0.25 (clipped term larger)
    # token 1: v=1 from old 0 -> clipped to 0.5: max(1, 0.25) = 1
    assert loss2[0].tolist() == pytest.approx([0.125, 0.5])
    assert metrics2["vf_clipfrac"].item() == pytest.approx(0.5)
    assert metrics["vf_clipfrac"].item() == 0.0
    assert values.grad[0].tolist() == pytest.approx([1.0, -1.0, -1.0, 0.0])
