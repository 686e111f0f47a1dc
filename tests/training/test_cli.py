"""The command line: each tool command end to end, in process."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from easyr1.cli import main
from easyr1.config import from_yaml


def test_config_command_prints_a_config_that_reads_back(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "worker.rollout.n=4", "trainer.logger=[console,file]"]) == 0
    text = capsys.readouterr().out
    config = from_yaml(text)
    assert config.worker.rollout.n == 4 and config.trainer.logger == ["console", "file"]


def test_config_errors_exit_2_with_the_key(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "worker.rollout.nn=4"]) == 2
    assert "did you mean worker.rollout.n?" in capsys.readouterr().err


def test_unknown_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trian"]) == 2
    assert "unknown command 'trian'" in capsys.readouterr().err


def test_make_data_and_tiny_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            [
                "make-data",
                "--task",
                "count_shapes",
                "--out",
                str(tmp_path / "d"),
                "--train",
                "4",
                "--test",
                "2",
                "--format",
                "jsonl",
                "--image-size",
                "84",
            ]
        )
        == 0
    )
    assert (tmp_path / "d" / "train.jsonl").is_file() and (tmp_path / "d" / "images").is_dir()
    assert main(["tiny-model", "--arch", "qwen3", "--out", str(tmp_path / "m")]) == 0
    config = yaml.safe_load((tmp_path / "m" / "config.json").read_text())
    assert config["model_type"] == "qwen3" and config["hidden_size"] == 64


def test_help_lists_every_command_and_a_config_commands_usage(capsys: pytest.CaptureFixture[str]) -> None:
    from easyr1.cli import COMMANDS

    assert main(["--help"]) == 0
    listing = capsys.readouterr().out
    assert all(f"  {name} " in listing for name in COMMANDS)
    for command in ("train", "config"):
        assert main([command, "--help"]) == 0  # not a config error about "--help"
        out = capsys.readouterr().out
        assert (
            out.startswith(f"usage: easyr1 {command} [config=FILE.yaml] [KEY=VALUE ...]")
            and "easyr1 config" in out
        )
    assert main([]) == 2 and "commands:" in capsys.readouterr().err
