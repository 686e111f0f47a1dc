"""The harness end to end: real Snakemake runs of tiny matrices, each in a temporary working
directory (the repository's runs/ and assets/ are never touched). The real SLURM check is in
.ci/slurm.sh, not here. The Apptainer runs use the stand-in in tests/bin (bubblewrap) and an image
laid out from this machine's stack (tests/harness/sandbox.py)."""

from __future__ import annotations

import csv
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from statistics import median

import pytest
import yaml

from tests.harness.sandbox import build_image, path_with_stand_in, require_bubblewrap
from tests.page import markdown_table

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "tests" / "harness" / "tiny.yaml"
MULTINODE = (
    REPO / "tests" / "harness" / "multinode.yaml"
)  # run on two SLURM nodes by tests/harness/test_slurm_multinode.py
# configs/matrix/hardware.yaml is the hardware workflow's (rules/memory.smk, tests/harness/test_memory_matrix.py).
MATRICES = sorted(p for p in (REPO / "configs" / "matrix").glob("*.yaml") if p.name != "hardware.yaml") + [
    TINY,
    MULTINODE,
]


def snakemake(
    workdir: Path,
    matrix: Path | None,
    *args: str,
    engine: Path | None = None,
    snakefile: Path = REPO / "Snakefile",
    profile: str = "local",
    path: str | None = None,
) -> subprocess.CompletedProcess:
    """Snakemake on ``matrix`` (None: the Snakefile's default) in ``workdir``; with ``engine``, the
    engine package is imported from that folder (a copy a test can change) instead of the checkout;
    with ``path``, that PATH (the Apptainer stand-in's, or one without it)."""
    command = [sys.executable, "-m", "snakemake", "-s", str(snakefile), "-d", str(workdir)]
    command += ["--configfile", str(matrix)] if matrix else []
    command += ["--profile", str(REPO / "configs" / "profiles" / profile), *args]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PATH": path or os.environ["PATH"]}
    if engine:
        env["PYTHONPATH"] = str(engine)
    return subprocess.run(command, capture_output=True, text=True, env=env)


def write_matrix(path: Path, change, base: Path = TINY) -> Path:
    """The ``base`` matrix, changed by ``change(matrix_dict)``, written to ``path``."""
    matrix = yaml.safe_load(base.read_text())
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


def add_recorded_result(matrix: dict) -> None:
    """A recorded benchmark result to merge into the report."""
    matrix["recorded"] = ["tests/harness/recorded.json"]


# A reward file the config check accepts (it exists and defines the function) and whose import fails
# when the ranks load it, at start-up: a failure only the run itself can meet.
UNIMPORTABLE_REWARD = """
import no_such_scoring_package


def compute_score(reward_inputs):
    return [{"overall": 0.0} for _ in reward_inputs]
"""


def only_a_broken_cell(reward: Path):
    """One cell the engine stops at start-up, scored by the UNIMPORTABLE_REWARD in ``reward``."""

    def change(matrix: dict) -> None:
        matrix["algorithms"] = {"broken": {}}
        matrix["datasets"]["arithmetic"]["reward"] = f"{reward}:compute_score"
        matrix["grid"] = [
            {"models": ["qwen2"], "datasets": ["arithmetic"], "algorithms": ["broken"], "precisions": ["amp"]}
        ]

    return change


# Scores odd-length responses; rank 0 dies at its third call (step 2, after checkpoint 1) while a
# file `fail-once` lies beside this one: a fault the next attempt does not meet, as a node failure.
FAIL_ONCE = """
import os
from pathlib import Path

CALLS = {"n": 0}


def compute_score(reward_inputs):
    CALLS["n"] += 1
    flag = Path(__file__).with_name("fail-once")
    if CALLS["n"] == 3 and os.environ.get("RANK") == "0" and flag.exists():
        flag.unlink()
        os._exit(3)
    return [{"overall": float(len(r["response"]) % 2)} for r in reward_inputs]
"""


def a_checkpointing_cell_that_fails_once(reward: Path):
    """One cell, 3 steps, a checkpoint after every step, scored by the FAIL_ONCE reward in ``reward``."""

    def change(matrix: dict) -> None:
        matrix["steps"] = 3
        matrix["datasets"]["arithmetic"]["reward"] = f"{reward}:compute_score"
        matrix["datasets"]["arithmetic"]["overrides"]["trainer.save_freq"] = 1
        matrix["grid"] = [
            {"models": ["qwen2"], "datasets": ["arithmetic"], "algorithms": ["grpo"], "precisions": ["amp"]}
        ]

    return change


@pytest.fixture(scope="module")
def finished(tmp_path_factory, engine_copy) -> tuple[Path, Path, subprocess.CompletedProcess]:
    """The tiny matrix (2 cells, 2 steps) with a recorded benchmark result, run for real once."""
    work = tmp_path_factory.mktemp("harness")
    matrix = write_matrix(work / "matrix.yaml", add_recorded_result)
    return work, matrix, snakemake(work, matrix, engine=engine_copy)


@pytest.fixture(scope="module")
def broken(tmp_path_factory, engine_copy) -> tuple[Path, Path, subprocess.CompletedProcess]:
    work = tmp_path_factory.mktemp("broken")
    (work / "reward.py").write_text(UNIMPORTABLE_REWARD)
    matrix = write_matrix(work / "matrix.yaml", only_a_broken_cell(work / "reward.py"))
    return work, matrix, snakemake(work, matrix, engine=engine_copy)


@pytest.fixture(scope="module")
def failed_once(tmp_path_factory, engine_copy) -> tuple[Path, Path, subprocess.CompletedProcess]:
    """The checkpointing cell, run once: rank 0 dies in step 2, after checkpoint 1 was saved."""
    work = tmp_path_factory.mktemp("resume")
    (work / "reward.py").write_text(FAIL_ONCE)
    (work / "fail-once").touch()
    matrix = write_matrix(work / "matrix.yaml", a_checkpointing_cell_that_fails_once(work / "reward.py"))
    return work, matrix, snakemake(work, matrix, engine=engine_copy)


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> Path:
    """An image shaped like containers/cpu.def, for the Apptainer stand-in."""
    require_bubblewrap()
    return build_image(tmp_path_factory.getbasetemp() / "apptainer-image")


