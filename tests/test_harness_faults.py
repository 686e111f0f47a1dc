"""The harness on damaged files: a cell folder with a cut or broken file (a rank or job killed while
writing it, a full disk, a hand edit) fails that cell alone, naming the file and what to delete; the
files the harness writes are written whole or not at all; a record is committed whole or not at all.

Cell folders are laid out here as a finished run leaves them (the files collect reads), so these
tests take seconds; tests/test_harness.py runs the matrix for real.
"""

from __future__ import annotations

import csv
import json
import re
import shutil
from pathlib import Path
from typing import Callable

import pytest
import yaml

from rules.scripts.cell import DamagedFile, hardware, read_status, train, write_atomic
from rules.scripts.collect import collect
from rules.scripts.record import record
from tests.test_harness import REPO, TINY, snakemake

CELLS = ("qwen2-grpo-arithmetic-amp", "qwen2-gspo-arithmetic-amp")  # tests/harness/tiny.yaml's text cells
ENGINE = {"fingerprint": "6385dce01934", "git": "cba3d1242335"}
RECORD = REPO / "baselines" / "cpu" / "2026-12-03-8ce11499300c"  # a committed record: results and curves


def write_run(run_dir: Path) -> None:
    """A finished cell's folder: the harness's cell.json, status.json, result.json and merge.json, the
    engine's config.yaml and metrics.jsonl (validated before RL and at step 2)."""
    run_dir.mkdir(parents=True)
    name = run_dir.name
    cell = {
        "name": name,
        "model": "qwen2",
        "size": "136K",
        "algorithm": name.split("-")[1],
        "dataset": "arithmetic",
        "precision": "amp",
        "lora": 0,
        "gpus": 0,
        "seed": 1,
        "steps": 2,
        "environment": "native",
        "image": None,
        "nodes": 1,
        "launcher": "local",
        "hash": f"hash-{name}",
        "engine": ENGINE["fingerprint"],
    }
    status = {
        "status": "ok",
        "exit_code": 0,
        "started": "2026-12-05T02:19:25+00:00",
        "attempt": "",
        "resumed_from": None,
        "wall_s": 8.7,
        "error_tail": "",
        "hardware": hardware(),
        "engine": ENGINE["fingerprint"],
        "git": ENGINE["git"],
        "versions": {"easyr1": "0.1.0"},
        "image_id": "",
    }
    config = {
        "worker": {"actor": {"optim": {"lr": 1e-4}}, "rollout": {"name": "hf"}},
        "trainer": {"n_gpus_per_node": 2},
    }
    metrics = [
        {"step": 0, "val/accuracy": 0.25},
        {"step": 1, "reward/accuracy": 0.5, "perf/time_per_step": 0.2, "perf/throughput": 3000.0},
        {
            "step": 2,
            "reward/accuracy": 0.75,
            "perf/time_per_step": 0.2,
            "perf/throughput": 3100.0,
            "val/accuracy": 0.5,
        },
    ]
    for file in ("status.json", "result.json"):
        (run_dir / file).write_text(json.dumps(status, indent=2))
    (run_dir / "cell.json").write_text(json.dumps(cell, indent=2))
    (run_dir / "merge.json").write_text(
        json.dumps({"status": "ok", "exit_code": 0, "error_tail": ""}, indent=2)
    )
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))


@pytest.fixture()
def runs(tmp_path: Path) -> Path:
    """A working directory whose runs/ holds the two finished cells."""
    for name in CELLS:
        write_run(tmp_path / "runs" / name)
    return tmp_path


def cut(path: Path, keep: int) -> None:
    """``path`` cut after ``keep`` characters (negative: that many off the end), as a killed writer leaves it."""
    path.write_text(path.read_text()[:keep])


def collected(work: Path) -> tuple[dict[str, dict[str, str]], list[dict[str, str]]]:
    """collect on every cell of ``work``: results.csv's rows by cell, and curves.csv's points."""
    runs = work / "runs"
    collect(
        [str(runs / c / "status.json") for c in CELLS],
        str(runs / "results.csv"),
        str(runs / "curves.csv"),
        str(runs / "collect.log"),
    )
    with (runs / "results.csv").open() as f:
        rows = {r["cell"]: r for r in csv.DictReader(f)}
    with (runs / "curves.csv").open() as f:
        return rows, list(csv.DictReader(f))


