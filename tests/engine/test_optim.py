"""The bf16 optimizer keeps updates that bf16 rounding alone would drop; LR schedules."""

from __future__ import annotations

import math

import pytest
import torch

from easyr1.workers.config import OptimConfig
from easyr1.workers.optim import AdamWBF16, build_optimizer, build_scheduler


def _train(optimizer_cls: type[torch.optim.Optimizer], steps: int = 100) -> torch.Tensor:
    param = torch.nn.Parameter(torch.ones(8, dtype=torch.bfloat16))
    opt = optimizer_cls([param], lr=1e-4, weight_decay=0.0)
    for _ in range(steps):
        param.grad = torch.ones_like(param)  # Adam's step is then lr in size, every step
        opt.step()
    return param.detach().float()


def test_plain_bf16_adamw_loses_small_updates() -> None:
    # 1e-4 is far below half a bf16 ulp at 1.0 (2**-8): every update rounds away.
    assert torch.equal(_train(torch.optim.AdamW), torch.ones(8))


def test_kahan_compensated_adamw_applies_them() -> None:
    result = _train(AdamWBF16)
    expected = 1.0 - 100 * 1e-4  # what fp32 arithmetic would reach
    assert torch.all(result < 1.0)
    assert torch.allclose(result, torch.full((8,), expected), atol=2**-7)


def test_matches_fp32_adamw_where_bf16_can_represent_it() -> None:
    torch.manual_seed(0)
    start = torch.randn(64)
    grads = [torch.randn(64) for _ in range(20)]
    p32 = torch.nn.Parameter(start.clone())
    p16 = torch.nn.Parameter(start.to(torch.bfloat16))
    ref = torch.optim.AdamW([p32], lr=1e-2, weight_decay=0.1)
    ours = AdamWBF16([p16], lr=1e-2, weight_decay=0.1)
    for g in grads:
        p32.grad, p16.grad = g.clone(), g.to(torch.bfloat16)
        ref.step()
        ours.step()
    assert torch.allclose(p16.float(), p32.detach(), atol=3e-2)


def test_strategy_picks_the_optimizer() -> None:
    params = [torch.nn.Parameter(torch.zeros(2))]
    assert isinstance(build_optimizer(params, OptimConfig(strategy="adamw_bf16")), AdamWBF16)
    adamw = build_optimizer(params, OptimConfig(strategy="adamw"))
    assert type(adamw) is torch.optim.AdamW
    assert adamw.defaults["fused"] is False  # CPU tensors: torch's per-tensor loop


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the fused AdamW is the GPU's (run on the H200)")
def test_adamw_on_gpus_is_fused_and_steps_without_a_temporary() -> None:
    # Four 64 MiB fp32 tensors: the foreach step would allocate 256 MiB more (sqrt(exp_avg_sq)).
    params = [torch.nn.Parameter(torch.randn(4096, 4096, device="cuda")) for _ in range(4)]
    adamw = build_optimizer(params, OptimConfig(strategy="adamw", lr=1e-3))
    assert adamw.defaults["fused"] is True
    for p in params:
        p.grad = torch.randn_like(p)
    adamw.step()  # creates the moments
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    adamw.step()
    torch.cuda.synchronize()
    assert torch.cuda.max_memory_allocated() - before < 2**20


@pytest.mark.parametrize(
    ("kind", "expected"), [("constant", [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]), ("cosine", None)]
)
def test_warmup_then_schedule(kind: str, expected: list[float] | None) -> None:
    param = torch.nn.Parameter(torch.zeros(1))
    optim = OptimConfig(lr=1.0, lr_warmup_steps=4, lr_scheduler_type=kind, min_lr_ratio=0.1)
    opt = build_optimizer([param], optim)
    sched = build_scheduler(opt, optim, total_steps=8)
    seen = []
    for _ in range(8):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    if expected is not None:
        assert seen[:6] == pytest.approx(expected)
    else:
        assert seen[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])
        progress = [(s - 4) / 4 for s in range(4, 8)]
        assert seen[4:] == pytest.approx([0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)) for p in progress])


def test_compiled_update_matches_eager() -> None:
    # The fused kernel GPUs run is the same function compiled; here compiled for the CPU.
    from easyr1.workers.optim import kahan_adamw_, kahan_adamw_compiled

    torch.manual_seed(0)
    scalars = torch.tensor([1e-3, 0.9, 0.999, 1e-8, 0.1, 1 - 0.9**3, 1 - 0.999**3])
    for shape in ((7, 5), (33,)):  # two shapes, one dynamic graph
        tensors = [torch.randn(shape).to(torch.bfloat16) for _ in range(3)] + [
            torch.randn(shape).abs().to(torch.bfloat16)
        ]
        param, grad, exp_avg, exp_avg_sq = tensors
        compensation = torch.zeros(shape, dtype=torch.bfloat16)
        eager = [t.clone() for t in (param, exp_avg, exp_avg_sq, compensation)]
        kahan_adamw_(eager[0], grad, eager[1], eager[2], eager[3], scalars)
        kahan_adamw_compiled()(param, grad, exp_avg, exp_avg_sq, compensation, scalars)
        for ours, theirs in zip((param, exp_avg, exp_avg_sq, compensation), eager, strict=True):
            assert torch.allclose(ours.float(), theirs.float(), rtol=2**-7, atol=1e-6)
        # What the compensated pair represents agrees to fp32 accuracy.
        assert torch.allclose(
            param.float() + compensation.float(), eager[0].float() + eager[3].float(), atol=1e-6
        )
