#!/usr/bin/env bash
# CI's dependency matrix: the pinned and the oldest supported combination (configs/deps/ci.yaml on
# top of configs/deps/cpu.yaml) through the regression suite, in a scratch working directory (the
# committed baselines/deps.csv is left alone); fails when either regresses, naming the failing test
# or the install error of each. Their virtualenvs are cached (~/.cache/easyr1/deps) by their hash:
# with them cached, a few minutes (the suites); the full matrix is make deps's (assets/dependencies.md
# says how long it took).
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
HF_HUB_OFFLINE=1 .venv/bin/snakemake -s rules/deps.smk --profile configs/profiles/local -d "$work" \
  --configfile configs/deps/cpu.yaml configs/deps/ci.yaml
.venv/bin/python -m rules.scripts.deps check "$work/baselines/deps.csv"