def test_a_torn_last_metrics_line_is_left_out(runs):
    """A rank that died while writing its last step leaves a torn line; the engine reads past it,
    and so does collect."""
    cut(runs / "runs" / CELLS[0] / "metrics.jsonl", -20)
    rows, points = collected(runs)
    assert rows[CELLS[0]]["status"] == "ok"
    assert rows[CELLS[0]]["steps_done"] == "1"  # step 2 was the torn line
    assert rows[CELLS[0]]["val_after"] == ""
    assert [p["step"] for p in points if p["cell"] == CELLS[0]] == ["0", "1"]


def _middle_line(run_dir: Path) -> Path:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines(keepends=True)
    (run_dir / "metrics.jsonl").write_text(lines[0] + lines[1][:30] + "\n" + lines[2])
    return run_dir / "metrics.jsonl"


def _cut_json(name: str) -> Callable[[Path], Path]:
    def damage(run_dir: Path) -> Path:
        cut(run_dir / name, 40)
        return run_dir / name

    return damage


def _without_key(name: str, key: str) -> Callable[[Path], Path]:
    """Valid JSON without a key collect reads (a hand edit, or a file from an older harness)."""

    def damage(run_dir: Path) -> Path:
        value = json.loads((run_dir / name).read_text())
        del value[key]
        (run_dir / name).write_text(json.dumps(value))
        return run_dir / name

    return damage


def _broken_config(run_dir: Path) -> Path:
    (run_dir / "config.yaml").write_text('worker: {actor: {optim: {lr: "1e-4\n')
    return run_dir / "config.yaml"


DAMAGES = {
    "a bad metrics line before the last": (_middle_line, "line 2"),
    "a cut cell.json": (_cut_json("cell.json"), "delete the folder"),
    "a cut merge.json": (_cut_json("merge.json"), "delete it"),
    "a broken config.yaml": (_broken_config, "delete the folder"),
    "a cell.json without its hash": (_without_key("cell.json", "hash"), "(no key 'hash'); delete the folder"),
    "a status.json without its hardware": (_without_key("status.json", "hardware"), "(no key 'hardware'); delete it"),
    "a merge.json without its status": (_without_key("merge.json", "status"), "(no key 'status'); delete it"),
}


@pytest.mark.parametrize("damage", DAMAGES, ids=list(DAMAGES))
def test_a_damaged_file_fails_its_cell_alone_and_names_the_file(damage, runs):
    make, fix = DAMAGES[damage]
    damaged = make(runs / "runs" / CELLS[0])
    rows, points = collected(runs)
    assert rows[CELLS[0]]["status"] == "failed"
    assert (
        rows[CELLS[0]]["error_tail"].startswith(f"{damaged} cannot be read (")
        and fix in rows[CELLS[0]]["error_tail"]
    )
    assert rows[CELLS[1]]["status"] == "ok" and rows[CELLS[1]]["val_after"] == "0.5"
    assert {p["cell"] for p in points} == {CELLS[1]}


def test_the_page_shows_a_cell_whose_cell_json_is_cut_as_failed(runs):
    """Its axes are unknown, yet the page is written, with the file in the cell's failure."""
    pytest.importorskip("pandas")
    from reports.baselines import Report, write_report

    cut(runs / "runs" / CELLS[0] / "cell.json", 40)
    collected(runs)
    out = runs / "assets"
    report = Report(
        results=str(runs / "runs" / "results.csv"),
        curves=str(runs / "runs" / "curves.csv"),
        recorded=[],
        matrix=str(TINY),
        engine=ENGINE["fingerprint"],
        repo=REPO,
    )
    write_report(
        report, str(out / "baselines.md"), str(out / "history.md"), str(out / "figures"), str(out / "log")
    )
    page = (out / "baselines.md").read_text()
    assert f"<summary>{CELLS[0]}: FAILED</summary>" in page
    assert f"{runs / 'runs' / CELLS[0] / 'cell.json'} cannot be read" in page
    assert "2 cells (2 configurations x seeds), 1 finished, 1 failed" in page


