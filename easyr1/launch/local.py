"""Start ``trainer.n_gpus_per_node`` ranks on this machine, as torchrun would.

If the environment already describes a rank (torchrun, ``srun``, or Ray set RANK and
WORLD_SIZE), this process IS that rank and runs the trainer directly. With ``trainer.nnodes > 1``
Ray places the ranks across machines (``launch/ray.py``). Otherwise it spawns one child per rank
(one per GPU; on a machine without GPUs, CPU ranks over gloo), watches them, and stops all of
them as soon as one fails, so a crash never leaves ranks waiting on a collective.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

from easyr1.config import PPOConfig


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _spawn(world: int, argv: list[str]) -> int:
    port = free_port()
    children: list[subprocess.Popen] = []
    for rank in range(world):
        env = dict(os.environ)
        env.update(
            RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
        )
        children.append(subprocess.Popen([sys.executable, "-m", "easyr1.cli", "train", *argv], env=env))
    try:
        while True:
            codes = [c.poll() for c in children]
            failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                rank, code = failed[0]
                print(f"easyr1 train: rank {rank} exited with code {code}; stopping the other ranks", file=sys.stderr)
                return code if code > 0 else 128 - code
            if all(c == 0 for c in codes):
                return 0
            time.sleep(0.2)
    finally:
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        for child in children:
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.kill()


def launch(config: PPOConfig, argv: list[str]) -> int:
    """Run training for ``config``; ``argv`` are the config arguments, passed on to spawned ranks."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        from easyr1.trainer import run

        run(config)
        return 0
    trainer = config.trainer
    if trainer.nnodes > 1:  # several machines: Ray places the ranks (or torchrun/srun set RANK above)
        from easyr1.launch.ray import launch_ray

        return launch_ray(config, argv)
    return _spawn(trainer.n_gpus_per_node, argv)
