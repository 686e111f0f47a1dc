"""Shared fixtures: offline tiny models (built once per test session), the arithmetic task, a one-rank
process group."""

from __future__ import annotations

import gc
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist

from easyr1.distributed.ports import free_port

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Every process the tests start (ranks forked from a forkserver, harness jobs) writes its threads'
# stacks if a fatal signal kills it: a rare crash in CI then says where it was.
os.environ.setdefault("PYTHONFAULTHANDLER", "1")

GROUPS = ("engine", "training", "harness")  # the folders under tests/, each a marker (tests/README.md)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each test carries its folder's marker, so ``pytest -m "not harness"`` selects by group."""
    for item in items:
        group = item.path.parent.name
        if group in GROUPS:
            item.add_marker(getattr(pytest.mark, group))


@pytest.fixture(scope="module")
def engine_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the engine package the harness runs (through PYTHONPATH), so a test can change it
    while the checkout stays as it is; one per test module."""
    root = tmp_path_factory.mktemp("engine")
    shutil.copytree(
        Path(__file__).resolve().parents[1] / "easyr1",
        root / "easyr1",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    return root


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


@pytest.fixture(scope="session")
def arithmetic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The synthetic arithmetic task, 32 train and 8 test problems (a module may override it)."""
    from easyr1.data.synthetic import write_task

    root = tmp_path_factory.mktemp("arithmetic")
    write_task("arithmetic", root, n_train=32, n_test=8, seed=0)
    return root


@pytest.fixture()
def one_rank() -> Any:
    """A one-rank gloo process group, for FSDP2 in the test's own process."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    yield
    dist.destroy_process_group()
    # The test's sharded models (their device meshes hold the group) may sit in reference cycles: free
    # them now, or the group's gloo threads outlive the test, and a later test that forks would copy
    # their locks into its children (which then wait forever).
    gc.collect()
