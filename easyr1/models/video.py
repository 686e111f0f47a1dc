"""The Qwen-VL video processor's work without torchvision: sampled frames -> ``pixel_values_videos``.

transformers' Qwen-VL video processors resize with torchvision, which must not be installed on CPU
machines (see loading.py), so this module does their steps with PIL and torch, and the loader puts it
in the processor's ``video_processor`` place on every machine (one way, whatever is installed). The
processor itself still expands each ``<|video_pad|>`` (Qwen3-VL with its frame timestamps) and adds
Qwen2.5-VL's ``second_per_grid_ts``, from the ``video_metadata`` given with the frames.

Steps, as transformers' ``Qwen2VLVideoProcessor`` / ``Qwen3VLVideoProcessor`` take them:
1. resize every frame of a video to one size whose sides are multiples of ``patch_size * merge_size``,
   within the processor's pixel bounds: per frame for Qwen2-VL and Qwen2.5-VL, over all frames
   (``frames * height * width``) for Qwen3-VL;
2. rescale to [0, 1] and normalize with the processor's mean and std;
3. repeat the last frame up to a multiple of ``temporal_patch_size``;
4. cut into ``temporal_patch_size x patch_size x patch_size`` patches, ordered by time, then by
   ``merge_size x merge_size`` block, then within the block (the vision tower merges each block
   into one token): ``(T/tps)·(H/p)·(W/p)`` rows and ``(T/tps)·(H/p)·(W/p)/merge²`` tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image
from transformers import BatchFeature
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as frame_smart_resize
from transformers.models.qwen3_vl.video_processing_qwen3_vl import smart_resize as video_smart_resize

# Model types whose pixel bounds apply to the whole video (frames x height x width), not to one frame.
_WHOLE_VIDEO_BOUNDS = ("qwen3_vl", "qwen3_vl_moe")


@dataclass(frozen=True)
class FrameVideoProcessor:
    """Stands in a Qwen-VL processor's ``video_processor`` place; called with a list of
    ``[T, H, W, 3]`` uint8 frame arrays and their ``video_metadata``."""

    patch_size: int
    temporal_patch_size: int
    merge_size: int
    min_pixels: int
    max_pixels: int
    image_mean: tuple[float, ...]
    image_std: tuple[float, ...]
    whole_video_bounds: bool
    rescale_factor: float = 1 / 255

    @classmethod
    def from_settings(cls, settings: dict[str, Any], model_type: str) -> FrameVideoProcessor:
        """From a ``video_preprocessor_config.json`` (a downloaded Qwen-VL folder has one) or, without
        one, the image processor's settings (tiny test models: their image and video settings agree)."""
        size = settings.get("size") or {}
        return cls(
            patch_size=int(settings["patch_size"]),
            temporal_patch_size=int(settings["temporal_patch_size"]),
            merge_size=int(settings["merge_size"]),
            min_pixels=int(size.get("shortest_edge", settings.get("min_pixels"))),
            max_pixels=int(size.get("longest_edge", settings.get("max_pixels"))),
            image_mean=tuple(float(x) for x in settings["image_mean"]),
            image_std=tuple(float(x) for x in settings["image_std"]),
            whole_video_bounds=model_type in _WHOLE_VIDEO_BOUNDS,
            rescale_factor=float(settings.get("rescale_factor", 1 / 255)),
        )

    def save_pretrained(self, *args: Any, **kwargs: Any) -> list[str]:
        """Writes nothing: a saved folder keeps the model folder's own video config, copied with its files."""
        return []

    def target_size(self, frames: int, height: int, width: int) -> tuple[int, int]:
        """(height, width) every frame of a ``frames``-frame video is resized to."""
        factor = self.patch_size * self.merge_size
        if self.whole_video_bounds:
            return video_smart_resize(
                frames,
                height,
                width,
                temporal_factor=self.temporal_patch_size,
                factor=factor,
                min_pixels=self.min_pixels,
                max_pixels=self.max_pixels,
            )
        return frame_smart_resize(
            height, width, factor=factor, min_pixels=self.min_pixels, max_pixels=self.max_pixels
        )

    def pixels(self, frames: np.ndarray) -> tuple[torch.Tensor, list[int]]:
        """One video's ``[T, H, W, 3]`` uint8 frames -> (patch rows, [grid_t, grid_h, grid_w])."""
        count, height, width, _ = frames.shape
        size = self.target_size(count, height, width)
        if size != (height, width):
            frames = np.stack(
                [np.asarray(Image.fromarray(f).resize(size[::-1], Image.Resampling.BICUBIC)) for f in frames]
            )
        video = torch.from_numpy(np.ascontiguousarray(frames)).float() * self.rescale_factor
        video = (video - torch.tensor(self.image_mean)) / torch.tensor(self.image_std)
        video = video.permute(0, 3, 1, 2)  # T, C, H, W
        if pad := -count % self.temporal_patch_size:
            video = torch.cat([video, video[-1:].expand(pad, -1, -1, -1)])
        t, tps, p, m = video.shape[0], self.temporal_patch_size, self.patch_size, self.merge_size
        channels, grid_t, grid_h, grid_w = video.shape[1], t // tps, size[0] // p, size[1] // p
        patches = video.reshape(grid_t, tps, channels, grid_h // m, m, p, grid_w // m, m, p)
        patches = patches.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
        return patches.reshape(grid_t * grid_h * grid_w, channels * tps * p * p), [grid_t, grid_h, grid_w]

    def __call__(
        self, videos: Sequence[np.ndarray], video_metadata: Sequence[Any] | None = None, **kwargs: Any
    ) -> BatchFeature:
        if video_metadata is None or len(video_metadata) != len(videos):
            raise ValueError("each video needs its video_metadata (frame rate and sampled frames)")
        rows, grids = zip(*(self.pixels(np.asarray(video)) for video in videos), strict=True)
        return BatchFeature(
            {
                "pixel_values_videos": torch.cat(rows),
                "video_grid_thw": torch.tensor(grids, dtype=torch.long),
                "video_metadata": list(video_metadata),
            }
        )
