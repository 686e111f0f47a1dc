"""Actor -> rollout weight hand-over, one bucket of full tensors at a time.

The FSDP2 actor holds 1/world of each tensor. A rollout engine with its own copy of the model
(vLLM) needs every tensor whole, named as in the Hugging Face checkpoint. Gathering the whole
model at once would cost a second full copy per GPU; instead tensors are gathered one by one
(``DTensor.full_tensor``), cast to the rollout dtype, and handed out in buckets of at most
``bucket_bytes``, so the extra memory is one bucket (plus one tensor being gathered).

Names are the Hugging Face model's ``state_dict`` keys: wrapper prefixes (FSDP1,
activation-checkpoint wrapper, ``torch.compile``, peft) are stripped; a tied ``lm_head`` is
left out, as checkpoints leave it out and vLLM skips it. For Qwen-VL these are transformers 5's
module names (``model.language_model.*``, ``model.visual.*``), not the older ones its folders
store: vLLM 0.24's Qwen2/2.5-VL weight mappers take both, its Qwen3-VL mapper only these. A peft (LoRA) actor is handed
over merged, ``W + B @ A * scaling`` per adapted layer, without the ``lora_*`` tensors: the
rollout engine runs the plain architecture.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from easyr1.models.lora import lora_layers

DEFAULT_BUCKET_BYTES = 512 * 2**20
_WRAPPER_PREFIXES = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.")
_PEFT_PREFIX = "base_model.model."
_BASE_LAYER = ".base_layer."


def hf_name(name: str) -> str:
    """A parameter's name in the wrapped (FSDP, checkpointing, compile, peft) model -> its checkpoint name."""
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    if name.startswith(_PEFT_PREFIX):
        name = name[len(_PEFT_PREFIX) :]
    return name.replace(_BASE_LAYER, ".")


def _whole(tensor: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The full tensor of a (possibly sharded) parameter; casting first halves the gather for fp32 -> bf16."""
    tensor = tensor.detach()
    if dtype is not None and tensor.is_floating_point():
        tensor = tensor.to(dtype)
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def _merged_weight(layer: nn.Module, weight: torch.Tensor) -> torch.Tensor:
    """``W + sum over active adapters of B @ A * scaling``, in fp32 (every rank gathers A and B alike)."""
    merged = _whole(weight).float()
    if getattr(layer, "merged", False) or getattr(layer, "disable_adapters", False):
        return merged  # peft already folded the adapters in, or they are switched off
    for adapter in layer.active_adapters:
        if adapter not in layer.lora_A:
            continue
        if getattr(layer, "use_dora", {}).get(adapter, False):
            raise NotImplementedError("handing a DoRA adapter to the rollout engine is not supported")
        delta = _whole(layer.lora_B[adapter].weight).float() @ _whole(layer.lora_A[adapter].weight).float()
        if getattr(layer, "fan_in_fan_out", False):
            delta = delta.T
        merged += delta * layer.scaling[adapter]
    return merged


@torch.no_grad()
def full_weights(model: nn.Module, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """(checkpoint name, full tensor cast to ``dtype``) for every parameter and persistent buffer.

    Collective under FSDP: every rank must consume the whole iterator, in step with the others.
    Integer buffers keep their dtype.
    """
    lora = lora_layers(model)
    seen: set[int] = set()
    for name, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) in seen:  # tied weights: the first name (the input embedding) stands for both
            continue
        seen.add(id(tensor))
        if ".lora_" in name:
            continue  # folded into the base weight below
        owner, _, leaf = name.rpartition(".")
        layer = lora.get(owner.removesuffix(_BASE_LAYER[:-1])) if owner.endswith(_BASE_LAYER[:-1]) else None
        if layer is not None and leaf == "weight":
            yield hf_name(name), _merged_weight(layer, tensor).to(dtype)
        else:
            yield hf_name(name), _whole(tensor, dtype)


def weight_buckets(
    model: nn.Module, dtype: torch.dtype, bucket_bytes: int = DEFAULT_BUCKET_BYTES
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """``full_weights`` grouped into lists of at most ``bucket_bytes`` (a larger tensor comes alone).

    The consumer should drop each bucket before asking for the next, or two are alive at once.
    """
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in full_weights(model, dtype):
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket
