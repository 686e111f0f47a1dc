"""The dependency matrix (rules/deps.smk): its committed record and page agree, pyproject.toml's
ranges are the proven ones, bad configs are named, and a real Snakemake run of a small matrix
shows a combination that cannot install as failed while the other one completes."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from glob import glob
from pathlib import Path

import pytest
import tomllib
import yaml
from packaging.requirements import Requirement

from reports.dependencies import gpu_stacks, page, proven_ranges, read_rows
from rules.scripts import deps
from tests.page import markdown_table

REPO = Path(__file__).resolve().parents[2]
MATRIX = REPO / "configs" / "deps" / "cpu.yaml"
RECORD = REPO / "baselines" / "deps.csv"


def snakemake(workdir: Path, *configs: Path, dry: bool = False) -> subprocess.CompletedProcess:
    command = [
        sys.executable,
        "-m",
        "snakemake",
        "-s",
        str(REPO / "rules" / "deps.smk"),
        "-d",
        str(workdir),
        "--profile",
        str(REPO / "configs" / "profiles" / "local"),
        "--configfile",
        *map(str, configs),
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run(command + (["-n"] if dry else []), capture_output=True, text=True, env=env)


def write(path: Path, change) -> Path:
    matrix = yaml.safe_load(MATRIX.read_text())
    change(matrix)
    path.write_text(yaml.safe_dump(matrix, sort_keys=False))
    return path


def project_requirements() -> dict[str, Requirement]:
    """pyproject.toml's dependencies and the lora extra (peft): what a combination installs."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    specs = project["dependencies"] + project["optional-dependencies"]["lora"]
    return {Requirement(s).name: Requirement(s) for s in specs}


def test_the_page_is_current_with_the_record():
    gpu = sorted(
        {
            f
            for pattern in yaml.safe_load(MATRIX.read_text())["gpu_records"]
            for f in glob(str(REPO / pattern))
        }
    )
    expected = page(read_rows(RECORD), gpu_stacks(gpu, REPO))
    assert (REPO / "assets" / "dependencies.md").read_text() == expected, (
        "stale: python -m reports.dependencies"
    )


def test_the_record_covers_the_matrix_and_its_reference_passed():
    rows = {row["combination"]: row for row in read_rows(RECORD)}
    matrix = yaml.safe_load(MATRIX.read_text())
    assert set(rows) == set(matrix["combinations"])
    assert rows[matrix["reference"]]["status"] == "ok"
    for name, pins in matrix["combinations"].items():  # installed as asked, where it installed
        if rows[name]["install"] == "ok":
            assert all(rows[name][package] == version for package, version in pins.items()), name


def test_pyproject_ranges_are_the_ones_the_matrix_proves():
    requirements = project_requirements()
    for package, (oldest, newest) in proven_ranges(read_rows(RECORD)).items():
        if package == "torch":  # fixed on CPU; its range also covers the GPU records' 2.11
            continue
        assert str(requirements[package].specifier) == f"<={newest},>={oldest}", package


def test_the_gpu_extra_is_a_pair_the_gpu_records_ran_with_both_workloads():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins = {
        Requirement(s).name: str(Requirement(s).specifier).removeprefix("==")
        for s in project["optional-dependencies"]["gpu"]
    }
    stacks = gpu_stacks(sorted(glob(str(REPO / "baselines" / "gpu" / "*.json"))), REPO)
    ran = [s for s in stacks if (s["transformers"], s["vllm"]) == (pins["transformers"], pins["vllm"])]
    assert ran and {"anchor (vllm)", "anchor_vl (vllm)"} <= set(ran[0]["runs"].split(", "))


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda m: m["combinations"]["pinned"].update(transformers="newest"), "transformers"),
        (lambda m: m["suite"]["tolerance"].update(logprob=1e-5), "logprob"),
        (lambda m: m.update(reference="nowhere"), "reference: 'nowhere'"),
        (lambda m: m["suite"]["tests"].append("tests/test_nothing_here.py"), "suite.tests[8]"),
        (
            lambda m: m["suite"]["run"]["overrides"].update({"worker.actor.global_batch_size": 3}),
            "suite.run: worker.actor.global_batch_size=3 must divide data.rollout_batch_size=4",
        ),
    ],
    ids=["bad-version", "unknown-key", "unknown-reference", "missing-test-file", "engine-config"],
)
def test_a_bad_config_is_an_error_naming_the_key(tmp_path, change, named):
    result = snakemake(tmp_path, write(tmp_path / "bad.yaml", change), dry=True)
    assert result.returncode != 0 and named in result.stderr + result.stdout


def test_junit_counts_name_the_first_failing_test(tmp_path):
    (tmp_path / "test_some.py").write_text(
        "def test_ok():\n    pass\n\ndef test_bad():\n    assert 1 == 2, 'one is not two'\n"
    )
    junit = tmp_path / "junit.xml"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--junitxml={junit}",
            "--rootdir",
            str(tmp_path),
            str(tmp_path / "test_some.py"),
        ],
        capture_output=True,
        cwd=tmp_path,
    )
    counts = deps.junit_counts(junit)
    assert (counts["passed"], counts["failed"]) == (1, 1)
    assert counts["first_failure"].startswith("test_some.py::test_bad: AssertionError: one is not two")


def test_drift_is_the_largest_difference_and_infinite_on_another_shape():
    assert deps.drift([[1.0, 2.0], [3.0]], [[1.0, 2.5], [3.0]]) == 0.5
    assert deps.drift([[1.0, 2.0]], [[1.0]]) == float("inf")
    assert deps.drift(None, [[1.0]]) is None


@pytest.mark.slow
def test_a_combination_that_cannot_install_fails_while_the_other_completes(tmp_path):
    """The pinned set (its virtualenv cached, shared with make deps and CI's matrix) with one test
    file and a one-step GRPO run, beside a pin no release satisfies."""

    def small(matrix: dict) -> None:
        matrix["combinations"] = {
            "pinned": matrix["combinations"]["pinned"],
            "impossible": {"transformers": "0.0.1"},
        }
        matrix["suite"]["tests"] = ["tests/engine/test_advantages.py"]
        matrix["suite"]["run"]["steps"] = 1

    result = snakemake(tmp_path, write(tmp_path / "small.yaml", small))
    assert result.returncode == 0, result.stderr[-3000:]
    with open(tmp_path / "baselines" / "deps.csv", newline="") as f:
        rows = {row["combination"]: row for row in csv.DictReader(f)}
    assert rows["impossible"]["status"] == "failed: install"
    assert "transformers==0.0.1" in rows["impossible"]["install_error"]
    pinned = rows["pinned"]
    assert pinned["status"] == "ok", pinned
    assert (
        int(pinned["tests_passed"]) > 0
        and pinned["tests_failed"] == "0"
        and pinned["transformers"] == "5.24.0"
    )
    assert len(json.loads(pinned["losses"])) == 1
    table = {
        row["combination"].split()[0].strip("*"): row
        for row in markdown_table((tmp_path / "assets" / "dependencies.md").read_text(), "CPU combinations")
    }
    assert table["impossible"]["install ok"] == "**install failed**"
    assert table["pinned"]["install ok"] == "yes" and table["pinned"]["status"] == "ok"

    verdict = subprocess.run(
        [sys.executable, "-m", "rules.scripts.deps", "check", str(tmp_path / "baselines" / "deps.csv")],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert verdict.returncode == 1 and "impossible: failed: install" in verdict.stdout
