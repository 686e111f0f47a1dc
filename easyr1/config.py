"""The whole run configuration, with EasyR1's schema and defaults.

A run is configured as ``config=FILE.yaml a.b.c=value ...``: the defaults below, then the file,
then the dotted overrides. Every value is converted to the type its field declares, ``Literal``
fields name their allowed values, and an unknown key is an error that names the closest valid
key, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional, Union

import yaml


class ConfigError(ValueError):
    """A configuration problem; the message names the offending key."""


# --------------------------------------------------------------------------------------- schema


@dataclass
class DataConfig:
    train_files: str = ""
    val_files: str = ""
    prompt_key: str = "prompt"
    answer_key: str = "answer"
    image_key: str = "images"
    video_key: str = "videos"
    image_dir: Optional[str] = None
    video_fps: float = 2.0  # frames sampled per second of video (EasyR1's key)
    # The most frames sampled from one video (rounded down to an even count): qwen-vl-utils, which
    # EasyR1 decodes with, allows 768; 128 keeps a long video's prompt within reach of a GPU.
    video_max_frames: int = 128
    max_prompt_length: int = 512
    max_response_length: int = 512
    rollout_batch_size: int = 512
    mini_rollout_batch_size: Optional[int] = None
    val_batch_size: int = -1
    format_prompt: Optional[str] = None
    override_chat_template: Optional[str] = None
    shuffle: bool = True
    seed: int = 1
    min_pixels: Optional[int] = 262144
    max_pixels: Optional[int] = 4194304
    filter_overlong_prompts: bool = True
    filter_overlong_prompts_workers: int = 16


@dataclass
class AlgorithmConfig:
    gamma: float = 1.0
    lam: float = 1.0
    adv_estimator: Literal["grpo", "gae", "reinforce_plus_plus", "remax", "rloo", "grpo_passk"] = "grpo"
    norm_adv_by_std_in_grpo: bool = True  # False: Dr. GRPO (no division by the group's std)
    disable_kl: bool = False
    use_kl_loss: bool = False
    kl_penalty: Literal["kl", "abs", "mse", "low_var_kl", "full"] = "kl"
    kl_coef: float = 1e-3
    kl_type: Literal["fixed", "adaptive"] = "fixed"
    kl_horizon: float = 10000.0
    kl_target: float = 0.1
    online_filtering: bool = False
    filter_key: str = "overall"
    filter_low: float = 0.01
    filter_high: float = 0.99


@dataclass
class LoraConfig:
    rank: int = 0
    alpha: int = 64
    target_modules: str = "all-linear"
    exclude_modules: Optional[str] = None


@dataclass
class ModelConfig:
    model_path: Optional[str] = None
    tokenizer_path: Optional[str] = None
    override_config: dict[str, Any] = field(default_factory=dict)
    # EasyR1's key. True: every decoder block recomputes its activations in backward (the least
    # memory); False: none does (the least compute). "auto": on GPUs, the actor recomputes only the
    # fewest first blocks with which the memory estimate fits the GPU with 10% to spare, vLLM's share
    # decided first (easyr1/memory.py, checkpointed_blocks); every block on CPUs and for the critic.
    # The log line "gradient checkpointing: ..." says how many.
    enable_gradient_checkpointing: Union[bool, Literal["auto"]] = "auto"
    trust_remote_code: bool = True
    freeze_vision_tower: bool = False
    lora: LoraConfig = field(default_factory=LoraConfig)


@dataclass
class OptimConfig:
    lr: float = 1e-6
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 1e-2
    strategy: Literal["adamw", "adamw_bf16"] = "adamw"
    lr_warmup_ratio: float = 0.0
    lr_warmup_steps: Optional[int] = None
    min_lr_ratio: Optional[float] = None
    lr_scheduler_type: Literal["constant", "cosine"] = "constant"


DType = Literal["fp32", "bf16", "fp16"]


@dataclass
class FSDPConfig:
    enable_full_shard: bool = True
    enable_cpu_offload: bool = False
    enable_rank0_init: bool = True
    use_orig_params: bool = False
    torch_dtype: Optional[DType] = None
    fsdp_size: int = -1
    mp_param_dtype: DType = "bf16"
    mp_reduce_dtype: DType = "fp32"
    mp_buffer_dtype: DType = "fp32"


@dataclass
class OffloadConfig:
    offload_params: bool = False
    offload_optimizer: bool = False


@dataclass
class ActorConfig:
    strategy: Literal["fsdp"] = "fsdp"
    global_batch_size: int = 256
    micro_batch_size_per_device_for_update: int = 4
    micro_batch_size_per_device_for_experience: int = 16
    max_grad_norm: float = 1.0
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.3
    clip_ratio_dual: float = 3.0
    loss_avg_mode: Literal[
        "token", "seq", "token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"
    ] = "token"
    loss_type: Literal["default", "gspo", "gspo_token", "cispo", "sapo"] = "default"
    ppo_epochs: int = 1
    padding_free: bool = True
    dynamic_batching: bool = True
    ulysses_size: int = 1
    use_torch_compile: bool = True
    tau_positive: float = 1.0
    tau_negative: float = 1.05
    entropy_coeff: float = 0.0  # veRL's key: the loss gets -entropy_coeff * entropy (a bonus for exploring)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)
    offload: OffloadConfig = field(default_factory=OffloadConfig)


@dataclass
class CriticConfig:
    strategy: Literal["fsdp"] = "fsdp"
    global_batch_size: int = 256
    micro_batch_size_per_device_for_update: int = 4
    micro_batch_size_per_device_for_experience: int = 16
    max_grad_norm: float = 1.0
    cliprange_value: float = 0.5
    loss_avg_mode: Literal["token", "seq"] = "token"
    ppo_epochs: int = 1
    padding_free: bool = False
    dynamic_batching: bool = True
    ulysses_size: int = 1
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)
    offload: OffloadConfig = field(default_factory=OffloadConfig)


@dataclass
class RefConfig:
    strategy: Literal["fsdp"] = "fsdp"
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)
    offload: OffloadConfig = field(default_factory=OffloadConfig)


@dataclass
class RewardConfig:
    reward_function: Optional[str] = None
    reward_function_kwargs: dict[str, Any] = field(default_factory=dict)
    skip_special_tokens: bool = True
    num_cpus: int = 1
    # Not in EasyR1. Seconds one call of the reward function may take (a batch function: the rank's
    # whole batch; a sequential one: one input); past it the run ends with an error naming the input,
    # instead of hanging. Generous, so that a slow but working function (a remote judge) is not cut off.
    timeout: float = 300.0


@dataclass
class RolloutConfig:
    # "auto": vLLM on GPUs when it is importable, Hugging Face generate otherwise.
    name: Literal["auto", "hf", "vllm"] = "auto"
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int = 1
    limit_images: int = 0
    # vLLM's limit_mm_per_prompt for videos; 0: videos are off in vLLM (it profiles them at start-up
    # through the model folder's own video processor, which image-only folders lack).
    limit_videos: int = 0
    dtype: DType = "bf16"
    gpu_memory_utilization: float = 0.6
    ignore_eos: bool = False
    enforce_eager: bool = False
    enable_chunked_prefill: bool = False
    tensor_parallel_size: int = 2
    max_model_len: Optional[int] = None
    max_num_batched_tokens: int = 8192
    # veRL's key: the most sequences vLLM's scheduler decodes at once; None leaves vLLM's default
    # (1024 on an H200). vLLM sizes its per-request buffers, which it copies to the GPU at each step, by it.
    max_num_seqs: Optional[int] = None
    disable_log_stats: bool = True
    disable_tqdm: bool = False
    # veRL's key. True: the rollout returns each sampled token's log-prob, and each step logs how far
    # the actor's log-probs are from it (rollout/logp_diff_*, rollout/ratio_*). It costs vLLM a pass
    # over the vocabulary per token (7% of the anchor's decoding kernels); nothing else reads them.
    calculate_log_probs: bool = False
    # veRL's key. True: vLLM's weights and KV cache are freed while the actor trains (sleep mode).
    # False: they stay on the GPU, which saves the sleep and wake-up at every step. "auto": False
    # when the memory estimate with vLLM's share kept through training fits the GPU with 10% to
    # spare (easyr1/memory.py, stays_awake), True otherwise; the log line naming the backend says which.
    free_cache_engine: Union[bool, Literal["auto"]] = "auto"
    val_override_config: dict[str, Any] = field(default_factory=dict)


@dataclass
class WorkerConfig:
    hybrid_engine: bool = True
    actor: ActorConfig = field(default_factory=ActorConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    ref: RefConfig = field(default_factory=RefConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)


LoggerName = Literal["console", "file", "tensorboard", "wandb", "swanlab", "mlflow"]


@dataclass
class TrainerConfig:
    total_epochs: int = 15
    max_steps: Optional[int] = None
    project_name: str = "easy_r1"
    experiment_name: str = "demo"
    logger: list[LoggerName] = field(default_factory=lambda: ["console", "wandb"])
    nnodes: int = 1
    n_gpus_per_node: int = 8
    max_try_make_batch: int = 20
    critic_warmup: int = 0
    val_freq: int = -1
    val_before_train: bool = True
    val_only: bool = False
    val_generations_to_log: int = 0
    save_freq: int = -1
    save_limit: int = -1
    save_model_only: bool = False
    save_checkpoint_path: Optional[str] = None
    load_checkpoint_path: Optional[str] = None
    ray_timeline: Optional[str] = None
    find_last_checkpoint: bool = True
    # Resume although the training data changed in place since the checkpoint (its fingerprint, in
    # trainer_state.json, differs): refused by default, as the saved position would name other rows. Our key.
    allow_changed_data: bool = False
    # Steps to run under torch.profiler; each rank writes profile/step{N}-rank{R}.json in the run folder
    # (easyr1/profiling.py: each phase's time and its costliest ops).
    profile_steps: list[int] = field(default_factory=list)
    # Steps whose Python time is sampled instead, profiler off; each rank writes
    # profile/step{N}-rank{R}-host.json (easyr1/profiling.py: per phase, where the host's time goes).
    host_profile_steps: list[int] = field(default_factory=list)
    # Seconds without progress (setup, each step with its validation and checkpoint, shutdown) after which
    # each rank writes every Python thread's stack to stderr, and again each further period while it
    # lasts (easyr1/stalls.py); the run goes on. 0: off. Our key.
    stall_report_s: float = 1800.0


@dataclass
class PPOConfig:
    data: DataConfig = field(default_factory=DataConfig)
    worker: WorkerConfig = field(default_factory=WorkerConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)

    def to_dict(self) -> dict[str, Any]:
        return _to_plain(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)


# ------------------------------------------------------------------------------ building


def _to_plain(obj: Any) -> Any:
    """Dataclasses -> dicts, tuples -> lists: the form YAML writes and reads back unchanged."""
    if dataclasses.is_dataclass(obj):
        return {f.name: _to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [_to_plain(v) for v in obj]
    if isinstance(obj, dict):
        return {k: _to_plain(v) for k, v in obj.items()}
    return obj


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _describe(tp: Any) -> str:
    """A declared type as an error message names it."""
    if typing.get_origin(tp) is Literal:
        return ", ".join(repr(a) for a in typing.get_args(tp))
    return {bool: "true, false", int: "an integer", float: "a number", str: "a string"}.get(tp, getattr(tp, "__name__", str(tp)))


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
            return tuple(_coerce(v, a, f"{key}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
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
        "EasyR1 dropped this key: the reward file says its type, with REWARD_TYPE = \"batch\" (the default) or "
        "\"sequential\" at module level"
    ),
    "worker.reward.score_function": "EasyR1 renamed it worker.reward.reward_function (path/file.py:function or a built-in)",
    "worker.reward.score_function_kwargs": "EasyR1 renamed it worker.reward.reward_function_kwargs",
}


def _unknown_key(key: str, cls: type, prefix: str) -> ConfigError:
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
            raise _unknown_key(str(key), cls, prefix)
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


def _parse_override_value(raw: str) -> Any:
    """YAML scalars/flow collections (``1.0e-6``, ``true``, ``null``, ``[a,b]``); else the string."""
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (PyYAML keeps the last: a second
    ``trainer:`` block would silently drop the first one's keys)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # ``<<: *anchor``: keys written beside it override the merged ones
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice in one mapping", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep)


def read_yaml(path: str | Path) -> dict[str, Any]:
    """A config file as a mapping, refusing duplicate keys; errors name the file (and the line)."""
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        with file.open("rb") as stream:  # an open file: YAML's errors name it
            loaded = yaml.load(stream, Loader=_UniqueKeyLoader) or {}
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
            elif tp is str or tp == Optional[str]:
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
        value = raw if key in strings and raw.lower() not in ("null", "none", "~") else _parse_override_value(raw)
        _set_dotted(tree, key, value)
    return from_tree(tree)


def from_tree(tree: dict[str, Any]) -> PPOConfig:
    """The config of a nested mapping (a YAML file's), checked as ``easyr1 train`` checks it."""
    config = _build(PPOConfig, tree)
    validate(config)
    return config


def from_yaml(text: str) -> PPOConfig:
    return from_tree(yaml.safe_load(text) or {})


# ------------------------------------------------------------------------------ checks


def _check_file(key: str, path: Optional[str], *, directory: bool = False) -> None:
    if path is None:
        return
    ok = os.path.isdir(path) if directory else os.path.isfile(path)
    if not ok:
        kind = "folder" if directory else "file"
        raise ConfigError(f"{key}: {kind} not found: {path}")


def _check_positive(key: str, value: Optional[int]) -> None:
    if value is not None and value <= 0:
        raise ConfigError(f"{key}: must be positive, got {value}")


def _check_range(
    key: str,
    value: Optional[float],
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


_LR_WHY = " (a negative lr climbs the loss and 0 trains nothing; trainer.val_only=true evaluates without training)"


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
    _check_range("algorithm.kl_target", algo.kl_target, 0.0, open_low=True)  # the adaptive controller divides by both
    _check_range("algorithm.kl_horizon", algo.kl_horizon, 0.0, open_low=True)
    _check_range("algorithm.gamma", algo.gamma, 0.0, 1.0)
    _check_range("algorithm.lam", algo.lam, 0.0, 1.0)
    _check_range("worker.reward.timeout", config.worker.reward.timeout, 0.0, open_low=True)
    _check_range("worker.reward.num_cpus", config.worker.reward.num_cpus, 0)  # Ray's resources are >= 0
    _check_range("trainer.stall_report_s", config.trainer.stall_report_s, 0.0)


def _check_reward(reward: RewardConfig) -> None:
    """Resolve the reward function now, without running the file: a missing file or function must
    stop a run before the models load and shard (minutes on a 7B model), and ``easyr1 config``
    must report it too. (Its imports are checked when the ranks load it, before the models.)"""
    if reward.reward_function is None:
        return
    # Imported here, not at the top: the rewards package may import this module's dataclasses.
    from easyr1.rewards.loader import RewardFunctionError, check_reward_spec

    try:
        check_reward_spec(reward.reward_function)
    except RewardFunctionError as exc:
        raise ConfigError(f"worker.reward.reward_function: {exc}") from exc


def validate(config: PPOConfig) -> None:
    """Checks that need more than one field's type: ranges, local files that must exist, and the
    reward function (resolved, not run)."""
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
        ("worker.actor.micro_batch_size_per_device_for_experience", actor.micro_batch_size_per_device_for_experience),
        ("worker.actor.ppo_epochs", actor.ppo_epochs),
        ("worker.critic.global_batch_size", critic.global_batch_size),
        ("worker.critic.micro_batch_size_per_device_for_update", critic.micro_batch_size_per_device_for_update),
        ("worker.critic.micro_batch_size_per_device_for_experience", critic.micro_batch_size_per_device_for_experience),
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
        raise ConfigError(f"data.video_max_frames: at least 2 frames (one temporal patch), got {data.video_max_frames}")
    _check_range("worker.rollout.limit_videos", rollout.limit_videos, 0)
    _check_range("worker.rollout.temperature", rollout.temperature, 0.0)
    _check_ranges(config)
    hints = _hints(RolloutConfig)
    for key, value in rollout.val_override_config.items():  # validation's sampling: checked as the rollout's own
        if key not in hints:
            raise _unknown_key(key, RolloutConfig, "worker.rollout.val_override_config.")
        name = f"worker.rollout.val_override_config.{key}"
        rollout.val_override_config[key] = value = _coerce(value, hints[key], name)
        if key == "n":
            _check_positive(name, value)
        elif key == "temperature":
            _check_range(name, value, 0.0)
        elif key == "top_p":
            _check_range(name, value, 0.0, 1.0)
    _check_reward(config.worker.reward)


# ------------------------------------------------------------------------------ checks for the run

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
    return f"{dotted}={value if isinstance(value, str) else json.dumps(_to_plain(value))}"


def planned_world(config: PPOConfig) -> int:
    """The ranks a run of ``config`` has: ``WORLD_SIZE`` where a launcher (torchrun, srun, Ray, the
    local launcher) has set it, else what ``easyr1 train`` starts, trainer.nnodes x trainer.n_gpus_per_node."""
    if "WORLD_SIZE" in os.environ:
        return int(os.environ["WORLD_SIZE"])
    return config.trainer.nnodes * config.trainer.n_gpus_per_node


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
        raise ConfigError(f"data.rollout_batch_size={data.rollout_batch_size} must be divisible by the {world} ranks")

    def check_mini_batch(worker: str, global_batch_size: int) -> None:
        if global_batch_size > data.rollout_batch_size or data.rollout_batch_size % global_batch_size:
            raise ConfigError(
                f"{worker}.global_batch_size={global_batch_size} must divide data.rollout_batch_size={data.rollout_batch_size}"
            )
        if (global_batch_size * n) % world:
            raise ConfigError(f"{worker}.global_batch_size * worker.rollout.n must be divisible by the {world} ranks")

    check_mini_batch("worker.actor", actor.global_batch_size)
    mini = data.mini_rollout_batch_size or data.rollout_batch_size
    if mini % world:
        raise ConfigError(f"data.mini_rollout_batch_size={mini} must be divisible by the {world} ranks")
    algo = config.algorithm
    for name in ("actor", "critic") if algo.adv_estimator == "gae" else ("actor",):
        worker = getattr(config.worker, name)
        if worker.ulysses_size < 1 or world % worker.ulysses_size:
            raise ConfigError(f"worker.{name}.ulysses_size={worker.ulysses_size} must divide the {world} ranks")
        if worker.ulysses_size > 1 and not worker.padding_free:
            raise ConfigError(
                f"worker.{name}.ulysses_size={worker.ulysses_size} splits packed rows: set worker.{name}.padding_free=true"
            )
    if algo.online_filtering and not algo.filter_low < algo.filter_high:
        raise ConfigError(f"algorithm.filter_low={algo.filter_low} must be below algorithm.filter_high={algo.filter_high}")
    if algo.adv_estimator == "gae":
        check_mini_batch("worker.critic", config.worker.critic.global_batch_size)


def config_warnings(config: PPOConfig) -> list[str]:
    """One message per EasyR1 key that is set but cannot act in this run; the caller shows each once
    (``easyr1 config`` on stderr, the trainer on rank 0)."""
    messages = [f"{_shown(config, key)}: {why}" for key, why in WARNED.items() if _changed(config, key)]
    if config.trainer.ray_timeline is not None:
        # Imported here, not at the top: the launcher imports this module.
        from easyr1.launch.ray import ray_starts_ranks

        if not ray_starts_ranks(config):
            messages.append(
                f"{_shown(config, 'trainer.ray_timeline')}: Ray writes a timeline only of runs whose "
                "ranks it starts (easyr1 train with trainer.nnodes > 1, not under torchrun or srun); "
                "none is written for this one"
            )
    return messages
