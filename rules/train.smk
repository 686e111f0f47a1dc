# Train one cell in runs/{cell}/ through the engine's CLI, natively, in the cell's Apptainer image
# (`container:`; None for any other cell) or in its combination's virtualenv (its record an input:
# see rules/prepare.smk). The cell's config hash (which knows its environment) and the engine's
# fingerprint are params, so a cell reruns when its resolved config, its environment or the engine
# changes (and after a failed attempt; see `jobs.attempt`).


rule train:
    input:
        unpack(lambda w: jobs.cell_inputs(MATRIX, w.cell)),
    output:
        "runs/{cell}/status.json",
    log:
        "runs/{cell}/train.log",
    container:
        lambda w: CELLS[w.cell]["image"]
    threads: lambda w: CELLS[w.cell]["resources"]["threads"]
    resources:
        mem_mb=lambda w: CELLS[w.cell]["resources"]["mem_mb"],
        runtime=lambda w: CELLS[w.cell]["resources"]["runtime"],
        gpu=lambda w: CELLS[w.cell]["resources"]["gpu"],
        gres=lambda w: CELLS[w.cell]["resources"]["gres"],
        cpus_per_gpu=lambda w: CELLS[w.cell]["resources"]["cpus_per_gpu"],
        nodes=lambda w: CELLS[w.cell]["resources"]["nodes"],
        mpi=lambda w: CELLS[w.cell]["resources"]["mpi"],
        tasks=lambda w: CELLS[w.cell]["resources"]["tasks"],
        tasks_per_gpu=lambda w: CELLS[w.cell]["resources"]["tasks_per_gpu"],
        cpus_per_task=lambda w: CELLS[w.cell]["resources"]["cpus_per_task"],
        slurm_extra=lambda w: CELLS[w.cell]["resources"]["slurm_extra"],
    params:
        hash=lambda w: CELLS[w.cell]["hash"],
        engine=ENGINE["fingerprint"],
        attempt=lambda w: jobs.attempt(f"runs/{w.cell}/status.json"),
    run:
        run_in, unusable = cell_runner(wildcards.cell, input, container_img, singularity_args)
        cell_jobs.train(
            CELLS[wildcards.cell],
            ENGINE,
            params.attempt,
            output[0],
            log[0],
            threads,
            run_in,
            unusable,
        )
