# Collect every cell into runs/results.csv and runs/curves.csv (outputs of this run), then write
# assets/baselines.md, its history page and plots from them and from the committed records the
# matrix lists under `recorded:` (inputs; see baselines/README.md).
#
# The committed records both pages read are checked here, when the workflow is read
# (reports/records.py): a damaged one stops the workflow before any cell trains, naming its file,
# key or column. Found by the report job instead, it would come after the whole matrix, and that
# job's start has already deleted the committed page (Snakemake removes a job's outputs first).

from glob import glob

from reports.records import RecordError, check_memory_records, check_recorded

MEMORY_RECORDS = sorted(glob(str(REPO / "baselines/gpu/memory/*/*.json")))
try:
    check_recorded(RECORDED)
except RecordError as exc:
    raise MATRIX.error("recorded", str(exc)) from None
try:
    check_memory_records(MEMORY_RECORDS)
except RecordError as exc:
    raise WorkflowError(f"the hardware page's records: {exc}") from None


rule collect:
    input:
        status=expand("runs/{cell}/status.json", cell=CELLS),
        merged=[f"runs/{c}/merge.json" for c in CELLS if jobs.saves_checkpoints(CELLS[c])],
    output:
        results="runs/results.csv",
        curves="runs/curves.csv",
    log:
        "runs/logs/collect.log",
    run:
        collect(input.status, output.results, output.curves, log[0])


rule report:
    input:
        results="runs/results.csv",
        curves="runs/curves.csv",
        recorded=RECORDED,
        recorded_curves=RECORDED_CURVES,
        # the summary's: EasyR1's hardware table (its verdicts) and the dependency matrix (its state)
        memory_records=MEMORY_RECORDS,
        deps=str(REPO / "baselines/deps.csv"),
        code=[
            *sorted(glob(str(REPO / "reports/baselines/*.py"))),
            *[
                str(REPO / f"reports/{name}.py")
                for name in ("records", "hardware", "hardware_records", "dependencies")
            ],
            str(REPO / "easyr1/memory.py"),
            str(REPO / "easyr1/activations.py"),
            str(REPO / "easyr1/models/architecture.py"),
        ],
        # a changed report reruns it
    output:
        page="assets/baselines.md",
        history="assets/baselines-history.md",
        figures=directory("assets/baselines"),
    log:
        "runs/logs/report.log",
    params:
        matrix=str(MATRIX_FILE),
        engine=ENGINE["fingerprint"],  # rows are flagged against the current engine
    run:
        write_baselines(input, output, params, log[0])


# EasyR1's hardware table against the estimator and the capped-memory records (reports/hardware.py).
rule hardware:
    input:
        records=MEMORY_RECORDS,
        code=[
            str(REPO / "reports/hardware.py"),
            str(REPO / "reports/hardware_records.py"),
            str(REPO / "reports/records.py"),
            str(REPO / "easyr1/memory.py"),
            str(REPO / "easyr1/activations.py"),
        ],
    output:
        page="assets/hardware.md",
        plot="assets/hardware/predicted-vs-measured.png",
    log:
        "runs/logs/hardware.log",
    run:
        from reports.hardware import write_hardware

        write_hardware(list(input.records), Path(output.page), Path(output.plot), Path(log[0]))
