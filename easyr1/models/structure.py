"""Where a model keeps its parts: decoder blocks, vision tower, language model, FSDP units.

Hugging Face models name these differently across families and under a peft wrapper; every
layer that needs a model's blocks (sharding, checkpointing, compiling, LoRA, the memory model)
finds them here, one way.
"""

from __future__ import annotations

import torch
from torch.distributed.fsdp import FSDPModule


def shard_units(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The blocks to shard one by one: the classes Hugging Face marks as not to be split (or their
    subclasses, such as ``workers.fsdp.compile_blocks``')."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    if not names:
        raise ValueError(f"{type(model).__name__} declares no _no_split_modules; cannot find its blocks")
    return [m for m in model.modules() if any(c.__name__ in names for c in type(m).__mro__)]


def base_model(model: torch.nn.Module) -> torch.nn.Module:
    """The Hugging Face model itself: under a peft wrapper, its base model."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def vision_tower(model: torch.nn.Module) -> torch.nn.Module | None:
    """The vision encoder of a Qwen-VL model (``model.model.visual``; under a peft wrapper, its
    base model's), or None for text models."""
    return getattr(getattr(base_model(model), "model", None), "visual", None)


def text_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder blocks, in order: ``shard_units`` without the vision tower's."""
    tower = vision_tower(model)
    in_tower = set(map(id, tower.modules())) if tower is not None else set()
    return [unit for unit in shard_units(model) if id(unit) not in in_tower]


def language_model(model: torch.nn.Module) -> torch.nn.Module:
    """The decoder stack (a Qwen-VL model's text model), whose inputs Ulysses slices (``models.ulysses``)."""
    inner = base_model(model).model
    return getattr(inner, "language_model", inner)


def fsdp_modules(model: torch.nn.Module) -> list[FSDPModule]:
    """The modules ``fully_shard`` has wrapped (none before sharding)."""
    return [m for m in model.modules() if isinstance(m, FSDPModule)]
