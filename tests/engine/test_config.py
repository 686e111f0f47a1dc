"""Config: EasyR1's schema and defaults, file + dotted overrides, errors that name the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from easyr1.config import ConfigError, PPOConfig, from_yaml, load_config

# The shape of EasyR1's examples/config.yaml (keys and nesting as EasyR1 users write them).
EASYR1_STYLE = """
data:
  train_files: hiyouga/math12k@train
  val_files: hiyouga/math12k@test
  prompt_key: problem
  answer_key: answer
  image_key: images
  max_prompt_length: 2048
  max_response_length: 2048
  rollout_batch_size: 512
  mini_rollout_batch_size: null
  val_batch_size: 1024
  shuffle: true
  seed: 1
  min_pixels: 262144
  max_pixels: 4194304
  filter_overlong_prompts: true
algorithm:
  adv_estimator: grpo
  disable_kl: false
  use_kl_loss: true
  kl_penalty: low_var_kl
  kl_coef: 1.0e-2
  online_filtering: false
worker:
  actor:
    global_batch_size: 128
    micro_batch_size_per_device_for_update: 1
    micro_batch_size_per_device_for_experience: 2
    max_grad_norm: 1.0
    padding_free: true
    model:
      model_path: Qwen/Qwen2.5-7B-Instruct
      enable_gradient_checkpointing: true
      lora:
        rank: 0
        alpha: 64
        target_modules: all-linear
        exclude_modules: .*visual.*
    optim:
      lr: 1.0e-6
      weight_decay: 1.0e-2
      strategy: adamw
      lr_warmup_ratio: 0.0
    fsdp:
      enable_full_shard: true
      enable_cpu_offload: false
      enable_rank0_init: true
    offload:
      offload_params: true
      offload_optimizer: true
  rollout:
    n: 5
    temperature: 1.0
    top_p: 1.0
    gpu_memory_utilization: 0.6
    tensor_parallel_size: 2
    val_override_config:
      temperature: 0.6
      top_p: 0.95
      n: 1
  ref:
    fsdp:
      enable_cpu_offload: true
    offload:
      offload_params: false
trainer:
  total_epochs: 15
  max_steps: null
  project_name: easy_r1
  experiment_name: qwen2_5_7b_math_grpo
  logger: ["file", "wandb"]
  nnodes: 1
  n_gpus_per_node: 8
  val_freq: 5
  save_freq: 5
  save_limit: 3
  find_last_checkpoint: true
