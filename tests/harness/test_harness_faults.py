"""The harness on damaged files: a cell folder with a cut or broken file (a rank or job killed while
writing it, a full disk, a hand edit) fails that cell alone, naming the file and what to delete; the
files the harness writes are written whole or not at all; a record is committed whole or not at all.

Cell folders are laid out here as a finished run leaves them (the files collect reads), so these
tests take seconds; tests/harness/test_harness.py runs the matrix for real.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from rules.scripts import engine
from rules.scripts.cell import DamagedFile, hardware, merge, outcome, read_status, tail, train, write_atomic
from rules.scripts.collect import collect, summary
from rules.scripts.record import record
from tests.harness.test_harness import REPO, TINY, snakemake
from tests.page import markdown_table

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
        {"step": 0, "val/accuracy_reward": 0.25},
        {"step": 1, "reward/accuracy": 0.5, "perf/time_per_step": 0.2, "perf/throughput": 3000.0},
        {
            "step": 2,
            "reward/accuracy": 0.75,
            "perf/time_per_step": 0.2,
            "perf/throughput": 3100.0,
            "val/accuracy_reward": 0.5,
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
    "a status.json without its hardware": (
        _without_key("status.json", "hardware"),
        "(no key 'hardware'); delete it",
    ),
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
    from reports.baselines.pages import write_report
    from reports.baselines.rows import Report

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
    # Its size is unknown: an empty CSV field, read back as NaN, was printed "nan".
    rows = {
        r["Cells (config hash)"].split("`")[1]: r
        for r in markdown_table(page, "Algorithm baselines (the CPU matrix)")
    }
    assert rows[CELLS[0]]["Size"] == "-" and rows[CELLS[0]]["Hardware"] != "nan"
    assert "| nan |" not in page


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
    with pytest.raises(SystemExit, match=f"^record: {re.escape(str(out))} exists: .* delete that folder"):
        record(runs, dest)  # a second record of the same day and revision says what to do


def test_record_help_is_help_not_a_folder():
    result = subprocess.run(
        [sys.executable, "-m", "rules.scripts.record", "--help"], cwd=REPO, capture_output=True, text=True
    )
    assert result.returncode == 0 and result.stdout.startswith(
        "usage: python -m rules.scripts.record [-h] [runs] [dest]"
    )


def test_the_attempt_resumes_from_the_highest_step_not_the_last_name(tmp_path: Path) -> None:
    """Sorted as text, global_step_5 came after global_step_10: the log and status.json named the
    older checkpoint while the engine resumed from the newer one."""
    from rules.scripts.cell import _checkpoints

    for step in (5, 10, 2):
        (tmp_path / f"global_step_{step}").mkdir()
        (tmp_path / f"global_step_{step}" / "checkpoint_complete.json").write_text("{}")
    assert [p.parent.name for p in _checkpoints(tmp_path)] == [
        "global_step_2",
        "global_step_5",
        "global_step_10",
    ]


@pytest.mark.parametrize(
    "code, received, expected",
    [
        (0, None, ("ok", None)),
        (0, signal.SIGTERM, ("ok", None)),  # it finished before the signal mattered
        (1, None, ("failed", None)),
        (130, None, ("stopped", "SIGINT")),  # the engine's exit after Ctrl-C: 128 + the signal
        (143, None, ("stopped", "SIGTERM")),
        (-15, None, ("stopped", "SIGTERM")),  # killed by it
        (1, signal.SIGINT, ("stopped", "SIGINT")),  # this job was signalled; the run ended as it could
        (-9, None, ("failed", "SIGKILL")),  # the out-of-memory killer's too: not a stop asked for
        (137, None, ("failed", "SIGKILL")),
        (255, None, ("failed", None)),
    ],
)
def test_a_run_ended_by_a_stop_signal_is_stopped_not_failed(code, received, expected):
    assert outcome(code, received) == expected


# The engine's stand-in, as a combination's virtualenv runs it (`python -m easyr1.cli ARGS`): `version`
# fails (no identity to report); `train` saves checkpoint 1, says it is ready and waits to be stopped,
# or, resumed from that checkpoint, finishes at once.
STAND_IN = """#!/bin/sh
[ "$3" = train ] || exit 1
run=$(dirname "${4#config=}")
[ -e "$run/global_step_1" ] && exit 0
mkdir "$run/global_step_1" && echo '{}' > "$run/global_step_1/checkpoint_complete.json"
echo ready > "$run/../ready"
exec sleep 60
"""

JOB = """
import json, sys
from pathlib import Path
from rules.scripts import engine
from rules.scripts.cell import train

