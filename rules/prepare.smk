# Offline inputs, built once and cached under runs/prepared/: tiny models, synthetic data sets,
# and warm starts (a short supervised pass on a data set's answer format). Each folder's name
# carries what defines it (warm starts: a hash of their settings), so a changed setting builds a
# new folder and the cells that use it rerun. They run in the matrix's environment (its image, when
# it is apptainer).


rule tiny_model:
    output:
        directory(f"{PREPARED}/model/{{arch}}"),
    log:
        f"{PREPARED}/logs/model-{{arch}}.log",
    container:
        PREPARE_IMAGE
    run:
        run_in = in_container(container_img, singularity_args, [])
        arch, _, size = wildcards.arch.partition("-")  # {arch} or {arch}-{scale}
        args = ["tiny-model", "--arch", arch, "--size", size or "tiny", "--out", output[0]]
        run_engine(args, log[0], threads, run_in)


rule synthetic_data:
    output:
        directory(f"{PREPARED}/data/{{name}}"),
    log:
        f"{PREPARED}/logs/data-{{name}}.log",
    container:
        PREPARE_IMAGE
    params:
        args=lambda w, output: synthetic_data_args(output[0]),
    run:
        run_in = in_container(container_img, singularity_args, params.args)
        run_engine(params.args, log[0], threads, run_in)


rule warm_start:
    input:
        unpack(warm_start_inputs),
    output:
        directory(f"{PREPARED}/warm/{{name}}"),
    log:
        f"{PREPARED}/logs/warm-{{name}}.log",
    container:
        PREPARE_IMAGE
    threads: 2
    resources:
        mem_mb=4000,
        runtime=30,
    params:
        args=lambda w, output: warm_start_args(output[0]),
    run:
        run_in = in_container(container_img, singularity_args, params.args)
        run_engine(params.args, log[0], threads, run_in)