@pytest.fixture(scope="module")
def in_apptainer(tmp_path_factory, engine_copy, image) -> tuple[Path, subprocess.CompletedProcess]:
    """The cells of ``finished``, in the image: preparation, training, a merge (gspo saves its last
    step) and the report, for real."""
    work = tmp_path_factory.mktemp("apptainer")

    def in_image(matrix: dict) -> None:
        add_recorded_result(matrix)
        matrix.update(environment="apptainer", image=str(image))
        matrix["algorithms"]["gspo"]["trainer.save_freq"] = 2

    matrix = write_matrix(work / "matrix.yaml", in_image)
    return work, snakemake(work, matrix, engine=engine_copy, path=path_with_stand_in())


def metrics(work: Path, cell: str) -> list[dict]:
    return [json.loads(line) for line in (work / "runs" / cell / "metrics.jsonl").read_text().splitlines()]


def test_report_numbers_are_read_from_the_runs_metrics(finished):
    work, _, result = finished
    assert result.returncode == 0, result.stdout + result.stderr
    page = (work / "assets" / "baselines.md").read_text()
    cell = "qwen2-grpo-arithmetic-amp"
    steps = metrics(work, cell)
    validated = [m for m in steps if "val/accuracy_reward" in m]
    before, after = validated[0]["val/accuracy_reward"], validated[-1]["val/accuracy_reward"]
    assert validated[0]["step"] == 0 and validated[-1]["step"] == 2

    algorithms = {
        (r["Algorithm"], r["Dataset"]): r
        for r in markdown_table(page, "Algorithm baselines (the CPU matrix)")
    }
    row = algorithms[("grpo", "arithmetic")]
    assert (row["Held-out acc. before"], row["after"]) == (f"{before:.3f}", f"{after:.3f}")
    assert row["gain (mean ± std)"] == f"{after - before:+.3f}" and row["Seeds"] == "1"
    assert row["Bits"] == "AMP" and row["LR"] == "1e-04" and row["Ranks"] == "2"
    throughput = median(m["perf/throughput"] for m in steps if m["step"] > 0)  # 2 steps: both count
    assert row["Tokens/s/device"] == f"{throughput:,.0f}"
    assert row["Regression"] == "-"  # nothing to compare with: no earlier record of this cell
    status = json.loads((work / "runs" / cell / "status.json").read_text())
    assert status["engine"] in page and row["Engine"] == status["git"][:7] + (
        "-dirty" if "dirty" in status["git"] else ""
    )

    for figure in re.findall(r"!\[[^]]*\]\(([^)]+)\)", page):
        assert (work / "assets" / figure).stat().st_size > 1000, figure
    assert "curves-qwen2-arithmetic.png" in page


def test_failed_cell_is_reported_and_reruns_at_the_next_invocation(broken):
    work, matrix, result = broken
    assert result.returncode == 0, result.stdout + result.stderr
    page = (work / "assets" / "baselines.md").read_text()
    rows = {r["Algorithm"]: r for r in markdown_table(page, "Algorithm baselines (the CPU matrix)")}
    assert rows["broken"]["gain (mean ± std)"] == "FAILED" and rows["broken"]["Seeds"] == "1 (1 FAILED)"
    failed = page.split("## Failed and stopped cells\n", 1)[1]
    assert (
        "qwen2-broken-arithmetic-amp" in failed and "no_such_scoring_package" in failed
    )  # the tail of the engine's error
    status = json.loads((work / "runs" / "qwen2-broken-arithmetic-amp" / "status.json").read_text())
    assert status["status"] == "failed" and status["exit_code"] != 0
    assert "1 cell (1 configuration x seeds), 0 finished, 1 failed" in page
    # Snakemake exits 0 (the failure is a row of the page): its last lines say so, before its timing.
    last = result.stderr.strip().splitlines()[-4:]
    assert any(
        f"matrix: 1 of 1 cells failed or stopped (1 failed): see {work / 'assets' / 'baselines.md'}" in line
        for line in last
    ), last
    assert planned(snakemake(work, matrix, "-n"), "train") == {"qwen2-broken-arithmetic-amp"}


def test_a_failed_cell_resumes_from_its_last_checkpoint_and_a_finished_result_is_kept(
    failed_once, engine_copy
):
    work, matrix, first = failed_once
    cell = work / "runs" / "qwen2-grpo-arithmetic-amp"
    assert first.returncode == 0, first.stdout + first.stderr
    assert json.loads((cell / "status.json").read_text())["status"] == "failed"
    assert (cell / "global_step_1" / "checkpoint_complete.json").is_file()

    second = snakemake(work, matrix, engine=engine_copy)
    assert second.returncode == 0, second.stdout + second.stderr
    status = json.loads((cell / "status.json").read_text())
    assert status["status"] == "ok" and status["resumed_from"] == "global_step_1"
    assert "global_step_1 (step 1)" in (cell / "train.log").read_text()  # the engine's "resumed from"
    assert [m["step"] for m in metrics(work, "qwen2-grpo-arithmetic-amp")] == [0, 1, 2, 3]

    # Snakemake deletes the output of a job it was interrupted in, even one that had finished:
    # the finished run is kept, not trained again.
    (cell / "status.json").unlink()
    third = snakemake(work, matrix, engine=engine_copy)
    assert third.returncode == 0, third.stdout + third.stderr
    assert "kept the finished run of this config and engine" in third.stderr
    assert json.loads((cell / "status.json").read_text()) == status
    assert [m["step"] for m in metrics(work, "qwen2-grpo-arithmetic-amp")] == [0, 1, 2, 3]


def measured(rows: list[dict]) -> list[dict]:
    """A run's metrics without the timings and memory readings, which differ from run to run."""
    return [{k: v for k, v in row.items() if not k.startswith(("perf/", "timing_s/"))} for row in rows]