cell, status, venv = json.loads(Path(sys.argv[1]).read_text()), sys.argv[2], engine.Virtualenv(Path(sys.argv[3]))
train(cell, {"fingerprint": "6385dce01934", "git": "cba3d1242335"}, "", status, status + ".log", 1, venv)
"""


def test_a_signalled_cell_is_stopped_and_resumes_from_its_last_checkpoint(tmp_path):
    """SIGTERM to the job's process (a scheduler's stop): status.json says stopped and by what, the
    merge is skipped saying so, and the next attempt resumes from the checkpoint the stopped one saved."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text(STAND_IN)
    (venv / "bin" / "python").chmod(0o755)
    run_dir = tmp_path / "runs" / CELLS[0]
    write_run(run_dir)
    cell = {**json.loads((run_dir / "cell.json").read_text()), "config": {}, "resources": {}}
    shutil.rmtree(run_dir)
    (tmp_path / "cell.json").write_text(json.dumps(cell))
    status = run_dir / "status.json"
    job = subprocess.Popen(
        [sys.executable, "-c", JOB, str(tmp_path / "cell.json"), str(status), str(venv)],
        cwd=REPO,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not (tmp_path / "runs" / "ready").exists():
        assert job.poll() is None and time.monotonic() < deadline, job.communicate()[1]
        time.sleep(0.1)
    os.kill(job.pid, signal.SIGTERM)
    _, err = job.communicate(timeout=30)
    stopped = json.loads(status.read_text())
    assert (stopped["status"], stopped["signal"]) == ("stopped", "SIGTERM"), err
    assert (
        f"{CELLS[0]}: stopped by SIGTERM after" in err and "resumes from its last complete checkpoint" in err
    )
    merge(cell, str(status), str(run_dir / "merge.json"), str(run_dir / "merge.log"), 1, None)
    assert json.loads((run_dir / "merge.json").read_text())["reason"] == "training stopped"
    status.unlink()  # as Snakemake deletes the output of the job it was interrupted in
    train(cell, ENGINE, "", str(status), str(run_dir / "train.log"), 1, engine.Virtualenv(venv))
    resumed = json.loads(status.read_text())
    assert (resumed["status"], resumed["resumed_from"], resumed["signal"]) == ("ok", "global_step_1", None)
    assert "# the stopped attempt left global_step_1: resuming from it" in (run_dir / "train.log").read_text()


def test_the_error_tail_is_a_few_dozen_short_lines(tmp_path):
    """It goes into status.json, results.csv and the page: a log of long lines (a dumped config, a
    progress bar) made it tens of KB."""
    log = tmp_path / "train.log"
    log.write_text("".join(f"{i} " + "x" * 5000 + "\n" for i in range(200)))
    lines = tail(log).splitlines()
    assert len(lines) == 40 and lines[-1].startswith("199 ") and lines[-1].endswith(" ...")
    assert max(map(len, lines)) <= 300 and len(tail(log)) < 13_000


def test_the_last_line_counts_the_failed_and_stopped_cells(runs):
    """Snakemake exits 0 when cells failed (each is a row of the page): this line says so."""
    statuses = [str(runs / "runs" / c / "status.json") for c in CELLS]
    page = str(runs / "assets" / "baselines.md")
    assert summary(statuses, page) == (f"matrix: all 2 cells finished; the page: {page}", False)
    for name, state in zip(CELLS, ("failed", "stopped"), strict=True):
        path = runs / "runs" / name / "status.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "status": state}))
    line, bad = summary([*statuses, str(runs / "runs" / "not-run-yet" / "status.json")], page)
    assert bad and line.startswith(
        f"matrix: 2 of 2 cells failed or stopped (1 failed, 1 stopped): see {page}"
    )
