"""GRPO learns: a warm-started tiny Qwen2 on the synthetic compare task, 2 CPU ranks, held-out prompts.

The warm start trains on the ``guess`` column: one of the two numbers at random, in the boxed
format. The model comes out answering in format with one of the two numbers, right about half
the time, and without the comparison (the teacher never compared). GRPO with the math reward
must learn the comparison from the reward alone, and validation is on number pairs it never
saw in training, so a rise in validation accuracy is a skill RL taught that generalises.

(The arithmetic task cannot show this: a 2-layer, 64-wide model memorises single-digit facts
and held-out sums are facts it never saw, so their accuracy stays near 0.1 however it is trained.)

GRPO (the default) and PPO (critic + GAE) each run 20 steps from the same warm start; measured on
an idle 2-core machine, GRPO goes 0.48 -> 0.81 (step 10) -> 0.88 (step 20) -> 0.95 (step 30, a
longer run). The other algorithms' curves on this task are the harness's (configs/matrix/cpu.yaml:
every algorithm, 3 seeds, `make baselines`); DAPO, GSPO and RLOO passed this test at 0.2 too
until 2026-12-02, when it left CI for time. So did the vision-language counterpart (dominant_color:
0.617 -> 0.90-0.95 over four seeds), the matrix's Qwen2.5-VL cells; video's is test_video_training.py.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from easyr1.data.config import DataConfig
from easyr1.data.synthetic import write_task
from easyr1.models.warmstart import warm_start
from tests.trainer_utils import read_metrics, run_train, tiny_config

# Held-out accuracy gain from step 0 to step 20 each algorithm must reach (the issue asks for 0.10
# for GRPO); measured on an idle 2-core machine: see each value's comment.
# Measured held-out accuracy at steps 0, 10, 20: dapo 0.48, 0.81, 0.95; grpo 0.48, 0.81, 0.88;
# ppo 0.48, 0.78, 0.85 (gspo 0.48, 0.81, 0.85; rloo 0.48, 0.80, 0.89 when they ran here).
MIN_ACCURACY_GAIN = {"grpo": 0.2, "ppo": 0.2}


@pytest.fixture(scope="module")
def warm_model(
    tiny_model: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("learning")
    write_task("compare", root / "data", n_train=2000, n_test=128, seed=0, difficulty=2)
    data = DataConfig(
        train_files=f"{root / 'data'}@train", prompt_key="problem", answer_key="guess", max_prompt_length=256
    )
    warm = warm_start(tiny_model("qwen2"), root / "warm", data, steps=1000, batch_size=32, lr=2e-3)
    return warm, root / "data"


# The algorithms CI checks for learning, as overrides of the GRPO run above (keys as in examples/).
ALGORITHMS = {
    "grpo": (),
    "ppo": (
        "algorithm.adv_estimator=gae",
        "algorithm.use_kl_loss=false",
        "algorithm.kl_penalty=kl",
        "algorithm.kl_coef=1.0e-3",
        "worker.critic.global_batch_size=16",
        "worker.critic.micro_batch_size_per_device_for_update=16",
        "worker.critic.micro_batch_size_per_device_for_experience=32",
        "worker.critic.optim.lr=1.0e-3",
        "worker.critic.model.enable_gradient_checkpointing=false",
        "worker.critic.fsdp.torch_dtype=fp32",
        "worker.critic.fsdp.mp_param_dtype=fp32",
    ),
}


# The RL run every learning test makes (here and in test_video_training.py): 20 steps,
# held-out validation at steps 0, 10 and 20.
RUN = (
    "data.rollout_batch_size=32",
    "data.max_response_length=24",
    "data.val_batch_size=-1",
    "worker.rollout.n=8",
    "worker.actor.micro_batch_size_per_device_for_update=16",
    "worker.actor.micro_batch_size_per_device_for_experience=32",
    "worker.actor.optim.lr=1.0e-3",
    "worker.actor.optim.lr_warmup_steps=3",
    "trainer.max_steps=20",
    "trainer.val_freq=10",
)


def assert_learns(
    model: Path, data: Path, tmp_path: Path, label: str, min_gain: float, *overrides: str
) -> None:
    """Train, then check held-out accuracy rose by ``min_gain`` and training accuracy rose too."""
    run_dir = tmp_path / "run"
    done = run_train(tiny_config(model, data, run_dir), tmp_path, *RUN, *overrides, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = read_metrics(run_dir)
    validations = [m for m in metrics if "val/accuracy_reward" in m]
    assert [v["step"] for v in validations] == [0, 10, 20]
    first, last = validations[0]["val/accuracy_reward"], validations[-1]["val/accuracy_reward"]
    print(f"{label}: held-out accuracy {[round(v['val/accuracy_reward'], 3) for v in validations]}")
    assert last - first >= min_gain, f"{label}: held-out accuracy {first:.3f} -> {last:.3f}"
    train = [m["reward/accuracy"] for m in metrics if "reward/accuracy" in m]
    assert sum(train[-5:]) > sum(train[:5]), f"training accuracy {train}"


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_rl_raises_held_out_accuracy(algorithm: str, warm_model: tuple[Path, Path], tmp_path: Path) -> None:
    model, data = warm_model
    assert_learns(
        model,
        data,
        tmp_path,
        algorithm,
        MIN_ACCURACY_GAIN[algorithm],
        "worker.actor.global_batch_size=16",
        *ALGORITHMS[algorithm],
    )
