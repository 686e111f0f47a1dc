# The dependency matrix, a workflow of its own (its config is not a baselines matrix):
#
#   snakemake -s rules/deps.smk --profile configs/profiles/local --configfile configs/deps/cpu.yaml
#   make deps                                                       # the same, the CPU matrix
#
# Each combination of configs/deps/*.yaml (schema: configs/schema/deps.schema.yaml) gets an
# isolated virtualenv, cached by the hash of what it installs, and runs the regression suite in
# it: the matrix's test files, the log-probs of a fixed batch and a short fp32 GRPO run, both on
# the same tiny model and data, prepared once natively. The collect rule compares every
# combination with the reference one and writes baselines/deps.csv; the report rule writes
# assets/dependencies.md from it and from the GPU records' versions. A combination that cannot
# install, fails a test or drifts is a row that says so; the others go on (see
# rules/scripts/deps.py). Outputs go to the working directory (-d).

import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.utils import min_version

min_version("9.0")  # the major release the harness is tested with (pyproject pins 9.27.1)

REPO = Path(workflow.basedir).parent.resolve()
sys.path.insert(0, str(REPO))  # rules.scripts and reports, as the main Snakefile imports them

from easyr1.config import ConfigError, from_tree
from easyr1.config_checks import check_config
from rules.scripts import deps, engine
from rules.scripts.inputs import check_schema, check_unique_keys, foreign_config_here, recorded_files

if not workflow.configfiles:  # its schema would only say which key is missing
    raise WorkflowError(
        f"deps config: none given: pass --configfile configs/deps/cpu.yaml (or a config of that form)"
    )
FOREIGN = foreign_config_here(
    workflow.configfiles, REPO, "configs/deps", "baselines/deps.csv and assets/dependencies.md"
)
if FOREIGN:
    raise WorkflowError(f"deps config {FOREIGN}")
try:
    check_unique_keys(workflow.configfiles)
except ConfigError as exc:
    raise WorkflowError(f"deps config: {exc}") from None
try:
    check_schema(config, REPO / "configs/schema/deps.schema.yaml")
except ConfigError as exc:
    where = workflow.configfiles[-1] if workflow.configfiles else "(command line)"
    raise WorkflowError(f"deps config {where}: {exc}") from None

if config["reference"] not in config["combinations"]:
    raise WorkflowError(
        f"deps config: reference: {config['reference']!r} is not one of the combinations "
        f"({', '.join(config['combinations'])})"
    )
if not (REPO / config["suite"]["run"]["engine"]).is_file():
    raise WorkflowError(
        f"deps config: suite.run.engine: file not found: {REPO / config['suite']['run']['engine']}"
    )
for index, test in enumerate(config["suite"]["tests"]):
    if not (REPO / test.split("::")[0]).exists():
        raise WorkflowError(f"deps config: suite.tests[{index}]: not found: {REPO / test.split('::')[0]}")

for name in config.get("only", []):
    if name not in config["combinations"]:
        raise WorkflowError(f"deps config: only: {name!r} is not one of the combinations")
COMBINATIONS = [
    name
    for name in config["combinations"]
    if name in config.get("only", [name]) or name == config["reference"]
]
SPECS = {name: deps.spec(config, name) for name in COMBINATIONS}
RUN = config["suite"]["run"]
try:  # as `easyr1 train` will check it: a typo is this config's error, not every combination's failed row
    check_config(from_tree(deps.grpo_config(RUN, {"data": "-", "model": "-"}, "-")), RUN["ranks"])
except ConfigError as exc:
    raise WorkflowError(f"deps config: suite.run: {exc}") from None
PREPARED = "runs/deps/prepared"
try:
    GPU_RECORDS = recorded_files(config["gpu_records"], REPO, (".json",), "gpu_records")
except ConfigError as exc:
    raise WorkflowError(f"deps config: {exc}") from None


wildcard_constraints:
    combination="[A-Za-z0-9_.-]+",


localrules:
    all,
    collect,
    report,


rule all:
    default_target: True
    input:
        "baselines/deps.csv",
        "assets/dependencies.md",


# The tiny model and data every combination starts from, made natively (one folder for all, so
# that combinations differ only in their packages).
rule deps_prepare:
    output:
        model=directory(f"{PREPARED}/model"),
        data=directory(f"{PREPARED}/data"),
    log:
        "runs/deps/logs/prepare.log",
    params:
        run=RUN,
    run:
        deps.prepare(params.run, output.model, output.data, log[0])


rule deps_install:
    output:
        "runs/deps/{combination}/install.json",
    log:
        "runs/deps/{combination}/install.log",
    params:
        key=lambda w: deps.env_key(SPECS[w.combination]),
        # a failed install is tried again by every later run, a deleted virtualenv is rebuilt, a
        # combination of the newest releases is resolved again
        retry=lambda w: deps.install_attempt(f"runs/deps/{w.combination}/install.json", SPECS[w.combination]),
    run:
        deps.install(SPECS[wildcards.combination], output[0], log[0], params.retry)


rule deps_suite:
    input:
        installed="runs/deps/{combination}/install.json",
        model=f"{PREPARED}/model",
        data=f"{PREPARED}/data",
    output:
        "runs/deps/{combination}/suite.json",
    log:
        "runs/deps/{combination}/suite.log",
    threads: RUN.get("ranks", 2)
    params:
        suite=config["suite"],
        engine=engine.describe()["fingerprint"],  # a changed engine reruns the suite
    run:
        deps.run_suite(config["suite"], input, output[0], log[0], threads)


rule collect:
    input:
        installs=expand("runs/deps/{combination}/install.json", combination=COMBINATIONS),
        suites=expand("runs/deps/{combination}/suite.json", combination=COMBINATIONS),
    output:
        "baselines/deps.csv",
    log:
        "runs/deps/logs/collect.log",
    params:
        reference=config["reference"],
    run:
        deps.collect(config, COMBINATIONS, input.installs, input.suites, output[0])


rule report:
    input:
        results="baselines/deps.csv",
        gpu=GPU_RECORDS,
        code=str(REPO / "reports/dependencies.py"),
        pyproject=str(REPO / "pyproject.toml"),
    output:
        "assets/dependencies.md",
    log:
        "runs/deps/logs/report.log",
    params:
        engine=engine.describe()["fingerprint"],  # today's: a row made at another is marked
    run:
        from reports.dependencies import write_page

        write_page(input.results, list(input.gpu), REPO, params.engine, output[0])