def test_cells_in_apptainer_have_the_native_metrics_and_name_their_image(
    finished, in_apptainer, engine_copy, image
):
    native, _, _ = finished
    work, result = in_apptainer
    assert result.returncode == 0, result.stdout + result.stderr
    for cell in ("qwen2-grpo-arithmetic-amp", "qwen2-gspo-arithmetic-amp"):
        assert measured(metrics(work, cell)) == measured(metrics(native, cell))
        log = (work / "runs" / cell / "train.log").read_text()
        # Snakemake's container mechanism, with the profile's arguments and the engine's source bound.
        assert f"$ apptainer exec --home {work} --nv --cleanenv --bind {engine_copy} {image} sh -c " in log
    assert (
        f"$ apptainer exec --home {work} --nv --cleanenv"
        in (work / "runs/prepared/logs/model-qwen2.log").read_text()
    )
    merged = work / "runs" / "qwen2-gspo-arithmetic-amp"
    assert json.loads((merged / "merge.json").read_text())["status"] == "ok"
    assert "$ apptainer exec " in (merged / "merge.log").read_text()
    assert list((merged / "global_step_2" / "actor" / "huggingface").glob("*.safetensors"))

    definition = (
        "definition sha256:" + hashlib.sha256((REPO / "containers" / "cpu.def").read_bytes()).hexdigest()
    )
    with (work / "runs" / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert {(r["environment"], r["image"], r["image_id"]) for r in rows} == {
        ("apptainer", str(image), definition)
    }
    provenance = markdown_table((work / "assets" / "baselines.md").read_text(), "Provenance")
    assert f"apptainer: {image} ({definition[:30]})" in {r["Environment"] for r in provenance}


def test_recorded_results_are_merged_and_marked(finished):
    work, _, _ = finished
    page = (work / "assets" / "baselines.md").read_text()
    recorded = markdown_table(page, "Performance (GPU benchmark records)")
    assert len(recorded) == 1
    row = recorded[0]
    assert row["Tokens/s/GPU"] == "9,830" and row["GPUs"] == "1 x H200" and row["Rollout"] == "vllm (sleep)"
    assert row["Actor MFU"] == "21.0%" and row["Engine"] == "0000000 (unknown)"
    assert "recorded: tests/harness/recorded.json" in page
    assert "a test fixture in the benchmark-record format" in page
    assert "2 cells (2 configurations x seeds), 2 finished, 0 failed. Recorded: 1 benchmark record," in page


def test_text_model_on_image_data_is_left_out(finished):
    work, _, result = finished
    assert "left out text-only model x image data set: qwen2-count_shapes" in result.stderr
    assert not list((work / "runs").glob("*count_shapes*"))


def test_a_second_run_plans_nothing(finished, engine_copy):
    work, matrix, _ = finished
    result = snakemake(work, matrix, "-n", engine=engine_copy)
    assert result.returncode == 0 and "Nothing to be done" in result.stdout + result.stderr, result.stdout


def test_the_checkout_reached_another_way_plans_nothing(finished, engine_copy, tmp_path):
    """A symlink, a moved clone or a relative ``-s`` must not change a cell's hash: a changed hash
    replaces the cell's run folder (its checkpoints too) with a new run."""
    work, matrix, _ = finished
    (tmp_path / "checkout").symlink_to(REPO)
    through_link = snakemake(
        work, matrix, "-n", engine=engine_copy, snakefile=tmp_path / "checkout" / "Snakefile"
    )
    assert through_link.returncode == 0 and "Nothing to be done" in through_link.stdout, through_link.stdout
    relative = Path(os.path.relpath(REPO / "Snakefile", work))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "snakemake",
            "-s",
            str(relative),
            "--configfile",
            str(matrix),
            "-n",
            "--profile",
            str(REPO / "configs" / "profiles" / "local"),
        ],
        cwd=work,
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(engine_copy)},
    )
    assert result.returncode == 0 and "Nothing to be done" in result.stdout, result.stdout + result.stderr


def test_a_repository_files_path_is_hashed_by_its_place_in_the_repository(tmp_path):
    """The format prompt's absolute path differs between two spellings of the checkout; the warm
    start it defines (and the cells, hashed the same way) must not."""

    def with_format_prompt(matrix: dict) -> None:
        matrix["datasets"]["arithmetic"]["format_prompt"] = "examples/format_prompt/math.jinja"

    matrix = write_matrix(tmp_path / "matrix.yaml", with_format_prompt)
    (tmp_path / "checkout").symlink_to(REPO)
    warm = [
        planned(snakemake(tmp_path / "work", matrix, "-n", snakefile=snakefile), "warm_start")
        for snakefile in (REPO / "Snakefile", tmp_path / "checkout" / "Snakefile")
    ]
    assert len(warm[0]) == 1 and warm[0] == warm[1]


