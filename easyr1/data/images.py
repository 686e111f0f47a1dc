"""Image decoding and resizing for EasyR1-format datasets.

Datasets store images in three ways: ``{"bytes": ...}`` dicts (what Hugging Face's ``Image``
feature writes to parquet, often with a ``"path"`` too), file paths, or PIL images already
decoded by ``datasets``. All of them become RGB PIL images whose pixel count lies within
``[min_pixels, max_pixels]``, so the processor's token count per image stays bounded.
"""

from __future__ import annotations

import io
import math
import os
from typing import Any

from PIL import Image


class ImageError(ValueError):
    """An image could not be read; the message says which one."""


def describe(item: Any) -> str:
    """A short human-readable description of an image entry, for error messages."""
    if isinstance(item, dict):
        if item.get("bytes") is not None:
            data = item["bytes"]
            return f"bytes ({len(data)} bytes, starting {bytes(data[:8])!r})"
        if item.get("path"):
            return f"path {item['path']!r}"
        return f"dict with keys {sorted(item)}"
    if isinstance(item, (bytes, bytearray)):
        return f"bytes ({len(item)} bytes, starting {bytes(item[:8])!r})"
    if isinstance(item, (str, os.PathLike)):
        return f"path {os.fspath(item)!r}"
    return type(item).__name__


def load_image(item: Any, image_dir: str | None = None) -> Image.Image:
    """Decode one image entry to an RGB PIL image; relative paths are joined with ``image_dir``."""
    try:
        if isinstance(item, Image.Image):
            image = item
        elif isinstance(item, dict) and item.get("bytes") is not None:
            image = Image.open(io.BytesIO(item["bytes"]))
        elif isinstance(item, dict) and item.get("path"):
            image = Image.open(_resolve(item["path"], image_dir))
        elif isinstance(item, (bytes, bytearray)):
            image = Image.open(io.BytesIO(item))
        elif isinstance(item, (str, os.PathLike)):
            image = Image.open(_resolve(os.fspath(item), image_dir))
        else:
            raise ImageError(f"unsupported image entry of type {type(item).__name__}")
        image.load()
    except ImageError:
        raise
    except Exception as exc:  # PIL raises several unrelated types for bad data
        raise ImageError(f"cannot read image {describe(item)}: {exc}") from exc
    return image.convert("RGB") if image.mode != "RGB" else image


def _resolve(path: str, image_dir: str | None) -> str:
    if image_dir is not None and not os.path.isabs(path):
        return os.path.join(os.path.expanduser(image_dir), path)
    return path


def resize_image(image: Image.Image, min_pixels: int | None, max_pixels: int | None) -> Image.Image:
    """Scale ``image`` (keeping its aspect ratio) so its pixel count lies in [min_pixels, max_pixels]."""
    width, height = image.size
    pixels = width * height
    if max_pixels is not None and pixels > max_pixels:
        scale = math.sqrt(max_pixels / pixels)
        size = (max(1, math.floor(width * scale)), max(1, math.floor(height * scale)))
    elif min_pixels is not None and pixels < min_pixels:
        scale = math.sqrt(min_pixels / pixels)
        size = (math.ceil(width * scale), math.ceil(height * scale))
    else:
        return image
    return image.resize(size, Image.Resampling.BICUBIC)


def prepare_image(
    item: Any, image_dir: str | None, min_pixels: int | None, max_pixels: int | None
) -> Image.Image:
    """Decode and resize one image entry, as the dataset feeds it to the processor."""
    return resize_image(load_image(item, image_dir), min_pixels, max_pixels)
