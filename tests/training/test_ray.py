"""Several machines through Ray (``trainer.nnodes > 1``): a real Ray cluster on loopback, started
with ``ray start`` as on a cluster's head node, runs the tiny trainer with its ranks placed by Ray;
the rank layout for GPU nodes; a clear error when the cluster is too small or absent."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from easyr1.config import ConfigError
from easyr1.distributed.ports import free_port
from easyr1.launch.ray import rank_layout
from easyr1.launch.slurm import wait_for_nodes
from tests.trainer_utils import read_metrics, run_train, tiny_config

pytest.importorskip("ray")
RAY = str(Path(sys.executable).with_name("ray"))


def test_ranks_go_node_by_node_and_see_their_nodes_gpus() -> None:
    # Bundle order as Ray might place them: nodes interleaved, GPUs out of order. The first node
    # seen (.2) takes ranks 0-1, in its GPUs' order.
    places = [("10.0.0.2", ["3"]), ("10.0.0.1", ["1"]), ("10.0.0.2", ["2"]), ("10.0.0.1", ["0"])]
    env = rank_layout(places)
    assert [e["RANK"] for e in env] == ["1", "3", "0", "2"]
    assert [e["LOCAL_RANK"] for e in env] == ["1", "1", "0", "0"]
    assert {e["CUDA_VISIBLE_DEVICES"] for e in env[::2]} == {"2,3"} and {
        e["CUDA_VISIBLE_DEVICES"] for e in env[1::2]
    } == {"0,1"}
    assert all(e["WORLD_SIZE"] == "4" and e["LOCAL_WORLD_SIZE"] == "2" for e in env)
    cpu = rank_layout([("h", []), ("h", [])])
    assert [e["RANK"] for e in cpu] == ["0", "1"] and "CUDA_VISIBLE_DEVICES" not in cpu[0]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A one-node Ray cluster on loopback with 2 CPUs; its address."""
    address = f"127.0.0.1:{free_port()}"
    temp = tmp_path_factory.mktemp("ray")
    start = [
        RAY,
        "start",
        "--head",
        "--node-ip-address=127.0.0.1",
        f"--port={address.split(':')[1]}",
        "--num-cpus=2",
        "--num-gpus=0",
        "--include-dashboard=false",
        "--disable-usage-stats",
        f"--temp-dir={temp}",
    ]
    subprocess.run(start, check=True, capture_output=True, timeout=120)
    try:
        yield address
    finally:
        subprocess.run([RAY, "stop", "--force"], capture_output=True, timeout=120)
        shutil.rmtree(temp, ignore_errors=True)


def test_two_nodes_worth_of_ranks_train_through_ray(
    cluster: str,
    tiny_model: Callable[[str], Path],
    arithmetic: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RAY_ADDRESS", cluster)
    run_dir = tmp_path / "run"
    config = tiny_config(tiny_model("qwen2"), arithmetic, run_dir)
    done = run_train(config, tmp_path, "trainer.nnodes=2", "trainer.n_gpus_per_node=1", "trainer.max_steps=1")
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(r"ray: 2 ranks on 1 node\(s\), rendezvous at [\d.]+:\d+", done.stdout), done.stdout[:500]
    assert [m["step"] for m in read_metrics(run_dir)] == [0, 1]

    # 4 ranks, which split the batch (the config's checks come first): more than the cluster has.
    too_many = run_train(
        config, tmp_path, "trainer.nnodes=4", "trainer.n_gpus_per_node=1", "trainer.max_steps=1"
    )
    assert too_many.returncode != 0
    assert "needs 4 CPUs; the Ray cluster has 2" in too_many.stderr


def test_without_a_cluster_the_error_says_how_to_start_one(
    tiny_model: Callable[[str], Path], arithmetic: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{free_port()}")  # nothing listens there
    config = tiny_config(tiny_model("qwen2"), arithmetic, tmp_path / "run")
    done = run_train(config, tmp_path, "trainer.nnodes=2", "trainer.n_gpus_per_node=1", timeout=180)
    assert done.returncode != 0
    assert "no Ray cluster to join" in done.stderr and "ray start --head" in done.stderr


def test_a_slurm_node_whose_ray_worker_does_not_join_is_named(cluster: str) -> None:
    """Inside an allocation the engine waits for every node's worker (``launch/slurm.py``); one whose
    job step ended without joining (it could not reach the head) fails the run naming the address.
    The head here is the loopback cluster; the two job steps are stand-in processes."""
    head, worker = subprocess.Popen(["sleep", "120"]), subprocess.Popen(["true"])
    worker.wait()
    try:
        with pytest.raises(
            ConfigError, match=rf"1 of the allocation's 2 nodes \(n1, n2\) joined the Ray head at {cluster} "
        ):
            wait_for_nodes(cluster, ["n1", "n2"], [head, worker])
    finally:
        head.kill()
        head.wait()


def test_a_ray_head_that_does_not_come_up_is_named() -> None:
    head = subprocess.Popen(["true"])  # the head's job step, ended at once
    head.wait()
    address = f"127.0.0.1:{free_port()}"
    with pytest.raises(ConfigError, match=rf"the Ray head on 127\.0\.0\.1 did not come up at {address}"):
        wait_for_nodes(address, ["n1", "n2"], [head])
