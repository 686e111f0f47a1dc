"""Checks of a config against the run it makes: batch sizes that must split evenly over the ranks,
the EasyR1 keys this engine refuses, warns about (they cannot act here) or accepts as unable to
change results, and where the ranks come from (``planned_world``, ``ray_starts_ranks``).

``easyr1 config``, the launcher and every rank run ``check_config``; the harness runs it on every
cell of a matrix before any job starts. Field-level checks (types, ranges, files) run as the config
is built (``easyr1.config.validate``).
"""

from __future__ import annotations

import json
import os
from typing import Any

from easyr1.config import ConfigError, PPOConfig, to_plain

# EasyR1 keys this engine refuses at any value but the default: the key -> why, and what to use instead.
REFUSED: dict[str, str] = {
    "worker.hybrid_engine": (
        "training and generation always share the GPUs here (the hybrid engine, the only mode EasyR1 "
        "implements too); remove the key or set it to true"
    ),
}

# EasyR1 keys that cannot act in this engine, and so cannot change its results: set to a value other
# than the default, each draws one warning that says why (config_warnings).
WARNED: dict[str, str] = {
    "worker.critic.model.tokenizer_path": (
        "the critic scores the actor's tokens, so the actor's tokenizer (worker.actor.model.tokenizer_path) is used"
    ),
    "worker.critic.model.lora.rank": "LoRA applies to the actor only, as in EasyR1; the critic trains all its weights",
    "worker.ref.offload.offload_optimizer": "the reference has no optimizer to offload (as in EasyR1)",
}

# EasyR1 keys whose every value gives this engine's one behaviour, with the reason that cannot change
# results; accepted without a warning.
EQUIVALENT: dict[str, str] = {
    f"worker.{worker}.fsdp.use_orig_params": (
        "FSDP2 always shards the original parameters, which is what true asks for; false (FSDP1's flat "
        "parameters) lays out the same numbers differently, and AdamW and gradient clipping are the same "
        "on either"
    )
    for worker in ("actor", "critic", "ref")
}


def _key_value(config: PPOConfig, dotted: str) -> Any:
    """The value of ``a.b.c`` in ``config``."""
    value: Any = config
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def _changed(config: PPOConfig, dotted: str) -> bool:
    return _key_value(config, dotted) != _key_value(PPOConfig(), dotted)


def _shown(config: PPOConfig, dotted: str) -> str:
    """``key=value`` as a user writes it on the command line (``false``, not ``False``)."""
    value = _key_value(config, dotted)
    return f"{dotted}={value if isinstance(value, str) else json.dumps(to_plain(value))}"


def planned_world(config: PPOConfig) -> int:
    """The ranks a run of ``config`` has: ``WORLD_SIZE`` where a launcher (torchrun, srun, Ray, the
    local launcher) has set it, else what ``easyr1 train`` starts, trainer.nnodes x trainer.n_gpus_per_node."""
    if "WORLD_SIZE" in os.environ:
        return int(os.environ["WORLD_SIZE"])
    return config.trainer.nnodes * config.trainer.n_gpus_per_node


RAY_RANK = "EASYR1_RAY_RANK"  # set to 1 in the ranks the Ray launcher (launch/ray.py) starts


