"""The dependency matrix (rules/deps.smk): its committed record and page agree, pyproject.toml's
ranges are the proven ones (no wider, no narrower, no failure inside them), a pin lifts its
package's range, bad configs are named, and a real Snakemake run of a small matrix shows a
combination that cannot install as failed while the other one completes."""

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
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from reports.dependencies import (
    gpu_extra,
    gpu_stacks,
    page,
    project_ranges,
    proven_ranges,
    range_disagreements,
    read_rows,
)
from rules.scripts import deps, engine
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


def test_the_page_is_current_with_the_record():
    gpu = sorted(
        {
            f
            for pattern in yaml.safe_load(MATRIX.read_text())["gpu_records"]
            for f in glob(str(REPO / pattern))
        }
    )
    now = engine.describe()["fingerprint"]
    expected = page(read_rows(RECORD), gpu_stacks(gpu, REPO), now, gpu_extra(REPO / "pyproject.toml"))
    assert (REPO / "assets" / "dependencies.md").read_text() == expected, (
        "stale: python -m reports.dependencies (after an engine change the page marks the record as "
        "made at an older engine; make deps records it again)"
    )


def test_the_record_covers_the_matrix_and_its_reference_passed():
    rows = {row["combination"]: row for row in read_rows(RECORD)}
    matrix = yaml.safe_load(MATRIX.read_text())
    assert set(rows) == set(matrix["combinations"])
    assert rows[matrix["reference"]]["status"] == "ok"
    for name, pins in matrix["combinations"].items():  # installed as asked, where it installed
        if rows[name]["install"] == "ok":
            for package, version in pins.items():
                if version == deps.LATEST:  # what it got is in the record, never "latest"
                    assert rows[name][package] and rows[name][package] != version, (name, package)
                else:
                    assert Version(rows[name][package]).public == version, (name, package)


def test_pyproject_ranges_are_the_ones_the_matrix_proves():
    assert range_disagreements(read_rows(RECORD), project_ranges(REPO / "pyproject.toml")) == []


def test_a_range_wider_or_narrower_than_the_record_or_claiming_a_failure_is_named():
    rows = read_rows(RECORD)
    ranges = project_ranges(REPO / "pyproject.toml")
    oldest, newest = proven_ranges(rows)["transformers"]
    wider = {**ranges, "transformers": SpecifierSet(f">={oldest},<6")}
    assert range_disagreements(rows, wider) == [
        f"transformers: pyproject.toml says <6,>={oldest}, the record proves <={newest},>={oldest}"
    ]
    narrower = {**ranges, "peft": SpecifierSet(">=0.21.2,<=0.21.2")}
    assert [p.split(":")[0] for p in range_disagreements(rows, narrower)] == ["peft"]
    reference = next(row for row in rows if row["reference"] == "True")
    failed = [
        *rows,
        {**reference, "combination": "broken", "reference": "False", "status": "failed: GRPO run"},
    ]
    assert range_disagreements(failed, ranges) == [
        "broken failed (failed: GRPO run) inside pyproject.toml's ranges"
    ]


def test_a_pin_lifts_its_packages_range_and_the_machines_cap(tmp_path):
    matrix = yaml.safe_load(MATRIX.read_text())
    torch_pinned = deps.spec(matrix, "torch-2.15")
    installs = deps._requirements(torch_pinned)
    assert "torch" in installs and not any(r.startswith("torch==") for r in installs)  # the stack's left
    assert f"transformers{project_ranges(REPO / 'pyproject.toml')['transformers']}" in installs
    outside = deps._requirements(deps.spec(matrix, "easyr1-stack"))
    assert "transformers" in outside and "peft" in outside and "datasets" in outside
    cap = tmp_path / "constraints.txt"
    cap.write_text("# the machine's cap\ntorch<=2.14.1\ntorchvision<=0.29.1\n")
    sources = deps._lift_constraints(["--find-links", "/w", "--constraint", str(cap)], {"torch"}, tmp_path)
    assert sources[:3] == ["--find-links", "/w", "--constraint"]
    assert Path(sources[3]).read_text() == "# the machine's cap\ntorchvision<=0.29.1\n"


def test_latest_is_resolved_again_by_every_run(tmp_path):
    matrix = yaml.safe_load(MATRIX.read_text())
    latest, pinned = deps.spec(matrix, "latest"), deps.spec(matrix, "pinned")
    assert deps.resolves(latest) and not deps.resolves(pinned)
    assert deps.install_attempt(tmp_path / "none.json", latest).startswith("resolved at ")
    assert deps.install_attempt(tmp_path / "none.json", pinned) == ""


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


def test_junit_counts_name_why_a_test_module_did_not_import(tmp_path):
    """EasyR1's stack fails at import: the row names the module and the ImportError, not only
    pytest's "collection failure"."""
    (tmp_path / "test_imports.py").write_text("from json import no_such_name\n")
    junit = tmp_path / "junit.xml"
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}"]
        + ["--rootdir", str(tmp_path), str(tmp_path / "test_imports.py")],
        capture_output=True,
        cwd=tmp_path,
    )
    counts = deps.junit_counts(junit)
    assert counts["failed"] == 1 and counts["first_failure"].startswith(
        "test_imports.py: collection failure: ImportError: cannot import name 'no_such_name' from 'json'"
    )


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
