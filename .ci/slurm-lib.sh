#!/usr/bin/env bash
# What .ci/slurm.sh (one node) and .ci/slurm-cluster.sh (two nodes) share, sourced by both:
# Debian's SLURM and munge installed when missing, munge started, and the slurm.conf settings
# for a throwaway cluster (no systemd, no cgroups, no accounting database).

slurm_install() {  # extra Debian packages the caller needs may follow
  if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null || [ $# -gt 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      munge slurmctld slurmd slurm-client "$@" >/dev/null
  fi
}

# munge: a key when the package left none, then the daemon as user munge, in the foreground,
# unless one runs already; its PID, if started here, is added to the caller's PIDS array.
munge_start() {
  [ -s /etc/munge/munge.key ] || mungekey --create --keyfile /etc/munge/munge.key
  chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  chown munge:munge /run/munge /var/log/munge /var/lib/munge
  if [ ! -S /run/munge/munge.socket.2 ]; then
    setpriv --reuid munge --regid munge --init-groups munged --foreground &
    PIDS+=($!)
  fi
  for _ in $(seq 50); do [ -S /run/munge/munge.socket.2 ] && break; sleep 0.2; done
}

# The slurm.conf lines every such cluster has; the caller adds names, paths, nodes and partition.
slurm_conf_common() {
  cat <<'CONF'
SlurmUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1000
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
MinJobAge=300
ReturnToService=2
CONF
}
