"""LoRA for the actor (``worker.actor.model.lora``, EasyR1's keys), through peft.

With ``lora.rank > 0`` the actor's base weights are frozen and only the adapters train. As in
EasyR1, the reference policy is then the actor with its adapters switched off
(``reference_mode``), so no second copy of the base model is loaded. The rollout sees the
adapted policy with each adapter merged into its base weight: the HF backend folds them into the
gathered weights it generates with (``folded``), the vLLM hand-over merges them as it sends each
weight (``workers/sync.py``). Checkpoints keep the adapters apart and save
the adapter config, so ``easyr1 merge`` can write merged weights or a peft adapter.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn

from easyr1.config import ConfigError
from easyr1.models.structure import fsdp_modules
from easyr1.workers.config import LoraConfig


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


def lora_layers(model: nn.Module) -> dict[str, nn.Module]:
    """peft's LoRA layers by module name (duck-typed, so peft need not be installed)."""
    return {
        name: module
        for name, module in model.named_modules()
        if hasattr(module, "base_layer") and hasattr(module, "lora_A") and hasattr(module, "scaling")
    }


@contextmanager
def folded(model: nn.Module) -> Iterator[nn.Module]:
    """The LoRA actor, its full weights gathered by FSDP (``workers.fsdp.gathered``), with each
    active adapter folded into its base weight for the duration: a rollout then runs one matrix
    product per adapted layer instead of three (decoding is bound by such small products; on an
    H200 the 1.5B LoRA cell's generation took 17.4 s against 13.0 for the full model).

    Only the gathered copies change: they are FSDP's all-gather buffers, which ``reshard`` drops,
    and the next gather rebuilds them from the shards that training updates. So nothing is unfolded
    (peft's unmerge subtracts in the weights' dtype and would not give a bf16 weight back exactly);
    the layers are only marked unmerged again. A model that FSDP does not manage is left as it is."""
    layers = (
        [layer for layer in lora_layers(model).values() if not layer.merged] if fsdp_modules(model) else []
    )
    for layer in layers:
        layer.merge()
    try:
        yield model
    finally:
        for layer in layers:
            layer.merged_adapters.clear()
