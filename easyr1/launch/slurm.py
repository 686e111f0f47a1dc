"""SLURM: ranks that ``srun`` started, and a Ray cluster started inside an allocation.

``srun`` sets ``SLURM_PROCID`` (the task's rank in the step), ``SLURM_STEP_NUM_TASKS``,
``SLURM_LOCALID``, ``SLURM_NODEID``, ``SLURM_STEP_TASKS_PER_NODE`` and ``SLURM_STEP_NODELIST``,
not the ``RANK``/``WORLD_SIZE``/``MASTER_ADDR`` that torch.distributed reads; ``rank_env`` maps
the first onto the second, so ``srun easyr1 train ...`` runs one rank per task with no wrapper
script. The rendezvous is on the step's first host, at ``MASTER_PORT`` when the job sets one,
else at a port every task derives from the job id. Only job steps (``srun``) count: a batch
script itself has no ``SLURM_STEP_NUM_TASKS``, and a one-task step is one process too, so
``easyr1 train`` run there starts its ranks itself as on any machine.

Ray, as EasyR1 runs several nodes: ``easyr1 train ... trainer.nnodes=N`` in the batch script of an
N-node allocation, with no ``RAY_ADDRESS``, starts the cluster itself (``ray_cluster``): a head on
the allocation's first node and a worker on each other one, each ``ray start --block`` as one job
step, so SLURM owns them and a cancelled job takes them down. The run then joins that cluster as
any other (``launch/ray.py``), and the steps are stopped when it ends, however it ends.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from easyr1.config import ConfigError

PORT_BASE, PORT_SPAN = 20000, 20000  # MASTER_PORT = PORT_BASE + job id mod PORT_SPAN
RAY_PORT_BASE = 40000  # the Ray head's port, likewise from the job id
READY_S = 180.0  # how long the nodes may take to join


def expand_nodelist(nodelist: str) -> list[str]:
    """SLURM's compressed host list, ``n[1-3,5],gpu07``, as host names in order."""
    hosts = []
    for prefix, ranges, plain in re.findall(r"([^,\[]+)\[([^\]]+)\]|([^,\[\]]+)", nodelist):
        if plain:
            hosts.append(plain)
            continue
        for part in ranges.split(","):
            first, _, last = part.partition("-")
            width = len(first)  # zero padding, as in gpu[07-10]
            for number in range(int(first), int(last or first) + 1):
                hosts.append(f"{prefix}{number:0{width}d}")
    return hosts


def tasks_per_node(spec: str) -> list[int]:
    """``SLURM_STEP_TASKS_PER_NODE``, ``2(x3),1``, as one count per node."""
    counts = []
    for count, repeat in re.findall(r"(\d+)(?:\(x(\d+)\))?", spec):
        counts += [int(count)] * int(repeat or 1)
    return counts


def rank_env(environ: Mapping[str, str]) -> dict[str, str] | None:
    """The torch.distributed variables for a task of an ``srun`` step of several tasks, or None:
    outside a step, where a launcher has set ``RANK`` already, or in a one-task step (``srun -n1
    easyr1 train``, as Snakemake's SLURM executor runs every job), whose one process starts the
    ranks itself."""
    if (
        "RANK" in environ
        or "SLURM_PROCID" not in environ
        or int(environ.get("SLURM_STEP_NUM_TASKS", "1")) < 2
    ):
        return None
    hosts = expand_nodelist(environ["SLURM_STEP_NODELIST"])
    per_node = tasks_per_node(environ["SLURM_STEP_TASKS_PER_NODE"])
    node = int(environ.get("SLURM_NODEID", "0"))
    port = environ.get("MASTER_PORT") or str(PORT_BASE + int(environ["SLURM_JOB_ID"]) % PORT_SPAN)
    return {
        "RANK": environ["SLURM_PROCID"],
        "WORLD_SIZE": environ["SLURM_STEP_NUM_TASKS"],
        "LOCAL_RANK": environ.get("SLURM_LOCALID", "0"),
        "LOCAL_WORLD_SIZE": str(per_node[node] if node < len(per_node) else 1),
        "MASTER_ADDR": environ.get("MASTER_ADDR") or hosts[0],
        "MASTER_PORT": port,
    }