def ray_starts_ranks(config: PPOConfig) -> bool:
    """Whether Ray starts the ranks of this run: ``easyr1 train`` hands ``trainer.nnodes > 1`` to
    Ray, unless a launcher (torchrun, srun) has made this process a rank already."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return os.environ.get(RAY_RANK) == "1"
    return config.trainer.nnodes > 1


def check_runnable(config: PPOConfig) -> None:
    """What a training run needs that a config need not have (``easyr1 config`` prints the defaults,
    which name none): a model, a reward function and training data. The launcher checks it before
    any rank starts, and each rank again (torchrun and srun start ranks without the launcher)."""
    if config.worker.actor.model.model_path is None:
        raise ConfigError("worker.actor.model.model_path is required")
    if config.worker.reward.reward_function is None:
        raise ConfigError(
            "worker.reward.reward_function is required (a built-in name or path/file.py:function)"
        )
    if not config.data.train_files:  # "" would be the working directory, scanned for any data file
        raise ConfigError("data.train_files is required (data files, a folder or a hub name, with @split)")


def check_config(config: PPOConfig, world: int) -> None:
    """Errors a run would otherwise hit late, or never notice: the refused EasyR1 keys, and batch sizes
    that must split evenly over the ``world`` ranks, or groups and mini-batches would straddle them.
    Every rank runs it for the ranks it has, and ``easyr1 config`` for the ranks the run will have
    (``planned_world``), so a config that passes one passes the other."""
    for key, why in REFUSED.items():
        if _changed(config, key):
            raise ConfigError(f"{_shown(config, key)}: {why}")
    for worker in ("actor", "critic", "ref"):
        size = getattr(config.worker, worker).fsdp.fsdp_size  # -1: shard over every rank
        if size != -1 and not (size >= 1 and world % size == 0):
            raise ConfigError(
                f"worker.{worker}.fsdp.fsdp_size={size} must be -1 (shard over all ranks) or divide the {world} ranks"
            )
    data, actor, n = config.data, config.worker.actor, config.worker.rollout.n
    if config.trainer.val_only and not data.val_files:
        raise ConfigError("trainer.val_only=true validates on data.val_files, which is empty")
    if data.rollout_batch_size % world:
        raise ConfigError(
            f"data.rollout_batch_size={data.rollout_batch_size} must be divisible by the {world} ranks"
        )

    def check_mini_batch(worker: str, global_batch_size: int) -> None:
        if global_batch_size > data.rollout_batch_size or data.rollout_batch_size % global_batch_size:
            raise ConfigError(
                f"{worker}.global_batch_size={global_batch_size} must divide data.rollout_batch_size={data.rollout_batch_size}"
            )
        if (global_batch_size * n) % world:
            raise ConfigError(
                f"{worker}.global_batch_size * worker.rollout.n must be divisible by the {world} ranks"
            )

    check_mini_batch("worker.actor", actor.global_batch_size)
    mini = data.mini_rollout_batch_size or data.rollout_batch_size
    if mini % world:
        raise ConfigError(f"data.mini_rollout_batch_size={mini} must be divisible by the {world} ranks")
    algo = config.algorithm
    for name in ("actor", "critic") if algo.adv_estimator == "gae" else ("actor",):
        worker = getattr(config.worker, name)
        if worker.ulysses_size < 1 or world % worker.ulysses_size:
            raise ConfigError(
                f"worker.{name}.ulysses_size={worker.ulysses_size} must divide the {world} ranks"
            )
        if worker.ulysses_size > 1 and not worker.padding_free:
            raise ConfigError(
                f"worker.{name}.ulysses_size={worker.ulysses_size} splits packed rows: set worker.{name}.padding_free=true"
            )
    if algo.online_filtering and not algo.filter_low < algo.filter_high:
        raise ConfigError(
            f"algorithm.filter_low={algo.filter_low} must be below algorithm.filter_high={algo.filter_high}"
        )
    if algo.adv_estimator == "gae":
        check_mini_batch("worker.critic", config.worker.critic.global_batch_size)


def config_warnings(config: PPOConfig) -> list[str]:
    """One message per EasyR1 key that is set but cannot act in this run; the caller shows each once
    (``easyr1 config`` on stderr, the trainer on rank 0)."""
    messages = [f"{_shown(config, key)}: {why}" for key, why in WARNED.items() if _changed(config, key)]
    if config.trainer.ray_timeline is not None:
        if not ray_starts_ranks(config):
            messages.append(
                f"{_shown(config, 'trainer.ray_timeline')}: Ray writes a timeline only of runs whose "
                "ranks it starts (easyr1 train with trainer.nnodes > 1, not under torchrun or srun); "
                "none is written for this one"
            )
    return messages
