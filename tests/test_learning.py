"""GRPO learns: a warm-started tiny Qwen2 on synthetic arithmetic, 2 CPU ranks, held-out accuracy.

The warm start teaches the answers but writes them in the boxed format only about half the time
(targets drawn from the "math" and "plain" formats, as an instruct model that follows a format
unreliably). The math reward pays for a correct boxed answer, so GRPO has a skill to improve that
carries over to the held-out test problems.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

from easyr1.config import DataConfig
from easyr1.data.synthetic import write_task
from easyr1.models.warmstart import warm_start
from tests.trainer_utils import read_metrics, run_train, tiny_config

# Measured: see the closing note of the RL-loop issue and README ("Learning check").
MIN_GAIN = 0.10


@pytest.fixture(scope="module")
def warm_model(tiny_model: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("learning")
    write_task("arithmetic", root / "data", n_train=180, n_test=55, seed=0)
    data = DataConfig(train_files=f"{root / 'data'}@train", prompt_key="problem", max_prompt_length=256)
    warm = warm_start(
        tiny_model("qwen2"), root / "warm", data, answer_formats=("math", "plain"), steps=400, batch_size=32, lr=2e-3
    )
    return warm, root / "data"


def test_grpo_raises_held_out_accuracy(warm_model: tuple[Path, Path], tmp_path: Path) -> None:
    model, data = warm_model
    run_dir = tmp_path / "run"
    done = run_train(
        tiny_config(model, data, run_dir),
        tmp_path,
        "data.rollout_batch_size=32",
        "data.max_response_length=24",
        "data.val_batch_size=-1",
        "worker.rollout.n=8",
        "worker.actor.global_batch_size=16",
        "worker.actor.micro_batch_size_per_device_for_update=16",
        "worker.actor.micro_batch_size_per_device_for_experience=32",
        "worker.actor.optim.lr=3.0e-4",
        "worker.actor.optim.lr_warmup_steps=3",
        "trainer.max_steps=30",
        "trainer.val_freq=10",
        timeout=1200,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = read_metrics(run_dir)
    validations = [m for m in metrics if "val/accuracy" in m]
    first, last = validations[0]["val/accuracy"], validations[-1]["val/accuracy"]
    assert validations[0]["step"] == 0 and validations[-1]["step"] == 30
    assert last - first >= MIN_GAIN, f"validation accuracy {first:.3f} -> {last:.3f}"
    assert validations[-1]["val/format"] > validations[0]["val/format"]
