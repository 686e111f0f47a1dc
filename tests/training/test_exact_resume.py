"""A run killed mid-way (SIGKILL of one rank) and resumed equals an uninterrupted run, exactly."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from safetensors.torch import load_file

from easyr1.data.synthetic import write_task
from easyr1.export import merge_checkpoint
from tests.trainer_utils import read_metrics, run_train, tiny_config

BATCH_REWARD = '''
import os
import signal

CALLS = {"n": 0}


def compute_score(reward_inputs, kill_at=0):
    """Rewards odd-length responses; rank 1 dies (SIGKILL) at its `kill_at`-th call."""
    CALLS["n"] += 1
    if kill_at and os.environ.get("RANK") == "1" and CALLS["n"] == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
    return [{"overall": float(len(r["response"]) % 2)} for r in reward_inputs]
'''

# Quantities that depend on the machine's speed, not on the training.
UNTIMED = ("timing_s/", "perf/")


@pytest.fixture()
def setup(tiny_model: Callable[[str], Path], tmp_path: Path) -> tuple[dict, Path]:
    data = tmp_path / "data"
    write_task("arithmetic", data, n_train=32, n_test=8, seed=0)
    reward = tmp_path / "reward.py"
    reward.write_text(BATCH_REWARD)
    config = tiny_config(tiny_model("qwen2"), data, tmp_path / "unused")
    config["worker"]["reward"] = {"reward_function": f"{reward}:compute_score"}
    config["trainer"].update(val_before_train=False, val_freq=-1, save_freq=3, max_steps=6)
    return config, tmp_path


def _trained(metrics: list[dict]) -> list[dict]:
    return [{k: v for k, v in m.items() if not k.startswith(UNTIMED)} for m in metrics]


def test_killed_and_resumed_equals_uninterrupted(setup: tuple[dict, Path]) -> None:
    config, tmp = setup
    straight, broken = tmp / "straight", tmp / "broken"

    done = run_train(config, tmp, f"trainer.save_checkpoint_path={straight}")
    assert done.returncode == 0, done.stderr[-3000:]

    # Rank 1 dies while scoring step 5: checkpoint 3 exists, step 4 is logged, step 5 is not.
    killed = run_train(
        config,
        tmp,
        f"trainer.save_checkpoint_path={broken}",
        "worker.reward.reward_function_kwargs={kill_at: 5}",
    )
    assert killed.returncode != 0
    assert [m["step"] for m in read_metrics(broken)] == [1, 2, 3, 4]
    assert not (broken / "global_step_6").exists()

    resumed = run_train(config, tmp, f"trainer.save_checkpoint_path={broken}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stdout and "global_step_3" in resumed.stdout

    # The killed run logged step 4 before dying; resuming from step 3 dropped that line and logged it again.
    resumed_metrics = _trained(read_metrics(broken))
    assert [m["step"] for m in resumed_metrics] == [1, 2, 3, 4, 5, 6]
    assert resumed_metrics == _trained(read_metrics(straight))

    a = load_file(merge_checkpoint(straight / "global_step_6" / "actor", tmp / "a") / "model.safetensors")
    b = load_file(merge_checkpoint(broken / "global_step_6" / "actor", tmp / "b") / "model.safetensors")
    assert a.keys() == b.keys()
    assert all((a[k] == b[k]).all() for k in a)