def test_the_pages_one_cell_command_runs(finished, engine_copy):
    work, _, _ = finished
    page = (work / "assets" / "baselines.md").read_text()
    command = re.search(r"one cell with\s+`\.venv/bin/snakemake ([^`]+)`", page).group(1)
    args = shlex.split(command.replace("CELL", "qwen2-grpo-arithmetic-amp"))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(engine_copy)}
    result = subprocess.run(
        [sys.executable, "-m", "snakemake", *args, "-n", "-d", str(work)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
    )
    assert result.returncode == 0 and "Nothing to be done" in result.stdout + result.stderr, (
        result.stdout + result.stderr
    )


def test_an_engine_change_reruns_every_cell(finished, engine_copy):
    work, matrix, _ = finished
    trainer = engine_copy / "easyr1" / "trainer.py"
    original = trainer.read_text()
    trainer.write_text(original + "\n# a change to the engine\n")
    try:
        result = snakemake(work, matrix, "-n", engine=engine_copy)
    finally:
        trainer.write_text(original)
    assert planned(result, "train") == {"qwen2-grpo-arithmetic-amp", "qwen2-gspo-arithmetic-amp"}
    assert (
        "Nothing to be done" in snakemake(work, matrix, "-n", engine=engine_copy).stdout
    )  # the same engine again


def test_changing_one_axis_reruns_only_the_touched_cells(finished, engine_copy, tmp_path):
    work, _, _ = finished

    def change(matrix: dict) -> None:
        add_recorded_result(matrix)
        matrix["algorithms"]["gspo"]["worker.actor.optim.lr"] = 3.0e-4

    result = snakemake(work, write_matrix(tmp_path / "lr.yaml", change), "-n", engine=engine_copy)
    assert planned(result, "train") == {"qwen2-gspo-arithmetic-amp"}

    def add_precision(matrix: dict) -> None:
        add_recorded_result(matrix)
        matrix["precisions"]["bf16"] = {"worker.actor.fsdp.torch_dtype": "bf16"}
        matrix["grid"][0]["precisions"].append("bf16")

    result = snakemake(work, write_matrix(tmp_path / "bf16.yaml", add_precision), "-n", engine=engine_copy)
    assert planned(result, "train") == {"qwen2-grpo-arithmetic-bf16", "qwen2-gspo-arithmetic-bf16"}


def test_a_fresh_clone_plans_every_cell_of_the_default_matrix(tmp_path):
    """What `make baselines` does on a fresh clone: committed records never stand in for a run."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True)
    result = snakemake(clone, None, "-n", snakefile=clone / "Snakefile")
    cpu = snakemake(tmp_path / "elsewhere", REPO / "configs" / "matrix" / "cpu.yaml", "-n")
    cells = planned(cpu, "train")
    assert len(cells) >= 36 and planned(result, "train") == cells
    assert {"collect", "report"} <= {m for m in re.findall(r"^(?:local)?rule (\w+):", result.stdout, re.M)}
    # Unpacked from an archive, every file has one time: the page is then as new as its inputs.
    moment = time.time()
    for path in clone.rglob("*"):
        os.utime(path, (moment, moment), follow_symlinks=False)
    result = snakemake(clone, None, "-n", snakefile=clone / "Snakefile")
    assert planned(result, "train") == cells
    assert {"collect", "report"} <= {m for m in re.findall(r"^(?:local)?rule (\w+):", result.stdout, re.M)}


@pytest.mark.parametrize("matrix", MATRICES, ids=lambda p: p.stem)
def test_every_matrix_dry_runs(matrix, tmp_path):
    result = snakemake(tmp_path, matrix, "-n")
    assert result.returncode == 0, result.stdout + result.stderr
    assert planned(result, "train"), "no cells"


def test_a_model_at_a_real_scale_is_built_offline_in_its_own_folder(tmp_path):
    """configs/matrix/h200-offline.yaml: the 1.5B architecture, random-init, for a GPU without the hub."""
    result = snakemake(tmp_path, REPO / "configs" / "matrix" / "h200-offline.yaml", "-n")
    assert planned(result, "tiny_model") == {"qwen2-1.5b"}
    assert (
        planned(result, "merge")
        == planned(result, "train")
        == {"qwen2_1.5b_random-grpo-compare-amp", "qwen2_1.5b_random-grpo-compare-bf16"}
    )
    unknown = subprocess.run(  # a size the engine does not build: its error names the ones it does
        [
            sys.executable,
            "-m",
            "easyr1.cli",
            "tiny-model",
            "--arch",
            "qwen3",
            "--size",
            "7b",
            "--out",
            str(tmp_path / "m"),
        ],
        capture_output=True,
        text=True,
    )
    assert unknown.returncode != 0 and "qwen2 7b" in unknown.stderr and not (tmp_path / "m").exists()


def test_the_rollout_column_is_the_backend_the_engine_chose(tmp_path):
    """``auto`` is what the config says; the row says what ran (the engine's line in train.log)."""
    from rules.scripts.collect import rollout_backend

    config = {"worker": {"rollout": {"name": "auto"}}}
    assert rollout_backend(tmp_path, config, on_gpus=False) == "hf"  # never started, no GPU
    assert rollout_backend(tmp_path, config, on_gpus=True) == "auto"  # never started: unknown
    (tmp_path / "train.log").write_text(
        "$ easyr1 train ...\nrollout backend: hf (auto: vllm cannot be imported (ModuleNotFoundError))\n"
    )
    assert rollout_backend(tmp_path, config, on_gpus=True) == "hf"


def test_merge_runs_only_for_cells_that_save_checkpoints(tmp_path):
    def save(matrix: dict) -> None:
        matrix["algorithms"]["gspo"]["trainer.save_freq"] = 1

    result = snakemake(tmp_path, write_matrix(tmp_path / "save.yaml", save), "-n")
    assert planned(result, "merge") == {"qwen2-gspo-arithmetic-amp"}


def test_apptainer_cells_name_the_missing_binary_before_any_cell_starts(tmp_path):
    no_apptainer = os.pathsep.join(
        d
        for d in os.environ["PATH"].split(os.pathsep)
        if not any(Path(d, b).exists() for b in ("apptainer", "singularity"))
    )
    matrix = write_matrix(
        tmp_path / "matrix.yaml", lambda m: m.update(environment="apptainer", image="easyr1-cpu.sif")
    )
    result = snakemake(tmp_path, matrix, path=no_apptainer)
    assert result.returncode != 0
    assert (
        f"matrix config {matrix}: cell qwen2-grpo-arithmetic-amp (and 1 more) runs in an Apptainer image, "
        "but neither apptainer nor singularity is on PATH"
    ) in result.stdout + result.stderr
    assert not (tmp_path / "runs").exists()


def test_a_missing_image_file_is_named_before_any_job(tmp_path):
    def block_in_image(matrix: dict) -> None:
        matrix["grid"][0].update(environment="apptainer", image="images/easyr1-cpu.sif")

    matrix = write_matrix(tmp_path / "matrix.yaml", block_in_image)
    result = snakemake(tmp_path, matrix, "-n", path=path_with_stand_in())
    assert result.returncode != 0
    assert (
        f"matrix config {matrix}: cell qwen2-grpo-arithmetic-amp runs in the Apptainer image images/easyr1-cpu.sif: "
        f"no such file or folder (a relative image path is read from the working directory, {tmp_path})"
    ) in result.stdout + result.stderr
    assert not (tmp_path / "runs").exists()
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "easyr1-cpu.sif").touch()  # where the matrix says, from the working directory
    result = snakemake(tmp_path, matrix, "-n", path=path_with_stand_in())
    assert planned(result, "train") == {"qwen2-grpo-arithmetic-amp", "qwen2-gspo-arithmetic-amp"}


def test_the_slurm_dry_run_shows_the_apptainer_command_of_a_gpu_cell(tmp_path):
    h200 = REPO / "configs" / "matrix" / "h200.yaml"
    (tmp_path / "easyr1-gpu.sif").touch()  # the image the README's `apptainer build` writes
    result = snakemake(
        tmp_path,
        h200,
        "-n",
        "--config",
        "environment=apptainer",
        "image=easyr1-gpu.sif",
        profile="slurm",
        path=path_with_stand_in(),
    )
    cell = "qwen2_5_1.5b-grpo-math12k-amp"
    assert cell in planned(result, "train")
    output = (result.stdout + result.stderr).splitlines()
    line = next(line for line in output if line.startswith(f"{cell} runs in "))
    assert line.startswith(
        f"{cell} runs in easyr1-gpu.sif: apptainer exec --home {tmp_path} --nv --cleanenv --bind {REPO} "
        "easyr1-gpu.sif sh -c 'exec env OMP_NUM_THREADS=16 "
    ), line
    assert line.endswith(f"python3 -m easyr1.cli train config=runs/{cell}/cell.yaml'"), line


def resources(result: subprocess.CompletedProcess, rule: str) -> dict[str, dict[str, str]]:
    """Each planned job of ``rule`` in a dry run: its wildcard value -> its resources."""
    assert result.returncode == 0, result.stdout + result.stderr
    blocks = re.split(r"\n(?=\[\w{3} \w{3} )", result.stdout + result.stderr)
    jobs = {}
    for block in blocks:
        wildcard, listed = re.search(r"wildcards: \w+=(\S+)", block), re.search(r"resources: (.*)", block)
        if re.search(rf"^(local)?rule {rule}:", block, re.M) and wildcard and listed:
            jobs[wildcard.group(1)] = dict(item.split("=", 1) for item in listed.group(1).split(", "))
    return jobs


def test_cells_on_several_nodes_ask_slurm_for_their_nodes_and_tasks(tmp_path):
    """In the SLURM executor plugin's names: srun cells one task a rank (mpi: the batch script
    starts them), Ray cells one task a node; GPUs of several nodes are asked for per node."""
    jobs = resources(snakemake(tmp_path, MULTINODE, "-n", profile="slurm"), "train")
    one, by_srun, by_ray = (
        jobs[f"qwen2-grpo-arithmetic-fp32{suffix}"] for suffix in ("", "-2node", "-2node-ray")
    )
    assert (one["nodes"], one["mpi"], one["tasks"]) == ("1", "", "0")
    assert (by_srun["nodes"], by_srun["mpi"], by_srun["tasks"], by_srun["cpus_per_task"]) == (
        "2",
        "srun",
        "2",
        "1",
    )
    assert (by_ray["nodes"], by_ray["mpi"], by_ray["tasks"], by_ray["cpus_per_task"]) == ("2", "", "2", "1")

    def gpus(matrix: dict) -> None:
        matrix.update(gpus=16, gpus_per_node=8)
        # batches that split over 16 ranks, as the engine config is checked before any job
        matrix["datasets"]["arithmetic"]["overrides"].update(
            {"data.rollout_batch_size": 16, "worker.actor.global_batch_size": 16}
        )
        matrix["grid"][0]["nodes"] = [2]  # the nodes its GPUs fill: no suffix
        matrix["grid"][1]["nodes"] = [4]

    jobs = resources(
        snakemake(tmp_path, write_matrix(tmp_path / "gpus.yaml", gpus, MULTINODE), "-n", profile="slurm"),
        "train",
    )
    by_srun, by_ray = jobs["qwen2-grpo-arithmetic-fp32"], jobs["qwen2-grpo-arithmetic-fp32-4node-ray"]
    assert (
        by_srun["gpu"],
        by_srun["gres"],
        by_srun["tasks"],
        by_srun["tasks_per_gpu"],
        by_srun["cpus_per_task"],
    ) == ("0", "gpu:8", "16", "1", "8")
    assert (by_ray["gres"], by_ray["tasks"], by_ray["cpus_per_task"], by_ray["slurm_extra"]) == (
        "gpu:4",
        "4",
        "32",
        "--ntasks-per-node=1",
    )


JOB = """
import sys
from rules.scripts.engine import job_child
print(job_child(["sh", "-c", 'echo $$ > "$1"; exec sleep 60', "sh", sys.argv[1]]).returncode, flush=True)
"""


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_a_jobs_child_stops_with_the_job(how, tmp_path):
    """A job's installs, test suites and engine runs (``engine.job_child``) end with the job: a
    SIGTERM is passed on and waited for, and a job killed outright takes its child with it (an
    orphaned install or suite would go on writing into the cache)."""
    import signal
    import time

    pidfile = tmp_path / "child.pid"
    job = subprocess.Popen(
        [sys.executable, "-c", JOB, str(pidfile)], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    for _ in range(300):  # the job imports Snakemake first: seconds on a loaded CI machine
        if pidfile.is_file() and pidfile.read_text().strip():
            break
        time.sleep(0.1)
    child = int(pidfile.read_text())
    job.send_signal(signal.SIGTERM if how == "sigterm" else signal.SIGKILL)
    out, _ = job.communicate(timeout=30)
    if how == "sigterm":  # passed on, waited for: the job reports the child's end and exits itself
        assert out.strip() == str(-signal.SIGTERM) and job.returncode == 0
    for _ in range(100):
        if not Path(f"/proc/{child}").exists() or "zombie" in Path(f"/proc/{child}/status").read_text():
            break
        time.sleep(0.1)
    else:
        os.kill(child, signal.SIGKILL)
        pytest.fail(f"the child {child} outlived its job ({how})")


def test_a_cell_on_several_nodes_says_where_it_can_run():
    from rules.scripts.cell import missing_nodes, rank_launch

    cell = {"name": "c-2node", "nodes": 2, "launcher": "srun", "resources": {"tasks": 4, "cpus_per_task": 3}}
    assert missing_nodes(cell, {}) == (
        "c-2node runs on 2 nodes and this job runs outside SLURM: run it with --profile configs/profiles/slurm "
        "(or take nodes: out of its grid block)"
    )
    assert "this SLURM job has 1" in missing_nodes(cell, {"SLURM_JOB_NUM_NODES": "1"})
    assert missing_nodes(cell, {"SLURM_JOB_NUM_NODES": "2"}) == ""
    assert rank_launch(cell) == (
        "srun",
        "--kill-on-bad-exit=1",
        "--nodes=2",
        "--ntasks=4",
        "--ntasks-per-node=2",
        "--cpus-per-task=3",
    )
    assert rank_launch({**cell, "launcher": "ray"}) == () and rank_launch({**cell, "launcher": "local"}) == ()


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda m: m.update(stepz=3), "'stepz' was unexpected"),
        (lambda m: m.update(environment="apptainer"), "image: environment apptainer needs an image"),
        (
            lambda m: m["grid"][0].update(environment="apptainer"),
            "grid[0]: qwen2: environment apptainer needs an image (image: on the block, model or matrix)",
        ),
        (lambda m: m["precisions"].update(fp8="bits"), "precisions"),
        (lambda m: m["grid"][0]["models"].append("qwen9"), "grid[0].models: unknown model 'qwen9'"),
        (
            lambda m: m["models"]["qwen2"]["warm_start"].update(dataset="count_shapes"),
            "models.qwen2.warm_start.dataset: count_shapes has images; qwen2 is text-only",
        ),
        (
            lambda m: m["grid"][0].update(nodes=[3]),
            "grid[0].nodes: cpu_ranks 2 do not split evenly over 3 nodes",
        ),
        (
            lambda m: m["grid"][0].update(gpus=[16], nodes=[1]),
            "grid[0].nodes: 16 GPUs over 1 nodes is 16 a node; gpus_per_node is 8",
        ),
        (lambda m: m["grid"][0].update(launcher="mpirun"), "'mpirun' is not one of ['srun', 'ray']"),
        (
            lambda m: m["grid"][0].update(
                launcher="ray", nodes=[2], environment="apptainer", image="img.sif"
            ),
            "grid[0]: qwen2: launcher ray does not run in an Apptainer image",
        ),
        (lambda m: m["models"]["qwen2"].update(scale="13b"), "'13b' is not one of"),
        (
            lambda m: m["models"].update(hub={"path": "Qwen/Qwen2.5-7B", "scale": "7b"}),
            "'tiny' is a dependency of 'scale'",
        ),
        (
            lambda m: m["algorithms"]["gspo"].update({"worker.actor.optim.lrr": 1e-3}),
            "grid[0]: qwen2-gspo-arithmetic-amp: unknown config key 'worker.actor.optim.lrr'; did you mean "
            "worker.actor.optim.lr?",
        ),
        (
            lambda m: m["datasets"]["arithmetic"]["overrides"].update({"worker.rollout.n": "eight"}),
            "grid[0]: qwen2-grpo-arithmetic-amp: worker.rollout.n: expected an integer, got 'eight'",
        ),
        (
            lambda m: m["datasets"]["arithmetic"]["overrides"].update({"data.rollout_batch_size": 3}),
            "grid[0]: qwen2-grpo-arithmetic-amp: data.rollout_batch_size=3 must be divisible by the 2 ranks",
        ),
        (
            lambda m: m.update(recorded=["baselines/gpu/*.json", "baselines/gpu/2026-*-h200-anchor-hf.jsn"]),
            "recorded: recorded[1]: 'baselines/gpu/2026-*-h200-anchor-hf.jsn' matches no file",
        ),
        (
            lambda m: m.update(recorded=["baselines/cpu/*"]),
            "recorded: recorded[0]: 'baselines/cpu/*' matches",
        ),
        (
            lambda m: m["datasets"].update(
                arithmetic={
                    "train": "data/mine/train.jsonl",
                    "test": "data/mine/test.jsonl",
                    "reward": "math",
                }
            ),
            "datasets.arithmetic.train: data/mine/train.jsonl: no such file or folder (local paths are read from the "
            "working directory",
        ),
        (
            # three parts: a folder, never a hub id (those are name or org/name), so checked before any job
            lambda m: m["datasets"].update(
                arithmetic={"train": "data/mine/train", "test": "data/mine/test", "reward": "math"}
            ),
            "datasets.arithmetic.train: data/mine/train: no such file or folder",
        ),
        (
            lambda m: m["models"].update(qwen2={"path": "./models/qwen2"}),
            "models.qwen2.path: ./models/qwen2: no such file or folder",
        ),
        (
            # absolute: local by the shared rule, and a native cell reads it on this machine
            lambda m: m["datasets"].update(
                arithmetic={
                    "train": "/no/such/dir/train.jsonl",
                    "test": "/no/such/dir/test.jsonl",
                    "reward": "math",
                }
            ),
            "datasets.arithmetic.train: /no/such/dir/train.jsonl: no such file or folder (a job outside an image "
            "reads an absolute path from this machine's files)",
        ),
        (
            lambda m: m["grid"][0].update(datasets=["count_shapes"]),
            "grid: no cells: every model of the grid is text-only and every data set has images",
        ),
    ],
    ids=[
        "unknown-key",
        "apptainer-without-image",
        "block-in-apptainer-without-image",
        "wrong-type",
        "unknown-model",
        "text-model-warm-start-on-images",
        "nodes-uneven",
        "gpus-overfill-nodes",
        "unknown-launcher",
        "ray-in-an-image",
        "unknown-scale",
        "scale-without-tiny",
        "engine-key-typo",
        "engine-value-type",
        "engine-batch-over-ranks",
        "recorded-matches-nothing",
        "recorded-matches-a-folder",
        "local-data-missing",
        "local-data-folder-missing",
        "local-model-missing",
        "local-data-absolute-missing",
        "no-cells",
    ],
)
def test_config_errors_name_the_key(change, message, tmp_path):
    result = snakemake(tmp_path, write_matrix(tmp_path / "bad.yaml", change), "-n")
    assert result.returncode != 0
    assert message in result.stdout + result.stderr
    assert not (tmp_path / "runs").exists()  # found before any job runs


