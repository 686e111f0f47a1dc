# The matrix: validate the config, expand its grid into cells, and name what each cell needs. The
# code is in rules/scripts/ (matrix.py: the config and its errors; sources.py: models and data
# sets; environments.py; grid.py: the cells; jobs.py: the jobs' inputs and runners); this file
# reads the workflow's config into it and keeps the glue the rules call.
#
# A cell's config hash (grid.py) is a param of the train rule, so changing one axis reruns exactly
# the cells whose config changed. The engine's fingerprint (a hash of its source, as `easyr1
# version` reports it) is a param too: a cell reruns when the engine it would run with is not the
# one it ran with.
#
# A cell runs in an environment (rules/scripts/engine.py): native, an Apptainer image that its
# rules name with `container:`, so that Snakemake pulls it and hands each job its local copy, or a
# dependency combination's virtualenv (`venv`), which the venv rule builds into the cache that
# `make deps` builds into too (rules/scripts/deps.py) and whose record is an input of its cells.
# Preparation runs in the matrix's environment, a cell in its grid block's, model's or matrix's.

from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.settings.types import DeploymentMethod

from easyr1.config import ConfigError
from rules.scripts import cell as cell_jobs, deps, engine, jobs
from rules.scripts.collect import collect, summary
from rules.scripts.environments import prepare_venv
from rules.scripts.grid import expand_grid, read_engine
from rules.scripts.inputs import check_schema, check_unique_keys, recorded_files
from rules.scripts.matrix import PREPARED, Matrix
from rules.scripts.sources import synthetic_sets, warm_starts

try:
    check_unique_keys(workflow.configfiles)
except ConfigError as exc:
    raise WorkflowError(f"matrix config: {exc}") from None
# Keys given on the command line (--config KEY=VALUE): an error in one is not the matrix file's.
MATRIX = Matrix(config, REPO, MATRIX_FILE, dict(workflow.config_settings.config or {}))
try:
    check_schema(config, REPO / "configs/schema/matrix.schema.yaml")
except ConfigError as exc:
    where = str(exc).split(": ", 1)[0]
    raise WorkflowError(
        f"matrix config {MATRIX_FILE}: {exc}{MATRIX.from_command_line(where, str(exc))}"
    ) from None

# The engine every environment runs: the one this interpreter imports.
ENGINE = engine.describe()
read_engine(MATRIX)
PREPARE_IMAGE = MATRIX.prepare_image
MATRIX.prepare_venv = prepare_venv(MATRIX)
CELLS = MATRIX.cells = expand_grid(MATRIX)
WARM_STARTS = warm_starts(MATRIX)
SYNTHETIC = synthetic_sets(config)
try:
    RECORDED = recorded_files(config["recorded"], REPO, (".json", "results.csv"))
except ConfigError as exc:
    raise MATRIX.error("recorded", str(exc)) from None
# A recorded CPU run (baselines/cpu/{date}-{revision}/results.csv) keeps its curves beside it.
RECORDED_CURVES = [
    str(Path(f).with_name("curves.csv"))
    for f in RECORDED
    if Path(f).name == "results.csv" and Path(f).with_name("curves.csv").is_file()
]

jobs.check_apptainer(
    MATRIX,
    DeploymentMethod.APPTAINER in workflow.deployment_settings.deployment_method,
    workflow.deployment_settings.apptainer_args,
    workflow.is_main_process,
    ENGINE["git"],
)
jobs.check_venvs(MATRIX, workflow.is_main_process)


def cell_runner(name, input, image, args):
    return jobs.cell_runner(MATRIX, name, input, image, args, ENGINE["git"])


def prepare_runner(input, image, args, values):
    return jobs.prepare_runner(MATRIX, input, image, args, values, ENGINE["git"])


def write_baselines(input, output, params, log):
    """The report rule's job: the baselines page, its history and figures (reports/baselines/)."""
    # Imported here, not with the workflow: every job reads the workflow again, and only this one
    # needs matplotlib and pandas (1.5 s).
    from reports.baselines.pages import write_report
    from reports.baselines.rows import Report

    records = Report(
        results=input.results,
        curves=input.curves,
        recorded=list(input.recorded),
        matrix=params.matrix,
        engine=params.engine,
        repo=REPO,
        memory_records=tuple(input.memory_records),
        deps=input.deps,
    )
    write_report(records, output.page, output.history, output.figures, log)
