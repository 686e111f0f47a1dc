#!/usr/bin/env bash
# Session 27's device runs (issue 20): PHASE a|b|c; results under $OUT.
set -u
phase=$1; rev=$2
O=$OUT
bash bench/h200.sh install /tmp/w > $O/install-$phase.log 2>&1
nvidia-smi -L > $O/gpu-$phase.txt; lscpu > $O/lscpu-$phase.txt
export PYTHONFAULTHANDLER=1 OUT=$O/r
run() { # NAME REVISION [ENV...] -- ARGS
  local name=$1 r=$2; shift 2
  local envs=(); while [ "$1" != -- ]; do envs+=("$1"); shift; done; shift
  local t0=$SECONDS
  env EASYR1_GIT_REVISION=$r "${envs[@]}" bash bench/h200.sh $name --workload anchor --backend vllm --steps 5 "$@" trainer.stall_report_s=120 > /dev/null 2>&1
  echo "$name rc=$? $((SECONDS-t0)) s" >> $O/times.txt
}
mod() { [ -f /tmp/bench-s27-trl/anchor/model/config.json ] && echo --model /tmp/bench-s27-trl/anchor/model; }
case $phase in
  a) run s27-trl $rev -- --trl --trl-vllm
     run s27-exp $rev PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True -- $(mod) ;;
  b) run s27-trl-b $rev -- --trl --trl-vllm $(mod)
     sed -i 's/^CHECKPOINT_SPARE = 0.15$/CHECKPOINT_SPARE = 0.08/' easyr1/memory.py
     grep -n '^CHECKPOINT_SPARE' easyr1/memory.py >> $O/times.txt
     run s27-exp-spare08 $rev-dirty PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True -- $(mod) ;;
  c) run s27-trl-c $rev -- --trl --trl-vllm $(mod) ;;
esac
nvidia-smi -q -d PERFORMANCE > $O/nvidia-smi-$phase.txt 2>&1
