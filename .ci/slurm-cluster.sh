#!/usr/bin/env bash
# A two-node SLURM cluster on one machine, for tests and CI (needs root): one slurmctld, and two
# slurmd "nodes", n1 and n2, each in its own network namespace with its own address on a private
# bridge (10.77.0.2 and .3; the controller is 10.77.0.1) and its own hostname (a UTS namespace),
# so a job step on n2 really runs on another host as far as SLURM, sockets and `hostname` go.
# Sourced by the scripts that use it: `cluster_start` starts everything in the background and
# waits for both nodes to be idle; `cluster_stop` (run it from an EXIT trap) stops the daemons by
# PID and removes the namespaces, the bridge, the /etc/hosts lines and the config.
# Debian's munge, slurmctld and slurmd are installed with apt-get when missing (.ci/slurm-lib.sh).

source "$(dirname "${BASH_SOURCE[0]}")/slurm-lib.sh"
CLUSTER_NET=10.77.0
CLUSTER_PIDS=()
CLUSTER_STATE=""
export SLURM_CONF=/etc/slurm/slurm.conf

cluster_start() {
  slurm_install $(command -v ip >/dev/null || echo iproute2)  # ip: the namespaces and the bridge
  if [ -e "$SLURM_CONF" ]; then
    echo "$SLURM_CONF exists: this machine has its own SLURM; not reconfiguring it" >&2
    return 1
  fi
  CLUSTER_STATE=$(mktemp -d /tmp/easyr1-slurm2.XXXXXX)

  # The network: a bridge in this namespace, a veth pair into each node's namespace.
  ip link add er1br type bridge
  ip addr add "$CLUSTER_NET.1/24" dev er1br
  ip link set er1br up
  for i in 1 2; do
    ip netns add "er1n$i"
    ip link add "er1v$i" type veth peer name eth0 netns "er1n$i"
    ip link set "er1v$i" master er1br up
    ip netns exec "er1n$i" ip addr add "$CLUSTER_NET.$((i + 1))/24" dev eth0
    ip netns exec "er1n$i" ip link set eth0 up
    ip netns exec "er1n$i" ip link set lo up
    ip netns exec "er1n$i" ip route add default via "$CLUSTER_NET.1"
  done
  cp /etc/hosts "$CLUSTER_STATE/hosts.orig"
  printf '%s n1\n%s n2\n' "$CLUSTER_NET.2" "$CLUSTER_NET.3" >> /etc/hosts

  PIDS=()
  munge_start
  CLUSTER_PIDS+=("${PIDS[@]}")

  local host cpus memory
  host=$(hostname -s)
  cpus=$(nproc)
  memory=$(awk '/MemTotal/ {print int($2 / 1024 / 2) - 1024}' /proc/meminfo)
  mkdir -p /etc/slurm "$CLUSTER_STATE/ctld"
  cat > "$SLURM_CONF" <<CONF
ClusterName=easyr1-ci2
SlurmctldHost=$host($CLUSTER_NET.1)
StateSaveLocation=$CLUSTER_STATE/ctld
SlurmdSpoolDir=$CLUSTER_STATE/d-%n
SlurmctldPidFile=$CLUSTER_STATE/slurmctld.pid
SlurmdPidFile=$CLUSTER_STATE/slurmd-%n.pid
SlurmctldLogFile=$CLUSTER_STATE/slurmctld.log
SlurmdLogFile=$CLUSTER_STATE/slurmd-%n.log
$(slurm_conf_common)
NodeName=n1 NodeAddr=$CLUSTER_NET.2 CPUs=$cpus RealMemory=$memory State=UNKNOWN
NodeName=n2 NodeAddr=$CLUSTER_NET.3 CPUs=$cpus RealMemory=$memory State=UNKNOWN
PartitionName=ci Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP
CONF
  slurmctld -D -i -f "$SLURM_CONF" &
  CLUSTER_PIDS+=($!)
  for i in 1 2; do
    mkdir -p "$CLUSTER_STATE/d-n$i"
    # nsenter, not `ip netns exec`: that remounts /sys, hiding the cgroup file system slurmd needs.
    nsenter --net="/run/netns/er1n$i" unshare --uts sh -c "hostname n$i && exec slurmd -D -f $SLURM_CONF" &
    CLUSTER_PIDS+=($!)
  done
  for _ in $(seq 150); do
    [ "$(sinfo -h -N -o %T 2>/dev/null | grep -cx idle)" = 2 ] && break
    sleep 0.3
  done
  sinfo -N
  [ "$(sinfo -h -N -o %T | grep -cx idle)" = 2 ] || { echo "the two nodes did not come up" >&2; for f in "$CLUSTER_STATE"/*.log; do echo "== $f"; tail -n 15 "$f"; done >&2; return 1; }
}

cluster_stop() {
  local pid
  for pid in "${CLUSTER_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${CLUSTER_PIDS[@]}"; do
    while kill -0 "$pid" 2>/dev/null; do sleep 0.2; done
  done
  for i in 1 2; do ip netns del "er1n$i" 2>/dev/null || true; done
  ip link del er1br 2>/dev/null || true
  if [ -n "$CLUSTER_STATE" ]; then
    [ -f "$CLUSTER_STATE/hosts.orig" ] && cp "$CLUSTER_STATE/hosts.orig" /etc/hosts
    rm -rf "$CLUSTER_STATE" "$SLURM_CONF"
  fi
}