@pytest.mark.parametrize("damage", ["cut", "without its attempt"])
def test_a_damaged_status_is_named_with_its_fix_before_any_job(damage, tmp_path):
    """The train rule's params read every cell's status.json to build the DAG: a damaged one stops
    the whole workflow, so its message must say which file and what to do."""
    status = tmp_path / "runs" / CELLS[0] / "status.json"
    write_run(status.parent)
    if damage == "cut":
        cut(status, 100)
        with pytest.raises(DamagedFile, match="delete it, and the next run redoes the job that wrote it"):
            read_status(status)
    else:
        _without_key("status.json", "attempt")(status.parent)
    result = snakemake(tmp_path, TINY, "-n")
    assert result.returncode != 0
    assert f"DamagedFile: runs/{CELLS[0]}/status.json cannot be read (" in result.stdout + result.stderr


@pytest.mark.parametrize("name", ["result.json", "cell.json"])
def test_a_cut_file_of_the_previous_attempt_stops_the_train_job_naming_it(name, tmp_path):
    """The train job reads what the interrupted attempt left (its status.json was deleted with the
    job's output) before it runs anything."""
    run_dir = tmp_path / "runs" / CELLS[0]
    write_run(run_dir)
    cell = json.loads((run_dir / "cell.json").read_text())
    (run_dir / "status.json").unlink()
    cut(run_dir / name, 40)
    with pytest.raises(DamagedFile, match=f"^{re.escape(str(run_dir / name))} cannot be read .*; delete "):
        train(cell, ENGINE, "", str(run_dir / "status.json"), str(run_dir / "train.log"), 1, None)
    assert not (run_dir / "status.json").exists() and (run_dir / "metrics.jsonl").is_file()  # nothing touched


def test_a_write_that_fails_leaves_the_previous_file_whole(tmp_path):
    status = tmp_path / "status.json"
    write_atomic(status, '{"status": "ok"}')
    with pytest.raises(UnicodeEncodeError):
        write_atomic(status, '{"status": "\ud800"}')  # a lone surrogate cannot be encoded
    assert json.loads(status.read_text()) == {"status": "ok"}
    assert [p.name for p in tmp_path.iterdir()] == ["status.json"]  # no temporary file left


def test_a_record_without_its_curves_makes_nothing_and_the_retry_succeeds(tmp_path):
    runs, dest = tmp_path / "runs", tmp_path / "baselines" / "cpu"
    runs.mkdir()
    shutil.copyfile(RECORD / "results.csv", runs / "results.csv")
    missing = f"record: {runs / 'curves.csv'} not found; run `make baselines` first"
    with pytest.raises(SystemExit, match=f"^{re.escape(missing)}$"):
        record(runs, dest)
    assert not dest.exists()
    shutil.copyfile(RECORD / "curves.csv", runs / "curves.csv")
    out = record(runs, dest)
    assert out == dest / RECORD.name and [p.name for p in dest.iterdir()] == [RECORD.name]
    assert sorted(p.name for p in out.iterdir()) == ["curves.csv", "results.csv"]
    assert (out / "curves.csv").read_bytes() == (RECORD / "curves.csv").read_bytes()


def test_the_attempt_resumes_from_the_highest_step_not_the_last_name(tmp_path: Path) -> None:
    """Sorted as text, global_step_5 came after global_step_10: the log and status.json named the
    older checkpoint while the engine resumed from the newer one."""
    from rules.scripts.cell import _checkpoints

    for step in (5, 10, 2):
        (tmp_path / f"global_step_{step}").mkdir()
        (tmp_path / f"global_step_{step}" / "checkpoint_complete.json").write_text("{}")
    assert [p.parent.name for p in _checkpoints(tmp_path)] == ["global_step_2", "global_step_5", "global_step_10"]
