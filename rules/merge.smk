# Merge a cell's last checkpoint into a Hugging Face folder, in the cell's environment; only cells
# that save checkpoints (trainer.save_freq > 0 in their config) ask for it.


rule merge:
    input:
        unpack(lambda w: jobs.merge_inputs(MATRIX, w.cell)),
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
        # a venv cell whose virtualenv cannot run it failed training: the merge is skipped
        run_in, _ = cell_runner(wildcards.cell, input, container_img, singularity_args)
        cell_jobs.merge(CELLS[wildcards.cell], input.status, output[0], log[0], threads, run_in)
