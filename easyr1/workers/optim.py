"""Optimizers and learning-rate schedules for the actor and critic.

``adamw_bf16`` keeps bf16 parameters and bf16 optimizer state, as EasyR1's BF16 mode does, but
adds Kahan-compensated updates: each parameter has a bf16 buffer holding the part of past
updates that bf16 rounding dropped, added back before the next update. Without it an update
smaller than half a bf16 ulp (2^-8 relative; 0.004 at 1.0) is lost entirely, which at RL's
learning rates (1e-6) is nearly every update.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from functools import cache

import torch
from torch.distributed.tensor import DTensor

from easyr1.workers.config import OptimConfig


def _local(t: torch.Tensor) -> torch.Tensor:
    """Adam is elementwise, so each rank updates its own shard of a DTensor directly."""
    return t.to_local() if isinstance(t, DTensor) else t


def kahan_adamw_(
    param: torch.Tensor,
    grad: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    compensation: torch.Tensor,
    scalars: torch.Tensor,
) -> None:
    """One AdamW update of a bf16 tensor in place, in fp32 arithmetic, with Kahan compensation.

    ``scalars`` holds (lr, beta1, beta2, eps, weight_decay, 1 - beta1**step, 1 - beta2**step) as
    one tensor on the parameter's device, so a compiled version sees the same graph at every step
    and learning rate instead of recompiling for new Python numbers.
    """
    lr, beta1, beta2, eps, weight_decay, bias1, bias2 = scalars.unbind()
    grad = grad.float()
    exp_avg_new = exp_avg.float() * beta1 + grad * (1 - beta1)
    exp_avg_sq_new = exp_avg_sq.float() * beta2 + grad * grad * (1 - beta2)
    exp_avg.copy_(exp_avg_new)
    exp_avg_sq.copy_(exp_avg_sq_new)
    exact = param.float()
    update = -lr * (exp_avg_new / bias1 / ((exp_avg_sq_new / bias2).sqrt() + eps) + weight_decay * exact)
    target = exact + compensation.float() + update
    param.copy_(target)  # rounds to bf16
    compensation.copy_(target - param.float())


# On GPUs the update compiles to one fused kernel per tensor (five tensors read, four written)
# instead of about twenty elementwise kernels and their fp32 temporaries; one graph serves every
# shape. Elsewhere it runs eagerly: a CPU's compile time would outweigh its gain. Inductor drops a
# round trip through bf16 unless told to emulate it, which would zero the compensation. Wrapped on
# first use, as the attention's varlen import is (easyr1.models.attention says why).
@cache
def kahan_adamw_compiled() -> Callable[..., None]:
    return torch.compile(kahan_adamw_, dynamic=True, options={"emulate_precision_casts": True})


class AdamWBF16(torch.optim.Optimizer):
    """AdamW for bf16 parameters with Kahan-compensated parameter updates."""

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter],
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ):
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure=None):  # noqa: ANN001 - torch's signature
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            scalars: dict[tuple[torch.device, int], torch.Tensor] = {}
            for p in group["params"]:
                if p.grad is None:
                    continue
                param, grad = _local(p).detach(), _local(p.grad)
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(param)
                    state["exp_avg_sq"] = torch.zeros_like(param)
                    state["compensation"] = torch.zeros_like(param)
                state["step"] += 1
                step = state["step"]
                key = (param.device, step)
                if key not in scalars:  # one small host-to-device copy per group and step
                    values = [
                        group["lr"],
                        beta1,
                        beta2,
                        group["eps"],
                        group["weight_decay"],
                        1 - beta1**step,
                        1 - beta2**step,
                    ]
                    scalars[key] = torch.tensor(values, dtype=torch.float32, device=param.device)
                update = kahan_adamw_compiled() if param.is_cuda else kahan_adamw_
                update(
                    param, grad, state["exp_avg"], state["exp_avg_sq"], state["compensation"], scalars[key]
                )
        return loss


def build_optimizer(params: list[torch.nn.Parameter], optim: OptimConfig) -> torch.optim.Optimizer:
    """``adamw`` is torch's AdamW, fused on GPUs: torch's GPU default (foreach) computes
    sqrt(exp_avg_sq) of every tensor at once, a temporary as large as the fp32 gradients, which
    made the 7B AMP update need 142.7 GiB and run out of memory on an H200; the fused kernel
    updates in place. Elsewhere torch's default loops over the tensors one at a time."""
    if optim.strategy == "adamw_bf16":
        return AdamWBF16(params, lr=optim.lr, betas=optim.betas, weight_decay=optim.weight_decay)
    fused = bool(params) and all(_local(p).is_cuda for p in params)
    return torch.optim.AdamW(
        params, lr=optim.lr, betas=optim.betas, weight_decay=optim.weight_decay, fused=fused
    )


def build_scheduler(
    optimizer: torch.optim.Optimizer, optim: OptimConfig, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warmup (``lr_warmup_steps`` or ``lr_warmup_ratio`` of the run), then constant or cosine.
    The i-th update runs at i / warmup of the peak; EasyR1's at (i - 1) / warmup, a first update at
    lr 0 that moves nothing, which this schedule leaves out."""
    warmup = (
        optim.lr_warmup_steps
        if optim.lr_warmup_steps is not None
        else int(optim.lr_warmup_ratio * total_steps)
    )
    floor = optim.min_lr_ratio or 0.0

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if optim.lr_scheduler_type == "cosine":
            progress = (step - warmup) / max(1, total_steps - warmup)
            return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
        return 1.0

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def follow_config(
    optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LambdaLR, optim: OptimConfig
) -> None:
    """Make a restored optimizer and schedule use ``optim``'s peak lr, betas and weight decay.

    Loading a checkpoint brings back the values the run was saved with (in the param groups and the
    schedule's ``base_lrs``), which would silently override a config changed for the resumed run.
    The schedule keeps its restored position; its shape (warmup, cosine, total steps) is already the
    new config's, built with the scheduler. With an unchanged config this changes nothing: the lr is
    recomputed exactly as the schedule's last step computed it.
    """
    scheduler.base_lrs = [optim.lr] * len(optimizer.param_groups)
    for group, factor in zip(optimizer.param_groups, scheduler.lr_lambdas, strict=True):
        group.update(
            initial_lr=optim.lr,
            lr=optim.lr * factor(scheduler.last_epoch),
            betas=tuple(optim.betas),
            weight_decay=optim.weight_decay,
        )
