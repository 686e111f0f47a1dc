#!/usr/bin/env bash
# The harness on a real one-node SLURM: Debian's munge, slurmctld and slurmd (installed with
# apt-get when missing; needs root), configured for this machine in a temporary folder (no
# systemd, no cgroups, no accounting database), started in the background and stopped by PID.
# The config goes to /etc/slurm/slurm.conf (job steps find it only there) and is removed at the
# end; a machine that already has one is left alone.
# Then the 2-cell test matrix runs through `--profile configs/profiles/slurm`, and the report
# must list both cells as finished.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD

source .ci/slurm-lib.sh
slurm_install

export SLURM_CONF=/etc/slurm/slurm.conf
if [ -e "$SLURM_CONF" ]; then
  echo "$SLURM_CONF exists: this machine has its own SLURM; not reconfiguring it" >&2
  exit 1
fi
STATE=$(mktemp -d /tmp/easyr1-slurm.XXXXXX)
WORK=$(mktemp -d /tmp/easyr1-slurm-work.XXXXXX)
PIDS=()
stop() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do
    while kill -0 "$pid" 2>/dev/null; do sleep 0.2; done
  done
  rm -rf "$STATE" "$WORK" "$SLURM_CONF"
}
trap stop EXIT

munge_start

HOST=$(hostname -s)
MEMORY_MB=$(awk '/MemTotal/ {print int($2 / 1024) - 1024}' /proc/meminfo)
mkdir -p /etc/slurm
cat > "$SLURM_CONF" <<EOF
ClusterName=easyr1-ci
SlurmctldHost=$HOST
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/slurmctld.log
SlurmdLogFile=$STATE/slurmd.log
$(slurm_conf_common)
NodeName=$HOST CPUs=$(nproc) RealMemory=$MEMORY_MB State=UNKNOWN
PartitionName=ci Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
EOF
mkdir -p "$STATE/ctld" "$STATE/d"

slurmctld -D -i -f "$SLURM_CONF" &
PIDS+=($!)
slurmd -D -f "$SLURM_CONF" &
PIDS+=($!)
for _ in $(seq 100); do sinfo -h -o %T 2>/dev/null | grep -qx idle && break; sleep 0.3; done
sinfo

HF_HUB_OFFLINE=1 "$REPO/.venv/bin/snakemake" -s "$REPO/Snakefile" -d "$WORK" \
  --configfile "$REPO/tests/harness/tiny.yaml" --profile "$REPO/configs/profiles/slurm"

grep -q "2 cells (2 configurations x seeds), 2 finished, 0 failed" "$WORK/assets/baselines.md"
echo "SLURM: the 2-cell matrix ran as SLURM jobs and the report lists both cells."
