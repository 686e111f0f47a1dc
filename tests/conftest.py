"""Shared fixtures: offline tiny models, built once per test session."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """Factory: tiny_model("qwen2_5_vl") -> folder of a tiny model of that architecture (cached)."""
    from easyr1.models.tiny import build_tiny_model

    root = tmp_path_factory.mktemp("tiny_models")
    built: dict[str, Path] = {}

    def get(arch: str) -> Path:
        if arch not in built:
            built[arch] = build_tiny_model(arch, root / arch, seed=0)
        return built[arch]

    return get
