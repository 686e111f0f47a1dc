"""Resuming a real run (2 CPU ranks) in a folder whose newest checkpoint is corrupted, with a changed
config: the corrupted checkpoint is skipped with a message, a new lr really takes effect (and says
so), the metrics hold each step once, and a change that would reinterpret the checkpoint is refused."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import pytest

from easyr1.data.synthetic import write_task
from tests.trainer_utils import read_metrics, run_train, tiny_config


def _flip_one_byte(file: Path) -> None:
    """Corrupt ``file`` in place without changing its size (what a bad disk or copy does)."""
    with file.open("r+b") as f:
        f.seek(file.stat().st_size // 2)
        byte = f.read(1)[0]
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte ^ 0xFF]))


def test_resume_with_a_changed_config(tiny_model: Callable[[str], Path], tmp_path: Path) -> None:
    data = tmp_path / "data"
    write_task("arithmetic", data, n_train=32, n_test=8, seed=0)
    run_dir = tmp_path / "run"
    config = tiny_config(tiny_model("qwen2"), data, run_dir)
    config["trainer"].update(val_before_train=False, val_freq=-1, save_freq=2, max_steps=3)
    # A warmup over 4 steps: step s trains at lr * s / 4, so the lr shows the schedule's position too.
    config["worker"]["actor"]["optim"].update(lr=1.0e-3, lr_warmup_steps=4)

    first = run_train(config, tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    assert [m["actor/lr"] for m in read_metrics(run_dir)] == pytest.approx([2.5e-4, 5e-4, 7.5e-4])
    _flip_one_byte(run_dir / "global_step_3" / "actor" / "__0_0.distcp")

    resumed = run_train(config, tmp_path, "worker.actor.optim.lr=5e-4", "trainer.max_steps=4")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"skipping {run_dir / 'global_step_3'}: actor/__0_0.distcp does not match its checksum" in resumed.stderr
    assert "resumed from" in resumed.stdout and "global_step_2 (step 2)" in resumed.stdout
    assert "[checkpoint] resuming with worker.actor.optim.lr: 0.001 -> 0.0005 (applied)" in resumed.stderr
    assert "[checkpoint] resuming with trainer.max_steps: 3 -> 4 (applied)" in resumed.stderr
    metrics = read_metrics(run_dir)
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]  # step 3 of the first run was dropped, then redone
    assert [m["actor/lr"] for m in metrics] == pytest.approx([2.5e-4, 5e-4, 3.75e-4, 5e-4])

    recorded = (run_dir / "config.yaml").read_text()
    refused = run_train(config, tmp_path, "data.rollout_batch_size=8")
    assert refused.returncode != 0
    assert (run_dir / "config.yaml").read_text() == recorded  # refused before the run folder is touched
    assert f"cannot resume from {run_dir / 'global_step_4'}" in refused.stderr
    assert "  data.rollout_batch_size: 4 -> 8\n" in refused.stderr
    assert "trainer.find_last_checkpoint=false" in refused.stderr
    assert [m["step"] for m in read_metrics(run_dir)] == [1, 2, 3, 4]

    # A step limit below the checkpoint's: nothing to train, and said (it once exited 0 without a word).
    below = run_train(config, tmp_path, "worker.actor.optim.lr=5e-4", "trainer.max_steps=2")
    assert below.returncode == 0, below.stderr[-3000:]
    expected = f"the checkpoint resumed ({run_dir / 'global_step_4'}) is at step 4, beyond the 2 steps of trainer.max_steps=2"
    assert expected in below.stderr, below.stderr[-3000:]
    assert [m["step"] for m in read_metrics(run_dir)] == [1, 2, 3, 4]
