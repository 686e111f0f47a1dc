"""What the baselines workflow's jobs are given: their inputs, the engine arguments of preparation
steps, where each job runs the engine (natively, in the image Snakemake hands it, or in a
combination's virtualenv), and the checks of those environments before any job starts."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from difflib import get_close_matches
from pathlib import Path
from typing import Any

from snakemake.exceptions import WorkflowError
from snakemake.logging import logger

from rules.scripts import cell as cell_jobs
from rules.scripts import deps, engine
from rules.scripts.environments import venv_record
from rules.scripts.matrix import PREPARED, Matrix, MatrixError, as_flags, leaves
from rules.scripts.sources import data_dir, model_path

Inputs = Callable[[Any], dict[str, str]]  # a rule's input function of its wildcards


def synthetic_data_args(synthetic: dict[str, dict[str, Any]], out: str) -> list[str]:
    """The engine command that writes the synthetic data set ``out`` (``synthetic``: folder -> settings)."""
    return ["make-data", "--out", out, *as_flags(synthetic[out])]


def warm_start_inputs(
    warm_starts: dict[str, dict[str, Any]], synthetic: dict[str, Any], name: str
) -> dict[str, str]:
    """What the warm start ``name`` (its folder's name) reads: its model and, when synthetic, its data."""
    spec = warm_starts[f"{PREPARED}/warm/{name}"]
    data = spec["data"].split("@")[0]
    return {"model": spec["model"], **({"data": data} if data in synthetic else {})}


def warm_start_args(warm_starts: dict[str, dict[str, Any]], out: str) -> list[str]:
    return ["warm-start", "--out", out, *as_flags(warm_starts[out])]


def known_cell(matrix: Matrix, name: str) -> dict[str, Any]:
    """The cell ``name`` of a target (runs/{cell}/...): one this matrix does not have is an error
    naming the matrix and its closest cells, before Snakemake looks any further."""
    cells = matrix.cells
    if name in cells:
        return cells[name]
    close = get_close_matches(name, cells, n=3, cutoff=0.6)
    hint = (
        f"did you mean {' or '.join(close)}?"
        if close
        else f"its {len(cells)} cells: {', '.join(sorted(cells)[:5])}{', ...' if len(cells) > 5 else ''}"
    )
    raise MatrixError(
        f"matrix config {matrix.file}: no cell {name!r} (runs/{name}/ is not one of its cells); {hint}"
    )


def cell_inputs(matrix: Matrix, name: str) -> dict[str, str]:
    """The prepared folders a cell reads (none for models and data given by path or hub name), and
    a venv cell's virtualenv record."""
    spec = known_cell(matrix, name)
    inputs = {}
    if "tiny" in matrix.config["models"][spec["model"]]:
        inputs["model"] = model_path(matrix, spec["model"])
    if "synthetic" in matrix.config["datasets"][spec["dataset"]]:
        inputs["data"] = data_dir(matrix.config, spec["dataset"])
    return {**inputs, **cell_venv_input(matrix, name)}


def cell_venv_input(matrix: Matrix, name: str) -> dict[str, str]:
    """The record of the virtualenv a venv cell's jobs run in: the venv rule builds it first."""
    venv = matrix.cells[name].get("venv")
    return {"venv": venv_record(venv)} if venv else {}


def merge_inputs(matrix: Matrix, name: str) -> dict[str, str]:
    known_cell(matrix, name)
    return {"status": f"runs/{name}/status.json", **cell_venv_input(matrix, name)}


def prepare_inputs(matrix: Matrix, more: Inputs = lambda wildcards: {}) -> Inputs:
    """A preparation rule's input function: ``more``'s inputs and, when the matrix's environment is
    venv, the record of the virtualenv preparation runs in."""
    venv = {"venv": venv_record(matrix.prepare_venv)} if matrix.prepare_venv else {}
    return lambda wildcards: {**more(wildcards), **venv}


def attempt(status_file: str) -> str:
    """Which failed attempt this run retries ("" for none).

    A failed cell is recorded, not raised, so the report can show it; this param makes the next
    invocation run it again: after a failure it names the failed attempt, which differs from the
    value that attempt ran with, so Snakemake sees changed params. A run that succeeds records the
    value it ran with, so the cell then stays done.
    """
    status = cell_jobs.read_status(status_file, ("status", "started", "attempt"))
    if status is None:
        return ""
    return status["attempt"] if status["status"] == "ok" else status["started"]


def saves_checkpoints(spec: dict[str, Any]) -> bool:
    return spec["config"].get("trainer", {}).get("save_freq", -1) > 0


def in_container(image: str | None, args: str, values: list[Any], revision: str) -> engine.Container | None:
    """Where a job's engine commands run: None natively, else the image Snakemake hands the job
    (``container_img`` in a run: block), the profile's apptainer-args (``singularity_args``), and
    binds for what ``values`` (the job's config or arguments) name outside the working directory;
    ``revision`` is the engine's git revision."""
    if image is None:
        return None
    return engine.Container(image=image, args=args, binds=engine.binds(values, Path.cwd()), revision=revision)


def cell_container(
    matrix: Matrix, name: str, image: str | None, args: str, revision: str
) -> engine.Container | None:
    """Where a cell's jobs run the engine (see ``in_container``): binds for what its config names."""
    return in_container(image, args, leaves(matrix.cells[name]["config"]), revision)


def cell_runner(
    matrix: Matrix, name: str, input: Any, image: str | None, args: str, revision: str
) -> tuple[Any, str]:
    """Where a cell's job runs the engine, and why it cannot ("" when it can): a venv cell in the
    virtualenv its ``input.venv`` record names (a failed install is the cell's failure, recorded
    like any other), any other cell as ``cell_container`` says."""
    spec = matrix.cells[name]
    if spec.get("venv"):
        venv, problem = deps.virtualenv(input.venv)
        return venv, problem and f"{name} runs in {spec['environment']}, but {problem}"
    return cell_container(matrix, name, image, args, revision), ""


def prepare_runner(
    matrix: Matrix, input: Any, image: str | None, args: str, values: list[Any], revision: str
) -> Any:
    """Where a preparation job runs the engine: the matrix's image (see ``in_container``), the
    matrix's combination's virtualenv (``input.venv``: its record), or natively (None)."""
    if matrix.prepare_venv is None:
        return in_container(image, args, values, revision)
    venv, problem = deps.virtualenv(input.venv)
    if problem:
        raise WorkflowError(f"preparation runs in venv {matrix.prepare_venv['combination']}, but {problem}")
    return venv


def run_engine(args: list[str], log: str, threads: int, container: Any) -> None:
    """Run an engine command for a preparation step; a failure fails the job."""
    code = engine.run(args, log, threads, container)
    if code:
        raise WorkflowError(f"easyr1 {args[0]} exited with status {code}; see {log}")


def check_apptainer(
    matrix: Matrix, with_apptainer: bool, apptainer_args: str, main_process: bool, revision: str
) -> None:
    """Before any job starts: the binary, the local image files and Snakemake's container mechanism
    (``with_apptainer``: --software-deployment-method apptainer) that apptainer cells need; then,
    in the main process, say how each cell's engine will be run (a dry run shows it too)."""
    cells = [name for name, spec in matrix.cells.items() if spec["environment"] == "apptainer"]
    if not cells and matrix.prepare_image is None:
        return
    needs = f"cell {cells[0]}" if cells else "preparation"
    if len(cells) > 1:
        needs += f" (and {len(cells) - 1} more)"
    if engine.apptainer_binary() is None:
        raise MatrixError(
            f"matrix config {matrix.file}: {needs} runs in an Apptainer image, but neither "
            f"{' nor '.join(engine.BINARIES)} is on PATH (install Apptainer, or set environment: native)"
        )
    images = {matrix.prepare_image: "preparation"} if matrix.prepare_image is not None else {}
    for name in cells:
        images.setdefault(matrix.cells[name]["image"], f"cell {name}")
    for image, user in images.items():
        # A relative path is read from the working directory, as local data sets are; Snakemake
        # would hand every job the missing file. A reference (docker://) is pulled; an absolute path
        # may exist only where the jobs run.
        if "://" not in image and not Path(image).expanduser().is_absolute() and not Path(image).exists():
            raise MatrixError(
                f"matrix config {matrix.file}: {user} runs in the Apptainer image {image}: no such file or "
                f"folder (a relative image path is read from the working directory, {Path.cwd()})"
            )
    if not with_apptainer:
        raise MatrixError(
            f"matrix config {matrix.file}: {needs} runs in an Apptainer image through Snakemake's container "
            "mechanism: pass --software-deployment-method apptainer (the profiles in "
            "configs/profiles set it)"
        )
    if not main_process:
        return
    for name in cells:
        spec = matrix.cells[name]
        run_in = cell_container(matrix, name, spec["image"], apptainer_args, revision)
        argv = engine.command(
            ["train", f"config=runs/{name}/cell.yaml"], spec["resources"]["threads"], run_in
        )
        logger.info(f"{name} runs in {spec['image']}: {shlex.join(argv)}")


def check_venvs(matrix: Matrix, main_process: bool) -> None:
    """Before any job starts: uv, where a combination's virtualenv is still to be built; then, in the
    main process, say how each venv cell's engine will be run (a dry run shows it too)."""
    cells = [name for name, spec in matrix.cells.items() if spec.get("venv")]
    venvs = [matrix.cells[name]["venv"] for name in cells] + (
        [matrix.prepare_venv] if matrix.prepare_venv else []
    )
    unbuilt = [v for v in venvs if not deps.is_installed(deps.cache_root() / v["key"])]
    if unbuilt:
        try:
            deps.uv()
        except RuntimeError as error:
            needs = f"cell {cells[0]}" if cells else "preparation"
            raise MatrixError(
                f"matrix config {matrix.file}: {needs} runs in venv {unbuilt[0]['combination']}, whose virtualenv "
                f"is not built yet ({deps.cache_root() / unbuilt[0]['key']}): {error}"
            ) from error
    if not main_process:
        return
    for name in cells:
        spec = matrix.cells[name]
        where = engine.Virtualenv(deps.cache_root() / spec["venv"]["key"])
        argv = engine.command(["train", f"config=runs/{name}/cell.yaml"], spec["resources"]["threads"], where)
        logger.info(f"{name} runs in {spec['environment']} ({spec['venv']['file']}): {shlex.join(argv)}")
