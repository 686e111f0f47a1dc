# Collect every cell into baselines/results.csv, then write assets/baselines.md and its plots.


rule collect:
    input:
        status=expand("runs/{cell}/status.json", cell=CELLS),
        merged=[f"runs/{c}/merge.json" for c in CELLS if saves_checkpoints(c)],
    output:
        "baselines/results.csv",
    log:
        "runs/logs/collect.log",
    run:
        collect(input.status, output[0], log[0])


rule report:
    input:
        results="baselines/results.csv",
        recorded=RECORDED,
        code=str(REPO / "reports/baselines.py"),  # a changed report reruns it
    output:
        page="assets/baselines.md",
        figures=directory("assets/baselines"),
    log:
        "runs/logs/report.log",
    params:
        matrix=str(MATRIX_FILE),
    run:
        write_report(
            input.results,
            input.recorded,
            output.page,
            output.figures,
            params.matrix,
            REPO,
            log[0],
        )
