#!/usr/bin/env bash
# GPU benchmarks as recorded under baselines/gpu/: run on the H200 host from the repository root.
# Expects vLLM 0.24's wheel parts in /tmp/ch (../shared/gpu/vllm-wheels.sh; xgrammar in /tmp/ch/x),
# the other vLLM wheels in .vc5 and the engine's wheels in .gpu_wheels (the host is offline).
# Usage: bash bench/h200.sh install | bash bench/h200.sh RUN-NAME BENCH-ARGS...  (writes $OUT/RUN-NAME.*)
set -euo pipefail
export PYTHONPATH="$PWD:/tmp/esite:/tmp/vsite" VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
if [ "$1" = install ]; then
  if [ ! -d /tmp/vsite/vllm ]; then
    (cd /tmp/ch && cat vllm.whl.part0* > vllm-0.24.0-cp38-abi3-manylinux_2_28_x86_64.whl && sha256sum -c "$OLDPWD/.vc5/vllm.sha256")
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/vsite \
      /tmp/ch/vllm-0.24.0-*.whl /tmp/ch/x/*.whl .vc5/*.whl
  fi
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/esite .gpu_wheels/*.whl
  python3 -c "import torch, transformers, vllm; print('torch', torch.__version__, 'transformers', transformers.__version__, 'vllm', vllm.__version__)"
  exit 0
fi
name=$1; shift  # pass EASYR1_GIT_REVISION=$(git rev-parse HEAD) from the machine that sent the tree
python3 -m easyr1.cli bench --root "/tmp/bench-$name" --out "$OUT/$name.json" "$@" 2>&1 | tee "$OUT/$name.log" | grep -v "it/s]" | tail -60
