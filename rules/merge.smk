# Merge a cell's last checkpoint into a Hugging Face folder, in the cell's environment; only cells
# that save checkpoints (trainer.save_freq > 0 in their config) ask for it.


rule merge:
    input:
        "runs/{cell}/status.json",
    output:
        "runs/{cell}/merge.json",
    log:
        "runs/{cell}/merge.log",
    container:
        lambda w: CELLS[w.cell]["image"]
    threads: 2
    resources:
        mem_mb=lambda w: CELLS[w.cell]["resources"]["mem_mb"],
        runtime=30,
    params:
        hash=lambda w: CELLS[w.cell]["hash"],
    run:
        run_in = cell_container(wildcards.cell, container_img, singularity_args)
        cell_jobs.merge(
            CELLS[wildcards.cell], input[0], output[0], log[0], threads, run_in
        )
