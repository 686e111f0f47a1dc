"""Attention over packed rows: several sequences in one row, each attending only to itself.

Padding-free training (EasyR1's ``worker.actor.padding_free``) concatenates the sequences of a
micro-batch into one row of ``T`` tokens, so no compute or memory goes to padding. Attention must
then stay inside each sequence. Hugging Face's SDPA path would build a ``T x T`` block-diagonal
mask for that (a gigabyte for a 32k-token row); this module registers an attention function,
``PACKED``, that instead takes the sequence boundaries (``packed_cu_seqlens``, cumulative
lengths, and ``packed_max_seqlen``) as forward keyword arguments, which transformers hands down
to every decoder layer's attention:

- on CUDA in bf16/fp16, one call of ``torch.nn.attention.varlen.varlen_attn`` (FlashAttention's
  variable-length kernel) for the whole row;
- elsewhere (CPU ranks, fp32), one SDPA call over the row's sequences padded into a batch for
  attention alone (the linear layers still see real tokens only).

Under Ulysses sequence parallelism (``packed_shard``), each rank holds a slice of the row: an
all-to-all first gives it the whole row for its share of the heads (``distributed.ulysses``).

Without those arguments (generation, padded batches) it is exactly Hugging Face's SDPA, so a model
switched to ``PACKED`` serves both. Only the language model is switched to it: a Qwen-VL vision
tower gets ``VISION`` (``use_vision_attention``), the same kernels without the causal mask over the
boundaries of its images (or their attention windows), which the tower computes itself.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from functools import cache
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from easyr1.distributed import ulysses
from easyr1.models.structure import vision_tower

PACKED = "packed_sdpa"


@cache
def _varlen_attn() -> tuple[Callable[..., torch.Tensor], set[str]]:
    """torch's varlen attention and its arguments, imported on first use (CUDA only): the import
    brings in most of torch.compile's stack, which a CPU rank never uses (deferring it and the two
    compiled helpers' wrapping starts a rank a second sooner: 7.9 s against 8.9 to import the trainer)."""
    from torch.nn.attention.varlen import varlen_attn

    return varlen_attn, set(inspect.signature(varlen_attn).parameters)


def packed_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *,
    packed_cu_seqlens: torch.Tensor | None = None,
    packed_max_seqlen: int | None = None,
    packed_shard: ulysses.Shard | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """``[1, H, T, D]`` queries/keys/values of a packed row -> ``[1, T, H, D]``, causal within each
    sequence; anything else goes to SDPA unchanged."""
    if packed_cu_seqlens is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    if query.shape[0] != 1 or attention_mask is not None:
        raise ValueError("a packed row must come alone and without an attention mask")
    if packed_shard is not None:
        if key.shape[1] % packed_shard.size:  # too few key/value heads to split: one per query head
            key, value = (t.repeat_interleave(query.shape[1] // t.shape[1], dim=1) for t in (key, value))
        query, key, value = (ulysses.heads_to_sequence(t, packed_shard) for t in (query, key, value))
        out, _ = packed_attention(
            module,
            query,
            key,
            value,
            None,
            packed_cu_seqlens=packed_cu_seqlens,
            packed_max_seqlen=packed_max_seqlen,
            **kwargs,
        )
        return ulysses.sequence_to_heads(out.transpose(1, 2), packed_shard).transpose(1, 2), None
    return _within_sequences(
        module, query, key, value, packed_cu_seqlens, packed_max_seqlen, kwargs.get("scaling"), causal=True
    )


def vision_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *,
    cu_seq_lens_q: torch.Tensor,
    max_length_q: int,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """A Qwen-VL vision tower's attention: ``[1, H, T, D]`` over every image's patches (or window of
    patches) at once, each attending to itself, -> ``[1, T, H, D]``. Transformers' SDPA path loops in
    Python over the chunks instead, one SDPA call per window: 64 448x448 images make 16 windows each,
    some 29,000 calls per forward pass of a 32-block tower."""
    return _within_sequences(module, query, key, value, cu_seq_lens_q, max_length_q, scaling, causal=False)


def _within_sequences(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    scale: float | None,
    *,
    causal: bool,
) -> tuple[torch.Tensor, None]:
    """Attention of a row of sequences, each to itself (``cu_seqlens``): ``[1, H, T, D]`` -> ``[1, T, H, D]``."""
    if query.is_cuda and query.dtype in (torch.bfloat16, torch.float16):
        q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # [T, H, D]
        # torch 2.11 takes fewer key/value heads as they come; later releases ask for enable_gqa.
        varlen_attn, arguments = _varlen_attn()
        gqa = {"enable_gqa": True} if k.shape[1] != q.shape[1] and "enable_gqa" in arguments else {}
        out = varlen_attn(
            q,
            k,
            v,
            cu_seqlens,
            cu_seqlens,
            max_seqlen,
            max_seqlen,
            scale=scale,
            window_size=(-1, 0) if causal else (-1, -1),
            **gqa,
        )
        return out[None], None
    # One batched SDPA call: the row's sequences padded into [sequences, longest] for attention only.
    lengths = cu_seqlens.diff().to(query.device)
    offsets = torch.arange(int(lengths.max()), device=query.device)
    valid = offsets[None, :] < lengths[:, None]  # [N, L]
    index = (cu_seqlens[:-1].to(query.device)[:, None] + offsets[None, :]).clamp(max=query.shape[2] - 1)
    q, k, v = (t[0][:, index].transpose(0, 1) for t in (query, key, value))  # [N, H, L, D]
    allowed = valid[:, None, None, :]  # real keys only
    if causal:
        allowed = allowed & (offsets[:, None] >= offsets[None, :])
    out, _ = sdpa_attention_forward(module, q, k, v, allowed, scaling=scale)  # [N, L, H, D]
    return out[valid][None], None


def _packed_mask(*, attention_mask: torch.Tensor | None = None, **kwargs: Any) -> torch.Tensor | None:
    """A packed row needs no mask (the boundaries do the masking); padded batches get SDPA's."""
    if attention_mask is None:
        return None
    return sdpa_mask(attention_mask=attention_mask, **kwargs)


AttentionInterface.register(PACKED, packed_attention)
AttentionMaskInterface.register(PACKED, _packed_mask)
# "flash" in the name is what makes a Qwen-VL tower hand its attention the chunks' boundaries
# (transformers' ``is_flash_attention_requested``) instead of looping over them.
VISION = "easyr1_varlen_flash"
AttentionInterface.register(VISION, vision_attention)


def use_packed_attention(model: torch.nn.Module) -> None:
    """Switch the language model of ``model`` (not a vision tower) to ``PACKED``."""
    config = model.config
    if (
        getattr(config, "text_config", None) is not None
        and getattr(config, "vision_config", None) is not None
    ):
        model.set_attn_implementation({"text_config": PACKED})
    else:
        model.set_attn_implementation(PACKED)


def use_vision_attention(model: torch.nn.Module) -> None:
    """Switch a Qwen-VL model's vision tower to ``VISION`` (no-op for text models). Set on the
    tower's config object itself, which its blocks share; ``set_attn_implementation`` would check
    the name for a flash-attention package."""
    tower = vision_tower(model)
    if tower is not None:
        tower.config._attn_implementation = VISION
