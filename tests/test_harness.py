"""The harness end to end: real Snakemake runs of tiny matrices, each in a temporary working
directory (the repository's runs/ and assets/ are never touched). The real SLURM check is in
.ci/slurm.sh, not here."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from statistics import median

import pytest
import yaml

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "tests" / "harness" / "tiny.yaml"
MATRICES = sorted((REPO / "configs" / "matrix").glob("*.yaml")) + [TINY]


def snakemake(workdir: Path, matrix: Path, *args: str) -> subprocess.CompletedProcess:
    command = [
        sys.executable,
        "-m",
        "snakemake",
        "-s",
        str(REPO / "Snakefile"),
        "-d",
        str(workdir),
        "--configfile",
        str(matrix),
        "--profile",
        str(REPO / "configs" / "profiles" / "local"),
        *args,
    ]
    return subprocess.run(command, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})


def write_matrix(path: Path, change) -> Path:
    """The tiny matrix, changed by ``change(matrix_dict)``, written to ``path``."""
    matrix = yaml.safe_load(TINY.read_text())
    change(matrix)
    path.write_text(yaml.safe_dump(matrix))
    return path


def planned(result: subprocess.CompletedProcess, rule: str) -> set[str]:
    """The wildcard values of the jobs of ``rule`` in a dry run's output."""
    assert result.returncode == 0, result.stdout + result.stderr
    blocks = re.split(r"\n(?=\[\w{3} \w{3} )", result.stdout + result.stderr)
    return {
        m.group(1)
        for block in blocks
        if re.search(rf"^(local)?rule {rule}:", block, re.M)
        for m in [re.search(r"wildcards: \w+=(\S+)", block)]
        if m
    }


def add_broken_cell_and_recorded_result(matrix: dict) -> None:
    """A cell the engine rejects at start-up (a mini-batch that does not divide the rollout batch),
    and a recorded benchmark result to merge into the report."""
    matrix["algorithms"]["broken"] = {"worker.actor.global_batch_size": 3}
    matrix["grid"].append(
        {"models": ["qwen2"], "datasets": ["arithmetic"], "algorithms": ["broken"], "precisions": ["amp"]}
    )
    matrix["recorded"] = ["tests/harness/recorded.json"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, subprocess.CompletedProcess]:
    """The tiny matrix (2 cells, 2 steps) plus one failing cell, run for real once."""
    work = tmp_path_factory.mktemp("harness")
    matrix = write_matrix(work / "matrix.yaml", add_broken_cell_and_recorded_result)
    return work, matrix, snakemake(work, matrix)


def table(page: str, heading: str) -> list[dict[str, str]]:
    """The markdown table under ``## heading``, as rows keyed by its header."""
    section = page.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    split = lambda line: [c.strip() for c in line.strip("|").split("|")]  # noqa: E731
    header = split(lines[0])
    return [dict(zip(header, split(line))) for line in lines[2:]]


def metrics(work: Path, cell: str) -> list[dict]:
    return [json.loads(line) for line in (work / "runs" / cell / "metrics.jsonl").read_text().splitlines()]


def test_report_numbers_are_read_from_the_runs_metrics(finished):
    work, _, result = finished
    assert result.returncode == 0, result.stdout + result.stderr
    page = (work / "assets" / "baselines.md").read_text()
    cell = "qwen2-grpo-arithmetic-amp"
    steps = metrics(work, cell)
    validated = [m for m in steps if "val/accuracy" in m]
    before, after = validated[0]["val/accuracy"], validated[-1]["val/accuracy"]
    assert validated[0]["step"] == 0 and validated[-1]["step"] == 2

    algorithms = {(r["Algorithm"], r["Dataset"]): r for r in table(page, "Algorithm Baselines")}
    assert (
        algorithms[("grpo", "arithmetic")]["Test accuracy"]
        == f"{before:.3f} -> {after:.3f} ({after - before:+.3f})"
    )
    assert algorithms[("grpo", "arithmetic")]["Bits"] == "AMP"
    assert algorithms[("grpo", "arithmetic")]["LR"] == "1e-04"

    performance = {r["Algorithm"]: r for r in table(page, "Performance Baselines")}
    throughput = median(m["perf/throughput"] for m in steps if m["step"] > 0)
    assert performance["grpo"]["Tokens/s/device"] == f"{throughput:,.0f}"
    assert performance["grpo"]["Devices"] == "2"

    for figure in re.findall(r"!\[[^]]*\]\(([^)]+)\)", page):
        assert (work / "assets" / figure).stat().st_size > 1000, figure
    assert "curves-qwen2-arithmetic.png" in page


