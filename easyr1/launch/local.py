"""Start ``trainer.n_gpus_per_node`` ranks on this machine, as torchrun would.

If the environment already describes a rank (torchrun or Ray set RANK and WORLD_SIZE; ``srun``
sets SLURM's variables, which ``launch/slurm.py`` maps), this process IS that rank and runs the
trainer directly. With ``trainer.nnodes > 1``
Ray places the ranks across machines (``launch/ray.py``). Otherwise it spawns one child per rank
(one per GPU; on a machine without GPUs, CPU ranks over gloo), watches them, and stops all of
them as soon as one fails, so a crash never leaves ranks waiting on a collective. A signal to the
launcher (a scheduler's SIGTERM, Ctrl-C) is passed on to the ranks, and a launcher that dies
without a word (SIGKILL) takes them with it: no rank outlives the job that started it.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import time
from typing import NoReturn

from easyr1.config import ConfigError, PPOConfig
from easyr1.config_checks import check_config, check_runnable, planned_world
from easyr1.distributed.lifetime import die_with_parent
from easyr1.distributed.ports import free_port
from easyr1.distributed.simulated import SIMULATED_RANKS_ENV, check_simulated, simulated_ranks
from easyr1.launch.slurm import in_allocation, rank_env, ray_cluster
from easyr1.rewards.loader import check_reward_config

# What schedulers and terminals send: SLURM's scancel and time limit (SIGTERM), Ctrl-C, a closed shell.
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_GRACE_S = 10.0  # a rank still alive this long after SIGTERM (or the signal forwarded to it) is killed


def _spawn(world: int, argv: list[str]) -> int:
    """Start the ``world`` ranks; under simulated ranks, rank 0 of them alone (``distributed/simulated.py``)."""
    port = free_port()
    children: list[subprocess.Popen] = []
    stop: list[int] = []  # the signal a scheduler (or Ctrl-C) sent the launcher

    def forward(signum: int, _frame: object) -> None:
        stop.append(signum)
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in _FORWARDED}
    watch = functools.partial(die_with_parent, os.getpid(), signal.SIGTERM)  # run by each rank before exec
    try:
        for rank in range(1 if simulated_ranks() is not None else world):
            env = dict(os.environ)
            env.update(
                RANK=str(rank),
                LOCAL_RANK=str(rank),
                WORLD_SIZE=str(world),
                LOCAL_WORLD_SIZE=str(world),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
            )
            children.append(
                subprocess.Popen(
                    [sys.executable, "-m", "easyr1.cli", "train", *argv], env=env, preexec_fn=watch
                )
            )
        while True:
            if stop:
                name = signal.Signals(stop[0]).name
                print(f"easyr1 train: {name} received; stopping the ranks", file=sys.stderr, flush=True)
                return 128 + stop[0]
            codes = [c.poll() for c in children]
            failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                rank, code = failed[0]
                print(
                    f"easyr1 train: rank {rank} exited with code {code}; stopping the other ranks",
                    file=sys.stderr,
                )
                return code if code > 0 else 128 - code
            if all(c == 0 for c in codes):
                return 0
            time.sleep(0.2)
    finally:
        # After a forwarded signal the ranks have it already, and stop as it asks (after Ctrl-C, rank 0
        # says the last checkpoint stays): a SIGTERM on its heels would cut that short.
        for child in children if not stop else []:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + _GRACE_S
        for rank, child in enumerate(children):
            try:
                child.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                print(
                    f"easyr1 train: rank {rank} did not stop within {_GRACE_S:g} s; killing it",
                    file=sys.stderr,
                    flush=True,
                )
                child.kill()
                child.wait()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _exit_finished_rank() -> NoReturn:
    """End a rank that finished: its process group is destroyed, its loggers closed and its reward
    worker stopped, so nothing is left to do. The interpreter's own teardown would take another
    second per rank (torch, transformers and the models, module by module), and would run the C++
    destructors of objects still referenced at exit (the DTensor meshes hold the process group) in
    an order nobody chose."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def launch(config: PPOConfig, argv: list[str]) -> int:
    """Run training for ``config``; ``argv`` are the config arguments, passed on to spawned ranks."""
    os.environ.update(rank_env(os.environ) or {})  # a task of an srun step is a rank (launch/slurm.py)
    check_reward_config(
        config.worker.reward
    )  # the reward file resolves, on every path, before any model loads
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        from easyr1.launch.rank import run

        run(config)
        _exit_finished_rank()
    trainer = config.trainer
    # The checks every rank runs, here first: one message at once, not one per rank once they start.
    from easyr1.loggers import check_loggers

    check_config(config, planned_world(config))
    check_runnable(config)  # a model, a reward and data named, in the order a rank checks them
    check_loggers(trainer.logger)
    if simulated_ranks() is not None:
        if simulated_ranks() != planned_world(config):
            raise ConfigError(
                f"{SIMULATED_RANKS_ENV}={simulated_ranks()} simulates rank 0 of that many ranks: set "
                f"trainer.n_gpus_per_node={simulated_ranks()} (and trainer.nnodes=1), not {planned_world(config)} ranks in all"
            )
        check_simulated(config)
    if trainer.nnodes > 1:  # several machines: Ray places the ranks (or torchrun/srun set RANK above)
        from easyr1.launch.ray import launch_ray

        if "RAY_ADDRESS" not in os.environ and in_allocation(os.environ):  # start Ray in the SLURM job
            with ray_cluster(os.environ) as address:
                os.environ["RAY_ADDRESS"] = address
                return launch_ray(config, argv)
        return launch_ray(config, argv)
    return _spawn(trainer.n_gpus_per_node, argv)