@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda m: m["grid"][0].update(model=["qwen2"]),
            "grid[0]: Additional properties are not allowed ('model' was unexpected)",
        ),
        (
            lambda m: m["models"]["qwen2"]["warm_start"].update(steps="ten"),
            "models.qwen2.warm_start.steps: 'ten' is not of type 'integer'",
        ),
        (
            lambda m: m["datasets"].update(mine={"train": "train.jsonl", "reward": "math"}),
            "datasets.mine: {'reward': 'math', 'train': 'train.jsonl'} is not valid under any of the given schemas "
            "(oneOf: {'required': ['synthetic']}, {'required': ['train', 'test']})",
        ),
    ],
    ids=["grid-key-typo", "nested-wrong-type", "dataset-without-test"],
)
def test_a_matrix_off_its_schema_names_the_file_and_the_key(change, message, tmp_path):
    """Snakemake's own schema error names neither the file nor the key, and prints the schema."""
    matrix = write_matrix(tmp_path / "bad.yaml", change)
    result = snakemake(tmp_path, matrix, "-n")
    assert result.returncode != 0
    assert f"matrix config {matrix}: {message}" in result.stdout + result.stderr
    assert "Failed validating" not in result.stdout + result.stderr


@pytest.mark.parametrize(
    "workflow, base, change, message",
    [
        (
            "rules/memory.smk",
            "configs/matrix/hardware.yaml",
            lambda c: c["whole_gpu"].update(sizes=["9b"]),
            "hardware config {}: whole_gpu.sizes[0]: '9b' is not one of",
        ),
        (
            "rules/deps.smk",
            "configs/deps/cpu.yaml",
            lambda c: c.update(refrence=c.pop("reference")),
            "deps config {}: (top level): Additional properties are not allowed ('refrence' was unexpected)",
        ),
    ],
    ids=["hardware", "deps"],
)
def test_the_other_workflows_configs_off_their_schema_name_the_file_and_the_key(
    workflow, base, change, message, tmp_path
):
    config = write_matrix(tmp_path / "bad.yaml", change, REPO / base)
    result = snakemake(tmp_path, config, "-n", snakefile=REPO / workflow)
    assert result.returncode != 0
    assert message.format(config) in result.stdout + result.stderr


