"""The baselines matrix's expansion, unit by unit, without running Snakemake: the config and its
errors (rules/scripts/matrix.py), models and data sets (sources.py), environments
(environments.py), the grid's cells (grid.py) and what the jobs are given (jobs.py). The workflow's
own behaviour (plans, reruns, the messages Snakemake prints) is tests/harness/test_harness.py's."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from rules.scripts import grid, jobs
from rules.scripts.environments import cell_environment, environment_key, environment_label, prepare_venv
from rules.scripts.inputs import check_schema
from rules.scripts.matrix import Matrix, MatrixError, as_flags, leaves, merged, nested, repo_file, short_hash
from rules.scripts.sources import built_model_dir, data_dir, local_source, model_path, splits, warm_start_spec

REPO = Path(__file__).resolve().parents[2]
SCHEMA = REPO / "configs" / "schema" / "matrix.schema.yaml"
TINY = REPO / "tests" / "harness" / "tiny.yaml"
CPU = REPO / "configs" / "matrix" / "cpu.yaml"


def load(
    path: Path = TINY, change=lambda config: None, repo: Path = REPO, command_line: dict | None = None
) -> Matrix:
    """A matrix as the workflow reads it: the file, ``change``d, with its schema's defaults, and the
    engine file read."""
    config = yaml.safe_load(path.read_text())
    change(config)
    check_schema(config, SCHEMA)
    matrix = Matrix(config, repo, Path("matrix.yaml"), command_line or {})
    grid.read_engine(matrix)
    return matrix


def expanded(path: Path = TINY, change=lambda config: None, repo: Path = REPO) -> Matrix:
    matrix = load(path, change, repo)
    matrix.cells = grid.expand_grid(matrix)
    return matrix


# ---- matrix.py: trees, files, hashes, errors


def test_nested_and_merged_build_a_tree_without_touching_the_base():
    base = {"data": {"seed": 1, "max_prompt_length": 256}, "trainer": {"max_steps": 5}}
    before = copy.deepcopy(base)
    out = merged(base, nested({"data.seed": 2, "worker.actor.lr": 0.1}))
    assert out == {
        "data": {"seed": 2, "max_prompt_length": 256},
        "trainer": {"max_steps": 5},
        "worker": {"actor": {"lr": 0.1}},
    }
    assert base == before
    assert sorted(map(str, leaves(out))) == ["0.1", "2", "256", "5"]


def test_flags_are_spelled_as_the_engine_tools_take_them():
    assert as_flags({"batch_size": 16, "task": "arithmetic"}) == [
        "--batch-size",
        "16",
        "--task",
        "arithmetic",
    ]


def test_a_repository_file_is_hashed_by_its_place_and_content_not_by_the_path_reaching_it(tmp_path):
    repo = tmp_path / "repo"
    (repo / "rewards").mkdir(parents=True)
    (repo / "rewards" / "r.py").write_text("def f(x): return 1\n")
    (tmp_path / "link").symlink_to(repo)

    def hashed(root: Path) -> str:
        matrix = Matrix({}, root, Path("m.yaml"))
        return short_hash(matrix, {"reward": repo_file(matrix, "datasets.d.reward", "rewards/r.py") + ":f"})

    first = hashed(repo)
    assert hashed(tmp_path / "link") == first
    (repo / "rewards" / "r.py").write_text("def f(x): return 0\n")
    assert hashed(repo) != first


def test_a_missing_repository_file_names_the_matrix_and_the_key(tmp_path):
    matrix = Matrix({}, tmp_path, Path("m.yaml"))
    with pytest.raises(
        MatrixError, match=r"^matrix config m.yaml: datasets.d.format_prompt: file not found: .*/nope.jinja$"
    ):
        repo_file(matrix, "datasets.d.format_prompt", "nope.jinja")


def test_an_error_in_a_key_given_on_the_command_line_says_so():
    matrix = Matrix({}, REPO, Path("m.yaml"), {"steps": 3})
    assert str(matrix.error("steps", "bad")).endswith(
        "steps: bad (steps came from --config, not from the file)"
    )
    assert str(matrix.error("grid[0].models", "bad")).endswith("grid[0].models: bad")
    assert matrix.from_command_line("x", "Additional properties ('steps' was unexpected)").startswith(
        " (steps came"
    )


# ---- sources.py: models and data sets


def test_prepared_folders_are_named_by_what_defines_them():
    matrix = load()
    assert data_dir(matrix.config, "arithmetic") == "runs/prepared/data/arithmetic-d1-64-16-s0"
    assert splits(matrix, "arithmetic") == (
        "runs/prepared/data/arithmetic-d1-64-16-s0@train",
        "runs/prepared/data/arithmetic-d1-64-16-s0@test",
    )
    assert built_model_dir(matrix.config, "qwen2_5_vl") == "runs/prepared/model/qwen2_5_vl"
    warm = model_path(matrix, "qwen2")
    assert warm.startswith("runs/prepared/warm/qwen2-") and len(warm.rsplit("-", 1)[1]) == 12

    def bigger(config: dict) -> None:
        config["models"]["qwen2"]["warm_start"]["steps"] = 21

    assert model_path(load(change=bigger), "qwen2") != warm  # a changed setting is a new folder


def test_a_model_at_a_real_scale_has_a_folder_of_its_own():
    def scaled(config: dict) -> None:
        config["models"]["qwen2_5_vl"]["scale"] = "1.5b"

    assert built_model_dir(load(change=scaled).config, "qwen2_5_vl") == "runs/prepared/model/qwen2_5_vl-1.5b"


def test_a_local_path_must_exist_where_the_job_reads_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    matrix = load()
    with pytest.raises(
        MatrixError, match=r"datasets.d.train: data/train.parquet: no such file or folder \(local paths"
    ):
        local_source(matrix, "datasets.d.train", "data/train.parquet", here=True)
    # an absolute path is the image's business when the job runs in one; a hub name is the engine's
    assert (
        local_source(matrix, "datasets.d.train", "/data/train.parquet", here=False) == "/data/train.parquet"
    )
    assert (
        local_source(matrix, "datasets.d.train", "hiyouga/geometry3k@train", here=True)
        == "hiyouga/geometry3k@train"
    )
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.parquet").write_bytes(b"")
    assert local_source(matrix, "datasets.d.train", "data/train.parquet", here=True) == "data/train.parquet"


def test_a_warm_start_on_images_for_a_text_model_is_refused():
    def on_images(config: dict) -> None:
        config["models"]["qwen2"]["warm_start"]["dataset"] = "count_shapes"

    with pytest.raises(
        MatrixError, match="models.qwen2.warm_start.dataset: count_shapes has images; qwen2 is text-only"
    ):
        warm_start_spec(load(change=on_images), "qwen2")

    def unknown(config: dict) -> None:
        config["models"]["qwen2"]["warm_start"]["dataset"] = "nope"

    with pytest.raises(MatrixError, match="unknown data set 'nope'"):
        warm_start_spec(load(change=unknown), "qwen2")


# ---- environments.py


def test_a_cells_environment_comes_from_its_block_then_its_model_then_the_matrix():
    def layered(config: dict) -> None:
        config["environment"] = "apptainer"
        config["image"] = "matrix.sif"
        config["models"]["qwen2"]["image"] = "model.sif"

    matrix = load(change=layered)
    assert cell_environment(matrix, "grid[0]", "qwen2", {}) == ("apptainer", "model.sif", None)
    assert cell_environment(matrix, "grid[0]", "qwen2_5_vl", {}) == ("apptainer", "matrix.sif", None)
    assert cell_environment(matrix, "grid[0]", "qwen2", {"environment": "native"}) == ("native", None, None)
    assert environment_key(("apptainer", "model.sif", None)) == "apptainer model.sif"
    assert environment_key(("native", None, None)) == "native"  # a native cell's hash is what it always was


def test_an_apptainer_cell_without_an_image_names_its_block():
    matrix = load()
    with pytest.raises(MatrixError, match=r"grid\[1\]: qwen2: environment apptainer needs an image"):
        cell_environment(matrix, "grid[1]", "qwen2", {"environment": "apptainer"})


def test_a_venv_cell_names_its_combination_and_an_unknown_one_is_refused():
    matrix = load()
    block = {"environment": "venv", "deps": {"file": "configs/deps/cpu.yaml", "combination": "oldest"}}
    env = cell_environment(matrix, "grid[0]", "qwen2", block)
    assert env[0] == "venv" and env[2]["combination"] == "oldest" and len(env[2]["key"]) == 16
    assert environment_label(env) == "venv oldest" and environment_key(env) == f"venv oldest {env[2]['key']}"
    assert env[2]["key"] in matrix.venv_specs  # what the venv rule installs
    block["deps"]["combination"] = "newest"
    with pytest.raises(
        MatrixError,
        match=r"grid\[0\].deps.combination: unknown combination 'newest' in configs/deps/cpu.yaml; defined: pinned",
    ):
        cell_environment(matrix, "grid[0]", "qwen2", block)
    assert prepare_venv(matrix) is None  # preparation runs in the matrix's environment: native


# ---- grid.py


def test_a_cells_name_carries_only_what_differs_from_the_matrixs_defaults():
    config = load().config
    assert (
        grid.cell_name(config, "m", "grpo", "d", "amp", 0, config["gpus"], config["seed"], 1, "srun")
        == "m-grpo-d-amp"
    )
    assert (
        grid.cell_name(config, "m", "grpo", "d", "amp", 8, 2, 3, 1, "srun") == "m-grpo-d-amp-lora8-2gpu-seed3"
    )


def test_gpus_that_do_not_fill_nodes_are_refused_and_cpu_ranks_split_over_nodes():
    matrix = load(change=lambda c: c.update(gpus_per_node=8, cpu_ranks=4))
    with pytest.raises(MatrixError, match=r"grid\[0\].gpus: 12 GPUs do not fill nodes of 8"):
        grid.topology(matrix, "grid[0]", 12, None)
    assert grid.topology(matrix, "grid[0]", 16, None) == (2, 8)
    assert grid.topology(matrix, "grid[0]", 0, 2) == (2, 2)
    with pytest.raises(MatrixError, match=r"grid\[0\].nodes: cpu_ranks 4 do not split evenly over 3 nodes"):
        grid.topology(matrix, "grid[0]", 0, 3)


def test_a_cell_on_several_nodes_asks_slurm_for_a_task_a_rank_with_srun_and_a_node_with_ray():
    config = load().config
    srun = grid.cell_resources(config, "qwen2", 16, 2, 8, "srun")
    assert (srun["nodes"], srun["tasks"], srun["mpi"], srun["gres"], srun["gpu"]) == (
        2,
        16,
        "srun",
        "gpu:8",
        0,
    )
    ray = grid.cell_resources(config, "qwen2", 16, 2, 8, "ray")
    assert (ray["tasks"], ray["mpi"], ray["slurm_extra"]) == (2, "", "--ntasks-per-node=1")
    one = grid.cell_resources(config, "qwen2", 1, 1, 1, "srun")
    assert (one["gpu"], one["tasks"], one["nodes"]) == (1, 0, 1)


def test_the_grid_leaves_text_models_off_image_data_and_hashes_each_cells_resolved_config():
    matrix = expanded()
    assert sorted(matrix.cells) == ["qwen2-grpo-arithmetic-amp", "qwen2-gspo-arithmetic-amp"]
    spec = matrix.cells["qwen2-gspo-arithmetic-amp"]
    assert spec["config"]["worker"]["actor"]["loss_type"] == "gspo"
    assert spec["config"]["trainer"]["experiment_name"] == "qwen2-gspo-arithmetic-amp"
    assert spec["config"]["worker"]["actor"]["model"]["model_path"] == model_path(matrix, "qwen2")
    assert (spec["environment"], spec["launcher"], spec["steps"]) == ("native", "local", 2)
    hashes = {name: s["hash"] for name, s in matrix.cells.items()}
    assert len(set(hashes.values())) == 2

    def gspo_changed(config: dict) -> None:
        config["algorithms"]["gspo"]["worker.actor.clip_ratio_low"] = 0.1

    changed = {name: s["hash"] for name, s in expanded(change=gspo_changed).cells.items()}
    assert changed["qwen2-grpo-arithmetic-amp"] == hashes["qwen2-grpo-arithmetic-amp"]
    assert changed["qwen2-gspo-arithmetic-amp"] != hashes["qwen2-gspo-arithmetic-amp"]


def test_the_default_matrixs_hashes_do_not_depend_on_the_path_to_the_checkout(tmp_path):
    (tmp_path / "checkout").symlink_to(REPO)
    here = {name: spec["hash"] for name, spec in expanded(CPU).cells.items()}
    there = {name: spec["hash"] for name, spec in expanded(CPU, repo=tmp_path / "checkout").cells.items()}
    assert len(here) == 39 and here == there


def test_grid_errors_name_the_block_and_what_is_defined():
    def unknown(config: dict) -> None:
        config["grid"][0]["algorithms"] = ["grpo", "ppo2"]

    with pytest.raises(
        MatrixError, match=r"grid\[0\].algorithms: unknown algorithm 'ppo2'; defined: grpo, gspo"
    ):
        expanded(change=unknown)

    def typo(config: dict) -> None:
        config["algorithms"]["gspo"]["worker.actor.loss_typo"] = "gspo"

    with pytest.raises(MatrixError, match=r"grid\[0\]: qwen2-gspo-arithmetic-amp: .*loss_typo"):
        expanded(change=typo)

    def only_images(config: dict) -> None:
        config["grid"][0]["datasets"] = ["count_shapes"]

    with pytest.raises(MatrixError, match="grid: no cells"):
        expanded(change=only_images)


def test_an_error_of_the_engine_file_itself_names_the_file(tmp_path):
    engine = tmp_path / "engine.yaml"
    engine.write_text(
        yaml.safe_dump({**yaml.safe_load((REPO / "configs/engine/cpu.yaml").read_text()), "nonsense": 1})
    )
    with pytest.raises(MatrixError, match=rf"engine: {engine}: .*nonsense"):
        expanded(change=lambda config: config.update(engine=str(engine)))


# ---- jobs.py


def test_an_unknown_cell_is_refused_with_the_closest_ones():
    matrix = expanded()
    with pytest.raises(
        MatrixError, match="no cell 'qwen2-grpo-arithmetic-bf16'.*did you mean qwen2-grpo-arithmetic-amp"
    ):
        jobs.known_cell(matrix, "qwen2-grpo-arithmetic-bf16")
    with pytest.raises(
        MatrixError, match="its 2 cells: qwen2-grpo-arithmetic-amp, qwen2-gspo-arithmetic-amp$"
    ):
        jobs.known_cell(matrix, "x")


def test_a_cell_reads_its_prepared_model_and_data():
    matrix = expanded()
    inputs = jobs.cell_inputs(matrix, "qwen2-grpo-arithmetic-amp")
    assert inputs == {"model": model_path(matrix, "qwen2"), "data": data_dir(matrix.config, "arithmetic")}
    assert jobs.merge_inputs(matrix, "qwen2-grpo-arithmetic-amp") == {
        "status": "runs/qwen2-grpo-arithmetic-amp/status.json"
    }
    assert jobs.prepare_inputs(matrix)(None) == {}
    assert not jobs.saves_checkpoints(matrix.cells["qwen2-grpo-arithmetic-amp"])


def test_a_warm_starts_command_and_inputs_come_from_its_spec():
    from rules.scripts.sources import synthetic_sets, warm_starts

    matrix = expanded()
    starts, synthetic = warm_starts(matrix), synthetic_sets(matrix.config)
    (folder,) = starts
    args = jobs.warm_start_args(starts, folder)
    assert args[:3] == ["warm-start", "--out", folder] and args[args.index("--steps") + 1] == "20"
    inputs = jobs.warm_start_inputs(starts, synthetic, folder.rsplit("/", 1)[1])
    assert inputs == {"model": "runs/prepared/model/qwen2", "data": data_dir(matrix.config, "arithmetic")}
    out = data_dir(matrix.config, "count_shapes")
    assert jobs.synthetic_data_args(synthetic, out)[:5] == [
        "make-data",
        "--out",
        out,
        "--task",
        "count_shapes",
    ]


@pytest.mark.parametrize(
    "status, expected",
    [
        (None, ""),
        ({"status": "ok", "started": "t1", "attempt": "t0"}, "t0"),
        ({"status": "failed", "started": "t1", "attempt": "t0"}, "t1"),
    ],
)
def test_a_failed_attempt_is_named_so_that_the_next_run_retries_it(
    tmp_path, status: dict[str, Any] | None, expected: str
):
    path = tmp_path / "status.json"
    if status is not None:
        path.write_text(json.dumps(status))
    assert jobs.attempt(str(path)) == expected


def test_a_native_job_runs_the_engine_natively_and_an_image_job_binds_what_it_names(tmp_path):
    assert jobs.in_container(None, "", ["/data/x"], "abc") is None
    container = jobs.in_container("img.sif", "--nv", [str(tmp_path / "data")], "abc")
    assert container.image == "img.sif" and container.args == "--nv" and container.revision == "abc"