def test_failed_cell_is_reported_while_the_others_complete(finished):
    work, _, result = finished
    assert result.returncode == 0, result.stdout + result.stderr
    page = (work / "assets" / "baselines.md").read_text()
    rows = {r["Algorithm"]: r for r in table(page, "Algorithm Baselines")}
    assert rows["broken"]["Test accuracy"] == "FAILED"
    assert "FAILED" not in rows["grpo"]["Test accuracy"] and "FAILED" not in rows["gspo"]["Test accuracy"]
    failed = page.split("## Failed cells\n", 1)[1]
    assert "qwen2-broken-arithmetic-amp" in failed and "global_batch_size=3" in failed  # the tail of the engine's error
    status = json.loads((work / "runs" / "qwen2-broken-arithmetic-amp" / "status.json").read_text())
    assert status["status"] == "failed" and status["exit_code"] != 0
    results = (work / "baselines" / "results.csv").read_text()
    assert "qwen2-grpo-arithmetic-amp" in results and "config_hash" in results


def test_recorded_results_are_merged_and_marked(finished):
    work, _, _ = finished
    page = (work / "assets" / "baselines.md").read_text()
    recorded = [
        r
        for r in table(page, "Performance Baselines")
        if r["Source"] == "recorded: tests/harness/recorded.json"
    ]
    assert len(recorded) == 1
    assert recorded[0]["Tokens/s/device"] == "9,830" and recorded[0]["Hardware"] == "NVIDIA H200"
    assert recorded[0]["Rollout (TP)"] == "vllm" and recorded[0]["Actor MFU"] == "21.0%"
    assert "a test fixture in the benchmark-record format" in page


def test_text_model_on_image_data_is_left_out(finished):
    work, _, result = finished
    assert "left out text-only model x image data set: qwen2-count_shapes" in result.stderr
    assert not list((work / "runs").glob("*count_shapes*"))


def test_failed_cell_reruns_at_the_next_invocation_and_finished_ones_do_not(finished):
    work, matrix, _ = finished
    assert planned(snakemake(work, matrix, "-n"), "train") == {"qwen2-broken-arithmetic-amp"}


def test_changing_one_axis_reruns_only_the_touched_cells(finished, tmp_path):
    work, _, _ = finished

    def change(matrix: dict) -> None:
        matrix["algorithms"]["gspo"]["worker.actor.optim.lr"] = 3.0e-4

    assert planned(snakemake(work, write_matrix(tmp_path / "lr.yaml", change), "-n"), "train") == {
        "qwen2-gspo-arithmetic-amp"
    }

    def add_precision(matrix: dict) -> None:
        matrix["precisions"]["bf16"] = {"worker.actor.fsdp.torch_dtype": "bf16"}
        matrix["grid"][0]["precisions"].append("bf16")

    assert planned(snakemake(work, write_matrix(tmp_path / "bf16.yaml", add_precision), "-n"), "train") == {
        "qwen2-grpo-arithmetic-bf16",
        "qwen2-gspo-arithmetic-bf16",
    }


@pytest.mark.parametrize("matrix", MATRICES, ids=lambda p: p.stem)
def test_every_matrix_dry_runs(matrix, tmp_path):
    result = snakemake(tmp_path, matrix, "-n")
    assert result.returncode == 0, result.stdout + result.stderr
    assert planned(result, "train"), "no cells"


def test_merge_runs_only_for_cells_that_save_checkpoints(tmp_path):
    def save(matrix: dict) -> None:
        matrix["algorithms"]["gspo"]["trainer.save_freq"] = 1

    result = snakemake(tmp_path, write_matrix(tmp_path / "save.yaml", save), "-n")
    assert planned(result, "merge") == {"qwen2-gspo-arithmetic-amp"}


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda m: m.update(stepz=3), "'stepz' was unexpected"),
        (lambda m: m["precisions"].update(fp8="bits"), "precisions"),
        (lambda m: m["grid"][0]["models"].append("qwen9"), "grid[0].models: unknown model 'qwen9'"),
        (
            lambda m: m["models"]["qwen2"]["warm_start"].update(dataset="count_shapes"),
            "models.qwen2.warm_start.dataset: count_shapes has images; qwen2 is text-only",
        ),
    ],
    ids=["unknown-key", "wrong-type", "unknown-model", "text-model-warm-start-on-images"],
)
def test_config_errors_name_the_key(change, message, tmp_path):
    result = snakemake(tmp_path, write_matrix(tmp_path / "bad.yaml", change), "-n")
    assert result.returncode != 0
    assert message in result.stdout + result.stderr


def test_lint_is_clean():
    result = subprocess.run(
        [sys.executable, "-m", "snakemake", "--lint"], cwd=REPO, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Congratulations" in result.stdout + result.stderr