def in_allocation(environ: Mapping[str, str]) -> bool:
    """The one process of a job with several nodes: its batch script, or a one-task step in it (as
    Snakemake's SLURM executor runs a job), not a task of a step of several (``rank_env``)."""
    one_process = int(environ.get("SLURM_STEP_NUM_TASKS", "1")) == 1
    return (
        "SLURM_JOB_NODELIST" in environ and one_process and int(environ.get("SLURM_JOB_NUM_NODES", "1")) > 1
    )


def _step(host: str, command: str) -> subprocess.Popen:
    """``command`` as a one-task job step on ``host``, sharing the allocation's CPUs with the others."""
    return subprocess.Popen(
        [
            "srun",
            "--nodes=1",
            "--ntasks=1",
            f"--nodelist={host}",
            "--overlap",
            "--kill-on-bad-exit=1",
            "sh",
            "-c",
            command,
        ],
        start_new_session=True,  # a Ctrl-C at the terminal reaches the run, which then stops these
    )


def wait_for_nodes(address: str, hosts: list[str], steps: list[subprocess.Popen]) -> None:
    """Until every host's node has joined the head at ``address``; an error naming what is missing."""
    import ray

    host, port = address.rsplit(":", 1)
    deadline = time.monotonic() + READY_S
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=2).close()
            break
        except OSError as exc:
            if time.monotonic() > deadline or steps[0].poll() is not None:
                raise ConfigError(f"the Ray head on {host} did not come up at {address}: {exc}") from None
            time.sleep(1)
    ray.init(address=address, log_to_driver=False)
    try:
        while True:
            alive = [n for n in ray.nodes() if n["Alive"]]
            if len(alive) >= len(hosts):
                return
            if time.monotonic() > deadline or any(step.poll() is not None for step in steps[1:]):
                raise ConfigError(
                    f"{len(alive)} of the allocation's {len(hosts)} nodes ({', '.join(hosts)}) joined the Ray head "
                    f"at {address} within {READY_S:.0f} s: a worker that cannot reach it fails in its job step's log"
                )
            time.sleep(1)
    finally:
        ray.shutdown()


@contextmanager
def ray_cluster(environ: Mapping[str, str]) -> Iterator[str]:
    """A Ray head on the allocation's first node and a worker on each other node; its address."""
    hosts = expand_nodelist(environ["SLURM_JOB_NODELIST"])
    job = environ["SLURM_JOB_ID"]
    address = f"{socket.gethostbyname(hosts[0])}:{RAY_PORT_BASE + int(job) % PORT_SPAN}"
    ray = Path(sys.executable).with_name("ray")
    # Each node its own temporary folder: nodes that share /tmp (as this project's CI cluster does)
    # would otherwise share Ray's sockets.
    # Each node offers Ray the CPUs the job has there, not all of the node's.
    common = f"--block --disable-usage-stats --temp-dir=/tmp/ray-{job}-$(hostname)"
    # No drain on SIGTERM: the run is over, and Ray's default drain (up to 30 s) matches SLURM's
    # default KillWait, after which a SIGKILL leaves the node's raylet running as an orphan.
    start = f"RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S=0 exec {ray} start"
    cpus = tasks_per_node(environ.get("SLURM_JOB_CPUS_PER_NODE", "")) or [0] * len(hosts)
    offer = [f"--num-cpus={n}" if n else "" for n in cpus]
    head = f"{start} --head --port={address.rsplit(':', 1)[1]} --include-dashboard=false {offer[0]} {common}"
    steps = [_step(hosts[0], head)]
    steps += [
        _step(host, f"{start} --address={address} {n} {common}")
        for host, n in zip(hosts[1:], offer[1:], strict=True)
    ]
    print(
        f"ray: head at {address}, workers on {', '.join(hosts[1:])} (job steps of SLURM job {job})",
        flush=True,
    )
    try:
        wait_for_nodes(address, hosts, steps)
        yield address
    finally:
        _stop(steps[1:])  # the workers while the head is still there to hear of it, then the head
        _stop(steps[:1])


def _stop(steps: list[subprocess.Popen]) -> None:
    """SIGTERM to each step (srun passes it to `ray start --block`, which stops its node's
    processes), then wait; a step still there after a minute is killed."""
    for step in steps:
        if step.poll() is None:
            step.send_signal(signal.SIGTERM)
    for step in steps:
        try:
            step.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(step.pid, signal.SIGKILL)
            step.wait()
