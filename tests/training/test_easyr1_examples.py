"""EasyR1's example launch scripts, as an EasyR1 user brings them.

``SCRIPTS`` writes down the arguments each of EasyR1's 20 example scripts (hiyouga/EasyR1 at
b44b311: ``examples/*.sh``, ``examples/baselines/*.sh``) passes after
``config=examples/config.yaml``, as the shell hands them over (quotes removed; ``${MODEL_PATH}``
and ``${EXPERIMENT_NAME}`` are the scripts' own variables). They are facts about EasyR1's examples.

Every script resolves through ``easyr1 config`` from a folder laid out as EasyR1's checkout:
``examples/config.yaml`` (this repository's, EasyR1's values), ``examples/format_prompt/`` and
``examples/reward_function/{math,r1v,dapo}.py``. The reward files are stand-ins that call the
built-ins, which give EasyR1's files' scores (tests/engine/test_rewards.py); EasyR1's own files import
here too (``mathruler``, ``pylatexenc`` are installed). Some scripts (``TRAINED``) then train one
step on 2 CPU ranks with their family's tiny twin, shrunk to tiny batches and lengths; those that
``examples/*.yaml`` reproduce train as those files (tests/training/test_example_configs.py).
"""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.trainer_utils import read_metrics

REPO = Path(__file__).resolve().parents[2]
GEO = ["data.train_files=hiyouga/geometry3k@train", "data.val_files=hiyouga/geometry3k@test"]
MODEL = "worker.actor.model.model_path=${MODEL_PATH}"

