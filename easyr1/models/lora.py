"""LoRA for the actor (``worker.actor.model.lora``, EasyR1's keys), through peft.

With ``lora.rank > 0`` the actor's base weights are frozen and only the adapters train. As in
EasyR1, the reference policy is then the actor with its adapters switched off
(``reference_mode``), so no second copy of the base model is loaded. The rollout sees the
adapted policy: the HF backend runs the peft model itself, and the vLLM hand-over merges each
adapter into its base weight (``workers/sync.py``). Checkpoints keep the adapters apart and save
the adapter config, so ``easyr1 merge`` can write merged weights or a peft adapter.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from torch import nn

from easyr1.config import ConfigError, LoraConfig


def target_modules(value: str) -> str | list[str]:
    """EasyR1's form: ``all-linear`` or comma-separated module names."""
    if value == "all-linear":
        return value
    names = [item.strip() for item in value.split(",") if item.strip()]
    if not names:
        raise ConfigError(f"worker.actor.model.lora.target_modules: no module names in {value!r}")
    return names


def apply_lora(model: nn.Module, lora: LoraConfig) -> nn.Module:
    """``model`` with LoRA adapters of ``lora.rank`` on ``lora.target_modules`` (all the linear
    layers but the output head by default), its other parameters frozen."""
    try:
        from peft import LoraConfig as PeftLoraConfig
        from peft import get_peft_model
    except ImportError:
        raise ConfigError("worker.actor.model.lora.rank > 0 needs peft: pip install -e '.[lora]'") from None
    config = PeftLoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        target_modules=target_modules(lora.target_modules),
        exclude_modules=lora.exclude_modules,
        task_type="CAUSAL_LM",
    )
    # With the embeddings frozen, the first block's input would need no gradient except on a
    # rank whose batch has images (the vision adapters' output joins the embeddings). FSDP2
    # reduces a block's gradients when the backward pass reaches its input, so ranks with and
    # without images would reduce in different orders, a collective mismatch. An embedding
    # output that always requires grad keeps every rank in the same order.
    model.enable_input_require_grads()
    try:
        return get_peft_model(model, config)
    except ValueError as exc:  # peft names the modules it could not find
        raise ConfigError(f"worker.actor.model.lora: {exc}") from None


def is_lora(model: nn.Module) -> bool:
    return hasattr(model, "disable_adapter") and hasattr(model, "peft_config")


@contextmanager
def reference_mode(model: nn.Module) -> Iterator[nn.Module]:
    """The LoRA actor with its adapters switched off: the base model, the reference policy."""
    with model.disable_adapter():
        yield model
