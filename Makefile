# Two entry points: `make baselines` (set up + the main job) and `make test` (set up + the tests).
# torch is installed first and pinned: an unpinned torch (or any torchvision) would pull another
# build. PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu makes it the CPU build (2.13.0+cpu).
PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV := .venv
BIN := $(VENV)/bin
EXTRAS ?= test,lora,harness,ray

.PHONY: help setup demo lint test baselines record deps hardware containers clean

# The targets, each with the first line of the comment above it.
help:
	@awk '/^# /{if(!c)c=substr($$0,3)} /^$$/{c=""} /^[a-z]+:/{sub(":.*","",$$1); if(c)printf "make %-11s %s\n",$$1,c; c=""}' Makefile

# Create .venv: torch first (pinned), then the package with its pinned dependencies.
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH)"
	$(BIN)/pip install --quiet -e ".[$(EXTRAS)]"
	touch $@

# A short look at the warm start alone (runs/demo).
demo: setup
	HF_HUB_OFFLINE=1 $(BIN)/easyr1 demo --out runs/demo

# Lint: ruff's rules (pyproject.toml), ruff's format and snakefmt, checked, never rewritten.
lint: setup
	$(BIN)/ruff check easyr1 tests rules reports bench
	$(BIN)/ruff format --check easyr1 tests rules reports bench
	$(BIN)/snakefmt --check Snakefile rules/

# Lint and the test suite, as CI runs it (.ci/run).
test: lint
	HF_HUB_OFFLINE=1 $(BIN)/pytest -q

# The main job: the default CPU matrix (configs/matrix/cpu.yaml) trained, collected and paged.
# runs/{cell}/ -> runs/results.csv -> assets/baselines.md (with the committed records merged in).
# A second run does nothing until the matrix or the engine changes.
baselines: setup
	HF_HUB_OFFLINE=1 $(BIN)/snakemake --profile configs/profiles/local

# Commit this run's results as a record (baselines/cpu/{date}-{revision}/), then regenerate the page.
record: setup
	$(BIN)/python -m rules.scripts.record runs baselines/cpu
	HF_HUB_OFFLINE=1 $(BIN)/snakemake --profile configs/profiles/local

# The dependency matrix (configs/deps/cpu.yaml) through the regression suite -> assets/dependencies.md.
# Each combination of package versions in its own virtualenv (cached by its hash), through the regression suite, compared with the pinned set ->
# baselines/deps.csv -> assets/dependencies.md. A failing combination is a row, not an error.
# The committed baselines/deps.csv is collected again (--forcerun), so that a fresh clone measures
# every combination rather than re-rendering the page from the record; a second run reuses the suites' results.
deps: setup
	HF_HUB_OFFLINE=1 $(BIN)/snakemake -s rules/deps.smk --profile configs/profiles/local --configfile configs/deps/cpu.yaml \
	  --forcerun collect

# EasyR1's hardware table measured on this machine's GPUs -> assets/hardware.md (needs GPUs).
# configs/matrix/hardware.yaml, one cell at a time on each GPU -> runs/memory/*.json -> the page
# with the committed records.
hardware: setup
	@gpus=$$(nvidia-smi -L 2>/dev/null | wc -l); \
	if [ "$$gpus" -eq 0 ]; then \
	  echo "make hardware measures GPU memory, and nvidia-smi finds no GPU here: run it on a GPU machine, or" \
	    "on a cluster as docs/memory.md says (snakemake -s rules/memory.smk --profile configs/profiles/slurm ...)" >&2; \
	  exit 1; \
	fi; \
	HF_HUB_OFFLINE=1 $(BIN)/snakemake -s rules/memory.smk --profile configs/profiles/local \
	  --configfile configs/matrix/hardware.yaml --resources gpu=$$gpus

# Write containers/*.Dockerfile and their Apptainer definitions from the pins.
# The pins: pyproject.toml, this Makefile, the GPU record; spython converts each Dockerfile; the
# tests fail while one is stale.
containers: setup
	$(BIN)/python -m rules.scripts.containers

# Remove .venv and runs/ (the committed pages and records stay).
clean:
	rm -rf $(VENV) runs .pytest_cache
