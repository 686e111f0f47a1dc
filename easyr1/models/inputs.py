"""Variable-length samples -> padded model inputs, for text and Qwen-VL models alike.

Generation pads on the left (every prompt ends where decoding starts); training pads on the
right. Images and videos travel as the processor made them: ``pixel_values`` rows of all images of
the batch concatenated in order, with one ``image_grid_thw`` row per image, and likewise
``pixel_values_videos`` with ``video_grid_thw`` (and Qwen2.5-VL's ``second_per_grid_ts``) per video.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch


def pad(
    seqs: Sequence[torch.Tensor], pad_id: int, side: Literal["left", "right"]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack 1-D sequences into (ids, attention_mask), padding on ``side``."""
    width = max(int(s.numel()) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for row, seq in enumerate(seqs):
        n = int(seq.numel())
        cols = slice(width - n, width) if side == "left" else slice(0, n)
        ids[row, cols] = seq
        mask[row, cols] = 1
    return ids, mask


def vision_token_ids(model_config: Any) -> dict[str, int]:
    """The image/video placeholder ids of a VLM config ({} for text models)."""
    ids = {}
    for name in ("image_token_id", "video_token_id"):
        value = getattr(model_config, name, None)
        if value is not None:
            ids[name] = int(value)
    return ids


# Per-sample processor outputs that concatenate over a batch, in the order the model reads them.
_VISION_KEYS = (
    "pixel_values",
    "image_grid_thw",
    "pixel_values_videos",
    "video_grid_thw",
    "second_per_grid_ts",
)


def multimodal_kwargs(
    input_ids: torch.Tensor, per_sample: Sequence[dict[str, torch.Tensor]], model_config: Any
) -> dict[str, torch.Tensor]:
    """Model kwargs for the images and videos of a batch; {} when no sample has any.

    ``mm_token_type_ids`` (1 for image tokens, 2 for video tokens) is derived from the ids, so it
    stays right for any suffix appended to a prompt (responses contain no vision tokens).
    """
    kwargs: dict[str, torch.Tensor] = {}
    for key in _VISION_KEYS:
        parts = [torch.as_tensor(mm[key]) for mm in per_sample if mm and key in mm]
        if parts:
            kwargs[key] = torch.cat(parts, dim=0)
    if not kwargs:
        return {}
    token_ids = vision_token_ids(model_config)
    types = torch.zeros_like(input_ids, dtype=torch.int)
    if "image_token_id" in token_ids:
        types[input_ids == token_ids["image_token_id"]] = 1
    if "video_token_id" in token_ids:
        types[input_ids == token_ids["video_token_id"]] = 2
    kwargs["mm_token_type_ids"] = types
    return kwargs
