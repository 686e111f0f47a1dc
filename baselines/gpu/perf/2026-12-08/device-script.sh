#!/usr/bin/env bash
# session 32: simulated cells (sim:SIZE:PREC:N[:CAP]), the LoRA anchor, partial_recompute A/B. Env: LIMIT (s, whole call)
R=$OUT; T0=$(date +%s); LIMIT=${LIMIT:-570}
site=/tmp/easyr1-site
if [ ! -e $site/.installed ]; then bash bench/h200.sh install .gpu_wheels/slim > $R/install.log 2>&1 || { tail -20 $R/install.log; exit 1; }; fi
n=$(ls -d .gpu_wheels/v/part* 2>/dev/null | wc -l); echo "vllm parts here: $n"
if [ "$n" = 9 ] && [ ! -e $site/.vllm ]; then rm -f $site/.installed; bash bench/h200.sh install .gpu_wheels/v > $R/install-v.log 2>&1 && touch $site/.vllm || tail -5 $R/install-v.log; fi
export EASYR1_GIT_REVISION=${REV:?} OUT=/tmp/o
mkdir -p /tmp/o
b() {
  n=$1; shift
  left=$(( LIMIT - ($(date +%s) - T0) )); [ $left -gt 30 ] || { echo "$n: no time left"; return; }
  s=$(date +%s)
  timeout $left bash bench/h200.sh $n "$@" > /tmp/o/$n.out 2>&1
  echo "$n rc=$? $(( $(date +%s) - s ))s $(python3 -c "import json;r=json.load(open('/tmp/o/$n.json'));print(r['step_s'],r.get('mfu_actor'),r.get('recomputed_blocks'),r.get('recomputed_attention_blocks'),r.get('recomputed_pointwise_blocks'),r.get('peak_mem_gib'),r.get('peak_needed_gib'),r.get('fits'),r['phases'].get('timing_s/update_actor'),r['phases'].get('timing_s/gen'),r['phases'].get('timing_s/ref_log_prob'))" 2>&1 | tail -1)"
  grep -h "gradient checkpointing auto\|out of memory\|Error\|step [0-9] |" /tmp/o/$n.out | cut -c1-300 | head -5
}
big=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1); echo "gpu MiB: $big"
for job in "$@"; do
  case $job in *"|"*) if [ "$big" -gt 100000 ]; then job=${job#*|}; else job=${job%%|*}; fi ;; esac
  echo "job: $job"
  case $job in
    sim:*) IFS=: read -r _ size prec n cap <<< "$job"
      b sim-$size-$prec-${n}x80g-simulated --workload easyr1_$size --precision $prec --gpus 1 --simulated-ranks $n --steps 2 --backend hf \
        --notes "rules/memory.smk: $size $prec on $n GPU(s) ${cap:+capped to $cap GiB}${cap:-whole} as simulated ranks" ${cap:+--gpu-memory $cap} ;;
    lora*) b $job --workload anchor --backend ${BACKEND:-vllm} --steps 4 $CAP worker.actor.model.lora.rank=64 worker.actor.model.lora.alpha=64 ;;
    partial*) b $job --workload anchor --backend ${BACKEND:-vllm} --steps 4 $CAP $PEERS worker.actor.model.partial_recompute=true ;;
    default*) b $job --workload anchor --backend ${BACKEND:-vllm} --steps 4 $CAP $PEERS ;;
  esac
done
nvidia-smi --query-gpu=name,memory.total --format=csv > /tmp/o/gpu.txt 2>&1
tar czf $R/r$RANDOM.tgz -C /tmp/o .
