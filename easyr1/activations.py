"""What a decoder block keeps for backward, and backward's peak over the blocks.

The share of ``Architecture.activation_bytes`` a block keeps (eager, compiled by torch.compile, with
LoRA adapters in fp32), how the actor's blocks recompute their activations (``RecomputePlan``: whole
blocks, their attention or their elementwise work only) and the peak that backward reaches over them
(``block_activations``). The memory estimator (``easyr1/memory.py``) adds these to its phases.
"""

from __future__ import annotations

from dataclasses import dataclass

from easyr1.models.architecture import ATTENTION, FULL, KEEP, POINTWISE

# A block compiled by torch.compile (``worker.actor.use_torch_compile``, the actor on GPUs) keeps
# this share of ``activation_bytes``: its fused kernels save fewer intermediates and recompute the
# cheap ones. Calibrated on the 1.5B records with gradient checkpointing off against on (every
# precision: 7.49-7.60 GiB more activations measured, 10.26 GiB uncompiled; 0.73-0.74).
COMPILED_ACTIVATIONS = 0.73
# ... but not a block whose LoRA adapters run in fp32: peft keeps them fp32 on a bf16 model
# (``torch_dtype=bf16``) and casts each adapted layer's input to fp32 for them, which autograd keeps too.
# Measured on CPU, Qwen2.5-1.5B's shapes with rank-64 adapters on every linear layer
# (tests/engine/test_memory.py): 1.43 of ``activation_bytes`` eager, 0.99 compiled; on the H200's LoRA
# anchor (bf16, 2026-12-07, every block recomputed) the update measured 1.01 compiled, and with no block
# recomputed it ran out of memory at 131.5 GiB, where 0.73 said 102.5. Under AMP, FSDP computes the
# adapters in bf16 with the rest, and the block keeps what a plain one keeps (0.73 compiled on EasyR1's
# LoRA example with no block recomputed, 2026-12-02; 0.69 on CPU).
LORA_FP32_ACTIVATIONS = 1.43
LORA_FP32_COMPILED_ACTIVATIONS = 1.01


def activation_share(compiled: bool, fp32_adapters: bool) -> float:
    """The share of ``activation_bytes`` a decoder block keeps for backward: ``compiled`` by torch.compile,
    ``fp32_adapters`` with LoRA adapters in fp32 on a bf16 model."""
    if fp32_adapters:
        return LORA_FP32_COMPILED_ACTIVATIONS if compiled else LORA_FP32_ACTIVATIONS
    return COMPILED_ACTIVATIONS if compiled else 1.0


@dataclass(frozen=True)
class RecomputePlan:
    """How many of the actor's decoder blocks recompute in each way (``models.recompute``); the others
    keep their activations. In forward order: ``full`` blocks first, then ``attention``, ``pointwise``
    and the kept ones, so that backward meets the blocks that keep the most first and frees them
    before it recomputes anything."""

    full: int
    attention: int = 0
    pointwise: int = 0

    def modes(self, layers: int) -> list[str]:
        kept = layers - self.full - self.attention - self.pointwise
        return (
            [FULL] * self.full + [ATTENTION] * self.attention + [POINTWISE] * self.pointwise + [KEEP] * kept
        )

    def describe(self, layers: int) -> str:
        partial = [
            f"{n} {what}"
            for n, what in ((self.attention, "their attention"), (self.pointwise, "their elementwise work"))
            if n
        ]
        return f"{self.full} of {layers} decoder blocks recomputed" + (
            f", {' and '.join(partial)} only" if partial else ""
        )


def block_activations(
    plan: RecomputePlan,
    layers: int,
    layer: float,
    block_input: float,
    partial: dict[str, float],
    head: float = 0.0,
    growing: float = 0.0,
) -> float:
    """Backward's peak over the decoder blocks' activations: all that the blocks saved at its start
    (``layer`` a kept block, ``block_input`` plus ``partial[mode]`` a recomputing one) with ``head``, what
    the scoring head's backward holds before the blocks' begins; then, at the last block of each
    recomputing mode, what that mode and those before it saved, plus the block's regenerated activations
    and their gradients (two blocks' worth, less what it had saved), plus the share of ``growing`` of the
    blocks after it: gradients that exist once their block's backward has run (all of them at the end)."""
    counts = {FULL: plan.full, ATTENTION: plan.attention, POINTWISE: plan.pointwise}
    peak = saved = 0.0
    before = 0  # blocks up to the last of this mode, in forward order
    for mode in (FULL, ATTENTION, POINTWISE):
        before += counts[mode]
        if counts[mode]:
            saved += counts[mode] * (block_input + partial.get(mode, 0.0))
            done = growing * (layers - before) / layers
            peak = max(peak, saved + 2 * layer - partial.get(mode, 0.0) + done)
    return max(peak, saved + (layers - before) * layer + head, growing)
