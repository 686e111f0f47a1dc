"""Ranks that SLURM's ``srun`` started: each task is one rank.

``srun`` sets ``SLURM_PROCID`` (the task's rank in the step), ``SLURM_STEP_NUM_TASKS``,
``SLURM_LOCALID``, ``SLURM_NODEID``, ``SLURM_STEP_TASKS_PER_NODE`` and ``SLURM_STEP_NODELIST``,
not the ``RANK``/``WORLD_SIZE``/``MASTER_ADDR`` that torch.distributed reads; ``rank_env`` maps
the first onto the second, so ``srun easyr1 train ...`` runs one rank per task with no wrapper
script. The rendezvous is on the step's first host, at ``MASTER_PORT`` when the job sets one,
else at a port every task derives from the job id. Only job steps (``srun``) count: a batch
script itself has no ``SLURM_STEP_NUM_TASKS``, so ``easyr1 train`` run there starts its ranks
itself as on any machine.
"""

from __future__ import annotations

import re
from typing import Mapping

PORT_BASE, PORT_SPAN = 20000, 20000  # MASTER_PORT = PORT_BASE + job id mod PORT_SPAN


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
    """The torch.distributed variables for a task of an ``srun`` step, or None outside one (or
    where a launcher has set ``RANK`` already)."""
    if "RANK" in environ or "SLURM_STEP_NUM_TASKS" not in environ or "SLURM_PROCID" not in environ:
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
