"""Two machines' worth of SLURM: ranks on two nodes through srun, and a node's rank killed mid-run.

Runs only on the two-node cluster that ``.ci/slurm-multinode.sh`` starts (two slurmd in their own
network namespaces with their own hostnames and addresses; see ``.ci/slurm-cluster.sh``), which
sets ``EASYR1_SLURM_NODES=n1,n2``. Everything is real: SLURM schedules the job steps, each rank
runs on its node and reaches the other over the namespaces' bridge through gloo.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.trainer_utils import read_metrics, run_train, tiny_config

REPO = Path(__file__).resolve().parents[2]
NODES = os.environ.get("EASYR1_SLURM_NODES", "")
pytestmark = pytest.mark.skipif(
    NODES != "n1,n2", reason="needs the two-node SLURM cluster of .ci/slurm-multinode.sh"
)

# Both ways run 2 ranks of one thread each (the local launcher would otherwise give each rank one
# of the 2 cores and srun's tasks both), so the arithmetic, and the metrics, are the same.
ENV = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
VARYING = ("timing_s/", "perf/")  # wall times and memory readings differ from run to run


def _srun(config: dict[str, Any], workdir: Path, *overrides: str) -> subprocess.Popen:
    """``srun -N2 -n2 easyr1 train ...``: one rank per node, as a user types it in an allocation."""
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    cmd = [
        "srun",
        "--nodes=2",
        "--ntasks=2",
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=1",
        sys.executable,
        "-m",
        "easyr1.cli",
        "train",
        f"config={path}",
        "trainer.nnodes=2",
        "trainer.n_gpus_per_node=1",
        *overrides,
    ]
    return subprocess.Popen(
        cmd, cwd=workdir, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _comparable(metrics: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in m.items() if not k.startswith(VARYING)} for m in metrics]


def _local(config: dict[str, Any], workdir: Path) -> list[dict[str, Any]]:
    """The same run with 2 ranks on this machine (the local launcher)."""
    os.environ["OMP_NUM_THREADS"] = ENV["OMP_NUM_THREADS"]  # this module runs only in its own CI job
    done = run_train(config, workdir)
    assert done.returncode == 0, done.stderr[-3000:]
    return read_metrics(Path(config["trainer"]["save_checkpoint_path"]))


def test_the_cluster_has_two_hosts() -> None:
    assert sorted(
        subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N"], capture_output=True, text=True, check=True
        ).stdout.split()
    ) == ["n1", "n2"]
    hosts = subprocess.run(
        ["srun", "-N2", "-n2", "hostname"], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    assert sorted(hosts) == ["n1", "n2"]


def _rank_pid(rank: int, run_dir: Path) -> int | None:
    """The PID of the rank of this run with SLURM_PROCID ``rank`` (every node's processes share
    this machine's process table; only their network and hostname are their own)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if (
            f"SLURM_PROCID={rank}".encode() in environ
            and b"easyr1.cli" in cmdline
            and str(run_dir.parent).encode() in cmdline
        ):
            return int(proc.name)
    return None


# The run is too quick to kill at a chosen step from outside (a tiny model's step takes ~0.15 s and a
# finished rank exits at once), so rank 1 holds in its reward function at its ``hold_at``-th call,
# after writing ``held``: the test kills it there, mid-step, with checkpoints of the steps before.
HOLDING_REWARD = """
import os
import time
from pathlib import Path

CALLS = {"n": 0}


def compute_score(reward_inputs, hold_at=0, held=""):
    CALLS["n"] += 1
    if hold_at and os.environ.get("RANK") == "1" and CALLS["n"] == hold_at:
        Path(held).touch()
        time.sleep(120)  # under worker.reward.timeout: the kill, not the timeout, ends the step
    return [{"overall": float(len(r["response"]) % 2)} for r in reward_inputs]
"""