"""


@pytest.fixture()
def easyr1_yaml(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(EASYR1_STYLE)
    return path


def test_defaults_follow_easyr1() -> None:
    config = load_config([])
    assert config.data.max_prompt_length == 512
    assert config.algorithm.adv_estimator == "grpo"
    assert config.algorithm.kl_penalty == "kl"
    assert config.worker.actor.global_batch_size == 256
    assert config.worker.actor.clip_ratio_high == 0.3
    assert config.worker.actor.optim.betas == (0.9, 0.999)
    assert config.worker.actor.fsdp.torch_dtype is None  # AMP: fp32 master weights
    assert config.worker.actor.fsdp.mp_param_dtype == "bf16"  # ... bf16 compute
    assert config.trainer.logger == ["console", "wandb"]


def test_easyr1_file_then_overrides(easyr1_yaml: Path) -> None:
    config = load_config(
        [
            f"config={easyr1_yaml}",
            "worker.actor.optim.lr=3.0e-7",
            "worker.actor.fsdp.torch_dtype=bf16",
            "worker.actor.optim.strategy=adamw_bf16",
            "worker.actor.model.lora.rank=8",
            "trainer.logger=[console,file]",
            "trainer.max_steps=10",
            "data.max_pixels=null",
            "algorithm.kl_coef=1e-3",
            "worker.rollout.val_override_config.temperature=0",
        ]
    )
    assert config.data.prompt_key == "problem"  # from the file
    assert config.worker.rollout.n == 5
    assert config.worker.actor.optim.lr == pytest.approx(3e-7)  # override wins
    assert config.worker.actor.fsdp.torch_dtype == "bf16"
    assert config.worker.actor.optim.strategy == "adamw_bf16"
    assert config.worker.actor.model.lora.rank == 8
    assert config.worker.actor.model.lora.exclude_modules == ".*visual.*"
    assert config.trainer.logger == ["console", "file"]
    assert config.trainer.max_steps == 10
    assert config.data.max_pixels is None
    assert config.algorithm.kl_coef == pytest.approx(1e-3)  # "1e-3" is a string to YAML 1.1
    assert config.worker.rollout.val_override_config == {"temperature": 0, "top_p": 0.95, "n": 1}
    assert config.worker.ref.fsdp.enable_cpu_offload is True
    assert config.worker.ref.fsdp.enable_full_shard is True  # default kept under a partial section


def test_type_conversion(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the reward file is imported during validation, from the working directory
    (tmp_path / "reward.py").write_text(
        "def compute(inputs):\n    return [{'overall': 0.0} for _ in inputs]\n"
    )
    config = load_config(
        [
            "data.rollout_batch_size=64",
            "worker.rollout.temperature=1",
            "data.shuffle=False",
            "trainer.experiment_name=0042",
            "worker.reward.reward_function=./reward.py:compute",
            "worker.actor.optim.betas=[0.9,0.95]",
            "trainer.logger=console,file",
        ]
    )
    assert config.data.rollout_batch_size == 64
    assert config.worker.rollout.temperature == 1.0 and isinstance(config.worker.rollout.temperature, float)
    assert config.data.shuffle is False
    assert config.trainer.experiment_name == "0042"  # strings stay verbatim
    assert config.worker.reward.reward_function == "./reward.py:compute"
    assert config.worker.actor.optim.betas == (0.9, 0.95)
    assert config.trainer.logger == ["console", "file"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["worker.actor.optim.lrr=1e-6"], "did you mean worker.actor.optim.lr?"),
        (["worker.actr.global_batch_size=1"], "did you mean worker.actor?"),
        (["trainer.total_epoch=3"], "did you mean trainer.total_epochs?"),
        # Keys EasyR1 itself dropped, from configs written for its older releases: where they went.
        (
            ["worker.reward.reward_type=sequential"],
            'the reward file says its type, with REWARD_TYPE = "batch"',
        ),
        (["worker.reward.score_function=math"], "EasyR1 renamed it worker.reward.reward_function"),
        (["worker.rollout.val_override_config.temprature=0.5"], "val_override_config.temperature?"),
        (["algorithm.adv_estimator=ppo"], "'grpo', 'gae', 'reinforce_plus_plus'"),
        (["worker.actor.optim.strategy=sgd"], "choose one of 'adamw', 'adamw_bf16'"),
        (["trainer.logger=[console,tensorbord]"], "trainer.logger[1]: 'tensorbord' is not allowed"),
        (["worker.rollout.n=five"], "worker.rollout.n: expected an integer"),
        (["data.shuffle=yes please"], "data.shuffle: expected true or false"),
        (["worker.actor.optim.lr=fast"], "worker.actor.optim.lr: expected a number"),
        (["worker.actor.optim.betas=[0.9]"], "expected 2 values"),
        (["worker.rollout.n=0"], "worker.rollout.n: must be positive"),
        (["worker.rollout.max_num_seqs=0"], "worker.rollout.max_num_seqs: must be positive"),
        (["data.min_pixels=100", "data.max_pixels=10"], "exceeds data.max_pixels"),
        (["data.format_prompt=/nonexistent/format.jinja"], "data.format_prompt: file not found"),
        (["data.image_dir=/nonexistent/images"], "data.image_dir: folder not found"),
        (["worker.rollout.top_p=1.5"], "worker.rollout.top_p"),
        (["no_equals_sign"], "expected key=value"),
        (["config=/nonexistent.yaml"], "config file not found: /nonexistent.yaml"),
    ],
)
def test_errors_name_the_key(args: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=None) as info:
        load_config(args)
    assert message in str(info.value)


def test_bad_yaml_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("data: [unclosed\n")
    with pytest.raises(ConfigError, match="broken.yaml: invalid YAML"):
        load_config([f"config={path}"])
    path.write_text("data:\n  max_prompt_lenght: 3\n")
    with pytest.raises(ConfigError, match="data.max_prompt_lenght'; did you mean data.max_prompt_length"):
        load_config([f"config={path}"])


def test_yaml_round_trip(easyr1_yaml: Path) -> None:
    config = load_config(
        [f"config={easyr1_yaml}", "worker.actor.optim.betas=[0.8,0.9]", "trainer.max_steps=3"]
    )
    text = config.to_yaml()
    again = from_yaml(text)
    assert again == config
    assert again.to_yaml() == text
    assert isinstance(again, PPOConfig)


def test_example_config_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    """examples/config.yaml is written as EasyR1 users write theirs; its relative paths resolve from the repo."""
    root = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(root)
    config = load_config(["config=examples/config.yaml"])
    assert config.worker.actor.model.model_path == "Qwen/Qwen2.5-7B-Instruct"
    assert config.worker.rollout.val_override_config["n"] == 1
