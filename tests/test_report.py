"""Recorded GPU benchmarks as report rows: the LoRA rank a benchmark ran with shows in its row."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("pandas")
from reports.baselines import from_benchmark  # noqa: E402


def test_benchmark_rows_carry_their_lora_rank() -> None:
    records = sorted(Path("baselines/gpu").glob("*anchor-hf-*.json"))
    rows = {path.stem: from_benchmark(json.loads(path.read_text()), path.stem) for path in records}
    assert rows["2026-11-30-h200-anchor-hf-lora"]["lora"] == 64
    assert rows["2026-11-30-h200-anchor-hf-graph"]["lora"] == 0
