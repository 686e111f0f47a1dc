# Two entry points: `make baselines` (set up + the main job) and `make test` (set up + the tests).
# torch is installed first and pinned: an unpinned torch (or any torchvision) would pull another
# build. PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu makes it the CPU build (2.13.0+cpu).
PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV := .venv
BIN := $(VENV)/bin
EXTRAS ?= test,lora,harness,ray

.PHONY: setup demo test baselines record deps hardware containers clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH)"
	$(BIN)/pip install --quiet -e ".[$(EXTRAS)]"
	touch $@

demo: setup
	HF_HUB_OFFLINE=1 $(BIN)/easyr1 demo --out runs/demo

test: setup
	$(BIN)/ruff check easyr1 tests rules reports bench
	HF_HUB_OFFLINE=1 $(BIN)/pytest -q

# The default CPU matrix end to end: runs/{cell}/ -> runs/results.csv -> assets/baselines.md (with
# the committed records merged in). A second run does nothing until the matrix or the engine changes.
baselines: setup
	HF_HUB_OFFLINE=1 $(BIN)/snakemake --profile configs/profiles/local

# Commit this run's results as a record (baselines/cpu/{date}-{revision}/), then regenerate the page.
record: setup
	$(BIN)/python -m rules.scripts.record runs baselines/cpu
	HF_HUB_OFFLINE=1 $(BIN)/snakemake --profile configs/profiles/local

# The dependency matrix (configs/deps/cpu.yaml): each combination of package versions in its own
# virtualenv (cached by its hash), through the regression suite, compared with the pinned set ->
# baselines/deps.csv -> assets/dependencies.md. A failing combination is a row, not an error.
# The committed baselines/deps.csv is collected again (--forcerun), so that a fresh clone measures
# every combination rather than re-rendering the page from the record; a second run reuses the suites' results.
deps: setup
	HF_HUB_OFFLINE=1 $(BIN)/snakemake -s rules/deps.smk --profile configs/profiles/local --configfile configs/deps/cpu.yaml \
	  --forcerun collect

# EasyR1's hardware table measured on this machine's GPUs (configs/matrix/hardware.yaml, one cell at
# a time on each GPU) -> runs/memory/*.json -> assets/hardware.md with the committed records.
hardware: setup
	@gpus=$$(nvidia-smi -L 2>/dev/null | wc -l); \
	if [ "$$gpus" -eq 0 ]; then \
	  echo "make hardware measures GPU memory, and nvidia-smi finds no GPU here: run it on a GPU machine, or" \
	    "on a cluster as the README says (snakemake -s rules/memory.smk --profile configs/profiles/slurm ...)" >&2; \
	  exit 1; \
	fi; \
	HF_HUB_OFFLINE=1 $(BIN)/snakemake -s rules/memory.smk --profile configs/profiles/local \
	  --configfile configs/matrix/hardware.yaml --resources gpu=$$gpus

# Write containers/*.Dockerfile from the pins (pyproject.toml, this Makefile, the GPU record) and
# convert each into its Apptainer definition with spython; the tests fail while one is stale.
containers: setup
	$(BIN)/python -m rules.scripts.containers

clean:
	rm -rf $(VENV) runs .pytest_cache