SCRIPTS: dict[str, list[str]] = {
    "baselines/qwen2_5_vl_3b_clevr": [
        "data.train_files=BUAADreamer/clevr_count_70k@train",
        "data.val_files=BUAADreamer/clevr_count_70k@test",
        "data.format_prompt=./examples/format_prompt/r1v.jinja",
        MODEL,
        "worker.rollout.tensor_parallel_size=1",
        "worker.reward.reward_function=./examples/reward_function/r1v.py:compute_score",
        "trainer.experiment_name=qwen2_5_vl_3b_clevr",
        "trainer.n_gpus_per_node=2",
    ],
    "baselines/qwen2_5_vl_3b_geoqa8k": [
        "data.train_files=leonardPKU/GEOQA_8K_R1V@train",
        "data.val_files=leonardPKU/GEOQA_8K_R1V@test",
        "data.format_prompt=./examples/format_prompt/r1v.jinja",
        MODEL,
        "worker.rollout.tensor_parallel_size=1",
        "worker.reward.reward_function=./examples/reward_function/r1v.py:compute_score",
        "trainer.experiment_name=qwen2_5_vl_3b_geoqa8k",
        "trainer.n_gpus_per_node=8",
    ],
    "qwen2_5_7b_math_grpo": [MODEL],
    "qwen2_5_vl_32b_geo3k_grpo": [
        *GEO,
        MODEL,
        "worker.actor.fsdp.torch_dtype=bf16",
        "worker.actor.optim.strategy=adamw_bf16",
        "worker.rollout.tensor_parallel_size=8",
        "trainer.experiment_name=qwen2_5_vl_32b_geo_grpo",
        "trainer.n_gpus_per_node=8",
    ],
    "qwen2_5_vl_3b_android_gui_grpo": [
        "data.train_files=yuehua-s/numbergame@train",
        "data.val_files=yuehua-s/numbergame@test",
        "data.max_prompt_length=3072",
        "data.max_response_length=64",
        "data.rollout_batch_size=32",
        "data.val_batch_size=60",
        "data.format_prompt=examples/format_prompt/android_gui.jinja",
        "data.seed=42",
        "data.filter_overlong_prompts=false",
        "algorithm.kl_coef=4.0e-2",
        "worker.actor.global_batch_size=32",
        "worker.actor.max_grad_norm=0.1",
        "worker.actor.model.model_path=Qwen/Qwen2.5-VL-3B-Instruct",
        "worker.actor.model.trust_remote_code=true",
        "worker.actor.optim.lr=1.0e-5",
        "worker.actor.optim.weight_decay=1.0e-1",
        "worker.actor.optim.lr_warmup_ratio=0.05",
        "worker.actor.optim.lr_scheduler_type=constant",
        "worker.rollout.n=8",
        "worker.rollout.temperature=0.9",
        "worker.rollout.top_p=0.95",
        "worker.rollout.limit_images=1",
        "worker.rollout.gpu_memory_utilization=0.75",
        "worker.rollout.tensor_parallel_size=1",
        "worker.reward.reward_function=examples/reward_function/android_gui.py:compute_score",
        "trainer.total_epochs=3",
        "trainer.project_name=easy_r1",
        "trainer.experiment_name=${EXPERIMENT_NAME}",
        'trainer.logger=["console","wandb"]',
        "trainer.n_gpus_per_node=2",
        "trainer.nnodes=1",
        "trainer.val_freq=2",
        "trainer.val_generations_to_log=10",
        "trainer.save_freq=10",
    ],
    "qwen2_5_vl_3b_geo3k_grpo": [
        *GEO,
        MODEL,
        "trainer.experiment_name=qwen2_5_vl_3b_geo_grpo",
        "trainer.n_gpus_per_node=2",
    ],
    "qwen2_5_vl_7b_geo3k_cispo": [
        *GEO,
        MODEL,
        "worker.actor.loss_type=cispo",
        "worker.actor.clip_ratio_low=0",
        "worker.actor.clip_ratio_high=4",
        "trainer.experiment_name=qwen2_5_vl_7b_geo_cispo",
        "trainer.n_gpus_per_node=8",
    ],
    "qwen2_5_vl_7b_geo3k_dapo": [
        *GEO,
        "data.mini_rollout_batch_size=128",
        MODEL,
        "worker.actor.clip_ratio_low=0.2",
        "worker.actor.clip_ratio_high=0.28",
        "algorithm.disable_kl=True",
        "algorithm.online_filtering=True",
        "trainer.experiment_name=qwen2_5_vl_7b_geo_dapo",
        "trainer.n_gpus_per_node=8",
    ],
    "qwen2_5_vl_7b_geo3k_grpo": [
        *GEO,
        MODEL,
        "trainer.experiment_name=qwen2_5_vl_7b_geo_grpo",
        "trainer.n_gpus_per_node=8",
    ],
    "qwen2_5_vl_7b_geo3k_gspo": [
        *GEO,
        MODEL,
        "worker.actor.loss_type=gspo_token",
        "worker.actor.loss_avg_mode=seq",
        "worker.actor.clip_ratio_low=3e-4",
        "worker.actor.clip_ratio_high=4e-4",
        "algorithm.disable_kl=True",
        "trainer.experiment_name=qwen2_5_vl_7b_geo_gspo",
        "trainer.n_gpus_per_node=8",
    ],
    "qwen2_5_vl_7b_geo3k_reinforce": [
        *GEO,
        MODEL,
        "algorithm.adv_estimator=reinforce_plus_plus",
        "algorithm.use_kl_loss=false",
        "algorithm.kl_penalty=kl",
        "algorithm.kl_coef=1.0e-3",
        "trainer.experiment_name=qwen2_5_vl_7b_geo_reinforce_pp",
        "trainer.n_gpus_per_node=8",
    ],
    "qwen2_5_vl_7b_geo3k_sapo": [
        *GEO,
        MODEL,
        "worker.actor.loss_type=sapo",
        "algorithm.disable_kl=True",
        "trainer.experiment_name=qwen2_5_vl_7b_geo_sapo",
        "trainer.n_gpus_per_node=8",
    ],
    "qwen2_5_vl_7b_geo3k_swanlab": [
        *GEO,
        MODEL,
        "trainer.experiment_name=qwen2_5_vl_7b_geo_grpo",
        "trainer.logger=[console,swanlab]",
        "trainer.n_gpus_per_node=8",
    ],
    "qwen2_5_vl_7b_multi_image": [
        "data.train_files=hiyouga/journeybench-multi-image-vqa@train",
        "data.val_files=hiyouga/journeybench-multi-image-vqa@test",
        "data.rollout_batch_size=256",
        MODEL,
        "worker.rollout.limit_images=2",
        "trainer.experiment_name=qwen2_5_vl_7b_multi_image",
        "trainer.n_gpus_per_node=8",
    ],
    "qwen3_14b_dapo17k_dapo": [
        "data.train_files=Saigyouji-Yuyuko1000/dapo17k@train",
        "data.val_files=Saigyouji-Yuyuko1000/dapo17k@test",
        "data.format_prompt=./examples/format_prompt/dapo.jinja",
        "data.max_prompt_length=2048",
        "data.max_response_length=20480",
        "data.rollout_batch_size=512",
        "data.mini_rollout_batch_size=256",
        "worker.actor.ulysses_size=8",
        MODEL,
        "worker.actor.fsdp.torch_dtype=bf16",
        "worker.actor.optim.strategy=adamw_bf16",
        "worker.actor.optim.weight_decay=0.1",
        "worker.actor.optim.lr_warmup_steps=10",
        "worker.actor.global_batch_size=32",
        "worker.actor.clip_ratio_low=0.2",
        "worker.actor.clip_ratio_high=0.28",
        "worker.actor.clip_ratio_dual=10.0",
        "worker.rollout.n=16",
        "worker.rollout.max_num_batched_tokens=22528",
        'worker.rollout.val_override_config={"n":16,"temperature":1.0,"top_p":0.7}',
        "worker.rollout.gpu_memory_utilization=0.8",
        "worker.rollout.tensor_parallel_size=4",
        "worker.reward.reward_function=./examples/reward_function/dapo.py:compute_score",
        'worker.reward.reward_function_kwargs={"max_response_length":20480,"overlong_buffer_length":4096,"overlong_penalty_factor":1.0}',
        "algorithm.disable_kl=True",
        "algorithm.online_filtering=True",
        "algorithm.filter_key=accuracy_normalized",
        "algorithm.filter_low=0.01",
        "algorithm.filter_high=0.99",
        "trainer.total_epochs=10",
        "trainer.max_try_make_batch=10",
        "trainer.experiment_name=qwen3_14b_dapo17k_dapo",
        "trainer.n_gpus_per_node=8",
    ],
    "qwen3_4b_math_grpo": [
        "data.max_response_length=4096",
        MODEL,
        "trainer.experiment_name=qwen3_4b_math_grpo",
    ],
    "qwen3_4b_math_grpo_lora": [
        "data.max_response_length=2048",
        MODEL,
        "worker.actor.model.lora.rank=64",
        "worker.actor.model.lora.alpha=64",
        "worker.actor.optim.lr=1e-5",
        "worker.rollout.tensor_parallel_size=1",
        "trainer.experiment_name=qwen3_4b_math_grpo_lora",
        "trainer.n_gpus_per_node=1",
    ],
    "qwen3_vl_30b_geo3k_grpo": [
        *GEO,
        MODEL,
        "worker.actor.fsdp.torch_dtype=bf16",
        "worker.actor.optim.strategy=adamw_bf16",
        "worker.rollout.tensor_parallel_size=8",
        "trainer.experiment_name=qwen3_vl_30b_geo_grpo",
        "trainer.n_gpus_per_node=8",
    ],
    "qwen3_vl_4b_geo3k_grpo": [
        *GEO,
        MODEL,
        "trainer.experiment_name=qwen3_vl_4b_geo_grpo",
        "trainer.n_gpus_per_node=2",
    ],
    "qwen3_vl_4b_geo3k_grpo_lora": [
        *GEO,
        MODEL,
        "worker.actor.model.lora.rank=64",
        "worker.actor.optim.lr=1e-5",
        "trainer.experiment_name=qwen3_vl_4b_geo_grpo_lora",
        "trainer.n_gpus_per_node=2",
    ],
}

