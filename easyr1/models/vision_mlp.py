"""The Qwen2.5-VL vision tower's MLP computed at a width cuBLAS aligns.

The tower's MLP is 3,420 wide in the 3B and 7B (1280 -> 3420 -> 1280), not a multiple of 8: each
of its matmuls, forward and backward, then has a 2-element-aligned operand, for which cuBLAS picks
SM80 CUTLASS kernels (``..._align2`` in a profile) at about 260 TFLOP/s on an H200, against twice
that for the aligned text matmuls (the VL anchor's profile of 2026-12-03). ``align_vision_mlp``
makes each such MLP pad its weights with zero rows (and the down-projection's with zero columns)
to the next multiple of 8 at every call: a few MiB copied per block, and the extra columns carry
zeros, since act(0 + 0) * (0 + 0) = 0 multiplies the down-projection's zero columns. The
parameters keep their shapes, so checkpoints, FSDP and the hand-over to vLLM do not change.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from easyr1.models.structure import vision_tower

ALIGN = 8  # bf16 elements in 16 bytes, the alignment cuBLAS's Hopper kernels need


def _padded_rows(layer: nn.Linear, pad: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    bias = None if layer.bias is None else F.pad(layer.bias, (0, pad))
    return F.pad(layer.weight, (0, 0, 0, pad)), bias


def _aligned_forward(eager: Any) -> Any:
    def forward(self: nn.Module, hidden_state: torch.Tensor) -> torch.Tensor:
        layers = (self.gate_proj, self.up_proj, self.down_proj)
        if any(
            type(layer) is not nn.Linear for layer in layers
        ):  # LoRA-wrapped: its adapters need its own forward
            return eager(self, hidden_state)
        pad = -self.intermediate_size % ALIGN
        gate = F.linear(hidden_state, *_padded_rows(self.gate_proj, pad))
        up = F.linear(hidden_state, *_padded_rows(self.up_proj, pad))
        return F.linear(self.act_fn(gate) * up, F.pad(self.down_proj.weight, (0, pad)), self.down_proj.bias)

    return forward


def align_vision_mlp(model: nn.Module) -> int:
    """Make each vision-tower MLP of ``model`` whose width is not a multiple of ``ALIGN`` compute
    at the padded width; how many were. Text models and aligned towers are left as they are."""
    tower = vision_tower(model)
    if tower is None:
        return 0
    classes: dict[type, type] = {}
    count = 0
    for module in tower.modules():
        width = getattr(module, "intermediate_size", None)
        if not (hasattr(module, "gate_proj") and hasattr(module, "down_proj") and width and width % ALIGN):
            continue
        base = type(module)
        if base not in classes:
            classes[base] = type(
                f"Aligned{base.__name__}", (base,), {"forward": _aligned_forward(base.forward)}
            )
        module.__class__ = classes[base]
        count += 1
    return count
