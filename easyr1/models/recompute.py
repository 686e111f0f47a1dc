"""What each decoder block recomputes in backward: one mode per block (``models.architecture``'s
``RECOMPUTE_MODES``), applied through Hugging Face's per-block gradient checkpointing and, for the
partial modes, torch's selective activation checkpointing.

- ``full``: the block keeps only its input and recomputes its whole forward in backward.
- ``attention``: it keeps the MLP's gate and up projections and recomputes the rest: the
  attention's projections and kernel, the norms and the elementwise work.
- ``pointwise``: it keeps every matmul's and the attention kernel's outputs and recomputes only the
  elementwise work (norms, rotary embedding, SiLU and product), which costs no matmul.
- ``keep``: no recomputation.

The partial modes save what their policy names and nothing else; torch.compile's partitioner
honours the same policy inside a compiled block (``workers.fsdp.compile_blocks`` puts the
checkpoint inside the compiled region there, where it can see it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cache, partial
from typing import Any

import torch
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from easyr1.models.architecture import ATTENTION, FULL, KEEP, POINTWISE
from easyr1.models.structure import text_blocks

_aten = torch.ops.aten
MATMULS = {_aten.mm.default, _aten.addmm.default, _aten.bmm.default, _aten.baddbmm.default}


def _is_attention_kernel(op: Any) -> bool:
    """SDPA's kernels on every device, and torch's varlen attention (``torch_attn._varlen_attn``)."""
    name = str(op)
    return "attention" in name or "_attn" in name


def _policy(mode: str, intermediate: int) -> Callable[..., CheckpointPolicy]:
    def policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        if mode == POINTWISE:
            keep = op in MATMULS or _is_attention_kernel(op)
        else:  # ATTENTION: the MLP's gate and up projections, the only matmuls of its width out
            keep = op in MATMULS and args[-1].shape[-1] == intermediate
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


@cache
def selective_context(mode: str, intermediate: int) -> Callable[[], Any]:
    """``torch.utils.checkpoint``'s ``context_fn`` for a partial mode of blocks whose MLP is
    ``intermediate`` wide. Cached, so that every block of a mode shares one (a compiled block's
    graph is guarded on it)."""
    if mode not in (ATTENTION, POINTWISE):
        raise ValueError(f"{mode!r} is not a partial recompute mode ({ATTENTION}, {POINTWISE})")
    return partial(create_selective_checkpoint_contexts, _policy(mode, intermediate))


def apply_recompute(model: torch.nn.Module, modes: Sequence[str] | None = None) -> None:
    """Gradient checkpointing by ``modes``, one per text decoder block in order (None: every block
    ``full``), and ``full`` on the vision tower's blocks. A block of a partial mode gets
    ``recompute_context``, its ``context_fn``; every other block gets None."""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    blocks = text_blocks(model)
    text = getattr(model.config, "text_config", None) or model.config
    for block, mode in zip(blocks, modes or [FULL] * len(blocks), strict=True):
        block.gradient_checkpointing = mode != KEEP
        block.recompute_context = None
        if mode in (ATTENTION, POINTWISE):
            block.recompute_context = selective_context(mode, text.intermediate_size)
            block._gradient_checkpointing_func = partial(
                checkpoint, use_reentrant=False, context_fn=block.recompute_context
            )
