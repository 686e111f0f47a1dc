"""The launcher as a scheduler treats it: whatever stops `easyr1 train` (SLURM's SIGTERM, Ctrl-C, an
out-of-memory SIGKILL) stops its ranks too, so no rank goes on writing into the run folder."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
import yaml

from easyr1.runlock import LOCK_FILE, RunLock
from tests.trainer_utils import tiny_config


@pytest.fixture()
def launcher(tiny_model: Callable[[str], Path], arithmetic: Path, tmp_path: Path):
    """`easyr1 train` on 2 CPU ranks for far more steps than the test waits for, once both ranks
    are training (step 1 is in metrics.jsonl); yields (launcher, its ranks)."""
    run_dir = tmp_path / "run"
    config = tiny_config(tiny_model("qwen2"), arithmetic, run_dir)
    config["trainer"].update(max_steps=10_000, val_before_train=False, val_freq=-1)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    process = subprocess.Popen(
        [sys.executable, "-m", "easyr1.cli", "train", f"config={path}"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while not (metrics.is_file() and metrics.read_text().strip()):
        assert process.poll() is None, process.stderr.read()[-3000:]
        assert time.monotonic() < deadline, "no training step within 300 s"
        time.sleep(0.5)
    ranks = psutil.Process(process.pid).children()
    assert len(ranks) == 2
    yield process, ranks
    for rank in ranks:
        if rank.is_running():
            rank.kill()
    if process.poll() is None:
        process.kill()
    process.wait()


def _alive_after(ranks: list[psutil.Process], seconds: float) -> list[int]:
    _, alive = psutil.wait_procs(ranks, timeout=seconds)
    return [rank.pid for rank in alive]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_launcher_stops_every_rank(launcher, sig: signal.Signals) -> None:
    process, ranks = launcher
    process.send_signal(sig)
    # The launcher waits for its ranks (killing one that is still there after its grace period, and
    # saying so), so none outlives it; how soon they stop depends on the host, not on the launcher.
    assert process.wait(timeout=120) == 128 + sig  # a bound on a hang, not a measurement
    assert _alive_after(ranks, 0) == []
    err = process.stderr.read()
    assert f"{sig.name} received; stopping the ranks" in err
    assert "did not stop within" not in err, err[-3000:]  # each stopped as the signal asked
    assert "Traceback" not in err, err[
        -3000:
    ]  # Ctrl-C used to print a KeyboardInterrupt traceback from each rank
    assert ("easyr1 train: interrupted; the last complete checkpoint stays" in err) == (
        sig == signal.SIGINT
    ), err[-3000:]


def test_a_killed_launcher_takes_its_ranks_with_it(launcher) -> None:
    process, ranks = launcher
    process.kill()  # no handler runs: the kernel's parent-death signal must stop the ranks
    assert (
        _alive_after(ranks, 120) == []
    )  # a bound on a hang (they would train on for hours), not a measurement


def test_one_run_per_run_folder(launcher, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The same command started again while a run trains (into its folder) is refused before any
    model loads, naming the first run's rank 0 by pid and host; it once resumed from the live run's
    checkpoints and interleaved its steps into metrics.jsonl. A run that died without a word leaves
    its lock file, which the next run takes over, and says so."""
    process, ranks = launcher
    run_dir = tmp_path / "run"
    [rank0] = [rank for rank in ranks if rank.environ().get("RANK") == "0"]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    second = subprocess.run(
        [sys.executable, "-m", "easyr1.cli", "train", f"config={tmp_path / 'config.yaml'}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert second.returncode == 1, second.stderr[-3000:]
    assert (
        f"another run is using this folder (pid {rank0.pid} on host {socket.gethostname()}" in second.stderr
    ), second.stderr[-3000:]
    assert "Traceback" not in second.stderr and "loading" not in second.stderr.lower(), second.stderr[-3000:]
    assert not list(run_dir.glob("*.before-*"))  # the first run's logs were not set aside
    assert process.poll() is None and all(rank.is_running() for rank in ranks)  # and it trains on
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(set(steps)), steps

    process.kill()  # the first run dies without releasing its lock: the kernel frees it, the file stays
    assert _alive_after(ranks, 120) == []  # a bound on a hang, not a measurement
    assert json.loads((run_dir / LOCK_FILE).read_text())["pid"] == rank0.pid
    with caplog.at_level(logging.WARNING, logger="easyr1.runlock"):
        lock = RunLock(run_dir)
    assert f"taking over the lock of pid {rank0.pid} on host {socket.gethostname()}" in caplog.text
    assert json.loads((run_dir / LOCK_FILE).read_text())["pid"] == os.getpid()
    lock.release()
    assert not (run_dir / LOCK_FILE).exists()  # released: the next run finds no lock to take over


def test_srun_tasks_become_ranks() -> None:
    """SLURM's variables for the tasks of an srun step, as srun sets them, mapped to torchrun's."""
    from easyr1.launch.slurm import expand_nodelist, in_allocation, rank_env, tasks_per_node

    assert expand_nodelist("n[1-2]") == ["n1", "n2"]
    assert expand_nodelist("gpu[07-10,12],login1") == ["gpu07", "gpu08", "gpu09", "gpu10", "gpu12", "login1"]
    assert tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    step = {
        "SLURM_JOB_ID": "4711",
        "SLURM_PROCID": "3",
        "SLURM_STEP_NUM_TASKS": "4",
        "SLURM_LOCALID": "1",
        "SLURM_NODEID": "1",
        "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
        "SLURM_STEP_NODELIST": "node[03-04]",
    }
    assert rank_env(step) == {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "node03",
        "MASTER_PORT": str(20000 + 4711),
    }
    assert rank_env({**step, "MASTER_PORT": "29400"})["MASTER_PORT"] == "29400"
    assert rank_env({**step, "RANK": "0"}) is None  # torchrun (or Ray) set the rank already
    batch_script = {k: v for k, v in step.items() if not k.startswith("SLURM_STEP")}
    assert rank_env(batch_script) is None  # the batch script itself is no rank
    # nor is the one task of `srun -n1 easyr1 train` (how Snakemake's SLURM executor runs a job): it starts the ranks
    assert (
        rank_env({**step, "SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "1", "SLURM_STEP_TASKS_PER_NODE": "1"})
        is None
    )
    allocation = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_JOB_NUM_NODES": "2"}
    assert in_allocation(allocation) and in_allocation({**allocation, "SLURM_STEP_NUM_TASKS": "1"})
    assert not in_allocation({**allocation, "SLURM_STEP_NUM_TASKS": "2"}) and not in_allocation(
        {**allocation, "SLURM_JOB_NUM_NODES": "1"}
    )
