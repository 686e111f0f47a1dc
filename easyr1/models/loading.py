"""The one place the engine loads models, tokenizers and processors by path (or Hugging Face model id).

A path is looked for on the file system first; only a name that is no folder here is taken as a Hub
model id, and that is said on stderr (once per name), or refused at once when ``HF_HUB_OFFLINE=1``
and the local Hugging Face cache has no such model. Every loader passes ``trust_remote_code`` (False
unless the caller says otherwise) to transformers, so a folder's own Python code (``auto_map``) runs
exactly when asked for: the trainer passes ``worker.*.model.trust_remote_code``, the value vLLM gets.

Qwen-VL processors need torchvision for their video processor; without it (CPU machines) a processor
built from the folder's image processor and tokenizer alone takes their place. Either way the video
processor is then the project's own (``models.video.FrameVideoProcessor``), so videos are processed the
same on every machine.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import is_offline_mode
from huggingface_hub.errors import StrictDataclassError
from safetensors import SafetensorError
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForImageTextToText,
    AutoModelForTokenClassification,
    AutoProcessor,
    AutoTokenizer,
    GenerationConfig,
    PreTrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    ProcessorMixin,
    Qwen2_5_VLProcessor,
    Qwen2VLProcessor,
    Qwen3VLProcessor,
)
from transformers.models.auto.modeling_auto import (
    MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
    MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES,
)
from transformers.utils import cached_file

from easyr1.config import ConfigError
from easyr1.data.paths import names_a_local_path
from easyr1.models.video import FrameVideoProcessor


class _ImageOnly:
    """Built without transformers' video processor (it needs torchvision): `ProcessorMixin` takes its
    sub-processors from `__init__`'s signature. ``load_processor`` then puts the project's in its place."""

    def __init__(
        self,
        image_processor: Any = None,
        tokenizer: Any = None,
        chat_template: str | None = None,
        **kwargs: Any,
    ):
        super().__init__(image_processor, tokenizer, None, chat_template=chat_template, **kwargs)

    def __call__(self, images: Any = None, text: Any = None, videos: Any = None, **kwargs: Any):
        if videos is not None and getattr(self, "video_processor", None) is None:
            raise ValueError(
                f"{type(self).__name__} handles images only until load_processor gives it a video processor"
            )
        return super().__call__(images=images, text=text, videos=videos, **kwargs)

    def to_dict(self) -> dict[str, Any]:
        # Saved under the full processor's name (the last base), so a folder written here, e.g. a merged
        # checkpoint, loads as a normal Qwen-VL folder; AutoProcessor would return a bare tokenizer otherwise.
        return {**super().to_dict(), "processor_class": type(self).__bases__[-1].__name__}


class Qwen2VLImageOnlyProcessor(_ImageOnly, Qwen2VLProcessor):
    """Qwen2-VL processor without transformers' video processor."""


class Qwen2_5_VLImageOnlyProcessor(_ImageOnly, Qwen2_5_VLProcessor):
    """Qwen2.5-VL processor without transformers' video processor."""


class Qwen3VLImageOnlyProcessor(_ImageOnly, Qwen3VLProcessor):
    """Qwen3-VL processor without transformers' video processor."""


VIDEO_CONFIG = "video_preprocessor_config.json"

_IMAGE_ONLY = {
    "qwen2_vl": Qwen2VLImageOnlyProcessor,
    "qwen2_5_vl": Qwen2_5_VLImageOnlyProcessor,
    "qwen3_vl": Qwen3VLImageOnlyProcessor,
    "qwen3_vl_moe": Qwen3VLImageOnlyProcessor,
}


def _is_local(path: str | Path) -> bool:
    """A path that names the file system rather than a hub model id (`org/name`)."""
    return Path(path).exists() or names_a_local_path(str(path))


_HUB_NAMES_SAID: set[str] = set()


def _hub_config_file(name: str) -> Path:
    """config.json of Hub model id ``name`` (from the cache, or downloaded). A mistyped folder
    (``models/qwen`` for ``model/qwen``) would otherwise become a stranger's model, remote code
    included, so the fall-back is said once, and offline a name missing from the cache fails at once."""
    offline = is_offline_mode()
    if name not in _HUB_NAMES_SAID:
        _HUB_NAMES_SAID.add(name)
        where = "the local Hugging Face cache (HF_HUB_OFFLINE=1)" if offline else "the Hugging Face Hub"
        print(
            f"model {name!r}: no such folder in {Path.cwd()}; trying it as a model id of {where}",
            file=sys.stderr,
        )
    try:
        return Path(cached_file(name, "config.json"))
    except OSError as error:
        if offline:
            message = (
                f"model folder not found: {name} (relative to {Path.cwd()}), and HF_HUB_OFFLINE=1 "
                f"with no cached Hub model of that name"
            )
            raise FileNotFoundError(message) from None
        message = f"{name}: not a model folder in {Path.cwd()}, and its config.json could not be fetched from the Hub"
        raise FileNotFoundError(message) from error


