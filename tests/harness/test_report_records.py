"""Damaged records stop the pages with their file, row and key or column named (reports/records.py):
a string where a number belongs, a missing column, a row cut short, a list that is not one, a cut
memory record. Each damage is made to a copy of a committed record. The committed records are
checked when the workflow is read, so a damaged one stops it before any job runs; and a report
that fails leaves the previous page and figures whole."""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
from collections.abc import Callable
from glob import glob
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pandas")
from reports.baselines import pages  # noqa: E402
from reports.baselines.rows import Report, load  # noqa: E402
from reports.hardware import write_hardware  # noqa: E402
from reports.records import RecordError, check_memory_records, check_recorded  # noqa: E402
from tests.harness.test_harness import REPO, snakemake, write_matrix  # noqa: E402
from tests.harness.test_report import ENGINE, render  # noqa: E402

CPU_RUN = Path("baselines/cpu/2026-12-03-8ce11499300c")  # a committed CPU run: results.csv and curves.csv
BENCH = Path("baselines/gpu/2026-11-30-h200-anchor-hf.json")  # a committed benchmark record
MEMORY = Path("baselines/gpu/memory/2026-12-02/h200-1.5b-amp.json")  # a committed memory record
# Every committed record: what the matrices list under `recorded:`, and the hardware page's.
RECORDED = ["baselines/gpu/*.json", "baselines/cpu/*/results.csv", "baselines/gpu/harness/*/results.csv"]


def committed(pattern: str) -> list[str]:
    return sorted(glob(str(REPO / pattern)))


def copy(tmp_path: Path, record: Path) -> Path:
    """A copy of a committed record (its curves beside a results.csv) at the same path under ``tmp_path``."""
    target = tmp_path / record
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / record, target)
    if record.name == "results.csv":
        shutil.copy(REPO / record.with_name("curves.csv"), target.with_name("curves.csv"))
    return target


def report(tmp_path: Path, recorded: list[str]) -> Report:
    """This run: a copy of a committed CPU run; and the ``recorded`` files."""
    run = copy(tmp_path / "this", CPU_RUN / "results.csv")
    return Report(
        results=str(run),
        curves=str(run.with_name("curves.csv")),
        recorded=recorded,
        matrix="configs/matrix/cpu.yaml",
        engine=ENGINE,
        repo=tmp_path,
    )


