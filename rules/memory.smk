# EasyR1's hardware table, measured: a workflow of its own (its config is not a baselines matrix).
#
#   make hardware                                          # this machine's GPUs
#   snakemake -s rules/memory.smk --profile configs/profiles/slurm \
#     --configfile configs/matrix/hardware.yaml --config table_gpus=32      # a cluster
#
# Each cell of configs/matrix/hardware.yaml (schema: configs/schema/hardware.schema.yaml) is
# `easyr1 bench` on EasyR1's example workload at its size, precision and GPU count, every GPU
# capped to the cell's size (`--gpu-memory`), on a random-init model built once per size. A cell of
# more GPUs than `table_gpus` runs as simulated ranks (`simulated_ranks`, on by default): rank 0 of
# its GPUs alone on one GPU (`--gpus 1 --simulated-ranks N`), so one GPU measures the whole table. A cell
# that runs out of memory is a record that says so (the phase included), not a failed job. The
# records go to runs/memory/{cell}.json, in the format of baselines/gpu/memory/, and
# assets/hardware.md is regenerated from them and the committed ones (`recorded`). Outputs go to
# the working directory (-d).

import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.utils import min_version

min_version("9.0")  # the major release the harness is tested with (pyproject pins 9.27.1)

REPO = Path(workflow.basedir).parent.resolve()
sys.path.insert(0, str(REPO))  # rules.scripts and reports, as the main Snakefile imports them

from easyr1.config import ConfigError
from rules.scripts import engine
from rules.scripts.inputs import check_schema, check_unique_keys, foreign_config_here, recorded_files
from rules.scripts.memory_cells import expand_cells
from reports.records import RecordError, check_memory_records

if not workflow.configfiles:  # its schema would only say which key is missing
    raise WorkflowError(
        f"hardware config: none given: pass --configfile configs/matrix/hardware.yaml (or a config of that form)"
    )
FOREIGN = foreign_config_here(workflow.configfiles, REPO, "configs/matrix", "assets/hardware.md and plot")
if FOREIGN:
    raise WorkflowError(f"hardware config {FOREIGN}")
try:
    check_unique_keys(workflow.configfiles)
except ConfigError as exc:
    raise WorkflowError(f"hardware config: {exc}") from None
try:
    check_schema(config, REPO / "configs/schema/hardware.schema.yaml")
except ConfigError as exc:
    where = workflow.configfiles[-1] if workflow.configfiles else "(command line)"
    raise WorkflowError(f"hardware config {where}: {exc}") from None
try:
    CELLS = expand_cells(config)
    RECORDED = recorded_files(config["recorded"], REPO, (".json",))
except ConfigError as exc:
    raise WorkflowError(f"hardware config: {exc}") from None
try:  # before the GPU jobs, as the main workflow checks them: a damaged one would stop the page after
    check_memory_records(RECORDED)
except RecordError as exc:
    raise WorkflowError(f"hardware config: recorded: {exc}") from None
# The GPU bench records: estimator cases too (reports/hardware_records.py, BENCH_GLOBS).
BENCH = sorted(
    str(path)
    for pattern in ("baselines/gpu/*.json", "baselines/gpu/features/*/*.json")
    for path in REPO.glob(pattern)
)


wildcard_constraints:
    cell="[^/]+",
    size="[0-9.]+b|tiny",


localrules:
    all,
    page,


rule all:
    default_target: True
    input:
        # The cells themselves, not only the page: the committed page is up to date with the committed
        # records, and Snakemake would not remake a missing input of an up-to-date output.
        [f"runs/memory/{name}.json" for name in CELLS],
        "assets/hardware.md",


rule sized_model:
    output:
        directory("runs/prepared/model/qwen2-{size}"),
    log:
        "runs/prepared/logs/model-qwen2-{size}.log",
    resources:
        gpu=lambda w: 0 if w.size == "tiny" else 1,
    run:
        # A real size is initialised on the GPU: the 7B folder takes 4 min 49 s on the H200 host's CPUs.
        device = "cpu" if wildcards.size == "tiny" else "cuda"
        args = [
            "tiny-model",
            "--arch",
            "qwen2",
            "--size",
            wildcards.size,
            "--device",
            device,
            "--out",
            output[0],
        ]
        if engine.run(args, log[0], threads):
            raise RuntimeError(f"building qwen2 {wildcards.size} failed: see {log[0]}")


rule model_config:
    output:
        directory("runs/prepared/model/qwen2-{size}-config"),
    log:
        "runs/prepared/logs/model-qwen2-{size}-config.log",
    run:
        # The simulated cells' model: no weights (each simulated rank draws its own shards at random).
        args = [
            "tiny-model",
            "--arch",
            "qwen2",
            "--size",
            wildcards.size,
            "--no-weights",
            "--out",
            output[0],
        ]
        if engine.run(args, log[0], threads):
            raise RuntimeError(f"writing the qwen2 {wildcards.size} config failed: see {log[0]}")


rule memory_cell:
    input:
        model=lambda w: CELLS[w.cell]["model"],
    output:
        "runs/memory/{cell}.json",
    log:
        "runs/memory/{cell}.log",
    threads: lambda w: CELLS[w.cell]["threads"]
    resources:
        mem_mb=config["resources"]["mem_mb"],
        runtime=config["resources"]["runtime"],
        gpu=lambda w: CELLS[w.cell]["gpu"],
    params:
        args=lambda w, input, output: CELLS[w.cell]["args"]
        + ["--root", f"runs/memory/{w.cell}", "--model", input.model, "--out", output[0]],
    run:
        if engine.run(params.args, log[0], threads):
            raise RuntimeError(
                f"{wildcards.cell}: easyr1 bench failed other than by running out of memory: see {log[0]}"
            )


rule page:
    input:
        records=RECORDED + [f"runs/memory/{name}.json" for name in CELLS],
        bench=BENCH,
        code=[
            str(REPO / f"{name}.py")
            for name in (
                "reports/hardware",
                "reports/hardware_records",
                "reports/records",
                "easyr1/memory",
                "easyr1/activations",
            )
        ],
    output:
        page="assets/hardware.md",
        plot="assets/hardware/predicted-vs-measured.png",
    log:
        "runs/logs/hardware.log",
    run:
        from reports.hardware import write_hardware

        write_hardware(
            list(input.records), Path(output.page), Path(output.plot), Path(log[0]), input.bench
        )