def test_an_absolute_data_path_of_a_cell_in_an_image_is_left_to_the_image(tmp_path):
    """In an image a path may be the image's own, or bound from a machine the cell runs on."""

    def in_image(matrix: dict) -> None:
        matrix["models"]["qwen2"] = {"tiny": "qwen2"}  # no warm start: nothing native reads the data
        matrix["datasets"]["arithmetic"] = {
            "train": "/data/train.jsonl",
            "test": "/data/test.jsonl",
            "reward": "math",
        }
        matrix["grid"][0].update(environment="apptainer", image="/images/easyr1-cpu.sif")

    result = snakemake(tmp_path, write_matrix(tmp_path / "m.yaml", in_image), "-n", path=path_with_stand_in())
    assert planned(result, "train") == {"qwen2-grpo-arithmetic-amp", "qwen2-gspo-arithmetic-amp"}


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_a_local_data_file_without_the_prompt_or_answer_column_is_named_before_any_job(kind, tmp_path):
    """The engine would find it in every cell's job, after preparation: its first row says so now."""
    rows = [{"question": "1+1", "answer": "2"}]
    (tmp_path / "data").mkdir()
    for split in ("train", "test"):
        path = tmp_path / "data" / f"{split}.{kind}"
        if kind == "jsonl":
            path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        else:
            import pyarrow as pa
            import pyarrow.parquet as pq

            pq.write_table(pa.Table.from_pylist(rows), path)

    def local(matrix: dict) -> None:
        matrix["datasets"]["arithmetic"] = {
            "train": f"data/train.{kind}",
            "test": f"data/test.{kind}",
            "reward": "math",
        }

    matrix = write_matrix(tmp_path / "m.yaml", local)
    result = snakemake(tmp_path, matrix, "-n")
    assert result.returncode != 0
    assert (
        f"matrix config {matrix}: datasets.arithmetic.train: data/train.{kind}: no column 'problem' "
        "(data.prompt_key); its columns: question, answer"
    ) in result.stdout + result.stderr
    assert not (tmp_path / "runs").exists()
    fixed = write_matrix(
        tmp_path / "fixed.yaml",
        lambda m: (local(m), m["datasets"]["arithmetic"].update(overrides={"data.prompt_key": "question"})),
    )
    assert planned(snakemake(tmp_path, fixed, "-n"), "train") == {
        "qwen2-grpo-arithmetic-amp",
        "qwen2-gspo-arithmetic-amp",
    }


