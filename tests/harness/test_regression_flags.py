"""The page's regression flags against real runs of one smoke-sized configuration (three seeds, as
the CPU matrix has: a configuration's speed compares as the mean change over its seeds), run three
times in one working directory, each run recorded (as `make record` does) before the next:

1. the engine as it is;
2. the same engine on a host loaded by a process burning a core: no flag (speed compares as the
   calibrated CPU step, which the other process does not lengthen);
3. an engine made worse on purpose: each step 30% slower (30% more CPU work, done inside the step's
   timing) and the held-out accuracy halved. Both flags fire.

The worse engine is a copy of the engine package with two functions wrapped (``_worsen``): the
test-only hook lives here, not in the engine.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rules.scripts.record import record
from tests.harness.test_harness import snakemake
from tests.page import markdown_table

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
CELLS = ("qwen2-grpo-compare-amp", "qwen2-grpo-compare-amp-seed2", "qwen2-grpo-compare-amp-seed3")
SLOWDOWN = 0.30

# A task a briefly warm-started tiny model answers right some of the time (an accuracy of 0 could not
# drop), 6 steps (5 timed, each half a second: the cells the spread was measured on), three seeds.
MATRIX = {
    "description": "one smoke-sized configuration, for the regression flags",
    "engine": "configs/engine/cpu.yaml",
    "steps": 6,
    "cpu_ranks": 2,
    "resources": {"mem_mb": 4000, "runtime": 10},
    "models": {
        "qwen2": {
            "tiny": "qwen2",
            "warm_start": {"dataset": "compare", "steps": 300, "batch_size": 32, "answer_key": "guess"},
        }
    },
    "datasets": {
        "compare": {
            "synthetic": {"task": "compare", "train": 256, "test": 32, "difficulty": 2},
            "reward": "math",
            "answer_format": "math",
            "overrides": {"trainer.val_freq": 6},
        }
    },
    "algorithms": {"grpo": {}},
    "precisions": {"amp": {}},
    "grid": [
        {
            "models": ["qwen2"],
            "datasets": ["compare"],
            "algorithms": ["grpo"],
            "precisions": ["amp"],
            "seeds": [1, 2, 3],
        }
    ],
}

# Appended to the copy's modules: the step's timing and CPU account end in StepTelemetry.finish, so
# CPU work done there (30% of what the step's own took so far) lengthens the step as the engine
# measures it; validation's accuracy is scaled after it is computed.
WORSE_TELEMETRY = f"""

_finish = StepTelemetry.finish


def _slower(self, **kwargs):
    own = self.contention.process.cpu_times()
    until = time.process_time() + {SLOWDOWN} * (own.user + own.system - self.contention.begin["process"])
    while time.process_time() < until:
        pass
    return _finish(self, **kwargs)


StepTelemetry.finish = _slower
"""
WORSE_TRAINER = """

_validate = Trainer.validate


def _less_accurate(self, step):
    metrics, samples = _validate(self, step)
    return {k: v / 2 if k.startswith("val/accuracy") else v for k, v in metrics.items()}, samples


Trainer.validate = _less_accurate
"""


def _worsen(engine: Path, dest: Path) -> Path:
    """A copy of the engine package at ``engine`` whose steps are slower and held-out accuracy lower."""
    shutil.copytree(engine / "easyr1", dest / "easyr1")
    for module, tail in (("telemetry.py", WORSE_TELEMETRY), ("trainer.py", WORSE_TRAINER)):
        path = dest / "easyr1" / module
        path.write_text(path.read_text() + tail)
    return dest


def _run(work: Path, matrix: Path, engine: Path, burn: bool = False) -> dict[str, str]:
    """Train the cells again (their folders and the collected results removed), record the run, and
    return the configuration's row of the page."""
    for cell in CELLS:
        shutil.rmtree(work / "runs" / cell, ignore_errors=True)
    for collected in ("results.csv", "curves.csv"):  # or Snakemake sees them up to date
        (work / "runs" / collected).unlink(missing_ok=True)
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if burn else None
    try:
        result = snakemake(work, matrix, engine=engine)
    finally:
        if burner is not None:
            burner.kill()
            burner.wait()
    assert result.returncode == 0, result.stdout + result.stderr
    record(work / "runs", work / "records" / str(len(list((work / "records").glob("*")))))
    page = (work / "assets" / "baselines.md").read_text()
    rows = markdown_table(page, "Algorithm baselines (the CPU matrix)")
    return next(r for r in rows if r["Dataset"] == "compare")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, engine_copy) -> dict[str, dict[str, str]]:
    work = tmp_path_factory.mktemp("regressions")
    (work / "records" / "0").mkdir(parents=True)
    matrix = work / "matrix.yaml"
    plain = dict(MATRIX)
    matrix.write_text(yaml.safe_dump(plain))
    rows = {"first": _run(work, matrix, engine_copy)}
    plain["recorded"] = [str(work / "records" / "*" / "*" / "results.csv")]
    matrix.write_text(yaml.safe_dump(plain))
    rows["loaded"] = _run(work, matrix, engine_copy, burn=True)
    rows["worse"] = _run(work, matrix, _worsen(engine_copy, work / "worse-engine"))
    return rows


def test_the_same_engine_on_a_loaded_host_raises_no_flag(runs):
    assert runs["first"]["Regression"] == "-"  # nothing recorded before it
    assert runs["loaded"]["Regression"] == "ok", runs["loaded"]


def test_an_engine_30_percent_slower_is_flagged(runs):
    assert "calibrated CPU step +" in runs["worse"]["Regression"], runs["worse"]


def test_an_engine_whose_held_out_accuracy_fell_is_flagged(runs):
    assert float(runs["loaded"]["after"].split(" ± ")[0]) > 0  # a drop the run can show (mean ± std)
    assert "held-out acc. -" in runs["worse"]["Regression"], runs["worse"]
