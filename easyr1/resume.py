"""What a resumed run may change: the config a checkpoint was saved with against today's.

A checkpoint stores its run's resolved config (``trainer_state.json``). Resuming with another
config is fine for most keys (a new lr, more steps, another logger), which are applied and
announced; but some keys fix what the checkpoint means — which rows the sampler's saved position
counts, the parameters' names and shapes, the kind of saved weights and optimizer state — and a
change there would silently train something that neither config describes, so it is refused.
The training data itself is compared too, through the fingerprint the checkpoint records
(``RLDataset.fingerprint``): data changed in place is refused unless ``trainer.allow_changed_data``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any

from easyr1.config import ConfigError, PPOConfig

# Where to resume from, not how to train: never compared.
NOT_COMPARED = ("trainer.load_checkpoint_path", "trainer.find_last_checkpoint", "trainer.allow_changed_data")
# Which rows the data has and in what order (the sampler's saved position counts batches of them),
# how many prompts and samples a step takes, and the advantage estimator (whether there is a critic).
FIXED_DATA = (
    "data.train_files",
    "data.prompt_key",
    "data.answer_key",
    "data.image_key",
    "data.video_key",
    "data.image_dir",
    "data.video_fps",
    "data.min_pixels",
    "data.max_pixels",
    "data.format_prompt",
    "data.override_chat_template",
    "data.max_prompt_length",
    "data.filter_overlong_prompts",
    "data.rollout_batch_size",
    "data.mini_rollout_batch_size",
    "data.shuffle",
    "data.seed",
    "worker.rollout.n",
    "algorithm.adv_estimator",
)
# For each trained model (worker.actor, worker.critic): its parameters' names and shapes (model,
# tokenizer, LoRA, frozen tower) and the kind of its saved weights and optimizer state.
FIXED_PER_MODEL = (
    "model.model_path",
    "model.tokenizer_path",
    "model.override_config",
    "model.freeze_vision_tower",
    "model.lora",
    "fsdp.torch_dtype",
    "optim.strategy",
)
_MISSING = object()  # a key the saved config does not have (the checkpoint predates the key)


@dataclass(frozen=True)
class Change:
    key: str
    saved: Any
    now: Any

    def __str__(self) -> str:
        return f"{self.key}: {json.dumps(self.saved)} -> {json.dumps(self.now)}"


def saved_config(trainer_state: Path) -> dict[str, Any] | None:
    """The config a checkpoint's ``trainer_state.json`` recorded (None: saved before configs were)."""
    return json.loads(trainer_state.read_text()).get("config")


def _leaf_keys(section: Any, prefix: str = "") -> list[str]:
    """The dotted names of a config's values; a dict-valued key (``override_config``) is one value."""
    keys: list[str] = []
    for field in fields(section):
        value = getattr(section, field.name)
        keys += _leaf_keys(value, f"{prefix}{field.name}.") if is_dataclass(value) else [prefix + field.name]
    return keys


def _lookup(tree: Any, key: str) -> Any:
    for part in key.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return _MISSING
        tree = tree[part]
    return tree


def config_changes(
    saved: dict[str, Any], config: PPOConfig, *, critic: bool, checkpoint: Path
) -> list[Change]:
    """Each key whose value differs from the one ``checkpoint`` was saved with. A ConfigError
    naming every refused key (old -> new) when a change would make the resumed run another run."""
    now = config.to_dict()
    changes = [
        Change(key, old, new)
        for key in _leaf_keys(config)
        if key not in NOT_COMPARED
        and (old := _lookup(saved, key)) is not _MISSING
        and old != (new := _lookup(now, key))
    ]
    models = ("actor", "critic") if critic else ("actor",)
    fixed = [*FIXED_DATA, *(f"worker.{m}.{key}" for m in models for key in FIXED_PER_MODEL)]
    refused = [c for c in changes if any(c.key == key or c.key.startswith(key + ".") for key in fixed)]
    if refused:
        lines = "\n".join(f"  {c}" for c in refused)
        raise ConfigError(
            f"cannot resume from {checkpoint}: these keys differ from the config it was saved with, and "
            f"resuming would train something that neither config describes:\n{lines}\n"
            "Resume with the saved values, or start a fresh run: another trainer.save_checkpoint_path, "
            "or trainer.find_last_checkpoint=false (and no trainer.load_checkpoint_path)."
        )
    return changes


def data_change(
    trainer_state: Path, fingerprint: dict[str, Any], *, train_files: str, allowed: bool, checkpoint: Path
) -> str | None:
    """None when the training data is the one ``checkpoint`` was saved with (or its state is unreadable:
    loading it says so); a note to print when the checkpoint predates fingerprints, or when the rows
    changed in place and ``allowed`` (``trainer.allow_changed_data``); a ConfigError when they changed
    otherwise, or changed in number (the saved position counts them, whatever ``allowed`` says)."""
    try:
        saved = json.loads(trainer_state.read_text()).get("data_fingerprint")
    except (OSError, ValueError):
        return None
    if saved is None:
        return f"{checkpoint} holds no fingerprint of the training data (saved before checkpoints recorded one): the data is not compared with it"
    if saved == fingerprint:
        return None
    fresh = (
        "Restore the data as it was, or start a fresh run: another trainer.save_checkpoint_path, or "
        "trainer.find_last_checkpoint=false (and no trainer.load_checkpoint_path)"
    )
    if (
        saved["rows"] != fingerprint["rows"]
    ):  # the saved position counts rows: no key makes it name the same ones
        raise ConfigError(
            f"cannot resume from {checkpoint}: data.train_files={train_files} has {fingerprint['rows']} rows, "
            f"{saved['rows']} when it was saved: the checkpoint's position in the data counts rows, so it would "
            f"name other rows now (trainer.allow_changed_data does not change that).\n{fresh}."
        )
    what = f"the prompts or answers of its {fingerprint['rows']} rows are not those it was saved with (rows reordered, edited or replaced)"
    if allowed:
        return f"resuming on changed training data (trainer.allow_changed_data=true): data.train_files={train_files}: {what}"
    raise ConfigError(
        f"cannot resume from {checkpoint}: data.train_files={train_files} changed since it was saved: {what}. "
        "The checkpoint's position in the data would name other rows, and resuming would train something "
        f"that neither run describes.\n{fresh}; to resume on the changed data on purpose: "
        "trainer.allow_changed_data=true."
    )