def test_an_engine_file_error_names_the_engine_file(tmp_path):
    """Checked in every cell, a typo of the engine file was blamed on the grid's first cell."""
    engine = tmp_path / "engine.yaml"
    engine.write_text(
        (REPO / "configs" / "engine" / "cpu.yaml")
        .read_text()
        .replace("max_response_length", "max_respone_length")
    )
    matrix = write_matrix(tmp_path / "m.yaml", lambda m: m.update(engine=str(engine)))
    result = snakemake(tmp_path, matrix, "-n")
    assert result.returncode != 0
    assert (
        f"matrix config {matrix}: engine: {engine}: unknown config key 'data.max_respone_length'"
    ) in result.stdout + result.stderr
    assert "grid[0]" not in result.stdout + result.stderr


def test_a_key_given_with_config_is_blamed_on_the_command_line(tmp_path):
    result = snakemake(tmp_path, TINY, "-n", "--config", "stepz=3")
    assert result.returncode != 0
    assert (
        "('stepz' was unexpected) (stepz came from --config, not from the file)"
        in result.stdout + result.stderr
    )
    result = snakemake(tmp_path, TINY, "-n", "--config", "engine=configs/engine/nope.yaml")
    assert result.returncode != 0
    assert (
        f"engine: file not found: {REPO / 'configs/engine/nope.yaml'} (engine came from --config, not from the file)"
    ) in result.stdout + result.stderr


