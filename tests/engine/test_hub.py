"""``USE_MODELSCOPE_HUB=1``: hub names resolved through ModelScope before a run starts.

ModelScope's servers cannot be reached here, so the download is the one thing stood in for: a
``modelscope`` module whose ``snapshot_download`` hands back local folders (the tiny model, the
synthetic data set), as the real one hands back its cache folder. Everything after it is real."""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from pathlib import Path

import pytest

from easyr1.cli import main
from easyr1.config import ConfigError, load_config
from easyr1.hub import modelscope_overrides


def _stand_in(monkeypatch: pytest.MonkeyPatch, folders: dict[tuple[str, str], Path]) -> list[tuple[str, str]]:
    """A ``modelscope`` module whose snapshot_download returns ``folders[(name, repo_type)]``."""
    calls: list[tuple[str, str]] = []

    def snapshot_download(name: str, repo_type: str = "model") -> str:
        calls.append((name, repo_type))
        return str(folders[(name, repo_type)])

    monkeypatch.setitem(sys.modules, "modelscope", types.SimpleNamespace(snapshot_download=snapshot_download))
    return calls


def test_hub_names_become_their_modelscope_copies(
    tiny_model: Callable[[str], Path], arithmetic: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tiny_model("qwen2")
    calls = _stand_in(
        monkeypatch,
        {("Qwen/Qwen2.5-0.5B-Instruct", "model"): model, ("hiyouga/math12k", "dataset"): arithmetic},
    )
    args = [
        "worker.actor.model.model_path=Qwen/Qwen2.5-0.5B-Instruct",
        "data.train_files=hiyouga/math12k@train",
        f"data.val_files={arithmetic}@test",  # a local path stays as it is
        "worker.actor.model.tokenizer_path=models/mine/tokenizer",
    ]  # so does one of three parts, even missing
    assert modelscope_overrides(load_config(args)) == []  # not asked for: names go to Hugging Face
    monkeypatch.setenv("USE_MODELSCOPE_HUB", "1")
    overrides = modelscope_overrides(load_config(args))
    assert overrides == [f"worker.actor.model.model_path={model}", f"data.train_files={arithmetic}@train"]
    assert calls == [("Qwen/Qwen2.5-0.5B-Instruct", "model"), ("hiyouga/math12k", "dataset")]
    resolved = load_config(args + overrides)
    assert (
        resolved.worker.actor.model.model_path == str(model)
        and resolved.data.val_files == f"{arithmetic}@test"
    )


def test_without_the_package_the_error_names_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "modelscope", None)  # not installed
    monkeypatch.setenv("USE_MODELSCOPE_HUB", "1")
    with pytest.raises(ConfigError, match="needs the modelscope package: pip install modelscope"):
        modelscope_overrides(load_config(["worker.actor.model.model_path=Qwen/Qwen2.5-0.5B-Instruct"]))
    assert main(["train", "worker.actor.model.model_path=Qwen/Qwen2.5-0.5B-Instruct"]) != 0
    assert "pip install modelscope" in capsys.readouterr().err
