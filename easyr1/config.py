"""The whole run configuration, with EasyR1's schema and defaults, and the one way to load it.

``PPOConfig`` composes each component's config, kept beside the component (``data/config.py``,
``algorithms/config.py``, ``workers/config.py``, ``rollout/config.py``, ``rewards/config.py``), with
the trainer's; every field carries a one-line doc string (``config_docs``, ``easyr1 config --explain``).
A run is configured as ``config=FILE.yaml a.b.c=value ...``: the defaults, then the file,
then the dotted overrides. Every value is converted to the type its field declares, ``Literal``
fields name their allowed values, and an unknown key is an error that names the closest valid
key, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from easyr1 import yaml_io
from easyr1.algorithms.config import AlgorithmConfig
from easyr1.data.config import DataConfig
from easyr1.rewards.config import RewardConfig
from easyr1.rollout.config import RolloutConfig
from easyr1.workers.config import ActorConfig, CriticConfig, OptimConfig, RefConfig


class ConfigError(ValueError):
    """A configuration problem; the message names the offending key."""


# --------------------------------------------------------------------------------------- schema


@dataclass
class WorkerConfig:
    hybrid_engine: bool = True
    """Training and generation share the GPUs (the only mode, here as in EasyR1)."""
    actor: ActorConfig = field(default_factory=ActorConfig)
    """The policy being trained."""
    critic: CriticConfig = field(default_factory=CriticConfig)
    """The value model (``algorithm.adv_estimator=gae`` only)."""
    ref: RefConfig = field(default_factory=RefConfig)
    """The frozen reference policy the KL term compares with (the actor's starting weights)."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """The reward function."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Generation: the backend and its sampling."""


LoggerName = Literal["console", "file", "tensorboard", "wandb", "swanlab", "mlflow"]


@dataclass
class TrainerConfig:
    total_epochs: int = 15
    """Passes over the training prompts (``max_steps`` stops sooner)."""
    max_steps: int | None = None
    """Training steps to run; null: ``total_epochs`` epochs."""
    project_name: str = "easy_r1"
    """The project: the loggers' project, and a folder of the checkpoint path."""
    experiment_name: str = "demo"
    """The run's name: the loggers' run, and a folder of the checkpoint path."""
    logger: list[LoggerName] = field(default_factory=lambda: ["console", "wandb"])
    """Where metrics go: any of console, file (metrics.jsonl), tensorboard, wandb, swanlab, mlflow."""
    nnodes: int = 1
    """Machines the run spans (``easyr1 train`` with more than one starts its ranks with Ray)."""
    n_gpus_per_node: int = 8
    """Ranks per machine: GPUs, or CPU processes where there are none."""
    max_try_make_batch: int = 20
    """Online filtering: rounds of generation a step may draw before it stops with an error; 0 or less: no limit."""
    critic_warmup: int = 0
    """Steps at the start that train only the critic."""
    val_freq: int = -1
    """Validate every this many steps and after the last; -1: never during training."""
    val_before_train: bool = True
    """Validate once before the first step."""
    val_only: bool = False
    """Validate and stop, without training."""
    val_generations_to_log: int = 0
    """Validation samples (prompt, response, score) the loggers get each time."""
    save_freq: int = -1
    """Save a checkpoint every this many steps and after the last; -1: never."""
    save_limit: int = -1
    """Checkpoints kept, the oldest removed first; -1: all."""
    save_model_only: bool = False
    """Checkpoints hold the model only, without the optimizer and scheduler (they cannot resume a run exactly)."""
    save_checkpoint_path: str | None = None
    """The run folder (checkpoints, metrics, reports); null: ``checkpoints/{project_name}/{experiment_name}``."""
    load_checkpoint_path: str | None = None
    """A checkpoint (``global_step_N``) to resume from; null: the latest in the run's folder (``find_last_checkpoint``)."""
    ray_timeline: str | None = None
    """A file for Ray's timeline of the run (runs whose ranks Ray starts)."""
    find_last_checkpoint: bool = True
    """Resume from the run folder's latest checkpoint where there is one."""
    # The fingerprint a checkpoint records of the training data (trainer_state.json) is compared on resume.
    allow_changed_data: bool = False
    """Resume although the training data changed in place since the checkpoint; refused otherwise (our key)."""
    # Each rank writes profile/step{N}-rank{R}.json in the run folder (easyr1/profiling.py: each
    # phase's time and its costliest ops).
    profile_steps: list[int] = field(default_factory=list)
    """Steps to run under torch.profiler (our key)."""
    # Each rank writes profile/step{N}-rank{R}-host.json (easyr1/profiling.py: per phase, where the
    # host's time goes).
    host_profile_steps: list[int] = field(default_factory=list)
    """Steps whose Python time is sampled instead, the profiler off (our key)."""
    # Progress: setup, each step with its validation and checkpoint, shutdown. Each rank writes every
    # Python thread's stack to stderr, and again each further period while it lasts (easyr1/stalls.py);
    # the run goes on.
    stall_report_s: float = 1800.0
    """Seconds without progress after which each rank prints its threads' stacks; 0: off (our key)."""


@dataclass
class PPOConfig:
    data: DataConfig = field(default_factory=DataConfig)
    """The prompts: files, columns, lengths, batch sizes."""
    worker: WorkerConfig = field(default_factory=WorkerConfig)
    """The models and what runs them: actor, critic, reference, rollout, reward."""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """The RL algorithm: advantages, KL, online filtering."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """The run: steps, validation, checkpoints, loggers, ranks."""

    def to_dict(self) -> dict[str, Any]:
        return to_plain(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)


# ------------------------------------------------------------------------------ building


def to_plain(obj: Any) -> Any:
    """Dataclasses -> dicts, tuples -> lists: the form YAML writes and reads back unchanged."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_plain(v) for k, v in obj.items()}
    return obj


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _describe(tp: Any) -> str:
    """A declared type as an error message names it."""
    if typing.get_origin(tp) is Literal:
        return ", ".join(repr(a) for a in typing.get_args(tp))
    return {bool: "true, false", int: "an integer", float: "a number", str: "a string"}.get(
        tp, getattr(tp, "__name__", str(tp))
    )


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Convert a YAML or command-line value to the declared type of ``key``."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None or (isinstance(value, str) and value.lower() in ("null", "none", "~")):
            if type(None) in args:
                return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            return _coerce(value, inner[0], key)
        for option in inner:  # the first type the value converts to
            try:
                return _coerce(value, option, key)
            except ConfigError:
                pass
        raise ConfigError(f"{key}: {value!r} is not allowed; expected {' or '.join(map(_describe, inner))}")
    if origin is Literal:
        if value not in args:
            allowed = ", ".join(repr(a) for a in args)
            raise ConfigError(f"{key}: {value!r} is not allowed; choose one of {allowed}")
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, bool):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        try:
            return int(str(value))
        except ValueError:
            raise ConfigError(f"{key}: expected an integer, got {value!r}") from None
    if tp is float:
        if isinstance(value, bool):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{key}: expected a number, got {value!r}") from None
    if tp is str:
        if isinstance(value, (dict, list)) or value is None:
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return str(value)
    if origin in (list, tuple):
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(value) != len(args):
                raise ConfigError(f"{key}: expected {len(args)} values, got {value!r}")
            return tuple(
                _coerce(v, a, f"{key}[{i}]") for i, (v, a) in enumerate(zip(value, args, strict=True))
            )
        item = args[0] if args else Any
        converted = [_coerce(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(converted) if origin is tuple else converted
    if origin is dict:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        return dict(value)
    if tp is Any:
        return value
    raise TypeError(f"{key}: unsupported field type {tp!r}")  # a schema bug, not a user error


# Keys of older EasyR1 releases that EasyR1 itself dropped, and where their setting went: configs
# written for those releases still carry them.
MOVED: dict[str, str] = {
    "worker.reward.reward_type": (
        'EasyR1 dropped this key: the reward file says its type, with REWARD_TYPE = "batch" (the default) or '
        '"sequential" at module level'
    ),
    "worker.reward.score_function": "EasyR1 renamed it worker.reward.reward_function (path/file.py:function or a built-in)",
    "worker.reward.score_function_kwargs": "EasyR1 renamed it worker.reward.reward_function_kwargs",
}


def unknown_key(key: str, cls: type, prefix: str) -> ConfigError:
    """The error for ``key`` under ``prefix`` (a section of type ``cls``): where EasyR1 moved it, or
    the closest valid key, or the valid keys."""
    names = [f.name for f in dataclasses.fields(cls)]
    close = difflib.get_close_matches(key, names, n=1)
    full = f"{prefix}{key}"
    if full in MOVED:
        return ConfigError(f"{full}: {MOVED[full]}")
    hint = f"; did you mean {prefix}{close[0]}?" if close else f"; valid keys here: {', '.join(names)}"
    return ConfigError(f"unknown config key {full!r}{hint}")


def _build(cls: type, values: dict[str, Any], prefix: str = "") -> Any:
    if not isinstance(values, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: expected a mapping, got {values!r}")
    hints = _hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in values.items():
        if key not in names:
            raise unknown_key(str(key), cls, prefix)
        tp = hints[key]
        if _is_dataclass_type(tp):
            kwargs[key] = _build(tp, value or {}, f"{prefix}{key}.")
        else:
            kwargs[key] = _coerce(value, tp, f"{prefix}{key}")
    return cls(**kwargs)


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    """Set ``a.b.c`` in a nested dict; the key is checked against the schema when it is built."""
    *parents, leaf = dotted.split(".")
    node = tree
    for part in parents:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[leaf] = value


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _parse_override_value(key: str, raw: str) -> Any:
    """YAML scalars/flow collections (``1.0e-6``, ``true``, ``null``, ``[a,b]``); else the string.
    Read as a config file is (``easyr1.yaml_io``): an alias bomb on the command line is refused too."""
    try:
        return yaml_io.load(raw)
    except yaml_io.YAMLTooLarge as exc:
        raise ConfigError(f"{key}: {exc.problem}") from None
    except yaml.YAMLError:
        return raw


def read_yaml(path: str | Path) -> dict[str, Any]:
    """A config file as a mapping, refusing duplicate keys; errors name the file (and the line)."""
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        with file.open("rb") as stream:  # an open file: YAML's errors name it
            loaded = yaml_io.load(stream) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML: {exc}") from exc
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path}: the top level must be a mapping")
    return loaded


def _string_fields() -> set[str]:
    """Dotted names of the string-typed fields: their override text is kept verbatim."""
    out: set[str] = set()

    def walk(cls: type, prefix: str) -> None:
        for name, tp in _hints(cls).items():
            if _is_dataclass_type(tp):
                walk(tp, f"{prefix}{name}.")
            elif tp is str or tp == str | None:
                out.add(f"{prefix}{name}")

    walk(PPOConfig, "")
    return out


def load_config(args: list[str]) -> PPOConfig:
    """Build the config from ``config=FILE.yaml`` (at most one) and ``a.b.c=value`` arguments."""
    tree: dict[str, Any] = {}
    overrides: list[tuple[str, str]] = []
    for arg in args:
        if "=" not in arg:
            raise ConfigError(f"expected key=value, got {arg!r}")
        key, raw = arg.split("=", 1)
        if key == "config":
            tree = _merge(tree, read_yaml(raw))
        else:
            overrides.append((key, raw))
    strings = _string_fields()
    for key, raw in overrides:
        value = (
            raw
            if key in strings and raw.lower() not in ("null", "none", "~")
            else _parse_override_value(key, raw)
        )
        _set_dotted(tree, key, value)
    return from_tree(tree)


def override_value(value: Any) -> str:
    """A value as the text of a ``key=value`` argument that ``load_config`` reads back as it was:
    strings verbatim, the rest as YAML flow."""
    return value if isinstance(value, str) else yaml.safe_dump(value, default_flow_style=True).splitlines()[0]


def from_tree(tree: dict[str, Any]) -> PPOConfig:
    """The config of a nested mapping (a YAML file's), checked as ``easyr1 train`` checks it."""
    config = _build(PPOConfig, tree)
    validate(config)
    return config


def from_yaml(text: str) -> PPOConfig:
    return from_tree(yaml_io.load(text) or {})


# ------------------------------------------------------------------------------ checks


def _check_file(key: str, path: str | None, *, directory: bool = False) -> None:
    if path is None:
        return
    ok = os.path.isdir(path) if directory else os.path.isfile(path)
    if not ok:
        kind = "folder" if directory else "file"
        raise ConfigError(f"{key}: {kind} not found: {path}")


def _check_positive(key: str, value: int | None) -> None:
    if value is not None and value <= 0:
        raise ConfigError(f"{key}: must be positive, got {value}")


def _check_range(
    key: str,
    value: float | None,
    low: float,
    high: float = math.inf,
    *,
    open_low: bool = False,
    open_high: bool = False,
    why: str = "",
) -> None:
    """``value`` must lie in [low, high] (a bound excluded where ``open_*``; an infinite one always).
    Written as ``not inside`` so that NaN, which compares false with everything, is refused too."""
    if value is None:
        return
    open_high = open_high or math.isinf(high)
    above = value > low if open_low else value >= low
    below = value < high if open_high else value <= high
    if not (above and below):
        interval = f"{'(' if open_low else '['}{low:g}, {high:g}{')' if open_high else ']'}"
        raise ConfigError(f"{key}: must lie in {interval}, got {value}{why}")


_LR_WHY = (
    " (a negative lr climbs the loss and 0 trains nothing; trainer.val_only=true evaluates without training)"
)


def _check_optim(prefix: str, optim: OptimConfig) -> None:
    _check_range(f"{prefix}.lr", optim.lr, 0.0, open_low=True, why=_LR_WHY)
    _check_range(f"{prefix}.weight_decay", optim.weight_decay, 0.0)
    for i, beta in enumerate(optim.betas):  # beta = 1 zeroes Adam's bias correction (a division by 0)
        _check_range(f"{prefix}.betas[{i}]", beta, 0.0, 1.0, open_high=True)
    _check_range(f"{prefix}.lr_warmup_ratio", optim.lr_warmup_ratio, 0.0, 1.0)
    _check_range(f"{prefix}.lr_warmup_steps", optim.lr_warmup_steps, 0.0)
    _check_range(f"{prefix}.min_lr_ratio", optim.min_lr_ratio, 0.0, 1.0)


def _check_ranges(config: PPOConfig) -> None:
    """Numbers whose type is right but whose value trains wrongly without an error: a negative lr
    or max_grad_norm ascends the loss, a negative kl_coef rewards drifting from the reference."""
    actor, critic, algo = config.worker.actor, config.worker.critic, config.algorithm
    for prefix, worker in (("worker.actor", actor), ("worker.critic", critic)):
        _check_optim(f"{prefix}.optim", worker.optim)
        _check_range(f"{prefix}.max_grad_norm", worker.max_grad_norm, 0.0, open_low=True)
    # losses.py clips the ratio to [1 - clip_ratio_low, 1 + clip_ratio_high]; dual clip caps the
    # loss of a negative advantage at clip_ratio_dual * |A|, which only bites above the clip (ratio 1).
    _check_range("worker.actor.clip_ratio_low", actor.clip_ratio_low, 0.0, 1.0)
    _check_range("worker.actor.clip_ratio_high", actor.clip_ratio_high, 0.0)
    _check_range("worker.actor.clip_ratio_dual", actor.clip_ratio_dual, 1.0, open_low=True)
    _check_range("worker.actor.tau_positive", actor.tau_positive, 0.0, open_low=True)  # SAPO divides by tau
    _check_range("worker.actor.tau_negative", actor.tau_negative, 0.0, open_low=True)
    _check_range("worker.critic.cliprange_value", critic.cliprange_value, 0.0, open_low=True)
    _check_range("algorithm.kl_coef", algo.kl_coef, 0.0)
    _check_range(
        "algorithm.kl_target", algo.kl_target, 0.0, open_low=True
    )  # the adaptive controller divides by both
    _check_range("algorithm.kl_horizon", algo.kl_horizon, 0.0, open_low=True)
    _check_range("algorithm.gamma", algo.gamma, 0.0, 1.0)
    _check_range("algorithm.lam", algo.lam, 0.0, 1.0)
    _check_range("worker.reward.timeout", config.worker.reward.timeout, 0.0, open_low=True)
    _check_range("worker.reward.num_cpus", config.worker.reward.num_cpus, 0)  # Ray's resources are >= 0
    _check_range("trainer.stall_report_s", config.trainer.stall_report_s, 0.0)


def validate(config: PPOConfig) -> None:
    """Checks that need more than one field's type: ranges, and local files that must exist. (The
    reward function is resolved where the run is checked before it starts: ``rewards.loader.check_reward_config``.)"""
    data, actor, rollout = config.data, config.worker.actor, config.worker.rollout
    critic = config.worker.critic
    _check_file("data.format_prompt", data.format_prompt)
    _check_file("data.override_chat_template", data.override_chat_template)
    _check_file("data.image_dir", data.image_dir, directory=True)
    save = config.trainer.save_checkpoint_path
    if save is not None and os.path.exists(save) and not os.path.isdir(save):
        raise ConfigError(f"trainer.save_checkpoint_path: {save} is a file; the run writes a folder there")
    for key, value in [
        ("data.max_prompt_length", data.max_prompt_length),
        ("data.max_response_length", data.max_response_length),
        ("data.rollout_batch_size", data.rollout_batch_size),
        ("data.mini_rollout_batch_size", data.mini_rollout_batch_size),
        ("data.video_max_frames", data.video_max_frames),
        ("worker.actor.global_batch_size", actor.global_batch_size),
        ("worker.actor.micro_batch_size_per_device_for_update", actor.micro_batch_size_per_device_for_update),
        (
            "worker.actor.micro_batch_size_per_device_for_experience",
            actor.micro_batch_size_per_device_for_experience,
        ),
        ("worker.actor.ppo_epochs", actor.ppo_epochs),
        ("worker.critic.global_batch_size", critic.global_batch_size),
        (
            "worker.critic.micro_batch_size_per_device_for_update",
            critic.micro_batch_size_per_device_for_update,
        ),
        (
            "worker.critic.micro_batch_size_per_device_for_experience",
            critic.micro_batch_size_per_device_for_experience,
        ),
        ("worker.critic.ppo_epochs", critic.ppo_epochs),
        ("worker.rollout.n", rollout.n),
        ("worker.rollout.tensor_parallel_size", rollout.tensor_parallel_size),
        ("worker.rollout.max_num_seqs", rollout.max_num_seqs),
        ("trainer.total_epochs", config.trainer.total_epochs),
        ("trainer.nnodes", config.trainer.nnodes),
        ("trainer.n_gpus_per_node", config.trainer.n_gpus_per_node),
        ("trainer.max_steps", config.trainer.max_steps),
    ]:
        _check_positive(key, value)
    if data.min_pixels is not None and data.max_pixels is not None and data.min_pixels > data.max_pixels:
        raise ConfigError(f"data.min_pixels ({data.min_pixels}) exceeds data.max_pixels ({data.max_pixels})")
    if actor.model.lora.rank < 0:
        raise ConfigError(f"worker.actor.model.lora.rank: must be >= 0, got {actor.model.lora.rank}")
    _check_range("worker.rollout.top_p", rollout.top_p, 0.0, 1.0)
    _check_range("data.video_fps", data.video_fps, 0.0, open_low=True)
    if data.video_max_frames < 2:
        raise ConfigError(
            f"data.video_max_frames: at least 2 frames (one temporal patch), got {data.video_max_frames}"
        )
    _check_range("worker.rollout.limit_videos", rollout.limit_videos, 0)
    _check_range("worker.rollout.temperature", rollout.temperature, 0.0)
    _check_ranges(config)
    hints = _hints(RolloutConfig)
    for (
        key,
        value,
    ) in rollout.val_override_config.items():  # validation's sampling: checked as the rollout's own
        if key not in hints:
            raise unknown_key(key, RolloutConfig, "worker.rollout.val_override_config.")
        name = f"worker.rollout.val_override_config.{key}"
        rollout.val_override_config[key] = value = _coerce(value, hints[key], name)
        if key == "n":
            _check_positive(name, value)
        elif key == "temperature":
            _check_range(name, value, 0.0)
        elif key == "top_p":
            _check_range(name, value, 0.0, 1.0)
