"""Variable-length samples -> padded model inputs, for text and Qwen-VL models alike.

Generation pads on the left (every prompt ends where decoding starts); training pads on the
right. Images travel as the processor made them: ``pixel_values`` rows of all images of the
batch concatenated in order, with one ``image_grid_thw`` row per image.
"""

from __future__ import annotations

from typing import Any, Literal, Sequence

import torch


def pad(seqs: Sequence[torch.Tensor], pad_id: int, side: Literal["left", "right"]) -> tuple[torch.Tensor, torch.Tensor]:
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


def multimodal_kwargs(
    input_ids: torch.Tensor, per_sample: Sequence[dict[str, torch.Tensor]], model_config: Any
) -> dict[str, torch.Tensor]:
    """Model kwargs for the images of a batch; {} when no sample has images.

    ``mm_token_type_ids`` (1 for image tokens, 2 for video tokens) is derived from the ids, so it
    stays right for any suffix appended to a prompt (responses contain no vision tokens).
    """
    with_images = [mm for mm in per_sample if mm and "pixel_values" in mm]
    if not with_images:
        return {}
    kwargs: dict[str, torch.Tensor] = {
        "pixel_values": torch.cat([mm["pixel_values"] for mm in with_images], dim=0),
        "image_grid_thw": torch.cat([mm["image_grid_thw"] for mm in with_images], dim=0),
    }
    token_ids = vision_token_ids(model_config)
    types = torch.zeros_like(input_ids, dtype=torch.int)
    if "image_token_id" in token_ids:
        types[input_ids == token_ids["image_token_id"]] = 1
    if "video_token_id" in token_ids:
        types[input_ids == token_ids["video_token_id"]] = 2
    kwargs["mm_token_type_ids"] = types
    return kwargs