@pytest.mark.parametrize(
    "workflow, own",
    [
        ("Snakefile", "configs/matrix/cpu.yaml"),
        ("rules/memory.smk", "configs/matrix/hardware.yaml"),
        ("rules/deps.smk", "configs/deps/cpu.yaml"),
    ],
    ids=["baselines", "hardware", "deps"],
)
def test_a_config_of_elsewhere_run_in_the_repository_stops_before_any_job(workflow, own, tmp_path):
    """Run with the repository as working directory, it would replace the committed results and
    pages with its own (a matrix without `recorded:` drops every committed GPU record from the page)."""
    for config in (write_matrix(tmp_path / "mine.yaml", lambda m: None, REPO / own), TINY):
        if config == TINY and workflow != "Snakefile":
            continue
        result = snakemake(REPO, config, "-n", snakefile=REPO / workflow)
        assert result.returncode != 0
        assert (
            f"config {config} is not one of the repository's own configs ({Path(own).parent}/*.yaml), and the "
            f"working directory is the repository ({REPO})"
        ) in result.stdout + result.stderr
        assert "pass -d DIR (--directory DIR) to run it in DIR" in result.stdout + result.stderr
    result = snakemake(tmp_path / "work", tmp_path / "mine.yaml", "-n", snakefile=REPO / workflow)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_other_workflows_without_a_config_say_which_to_pass():
    for workflow, config in (
        ("rules/deps.smk", "configs/deps/cpu.yaml"),
        ("rules/memory.smk", "configs/matrix/hardware.yaml"),
    ):
        result = subprocess.run(
            [sys.executable, "-m", "snakemake", "-s", workflow, "--lint"],
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        assert result.returncode != 0
        assert f"config: none given: pass --configfile {config}" in result.stdout + result.stderr


def test_config_on_the_command_line_changes_the_default_matrix(tmp_path):
    """``--config`` without ``--configfile`` changes the CPU matrix, as it changes any other: it does
    not replace it with a matrix of its keys alone."""
    result = snakemake(tmp_path, None, "-n", "--config", "steps=3")
    assert len(planned(result, "train")) == 39
    result = snakemake(tmp_path, None, "-n", "--config", "steps=ten")
    assert result.returncode != 0
    assert (
        "matrix config configs/matrix/cpu.yaml: steps: 'ten' is not of type 'integer' (steps came from --config, "
        "not from the file)"
    ) in result.stdout + result.stderr


@pytest.mark.parametrize(
    "target, message",
    [
        (
            "runs/qwen2-grpo-arithmetic-amq/status.json",
            "no cell 'qwen2-grpo-arithmetic-amq' (runs/qwen2-grpo-arithmetic-amq/ is not one of its cells); "
            "did you mean qwen2-grpo-arithmetic-amp or qwen2-gspo-arithmetic-amp?",
        ),
        (
            "runs/llama-ppo/merge.json",
            "no cell 'llama-ppo' (runs/llama-ppo/ is not one of its cells); its 2 cells: qwen2-grpo-arithmetic-amp, "
            "qwen2-gspo-arithmetic-amp",
        ),
    ],
    ids=["train-near-miss", "merge-unknown"],
)
def test_a_target_of_no_cell_names_the_matrix_and_its_cells(target, message, tmp_path):
    result = snakemake(tmp_path, TINY, "-n", target)
    assert result.returncode != 0
    assert f"matrix config {TINY.relative_to(REPO)}: {message}" in result.stdout + result.stderr
    assert "KeyError" not in result.stdout + result.stderr


def test_a_key_given_twice_names_the_file_and_key(tmp_path):
    """Snakemake's loader keeps a repeated key's last value: a second ``grid:`` would drop the first
    block's cells, a second ``algorithm:`` in the engine file its other keys, without a word."""
    matrix = tmp_path / "twice.yaml"
    matrix.write_text(TINY.read_text() + "\nsteps: 3\n")
    result = snakemake(tmp_path, matrix, "-n")
    assert result.returncode != 0 and "key 'steps' is given twice" in result.stdout + result.stderr
    engine = tmp_path / "engine.yaml"
    engine.write_text(
        (REPO / "configs" / "engine" / "cpu.yaml").read_text() + "\nalgorithm: {kl_coef: 0.05}\n"
    )
    result = snakemake(
        tmp_path, write_matrix(tmp_path / "m.yaml", lambda m: m.update(engine=str(engine))), "-n"
    )
    assert result.returncode != 0
    assert (
        f"matrix config {tmp_path / 'm.yaml'}: engine: {engine}: invalid YAML"
        in result.stdout + result.stderr
    )
    assert "key 'algorithm' is given twice" in result.stdout + result.stderr
    assert not (tmp_path / "runs").exists()


def test_paths_inside_the_checkout_that_the_harness_did_not_resolve_pass_as_given(tmp_path):
    """Only the files the harness resolves (format prompts, reward files) are hashed by content: a
    data folder with @split or a model folder that happens to lie in the checkout is a path."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text('{"problem": "1+1", "answer": "2"}\n')

    def inside(matrix: dict) -> None:
        matrix["datasets"]["arithmetic"] = {
            "train": f"{tmp_path / 'data'}@train",
            "test": f"{tmp_path / 'data'}@train",
            "reward": "math",
        }
        matrix["models"]["qwen2"] = {"path": str(REPO / "tests")}

    result = snakemake(tmp_path / "work", write_matrix(tmp_path / "m.yaml", inside), "-n")
    assert planned(result, "train") == {"qwen2-grpo-arithmetic-amp", "qwen2-gspo-arithmetic-amp"}


def test_local_data_is_read_from_the_working_directory(tmp_path):
    (tmp_path / "data").mkdir()
    for split in ("train", "test"):
        (tmp_path / "data" / f"{split}.jsonl").write_text('{"problem": "1+1", "answer": "2"}\n')

    def local(matrix: dict) -> None:
        matrix["datasets"]["arithmetic"] = {
            "train": "data/train.jsonl",
            "test": "data/test.jsonl",
            "reward": "math",
        }

    assert planned(snakemake(tmp_path, write_matrix(tmp_path / "m.yaml", local), "-n"), "train") == {
        "qwen2-grpo-arithmetic-amp",
        "qwen2-gspo-arithmetic-amp",
    }


@pytest.mark.parametrize(
    "workflow",
    [
        [],
        ["-s", "rules/deps.smk", "--configfile", "configs/deps/cpu.yaml"],
        ["-s", "rules/memory.smk", "--configfile", "configs/matrix/hardware.yaml"],
    ],
    ids=["baselines", "deps", "hardware"],
)
def test_lint_is_clean(workflow):
    result = subprocess.run(
        [sys.executable, "-m", "snakemake", "--lint", *workflow], cwd=REPO, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Congratulations" in result.stdout + result.stderr
