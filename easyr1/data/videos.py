"""Video decoding, frame sampling and frame resizing for EasyR1-format datasets (PyAV, no torchvision).

A row's ``videos`` entries are file paths (joined with ``data.image_dir``, as EasyR1 does),
``{"bytes": ...}`` / ``{"path": ...}`` dicts or raw bytes of a video file (mp4, mkv, webm, ...).
Frames are sampled as qwen-vl-utils samples them for EasyR1: ``data.video_fps`` frames per second
of video, at least ``MIN_FRAMES`` (fewer only when the file has fewer), at most
``data.video_max_frames``, an even count (the vision tower groups 2 frames per temporal patch),
spread evenly over the file. Each sampled frame is then scaled into ``[min_pixels, max_pixels]``
like an image (``images.resize_image``); the model's processor does the rest (``models.video``).
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from PIL import Image

from easyr1.data.images import describe, resize_image

if TYPE_CHECKING:
    from transformers.video_utils import VideoMetadata

MIN_FRAMES = 4  # qwen-vl-utils' and transformers' Qwen-VL minimum, when the file has that many
FRAME_FACTOR = 2  # frames come in pairs: the Qwen-VL vision towers' temporal patch


class VideoError(ValueError):
    """A video could not be read; the message says which one."""


@dataclass(frozen=True)
class Video:
    """The sampled, resized frames of one video and where they came from.

    ``indices`` are the sampled frames' positions in the file and ``fps`` its frame rate: Qwen2.5-VL's
    ``second_per_grid_ts`` and Qwen3-VL's frame timestamps are computed from them.
    """

    frames: np.ndarray  # [T, H, W, 3] uint8
    fps: float
    total_frames: int
    indices: tuple[int, ...]

    def metadata(self) -> VideoMetadata:
        """The transformers form the Qwen-VL processors read."""
        from transformers.video_utils import (
            VideoMetadata,  # here: synthetic.py imports this module without torch
        )

        frames, height, width, _ = self.frames.shape
        return VideoMetadata(
            total_num_frames=self.total_frames,
            fps=self.fps,
            width=width,
            height=height,
            duration=self.total_frames / self.fps,
            video_backend="pyav",
            frames_indices=list(self.indices),
        )

    @property
    def sampled_fps(self) -> float:
        """Sampled frames per second of video time."""
        return len(self.indices) / self.total_frames * self.fps


def sample_indices(total_frames: int, fps: float, video_fps: float, max_frames: int) -> list[int]:
    """Which of a file's ``total_frames`` (at ``fps``) to keep: ``video_fps`` per second of video,
    clamped to ``[MIN_FRAMES, max_frames]`` and to the frames the file has, rounded to an even count,
    evenly spaced from the first frame to the last. A file of one frame gives it twice."""
    if max_frames < FRAME_FACTOR:
        raise ValueError(f"max_frames={max_frames}: at least {FRAME_FACTOR} frames are needed")
    high = max(FRAME_FACTOR, min(max_frames, total_frames) // FRAME_FACTOR * FRAME_FACTOR)
    wanted = min(max(total_frames / fps * video_fps, MIN_FRAMES), high)
    count = min(high, max(FRAME_FACTOR, round(wanted / FRAME_FACTOR) * FRAME_FACTOR))
    return np.linspace(0, total_frames - 1, count).round().astype(int).tolist()


def _source(item: Any, video_dir: str | None) -> Any:
    """What PyAV opens for a video entry: a file name or an in-memory file."""
    if isinstance(item, dict) and item.get("bytes") is not None:
        return io.BytesIO(item["bytes"])
    if isinstance(item, (bytes, bytearray)):
        return io.BytesIO(item)
    path = item.get("path") if isinstance(item, dict) else item
    if isinstance(path, (str, os.PathLike)) and path:
        path = os.fspath(path)
        if video_dir is not None and not os.path.isabs(path):
            path = os.path.join(os.path.expanduser(video_dir), path)
        if not os.path.isfile(path):
            raise VideoError(f"no such video file: {path!r}")
        return path
    raise VideoError(
        f"unsupported video entry: {describe(item)} (use a file path, bytes or a {{'bytes': ...}} dict)"
    )


def load_video(
    item: Any,
    video_dir: str | None,
    video_fps: float,
    max_frames: int,
    min_pixels: int | None,
    max_pixels: int | None,
) -> Video:
    """Decode one video entry, keep the frames ``sample_indices`` picks, and scale each into
    ``[min_pixels, max_pixels]``. Only the kept frames are converted to RGB arrays."""
    import av  # PyAV: imported here, so image and text datasets never need it

    source = _source(item, video_dir)
    try:
        with av.open(source) as container:
            if not container.streams.video:
                raise VideoError(f"{describe(item)} has no video stream")
            stream = container.streams.video[0]
            rate = stream.average_rate or stream.guessed_rate or stream.base_rate
            fps = float(rate) if rate else 0.0
            # The container's frame count can be missing or wrong: count by decoding, then decode again
            # keeping only the sampled frames, so a long video is never held in memory whole.
            total = sum(1 for _ in container.decode(stream))
            if total == 0 or fps <= 0:
                raise VideoError(f"{describe(item)} has {'no frames' if total == 0 else 'no frame rate'}")
            indices = sample_indices(total, fps, video_fps, max_frames)
            container.seek(0)
            wanted = set(indices)
            kept = {i: frame.to_image() for i, frame in enumerate(container.decode(stream)) if i in wanted}
    except VideoError:
        raise
    except Exception as exc:  # PyAV raises its own error types for damaged or unknown files
        raise VideoError(f"cannot read video {describe(item)}: {exc}") from exc
    if len(kept) != len(wanted):
        raise VideoError(f"{describe(item)}: decoding twice gave different frames")
    frames = [np.asarray(resize_image(kept[i], min_pixels, max_pixels).convert("RGB")) for i in indices]
    return Video(np.stack(frames), fps, total, tuple(indices))


def encode_video(frames: list[Image.Image], fps: int, codec: str = "libx264") -> bytes:
    """Frames -> the bytes of an mp4 file, for synthetic tasks and tests; x264 at qp 0 in 4:4:4 by
    default, which gives the frames back up to RGB/YUV rounding (a few levels)."""
    import av

    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="mp4") as container:
        stream = container.add_stream(codec, rate=fps)
        stream.width, stream.height = frames[0].size
        stream.pix_fmt = "yuv444p" if codec == "libx264" else "yuv420p"
        if codec == "libx264":
            stream.options = {"qp": "0"}
        for image in frames:
            for packet in stream.encode(av.VideoFrame.from_image(image.convert("RGB"))):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buffer.getvalue()
