"""Resuming a real run (2 CPU ranks) in a folder whose newest checkpoint is corrupted, with a changed
config: the corrupted checkpoint is skipped with a message, a new lr really takes effect (and says
so), the metrics hold each step once, and a change that would reinterpret the checkpoint is refused."""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
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
    assert (
        f"skipping {run_dir / 'global_step_3'}: actor/__0_0.distcp does not match its checksum"
        in resumed.stderr
    )
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


def test_resume_on_training_data_changed_in_place(tiny_model: Callable[[str], Path], tmp_path: Path) -> None:
    """The same number of rows, reordered and every answer replaced: resuming is refused before any
    model loads, naming the data and the key that allows it; with trainer.allow_changed_data=true it
    resumes and says so, but not on a changed number of rows (the saved position counts them); a
    checkpoint saved before checkpoints held a fingerprint resumes with a note."""
    data = tmp_path / "data"
    write_task("arithmetic", data, n_train=32, n_test=8, seed=0)
    run_dir = tmp_path / "run"
    config = tiny_config(tiny_model("qwen2"), data, run_dir)
    config["trainer"].update(val_before_train=False, val_freq=-1, save_freq=2, max_steps=2)
    first = run_train(config, tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    assert (
        json.loads((run_dir / "global_step_2" / "trainer_state.json").read_text())["data_fingerprint"]["rows"]
        == 32
    )

    table = pq.read_table(data / "train.parquet")
    rows = [{**row, "answer": "0"} for row in reversed(table.to_pylist())]
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), data / "train.parquet")
    refused = run_train(config, tmp_path, "trainer.max_steps=3")
    assert refused.returncode != 0
    assert (
        f"cannot resume from {run_dir / 'global_step_2'}: data.train_files={data}@train changed since it was saved: "
        "the prompts or answers of its 32 rows are not those it was saved with" in refused.stderr
    ), refused.stderr[-3000:]
    assert "trainer.allow_changed_data=true" in refused.stderr and "Traceback" not in refused.stderr
    assert "Loading weights" not in refused.stderr  # before any model loads

    pq.write_table(pa.Table.from_pylist(rows[:-1], schema=table.schema), data / "train.parquet")
    fewer = run_train(config, tmp_path, "trainer.max_steps=3", "trainer.allow_changed_data=true")
    assert fewer.returncode != 0
    assert f"data.train_files={data}@train has 31 rows, 32 when it was saved" in fewer.stderr, fewer.stderr[
        -3000:
    ]
    assert "Traceback" not in fewer.stderr and "Loading weights" not in fewer.stderr

    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), data / "train.parquet")
    allowed = run_train(config, tmp_path, "trainer.max_steps=3", "trainer.allow_changed_data=true")
    assert allowed.returncode == 0, allowed.stderr[-3000:]
    assert (
        "[checkpoint] resuming on changed training data (trainer.allow_changed_data=true)" in allowed.stderr
    )
    assert "global_step_2 (step 2)" in allowed.stdout

    # A checkpoint written before checkpoints recorded the data (its marker's checksum made to match).
    path = run_dir / "global_step_3"
    state = json.loads((path / "trainer_state.json").read_text())
    del state["data_fingerprint"]
    (path / "trainer_state.json").write_text(json.dumps(state))
    marker = json.loads((path / "checkpoint_complete.json").read_text())
    marker["crc32"]["trainer_state.json"] = f"{zlib.crc32((path / 'trainer_state.json').read_bytes()):08x}"
    (path / "checkpoint_complete.json").write_text(json.dumps(marker))
    old = run_train(config, tmp_path, "trainer.max_steps=4")
    assert old.returncode == 0, old.stderr[-3000:]
    assert f"[checkpoint] {path} holds no fingerprint of the training data" in old.stderr
    assert "global_step_3 (step 3)" in old.stdout