def edit_json(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    record = json.loads(path.read_text())
    change(record)
    path.write_text(json.dumps(record))


def edit_csv(path: Path, change: Callable[[list[dict[str, str]]], list[dict[str, str]]]) -> None:
    """The rows of a CSV record changed by ``change``; its header is the first row's keys."""
    with path.open(newline="") as f:
        rows = change(list(csv.DictReader(f)))
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def cut_row(path: Path) -> str:
    """The file cut in the middle of its third row (after its 'hardware' field): the cell it names."""
    lines = path.read_text().splitlines(keepends=True)
    row = lines[3]
    end = row.index(",", row.index("CPU: "))  # the row's fields up to and with the hardware
    path.write_text("".join(lines[:3]) + row[:end])
    return row.split(",", 1)[0]


def raises(path: Path, *named: str) -> Any:
    """A RecordError whose message names the file first, then each of ``named`` in turn."""
    return pytest.raises(
        RecordError, match=re.escape(str(path)) + "".join(f".*{re.escape(n)}" for n in named)
    )


def test_every_committed_record_loads(tmp_path: Path) -> None:
    records = [f for pattern in RECORDED for f in committed(pattern)]
    check_recorded(records)
    check_memory_records(committed("baselines/gpu/memory/*/*.json"))
    df, curves = load(report(tmp_path, records))
    assert set(df["source"]) >= {f"recorded: {os.path.relpath(f, tmp_path)}" for f in records}
    assert len(curves) and df["date"].notna().all()


BENCH_DAMAGES = {
    "a string step time": (lambda r: r.update(step_s="3.1"), "key 'step_s'"),
    "a string phase": (lambda r: r["phases"].update({"timing_s/gen": "1.5"}), "key 'phases.timing_s/gen'"),
    "a step time of NaN": (
        lambda r: r["per_step"][1].update({"perf/time_per_step": float("nan")}),
        "key 'per_step[1].perf/time_per_step'",
    ),
    "overrides as one string": (lambda r: r.update(overrides="worker.rollout.n=4"), "key 'overrides'"),
}


@pytest.mark.parametrize("damage", BENCH_DAMAGES, ids=list(BENCH_DAMAGES))
def test_a_damaged_benchmark_record_is_named_with_its_key(damage: str, tmp_path: Path) -> None:
    change, key = BENCH_DAMAGES[damage]
    path = copy(tmp_path, BENCH)
    edit_json(path, change)
    with raises(path, key):
        load(report(tmp_path, [str(path)]))
    with raises(path, key):  # as the workflow checks it when it is read
        check_recorded([str(path)])


def _text_in_val_after(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    rows[4]["val_after"] = "0.8 (rerun)"
    return rows


def _without(column: str) -> Callable[[list[dict[str, str]]], list[dict[str, str]]]:
    return lambda rows: [{k: v for k, v in row.items() if k != column} for row in rows]


CSV_DAMAGES = {
    "text where a number belongs": (_text_in_val_after, ["line 6, cell", "column 'val_after'"]),
    "no status column": (_without("status"), ["column 'status' missing"]),
    "no date column": (_without("date"), ["column 'date' missing"]),
}


@pytest.mark.parametrize("damage", CSV_DAMAGES, ids=list(CSV_DAMAGES))
def test_a_damaged_cpu_record_is_named_with_its_row_and_column(damage: str, tmp_path: Path) -> None:
    change, named = CSV_DAMAGES[damage]
    path = copy(tmp_path, CPU_RUN / "results.csv")
    edit_csv(path, change)
    with raises(path, *named):
        load(report(tmp_path, [str(path)]))


def test_a_committed_run_cut_mid_row_is_named_with_the_row(tmp_path: Path) -> None:
    path = copy(tmp_path, CPU_RUN / "results.csv")
    cell = cut_row(path)
    with raises(path, f"line 4, cell {cell}", "cut short", "column 'devices'"):
        load(report(tmp_path, [str(path)]))


def test_a_damaged_curve_is_named(tmp_path: Path) -> None:
    path = copy(tmp_path, CPU_RUN / "results.csv").with_name("curves.csv")
    edit_csv(path, lambda rows: [dict(row, reward="high") if i == 7 else row for i, row in enumerate(rows)])
    with raises(path, "line 9, cell", "column 'reward'"):
        load(report(tmp_path, [str(path.with_name("results.csv"))]))


def test_this_runs_results_cut_mid_row_are_named_not_moved_into_the_gpu_table(tmp_path: Path) -> None:
    """A cut runs/results.csv once showed its last CPU cell among the GPU cells (its hardware NaN)."""
    this_run = report(tmp_path, [])
    cell = cut_row(Path(this_run.results))
    with raises(Path(this_run.results), f"cell {cell}", "cut short"):
        load(this_run)


def test_a_failed_report_leaves_the_previous_page_and_figures_whole(tmp_path: Path, monkeypatch) -> None:
    """Everything is made before any file is written: a figure that fails writes none of the others."""
    out = tmp_path / "out"
    render(report(tmp_path, committed(str(BENCH))), out)
    (out / "baselines.md").write_text("the previous page")
    (out / "figures" / "curves-qwen2-compare.png").unlink()  # a figure the previous page did not have
    before = sorted(out.rglob("*"))

    def broken(*args: Any) -> None:
        raise RuntimeError("a figure that fails")

    monkeypatch.setattr(pages, "bench_figures", broken)
    with pytest.raises(RuntimeError, match="a figure that fails"):
        render(report(tmp_path, committed(str(BENCH))), out)
    assert sorted(out.rglob("*")) == before and (out / "baselines.md").read_text() == "the previous page"


def _cut(path: Path) -> None:
    text = path.read_text()
    path.write_text(text[: len(text) // 2])


MEMORY_DAMAGES = {
    "cut short": (_cut, "JSONDecodeError"),
    "no workload": (lambda path: edit_json(path, lambda r: r.pop("workload")), "key 'workload' missing"),
    "a string peak": (
        lambda path: edit_json(path, lambda r: r["memory_phases"]["gen"].update(allocated="9.2")),
        "key 'memory_phases.gen.allocated'",
    ),
}


@pytest.mark.parametrize("damage", MEMORY_DAMAGES, ids=list(MEMORY_DAMAGES))
def test_a_damaged_memory_record_is_named(damage: str, tmp_path: Path) -> None:
    change, named = MEMORY_DAMAGES[damage]
    path = copy(tmp_path, MEMORY)
    change(path)
    page = tmp_path / "hardware.md"
    with raises(path, named):
        write_hardware([*committed("baselines/gpu/memory/*/*.json"), str(path)], page, tmp_path / "plot.png")
    assert not page.exists()
    with raises(path, named):  # as the workflow checks it when it is read
        check_memory_records([str(path)])


def test_a_damaged_recorded_file_stops_the_workflow_before_any_job(tmp_path: Path) -> None:
    """Checked when the workflow is read: the dry run fails naming the matrix key, the file and its
    key, rather than the report job after the whole matrix trained (and after deleting the page)."""
    path = copy(tmp_path, BENCH)
    edit_json(path, lambda r: r.update(step_s="3.1"))
    matrix = write_matrix(tmp_path / "matrix.yaml", lambda m: m.update(recorded=[str(path)]))
    result = snakemake(tmp_path / "work", matrix, "-n")
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert f"recorded: {path}: not a record the page can read (key 'step_s': " in output
    assert "Job stats" not in output and not (tmp_path / "work" / "runs").exists()