# Scripts that train a step with the tiny twin of their model family (text, Qwen2.5-VL with online
# filtering, DAPO with Ulysses and its reward file). The scripts that examples/*.yaml reproduce
# (Qwen3 and Qwen3-VL, full and LoRA, among them) train as those files in tests/training/test_example_configs.py.
TRAINED = {
    "qwen2_5_7b_math_grpo": "qwen2",
    "qwen2_5_vl_7b_geo3k_dapo": "qwen2_5_vl",
    "qwen3_14b_dapo17k_dapo": "qwen3",
}


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder laid out as EasyR1's checkout, for the scripts' relative paths."""
    root = tmp_path_factory.mktemp("easyr1_checkout")
    shutil.copytree(REPO / "examples" / "format_prompt", root / "examples" / "format_prompt")
    shutil.copy(REPO / "examples" / "config.yaml", root / "examples" / "config.yaml")
    (root / "examples" / "format_prompt" / "android_gui.jinja").write_text("{{ content | trim }}")
    rewards = root / "examples" / "reward_function"
    rewards.mkdir()
    for name, builtin in (("math", "math"), ("r1v", "r1v"), ("dapo", "dapo"), ("android_gui", "r1v")):
        kind = importlib.import_module(f"easyr1.rewards.{builtin}").REWARD_TYPE
        (rewards / f"{name}.py").write_text(
            f"from easyr1.rewards import {builtin} as builtin\n\nREWARD_TYPE = {kind!r}\n\n\n"
            "def compute_score(*args, **kwargs):\n    return builtin.compute_score(*args, **kwargs)\n"
        )
    return root


def _easyr1(cwd: Path, command: str, args: list[str], timeout: int = 600) -> subprocess.CompletedProcess:
    env = dict(
        os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", MODEL_PATH="", EXPERIMENT_NAME=""
    )
    return subprocess.run(
        [sys.executable, "-m", "easyr1.cli", command, "config=examples/config.yaml", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _with(args: list[str], model: str) -> list[str]:
    return [a.replace("${MODEL_PATH}", model).replace("${EXPERIMENT_NAME}", "run") for a in args]


@pytest.mark.parametrize("script", SCRIPTS)
def test_script_resolves(checkout: Path, script: str) -> None:
    done = _easyr1(checkout, "config", _with(SCRIPTS[script], "Qwen/Qwen2.5-7B-Instruct"), timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "worker:" in done.stdout


# Shrinks a script's run to one step of a tiny model on 2 CPU ranks: batches, lengths, GPUs,
# loggers, validation, the Ulysses group (8 ranks there).
SMALL = [
    "data.max_prompt_length=512",
    "data.max_response_length=8",
    "data.rollout_batch_size=4",
    "data.val_batch_size=4",
    "worker.actor.global_batch_size=2",
    "worker.actor.micro_batch_size_per_device_for_update=4",
    "worker.actor.micro_batch_size_per_device_for_experience=8",
    "worker.rollout.n=2",
    "trainer.n_gpus_per_node=2",
    "trainer.nnodes=1",
    "trainer.max_steps=1",
    "trainer.val_before_train=false",
    "trainer.val_freq=-1",
    "trainer.logger=[file]",
    "trainer.save_freq=-1",
    "worker.actor.fsdp.torch_dtype=null",
    "worker.actor.optim.strategy=adamw",
]


@pytest.mark.parametrize("script", TRAINED)
def test_script_trains_with_its_tiny_twin(
    checkout: Path, tiny_model: Callable[[str], Path], arithmetic: Path, tmp_path: Path, script: str
) -> None:
    from easyr1.data.synthetic import write_task

    arch = TRAINED[script]
    args = _with(SCRIPTS[script], str(tiny_model(arch)))
    if arch.endswith("_vl"):
        data = tmp_path / "shapes"
        write_task("count_shapes", data, n_train=16, n_test=4, seed=0, image_size=56)
    else:
        data = arithmetic
    args += [f"data.train_files={data}@train", f"data.val_files={data}@test", *SMALL]
    args += [f"trainer.save_checkpoint_path={tmp_path / 'run'}", "data.mini_rollout_batch_size=4"]
    if any(a.startswith("worker.actor.ulysses_size=") for a in args):
        args.append("worker.actor.ulysses_size=2")
    if any(a.startswith("worker.reward.reward_function_kwargs=") for a in args):
        args.append(
            'worker.reward.reward_function_kwargs={"max_response_length":8,"overlong_buffer_length":4,"overlong_penalty_factor":1.0}'
        )
    if "algorithm.online_filtering=True" in args:  # a random model's groups are all wrong: keep them all
        args += ["algorithm.filter_low=-1.0", "algorithm.filter_high=2.0"]
    done = _easyr1(checkout, "train", args)
    assert done.returncode == 0, done.stderr[-3000:]
    [record] = read_metrics(tmp_path / "run")
    assert record["step"] == 1 and "actor/pg_loss" in record
