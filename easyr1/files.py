"""Small helpers for the files of a model folder, shared by the code that writes one (tiny models,
warm starts, checkpoints and their Hugging Face export)."""

from __future__ import annotations

import os
from pathlib import Path

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf", ".onnx")


def is_weight_file(name: str) -> bool:
    """Whether a model folder's file ``name`` holds weights (or a sharded checkpoint's index)."""
    return name.endswith(WEIGHT_SUFFIXES) or name.endswith(".index.json")


def share_weight_files(folder: Path) -> None:
    """Give ``folder``'s weight files the mode an ordinary new file gets (0666 less the umask):
    safetensors writes them 0600, which the other users of a shared cluster cannot read."""
    umask = os.umask(0o022)
    os.umask(umask)
    for file in folder.iterdir():
        if is_weight_file(file.name):
            file.chmod(0o666 & ~umask)
