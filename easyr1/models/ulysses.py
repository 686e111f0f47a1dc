"""The model side of Ulysses sequence parallelism (``easyr1.distributed.ulysses`` has the scheme
and its collectives): a pre-hook on the language model that keeps each rank's slice of a packed row."""

from __future__ import annotations

from typing import Any

import torch

from easyr1.distributed.ulysses import Shard
from easyr1.models.structure import language_model


def slice_inputs(
    module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]
) -> tuple[tuple, dict[str, Any]]:
    """Forward pre-hook of the language model: keep this rank's slice of the row (token ids or
    embeddings, rotary positions, Qwen3-VL's deepstack features)."""
    shard: Shard | None = kwargs.get("packed_shard")
    if shard is None:
        return args, kwargs
    if args:  # the token-classification (critic) classes pass the ids by position
        (kwargs["input_ids"],), args = args, ()
    tokens = kwargs["inputs_embeds"] if kwargs.get("inputs_embeds") is not None else kwargs["input_ids"]
    start, end = shard.bounds(tokens.shape[1])
    visual = kwargs.get("visual_pos_masks")
    if kwargs.get("deepstack_visual_embeds") is not None:  # one row per visual token of the row
        first, last = int(visual[:, :start].sum()), int(visual[:, :end].sum())
        kwargs["deepstack_visual_embeds"] = [
            embeds[first:last] for embeds in kwargs["deepstack_visual_embeds"]
        ]
    for name in ("input_ids", "inputs_embeds", "visual_pos_masks"):
        if kwargs.get(name) is not None:
            kwargs[name] = kwargs[name][:, start:end]
    kwargs["position_ids"] = kwargs["position_ids"][..., start:end]
    return args, kwargs


def enable(model: torch.nn.Module, size: int) -> None:
    """Let ``model`` run rows split over groups of ``size`` ranks (call before sharding)."""
    text = getattr(model.config, "text_config", None) or model.config
    if text.num_attention_heads % size:
        raise ValueError(
            f"the model's {text.num_attention_heads} attention heads do not split over {size} ranks"
        )
    language_model(model).register_forward_pre_hook(slice_inputs, with_kwargs=True)
