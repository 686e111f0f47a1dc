#!/usr/bin/env bash
# GPU benchmarks as recorded under baselines/gpu/, on an offline H200 host, from the repository root
# (bench/README.md says what is measured).
#   bash bench/h200.sh install [WHEELS]    once per machine: installs the wheels that bench/gpu_wheels.sh
#       prepared and that were copied to WHEELS (default .gpu_wheels), at any depth below it; wheels
#       that travelled in pieces (NAME.whl.partNN + NAME.whl.sha256) are put together and checked first.
#   bash bench/h200.sh RUN-NAME BENCH-ARGS...   runs `easyr1 bench BENCH-ARGS` and writes
#       $OUT/RUN-NAME.json (the summary) and $OUT/RUN-NAME.log; pass EASYR1_GIT_REVISION=$(git rev-parse
#       HEAD) from the machine that sent the tree when it has no .git. The TRL peer: --trl (HF generate)
#       or --trl-vllm (vLLM colocated) among BENCH-ARGS, or both (then also $OUT/RUN-NAME-trl-vllm.json,
#       the same run of ours beside the second peer); the peers' own JSON stays in /tmp/bench-RUN-NAME.
#   bash bench/h200.sh hardware [TARGET...]   the hardware workflow (rules/memory.smk on
#       configs/matrix/hardware.yaml) on this host's GPUs, as `make hardware` runs it: its records go to
#       runs/memory/ (targets such as runs/memory/1.5b-amp-whole.json pick cells; none: the whole matrix
#       and assets/hardware.md).
# Variables: EASYR1_SITE, the folder the wheels are installed into (default /tmp/easyr1-site; remove it
# to install again); OUT, the results folder (default runs/h200).
set -euo pipefail
site=${EASYR1_SITE:-/tmp/easyr1-site}
export PYTHONPATH="$PWD:$site" VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
[ $# -ge 1 ] || { sed -n '2,17p' "$0" >&2; exit 2; }

if [ "$1" = install ]; then
  wheels=${2:-.gpu_wheels}
  [ -d "$wheels" ] || { echo "no folder $wheels: prepare it with bench/gpu_wheels.sh and copy it here" >&2; exit 1; }
  if [ ! -e "$site/.installed" ]; then
    while read -r sum; do
      name=$(basename "$sum" .sha256)
      find "$wheels" -name "$name.part*" -printf '%f\t%p\n' | sort | cut -f2 | xargs -r cat > "$wheels/$name"
      [ "$(sha256sum < "$wheels/$name" | cut -d' ' -f1)" = "$(cut -d' ' -f1 "$sum")" ] \
        || { echo "$name: its pieces do not add up (one missing?)" >&2; rm "$wheels/$name"; exit 1; }
    done < <(find "$wheels" -name '*.whl.sha256')
    # One copy of each wheel, wherever it lies.
    mapfile -t files < <(find "$wheels" -name '*.whl' -printf '%f\t%p\n' | sort -u -t $'\t' -k1,1 | cut -f2)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "${files[@]}"
    touch "$site/.installed"
  fi
  # What is there now (bench/gpu_wheels.sh may have brought only some of its groups).
  python3 - <<'PY'
import importlib
for name in ("torch", "transformers", "datasets", "vllm", "trl", "snakemake"):
    try:
        print(name, importlib.import_module(name).__version__)
    except ImportError:
        print(name, "not installed")
PY
  exit 0
fi

if [ "$1" = hardware ]; then
  shift
  # make hardware's command, with the host's python3; the targets first, as --configfile and
  # --resources take every word after them.
  exec python3 -m snakemake "$@" -s rules/memory.smk --profile configs/profiles/local \
    --configfile configs/matrix/hardware.yaml --resources gpu="$(nvidia-smi -L | wc -l)"
fi

name=$1; shift
out=${OUT:-runs/h200}
mkdir -p "$out"
python3 -m easyr1.cli bench --root "/tmp/bench-$name" --out "$out/$name.json" "$@" 2>&1 | tee "$out/$name.log" | grep -v "it/s]" | tail -60
