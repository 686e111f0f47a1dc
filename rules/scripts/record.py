"""Commit a run's results as a record: ``python -m rules.scripts.record [RUNS] [DEST]``.

Copies ``RUNS/results.csv`` and ``RUNS/curves.csv`` (what the collect rule wrote) into
``DEST/{date}-{revision}/``, named by the run's first start date and the engine revision its
cells ran with. Committed there, they are an input the report merges like the GPU records: the
page's current row of each cell, and the previous result a later run is compared with.
"""

from __future__ import annotations

import argparse
import csv
import shutil
from pathlib import Path


def record(runs: Path, dest: Path) -> Path:
    """The record's folder, made whole or not at all: a half record would block the retry ("exists")
    and feed the page a run without its curves."""
    results, curves = runs / "results.csv", runs / "curves.csv"
    for needed in (results, curves):
        if not needed.is_file():
            raise SystemExit(f"record: {needed} not found; run `make baselines` first")
    with results.open() as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise SystemExit(f"record: {results} has no cells")
    revisions = sorted({r["git"] for r in rows})
    if len(revisions) > 1:
        raise SystemExit(
            f"record: {results} mixes engine revisions {', '.join(revisions)}; rerun the matrix first"
        )
    date = min(r["date"] for r in rows)[:10]
    out = dest / f"{date}-{revisions[0]}"
    if out.exists():
        raise SystemExit(
            f"record: {out} exists: a record of this run's date and engine revision was made already. "
            f"It is the page's record of these cells: to record this run in its place, delete that folder "
            f"(git rm -r {out} where it is committed) and run this again"
        )
    # Hidden (a leading dot), so that the report's baselines/cpu/*/results.csv never matches it.
    partial = dest / f".{out.name}.partial"
    shutil.rmtree(partial, ignore_errors=True)  # left by a copy that was killed
    partial.mkdir(parents=True)
    for source in (results, curves):
        shutil.copyfile(source, partial / source.name)
    partial.rename(out)
    return out


def main(argv: list[str] | None = None) -> None:
    """The command line: ``--help`` says what it does (it was taken for RUNS, a folder)."""
    parser = argparse.ArgumentParser(
        prog="python -m rules.scripts.record",
        description="Copy RUNS/results.csv and RUNS/curves.csv into DEST/{date}-{revision}/ as a record (commit it).",
    )
    parser.add_argument(
        "runs", nargs="?", default="runs", type=Path, help="what the collect rule wrote (default: runs)"
    )
    parser.add_argument("dest", nargs="?", default="baselines/cpu", type=Path, help="default: baselines/cpu")
    args = parser.parse_args(argv)
    print(record(args.runs, args.dest))


if __name__ == "__main__":
    main()