def read_config(path: str | Path) -> dict[str, Any]:
    """config.json of a model folder (or of a hub model id, see the module docstring) as a dict."""
    if _is_local(path):
        folder = Path(path)
        if not folder.is_dir():
            raise FileNotFoundError(f"model folder not found: {path}")
        file = folder / "config.json"
        if not file.is_file():
            raise FileNotFoundError(f"no config.json in model folder {path}")
    else:
        file = _hub_config_file(str(path))
    return json.loads(file.read_text())


def _takes_images(config: dict[str, Any]) -> bool:
    return config.get("model_type") in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES or "vision_config" in config


def is_vision_model(path: str | Path) -> bool:
    """Whether the model at `path` takes images (its model type maps to an image-text-to-text class)."""
    return _takes_images(read_config(path))


def _ensure_pad(tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """Batches need a pad token; models without one (Llama-3) pad with eos, as EasyR1 does."""
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_tokenizer(path: str | Path, *, trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    """The model's tokenizer, with a pad token; padding side is left to the caller."""
    read_config(path)  # a clear error naming the path, rather than a hub lookup of a typo
    return _ensure_pad(AutoTokenizer.from_pretrained(str(path), trust_remote_code=trust_remote_code))


def _video_settings(path: str | Path) -> dict[str, Any] | None:
    """The model's ``video_preprocessor_config.json`` as a dict, or None when it has none."""
    if _is_local(path):
        file = Path(path) / VIDEO_CONFIG
        return json.loads(file.read_text()) if file.is_file() else None
    found = cached_file(str(path), VIDEO_CONFIG, _raise_exceptions_for_missing_entries=False)
    return json.loads(Path(found).read_text()) if found else None


def load_processor(path: str | Path, *, trust_remote_code: bool = False) -> ProcessorMixin | None:
    """The multimodal processor of a vision-language model, or None for a text model."""
    config = read_config(path)
    if not _takes_images(config):
        return None
    try:
        processor = AutoProcessor.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    except (ImportError, OSError):  # the video processor needs torchvision, or its config is missing
        processor = None
    if not isinstance(processor, ProcessorMixin):  # AutoProcessor may fall back to the bare tokenizer
        model_type = config.get("model_type")
        if model_type not in _IMAGE_ONLY:
            message = f"{path}: no image-only processor for model type {model_type!r} (install torchvision)"
            raise ValueError(message)
        processor = _IMAGE_ONLY[model_type].from_pretrained(str(path))
    if config.get("model_type") in _IMAGE_ONLY:
        settings = _video_settings(path) or processor.image_processor.to_dict()
        processor.video_processor = FrameVideoProcessor.from_settings(settings, config["model_type"])
    _ensure_pad(processor.tokenizer)
    return processor


def load_model(
    path: str | Path,
    dtype: torch.dtype = torch.float32,
    attn_implementation: str = "sdpa",
    *,
    trust_remote_code: bool = False,
    weights: bool = True,
    override_config: dict[str, Any] | None = None,
) -> PreTrainedModel:
    """The model with its generation head: causal LM for text, image-text-to-text for vision-language.

    ``weights=False``: the same model with every tensor on the meta device and no weight file read,
    for a rank that receives its shards from rank 0 (``fsdp.enable_rank0_init``).
    ``override_config``: settings of its config to replace (see ``hf_config``).
    """
    auto_class = AutoModelForImageTextToText if is_vision_model(path) else AutoModelForCausalLM
    config = hf_config(path, override_config, trust_remote_code=trust_remote_code)
    with _overrides_named(override_config, config, path):
        if not weights:
            return _on_meta(auto_class, config, path, dtype, attn_implementation, trust_remote_code)
        return _from_pretrained(auto_class, path, config, dtype, attn_implementation, trust_remote_code)


def load_value_model(
    path: str | Path,
    dtype: torch.dtype = torch.float32,
    attn_implementation: str = "sdpa",
    *,
    trust_remote_code: bool = False,
    weights: bool = True,
    override_config: dict[str, Any] | None = None,
) -> PreTrainedModel:
    """A critic: the model's body with a one-output linear head (``score``) at every position.

    This is the token-classification class of the architecture with ``num_labels=1``, as EasyR1
    and veRL build their critics, so a saved critic reloads with ``AutoModelForTokenClassification``.
    The head starts random unless the folder holds one. The dropout before the head is turned off
    (transformers defaults it to 0.1): a value must not change between computing and updating it.
    ``weights=False``: on the meta device, as for ``load_model``; ``override_config`` as there, except
    for those two settings.
    """
    model_type = read_config(path).get("model_type")
    if model_type not in MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES:
        message = f"{path}: model type {model_type!r} has no token-classification (value head) class in transformers"
        raise ValueError(message)
    fixed = {"num_labels": 1, "classifier_dropout": 0.0}
    clash = sorted((override_config or {}).keys() & fixed.keys())
    if clash:
        raise ConfigError(
            f"override_config.{clash[0]}: the critic's value head is fixed at {clash[0]}={fixed[clash[0]]}"
        )
    config = hf_config(path, override_config, trust_remote_code=trust_remote_code)
    config.update(fixed)
    with _overrides_named(override_config, config, path):
        if not weights:
            return _on_meta(
                AutoModelForTokenClassification, config, path, dtype, attn_implementation, trust_remote_code
            )
        return _from_pretrained(
            AutoModelForTokenClassification, path, config, dtype, attn_implementation, trust_remote_code
        )


class ModelLoadError(OSError):
    """A model folder whose weight files cannot be read (truncated, damaged)."""


@contextmanager
def _overrides_named(
    override_config: dict[str, Any] | None, config: PreTrainedConfig, path: str | Path
) -> Iterator[None]:
    """A model that cannot be built with an ``override_config`` value (``hidden_act: bogus``: a raw
    ``KeyError`` from deep in transformers) is a ConfigError naming the key and the value."""
    try:
        yield
    except (KeyError, ValueError, TypeError) as exc:
        culprits = [(key, value) for key, value in (override_config or {}).items() if str(value) in str(exc)]
        if not culprits:
            raise
        key, value = culprits[0]
        raise ConfigError(
            f"override_config.{key}={value}: {type(config).__name__} of {path} cannot be built with it "
            f"({type(exc).__name__}: {exc})"
        ) from None


def _from_pretrained(
    auto_class: type,
    path: str | Path,
    config: PreTrainedConfig,
    dtype: torch.dtype,
    attn_implementation: str,
    trust_remote_code: bool,
) -> PreTrainedModel:
    """``from_pretrained``, a folder whose weights cannot be read named as such: a cut-short
    safetensors file fails deep inside safetensors, with no path in the message."""
    try:
        return auto_class.from_pretrained(
            str(path),
            config=config,
            dtype=dtype,
            attn_implementation=attn_implementation,
            trust_remote_code=trust_remote_code,
        )
    except torch.OutOfMemoryError:
        raise
    except (SafetensorError, OSError, RuntimeError) as exc:
        raise ModelLoadError(f"{path}: cannot load the model's weights: {type(exc).__name__}: {exc}") from exc


def hf_config(
    path: str | Path, override_config: dict[str, Any] | None, *, trust_remote_code: bool
) -> PreTrainedConfig:
    """The model's Hugging Face config with ``override_config`` (``worker.*.model.override_config``)
    applied as EasyR1 applies it, as ``AutoConfig`` keyword overrides (``{"attention_dropout": 0.0}``).
    A key the config lacks, which transformers would drop without a word, is an error naming it. As in
    EasyR1, vLLM reads the folder's own config; the Hugging Face rollout generates with the actor's
    model, overrides included."""
    try:
        config, unused = AutoConfig.from_pretrained(
            str(path),
            trust_remote_code=trust_remote_code,
            return_unused_kwargs=True,
            **(override_config or {}),
        )
    except StrictDataclassError as exc:  # transformers' configs check their fields' types
        raise ConfigError(f"override_config: {exc}") from None
    if unused:
        key = next(iter(unused))
        nested = [name for name in config.sub_configs if hasattr(getattr(config, name, None), key)]
        where = f"; its {nested[0]} has it, and overrides set top-level settings only" if nested else ""
        raise ConfigError(
            f"override_config.{key}: {type(config).__name__} of {path} has no such setting{where}"
        )
    return config


def _on_meta(
    auto_class: Any,
    config: Any,
    path: str | Path,
    dtype: torch.dtype,
    attn_implementation: str,
    trust_remote_code: bool,
) -> PreTrainedModel:
    """What ``from_pretrained`` would return (same classes, dtypes, eval mode, generation config),
    built from the config alone with its tensors on the meta device."""
    with torch.device("meta"):
        model = auto_class.from_config(
            config, dtype=dtype, attn_implementation=attn_implementation, trust_remote_code=trust_remote_code
        )
    if model.can_generate():
        try:
            model.generation_config = GenerationConfig.from_pretrained(str(path))
        except OSError:  # none saved: from_pretrained keeps the one derived from the config too
            pass
    return model.eval()
