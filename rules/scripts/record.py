"""Commit a run's results as a record: ``python -m rules.scripts.record [RUNS] [DEST]``.

Copies ``RUNS/results.csv`` and ``RUNS/curves.csv`` (what the collect rule wrote) into
``DEST/{date}-{revision}/``, named by the run's first start date and the engine revision its
cells ran with. Committed there, they are an input the report merges like the GPU records: the
page's current row of each cell, and the previous result a later run is compared with.
"""

from __future__ import annotations

import csv
import shutil
import sys
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
        raise SystemExit(f"record: {out} exists")
    # Hidden (a leading dot), so that the report's baselines/cpu/*/results.csv never matches it.
    partial = dest / f".{out.name}.partial"
    shutil.rmtree(partial, ignore_errors=True)  # left by a copy that was killed
    partial.mkdir(parents=True)
    for source in (results, curves):
        shutil.copyfile(source, partial / source.name)
    partial.rename(out)
    return out


if __name__ == "__main__":
    args = sys.argv[1:]
    print(record(Path(args[0] if args else "runs"), Path(args[1] if len(args) > 1 else "baselines/cpu")))
