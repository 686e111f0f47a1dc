"""ModelScope as the hub, as EasyR1 and LLaMA-Factory take it: ``USE_MODELSCOPE_HUB=1``.

With it set, every model and data set that a config names but is not a local path (a hub name
such as ``Qwen/Qwen2.5-7B-Instruct`` or ``hiyouga/geometry3k@train``) is downloaded through
``modelscope.snapshot_download`` before the run starts, and the run reads the local copy: a model
folder as any other, a data set's folder with ``@split`` choosing its files (``data/dataset.py``).
Without it, names go to the Hugging Face hub as before.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from easyr1.config import ConfigError, PPOConfig
from easyr1.data.paths import names_a_local_path

ENV = "USE_MODELSCOPE_HUB"
MODEL_KEYS = (
    "worker.actor.model.model_path",
    "worker.actor.model.tokenizer_path",
    "worker.critic.model.model_path",
    "worker.critic.model.tokenizer_path",
)
DATA_KEYS = ("data.train_files", "data.val_files")


def use_modelscope(environ: Mapping[str, str] = os.environ) -> bool:
    return environ.get(ENV, "0").strip().lower() in ("1", "true", "y", "yes")


def _download() -> Callable[..., str]:
    try:
        from modelscope import snapshot_download
    except ImportError:
        raise ConfigError(
            f"{ENV}=1 loads models and data sets through ModelScope, which needs the modelscope "
            "package: pip install modelscope (or unset it to use the Hugging Face hub)"
        ) from None
    return snapshot_download


def _get(config: PPOConfig, key: str) -> Any:
    value: Any = config
    for part in key.split("."):
        value = getattr(value, part, None)
    return value


def _is_hub_name(value: Any) -> bool:
    return (
        isinstance(value, str) and value != "" and not os.path.exists(value) and not names_a_local_path(value)
    )


def modelscope_overrides(config: PPOConfig) -> list[str]:
    """``key=local_path`` arguments for every hub name of ``config``, downloaded through ModelScope;
    [] unless ``USE_MODELSCOPE_HUB`` is set."""
    if not use_modelscope():
        return []
    overrides = []
    for key in MODEL_KEYS:
        value = _get(config, key)
        if _is_hub_name(value):
            overrides.append(f"{key}={_download()(value)}")
    for key in DATA_KEYS:
        value = _get(config, key)
        if not isinstance(value, str) or not value:
            continue
        name, _, split = value.rpartition("@") if "@" in value else (value, "", "")
        if _is_hub_name(name) and _is_hub_name(value):
            folder = _download()(name, repo_type="dataset")
            overrides.append(f"{key}={folder}@{split}" if split else f"{key}={folder}")
    return overrides
