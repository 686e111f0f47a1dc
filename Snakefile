# The baselines harness: a model x algorithm x data set x precision matrix -> one training run
# per cell (runs/{cell}/) -> runs/results.csv -> assets/baselines.md with plots.
#
#   snakemake --profile configs/profiles/local                                  # the CPU default
#   snakemake --profile configs/profiles/local --configfile configs/matrix/h200.yaml -n
#   snakemake --profile configs/profiles/slurm --configfile MATRIX.yaml         # on a SLURM cluster
#
# Outputs go to the working directory (-d). See configs/schema/matrix.schema.yaml for the
# matrix format and rules/scripts/grid.py for how it expands.

from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.utils import min_version

min_version("9.0")  # the major release the harness is tested with (pyproject pins 9.27.1)

REPO = Path(workflow.basedir).resolve()  # one spelling of the checkout however -s names it

if not workflow.overwrite_configfiles:  # --config alone changes the default matrix

    configfile: REPO / "configs/matrix/cpu.yaml"


MATRIX_FILE = Path(workflow.configfiles[-1]).resolve() if workflow.configfiles else Path("(command line)")
if MATRIX_FILE.is_relative_to(REPO):
    MATRIX_FILE = MATRIX_FILE.relative_to(REPO)

# Run in the repository, a matrix of elsewhere would replace the committed page with its own.
from rules.scripts.inputs import foreign_config_here

FOREIGN = foreign_config_here(
    workflow.configfiles,
    REPO,
    "configs/matrix",
    "runs/results.csv, assets/baselines.md, its history page and plots",
)
if FOREIGN:
    raise WorkflowError(f"matrix config {FOREIGN}")


include: "rules/common.smk"
include: "rules/prepare.smk"
include: "rules/train.smk"
include: "rules/merge.smk"
include: "rules/report.smk"


wildcard_constraints:
    cell="[^/]+",
    name="[^/]+",
    arch="[a-z0-9_]+(-[0-9.]+b)?",  # {arch} or {arch}-{scale}


localrules:
    all,
    tiny_model,
    synthetic_data,
    collect,
    report,
    hardware,


rule all:
    default_target: True
    input:
        # This run's results, not only the page: a checkout whose files share one time (an archive)
        # has a page as new as its inputs, and Snakemake remakes no missing input of an up-to-date output.
        "runs/results.csv",
        "assets/baselines.md",
        "assets/hardware.md",


# Failed cells are rows of the page, not errors (the workflow exits 0): say so last, where it is seen.
onsuccess:
    line, bad = summary([f"runs/{c}/status.json" for c in CELLS], "assets/baselines.md")
    (logger.warning if bad else logger.info)(line)