def test_a_node_killed_mid_run_ends_the_job_and_the_rerun_resumes(
    tiny_model: Callable[[str], Path], arithmetic: Path, tmp_path: Path
) -> None:
    model = tiny_model("qwen2")
    config = tiny_config(model, arithmetic, tmp_path / "run")
    config["trainer"].update(max_steps=4, save_freq=1, val_freq=-1)
    (tmp_path / "reward.py").write_text(HOLDING_REWARD)
    config["worker"]["reward"] = {"reward_function": f"{tmp_path / 'reward.py'}:compute_score"}
    (tmp_path / "ref").mkdir()
    reference = _local(
        {**config, "trainer": {**config["trainer"], "save_checkpoint_path": str(tmp_path / "ref" / "run")}},
        tmp_path / "ref",
    )

    held = tmp_path / "held"
    job = _srun(config, tmp_path, f"worker.reward.reward_function_kwargs={{hold_at: 4, held: {held}}}")
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and job.poll() is None and not held.exists():
        time.sleep(0.2)
    assert held.exists(), (
        f"rank 1 never reached its 4th reward call:\n{job.communicate()[0][-3000:] if job.poll() is not None else ''}"
    )
    pid, first = _rank_pid(1, tmp_path / "run"), _rank_pid(0, tmp_path / "run")
    assert pid is not None and first is not None, "the ranks were not found"
    # its 4th call: the validation before training, steps 1 and 2 (checkpointed), and now step 3
    assert [m["step"] for m in read_metrics(tmp_path / "run")] == [0, 1, 2]
    # two hosts: each rank in its own node's network and hostname namespaces
    assert os.readlink(f"/proc/{pid}/ns/net") != os.readlink(f"/proc/{first}/ns/net")
    assert os.readlink(f"/proc/{pid}/ns/uts") != os.readlink(f"/proc/{first}/ns/uts")
    os.kill(pid, signal.SIGKILL)  # the node's rank dies without a word
    killed = time.monotonic()
    output, _ = job.communicate(timeout=180)
    print(f"the job ended {time.monotonic() - killed:.1f} s after rank 1 was killed")
    assert job.returncode != 0 and time.monotonic() - killed < 60, output[-3000:]
    assert (tmp_path / "run" / "global_step_2").is_dir(), "the last complete checkpoint is gone"

    rerun = _srun(config, tmp_path)
    output, _ = rerun.communicate(timeout=600)
    assert rerun.returncode == 0, output[-3000:]
    assert "resumed from" in output and "global_step_2" in output, output[-3000:]
    final = _comparable(read_metrics(tmp_path / "run"))
    assert [m["step"] for m in final] == [0, 1, 2, 3, 4] and final[-1] == _comparable(reference)[-1]


def _processes(marker: str) -> str:
    """The processes whose command line holds ``marker``, one ``PID command`` line each."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if proc.name.isdigit() and int(proc.name) != os.getpid() and marker in cmdline:
            found.append(f"{proc.name} {cmdline[:200]}")
    return "\n".join(found)


def _gone(marker: str, within: float) -> bool:
    """Whether the processes with ``marker`` in their command line are gone within ``within`` s
    (a step's processes are signalled when it ends; the kernel may take a moment to reap them)."""
    deadline = time.monotonic() + within
    while _processes(marker):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


def test_the_harness_runs_a_cell_on_two_nodes_through_srun_and_through_ray(tmp_path: Path) -> None:
    """The multi-node matrix through the SLURM profile: the one-node cell, the same cell with one
    rank on each node started by srun, and by Ray inside the allocation, give the same metrics."""
    work = tmp_path / "work"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "snakemake",
            "-s",
            str(REPO / "Snakefile"),
            "-d",
            str(work),
            "--configfile",
            str(REPO / "tests/harness/multinode.yaml"),
            "--profile",
            str(REPO / "configs/profiles/slurm"),
        ],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    cells = {
        name: work / "runs" / f"qwen2-grpo-arithmetic-fp32{name}" for name in ("", "-2node", "-2node-ray")
    }
    for name, run_dir in cells.items():
        status = json.loads((run_dir / "status.json").read_text())
        assert status["status"] == "ok", f"cell{name}: " + status["error_tail"]
    srun_log, ray_log = ((cells[name] / "train.log").read_text() for name in ("-2node", "-2node-ray"))
    assert "$ srun --kill-on-bad-exit=1 --nodes=2 --ntasks=2 --ntasks-per-node=1" in srun_log, srun_log[:2000]
    assert re.search(r"ray: head at 10\.77\.0\.2:\d+, workers on n2", ray_log), ray_log[:2000]
    assert "ray: 2 ranks on 2 node(s)" in ray_log, ray_log[-3000:]
    one_node = _comparable(read_metrics(cells[""]))
    assert any(m.get("actor/grad_norm", 0) > 1e-3 for m in one_node), one_node  # numbers worth comparing
    assert _comparable(read_metrics(cells["-2node"])) == one_node
    assert _comparable(read_metrics(cells["-2node-ray"])) == one_node
    assert _gone("/tmp/ray-", within=20), "Ray processes outlived the job: " + _processes("/tmp/ray-")
    page = (work / "assets/baselines.md").read_text()
    assert "3 cells (3 configurations x seeds), 3 finished, 0 failed" in page
    assert "2 x 1 (srun)" in page and "2 x 1 (ray)" in page
