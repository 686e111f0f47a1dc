# Offline inputs, built once and cached under runs/prepared/: tiny models, synthetic data sets,
# and warm starts (a short supervised pass on a data set's answer format). Each folder's name
# carries what defines it (warm starts: a hash of their settings), so a changed setting builds a
# new folder and the cells that use it rerun. They run in the matrix's environment (its image, when
# it is apptainer; its combination's virtualenv, when it is venv).
#
# The virtualenvs of venv cells: each dependency combination a cell (or preparation) runs in is
# installed by deps.install into the cache `make deps` shares (~/.cache/easyr1/deps/{key}: the
# hash of what it installs), or found there; its record, runs/prepared/venv/{combination}-{key}.json,
# says where it is and what it has, and is an input of the jobs that run in it. A failed install is
# recorded (its cells record it as their failure) and tried again by the next run; so is a cached
# virtualenv deleted since. It runs on the machine Snakemake runs on (it needs the package index).


localrules:
    venv,


rule venv:
    output:
        f"{PREPARED}/venv/{{combination}}-{{key}}.json",
    log:
        f"{PREPARED}/logs/venv-{{combination}}-{{key}}.log",
    wildcard_constraints:
        combination="[A-Za-z0-9_.-]+",
        key="[0-9a-f]{16}",
    params:
        # wildcards only: Snakemake keeps no record of a param that depends on the output
        attempt=lambda w: deps.install_attempt(f"{PREPARED}/venv/{w.combination}-{w.key}.json"),
    run:
        deps.install(MATRIX.venv_specs[wildcards.key], output[0], log[0], params.attempt)


rule tiny_model:
    input:
        unpack(jobs.prepare_inputs(MATRIX)),
    output:
        directory(f"{PREPARED}/model/{{arch}}"),
    log:
        f"{PREPARED}/logs/model-{{arch}}.log",
    container:
        PREPARE_IMAGE
    run:
        run_in = prepare_runner(input, container_img, singularity_args, [])
        arch, _, size = wildcards.arch.partition("-")  # {arch} or {arch}-{scale}
        args = ["tiny-model", "--arch", arch, "--size", size or "tiny", "--out", output[0]]
        jobs.run_engine(args, log[0], threads, run_in)


rule synthetic_data:
    input:
        unpack(jobs.prepare_inputs(MATRIX)),
    output:
        directory(f"{PREPARED}/data/{{name}}"),
    log:
        f"{PREPARED}/logs/data-{{name}}.log",
    container:
        PREPARE_IMAGE
    params:
        args=lambda w, output: jobs.synthetic_data_args(SYNTHETIC, output[0]),
    run:
        run_in = prepare_runner(input, container_img, singularity_args, params.args)
        jobs.run_engine(params.args, log[0], threads, run_in)


rule warm_start:
    input:
        unpack(jobs.prepare_inputs(MATRIX, lambda w: jobs.warm_start_inputs(WARM_STARTS, SYNTHETIC, w.name))),
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
        args=lambda w, output: jobs.warm_start_args(WARM_STARTS, output[0]),
    run:
        run_in = prepare_runner(input, container_img, singularity_args, params.args)
        jobs.run_engine(params.args, log[0], threads, run_in)
