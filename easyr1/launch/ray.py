"""Several machines: Ray places the ranks of a run across a cluster (``trainer.nnodes > 1``).

The run joins a running cluster (``RAY_ADDRESS``, else the one ``ray start`` made on this
machine), reserves ``nnodes x n_gpus_per_node`` bundles of one GPU each (one CPU each on a
cluster without GPUs) in a placement group, and starts one rank in each bundle: a Ray actor that
runs ``easyr1 train`` as a child process with the variables torchrun would set, so every rank
runs the same program (SPMD) as with the local launcher. Ranks are numbered node by node (tensor-
parallel groups, runs of consecutive ranks, then stay on one node); rank 0's node hosts the
rendezvous. On each node the processes see all of that node's GPUs given to the run, each with
its own ``LOCAL_RANK``. Paths in the config are read from the directory the run was started in,
so the nodes need a shared file system, as on an HPC cluster. The first rank to fail stops the
others. When the run ends, Ray's timeline of it (a Chrome trace) is written to
``trainer.ray_timeline`` where that is set, as EasyR1 does.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from easyr1.config import ConfigError, PPOConfig
from easyr1.config_checks import RAY_RANK
from easyr1.distributed.ports import free_port

HINT = (
    "start one with `ray start --head` (and `ray start --address=HEAD:PORT` on the other nodes), or set "
    "RAY_ADDRESS; or start one process per GPU yourself with torchrun or srun"
)


class RankProcess:
    """One rank: ``easyr1 train`` in a child process of a Ray actor placed in its bundle."""

    def __init__(self) -> None:
        self.child: subprocess.Popen | None = None
        self.lock = threading.Lock()
        self.stopped = False

    def where(self) -> tuple[str, list[str]]:
        """This actor's node (Ray's id) and the GPUs Ray gave it."""
        import ray

        return ray.get_runtime_context().get_node_id(), [str(g) for g in ray.get_gpu_ids()]

    def free_port(self) -> int:
        return free_port()

    def run(self, argv: list[str], env: dict[str, str], cwd: str) -> int:
        with self.lock:
            if self.stopped:
                return -15
            self.child = subprocess.Popen(
                [sys.executable, "-m", "easyr1.cli", "train", *argv], env={**os.environ, **env}, cwd=cwd
            )
        return self.child.wait()

    def stop(self) -> None:
        with self.lock:
            self.stopped = True
            if self.child is not None and self.child.poll() is None:
                self.child.terminate()
                try:
                    self.child.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    self.child.kill()


def rank_layout(places: list[tuple[str, list[str]]]) -> list[dict[str, str]]:
    """Per actor (in bundle order), the variables of its rank, from each actor's (node, GPUs).

    Nodes come in order of first appearance, ranks node by node; on a node with GPUs every
    process sees the node's GPUs and ``LOCAL_RANK`` picks its own.
    """
    nodes: dict[str, list[int]] = {}
    for actor, (node, _) in enumerate(places):
        nodes.setdefault(node, []).append(actor)
    world = len(places)
    env: list[dict[str, str]] = [{} for _ in places]
    rank = 0
    for actors in nodes.values():
        gpus = sorted({g for actor in actors for g in places[actor][1]}, key=lambda g: (len(g), g))
        actors = sorted(actors, key=lambda a: gpus.index(places[a][1][0]) if places[a][1] else a)
        for local, actor in enumerate(actors):
            env[actor] = {
                "RANK": str(rank),
                "WORLD_SIZE": str(world),
                "LOCAL_RANK": str(local),
                "LOCAL_WORLD_SIZE": str(len(actors)),
            }
            if gpus:
                env[actor]["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
            rank += 1
    return env


def _connect() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError(
            "trainer.nnodes > 1 runs on a Ray cluster: pip install -e '.[ray]'; " + HINT
        ) from None
    address = os.environ.get("RAY_ADDRESS", "auto")
    host, _, port = address.rpartition(":")
    if host and port.isdigit():  # Ray would retry an address where nothing listens for minutes
        try:
            socket.create_connection((host, int(port)), timeout=10).close()
        except OSError as exc:
            raise ConfigError(
                f"trainer.nnodes > 1: no Ray cluster to join at RAY_ADDRESS={address} ({exc}); " + HINT
            ) from None
    try:
        ray.init(address=address, log_to_driver=True)
    except ConnectionError as exc:
        raise ConfigError(f"trainer.nnodes > 1: no Ray cluster to join ({exc}); " + HINT) from None
    return ray


def launch_ray(config: PPOConfig, argv: list[str]) -> int:
    """Run ``argv`` (``easyr1 train``'s config arguments) with one rank per bundle; the first
    failing rank's exit code, or 0."""
    trainer = config.trainer
    world = trainer.nnodes * trainer.n_gpus_per_node
    ray = _connect()
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    try:
        resources = ray.cluster_resources()
        kind = "GPU" if resources.get("GPU", 0) > 0 else "CPU"
        if resources.get(kind, 0) < world:
            raise ConfigError(
                f"trainer.nnodes={trainer.nnodes} x trainer.n_gpus_per_node={trainer.n_gpus_per_node} needs {world} "
                f"{kind}s; the Ray cluster has {int(resources.get(kind, 0))}"
            )
        bundle = {"CPU": 1, "GPU": 1} if kind == "GPU" else {"CPU": 1}
        group = placement_group([bundle] * world, strategy="PACK")
        ray.get(group.ready())
        remote = ray.remote(RankProcess)
        actors = [
            remote.options(
                num_cpus=1,
                num_gpus=1 if kind == "GPU" else 0,
                max_concurrency=2,  # stop() must run while run() waits
                scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=i),
            ).remote()
            for i in range(world)
        ]
        address = {node["NodeID"]: node["NodeManagerAddress"] for node in ray.nodes()}  # as the node joined
        places = [(address[node], gpus) for node, gpus in ray.get([actor.where.remote() for actor in actors])]
        layout = rank_layout(places)
        head = next(i for i, env in enumerate(layout) if env["RANK"] == "0")
        master = {
            "MASTER_ADDR": places[head][0],
            "MASTER_PORT": str(ray.get(actors[head].free_port.remote())),
        }
        nodes = len({node for node, _ in places})
        print(
            f"ray: {world} ranks on {nodes} node(s), rendezvous at {master['MASTER_ADDR']}:{master['MASTER_PORT']}",
            flush=True,
        )
        envs = [{**env, **master, RAY_RANK: "1"} for env in layout]
        runs = {
            actor.run.remote(argv, env, os.getcwd()): actor for actor, env in zip(actors, envs, strict=True)
        }
        code = _wait(ray, runs)
        if trainer.ray_timeline is not None:  # also after a failed run, which is when a trace helps most
            _write_timeline(ray, trainer.ray_timeline)
        return code
    finally:
        ray.shutdown()


def _write_timeline(ray: Any, path: str) -> None:
    """Ray's timeline of the run's actors and their calls (``ray.timeline``: a Chrome trace, for
    chrome://tracing or Perfetto) to ``path``."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    ray.timeline(filename=path)
    print(f"ray: timeline written to {path}", flush=True)


def _wait(ray: Any, runs: dict[Any, Any]) -> int:
    pending = list(runs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        code = ray.get(done[0])
        if code != 0:
            print(
                f"easyr1 train: a rank exited with code {code}; stopping the other ranks",
                file=sys.stderr,
                flush=True,
            )
            ray.get([runs[ref].stop.remote() for ref in pending])
            return code if code > 0 else 128 - code
    return 0
