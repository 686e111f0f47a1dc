"""FSDP2 wrapping: one ``fully_shard`` per decoder block and vision block, then the root.

Precision follows EasyR1's keys. AMP (the default, ``fsdp.torch_dtype`` unset for the actor):
parameters and optimizer state stay fp32 and FSDP casts the gathered parameters to
``mp_param_dtype`` (bf16) for compute, reducing gradients in ``mp_reduce_dtype`` (fp32). BF16
(``torch_dtype=bf16``): parameters are bf16 and no casting happens.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard

from easyr1.config import FSDPConfig

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def param_dtype(fsdp: FSDPConfig, *, trainable: bool) -> torch.dtype:
    """Storage dtype: fp32 master weights for a trained model under AMP, bf16 for a frozen one."""
    if fsdp.torch_dtype is not None:
        return DTYPES[fsdp.torch_dtype]
    return torch.float32 if trainable else torch.bfloat16


def compute_dtype(fsdp: FSDPConfig, *, trainable: bool) -> torch.dtype:
    stored = param_dtype(fsdp, trainable=trainable)
    return DTYPES[fsdp.mp_param_dtype] if stored == torch.float32 else stored


def shard_units(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The blocks to shard one by one: the classes Hugging Face marks as not to be split."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    if not names:
        raise ValueError(f"{type(model).__name__} declares no _no_split_modules; cannot find its blocks")
    return [m for m in model.modules() if type(m).__name__ in names]


def parallelize(model: torch.nn.Module, fsdp: FSDPConfig, *, trainable: bool, device: torch.device) -> FSDPModule:
    """Shard ``model`` in place over the default process group."""
    stored = param_dtype(fsdp, trainable=trainable)
    compute = compute_dtype(fsdp, trainable=trainable)
    mp = MixedPrecisionPolicy(
        param_dtype=compute if compute != stored else None,
        reduce_dtype=DTYPES[fsdp.mp_reduce_dtype] if trainable else None,
        output_dtype=None,
    )
    kwargs = {
        "mp_policy": mp,
        "reshard_after_forward": fsdp.enable_full_shard,
        "offload_policy": CPUOffloadPolicy() if fsdp.enable_cpu_offload and device.type == "cuda" else None,
    }
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    for unit in shard_units(model):
        fully_shard(unit, **kwargs)
    fully_shard(model, **kwargs)
    # FSDP2 initialises lazily at the root's first forward. A VLM's generate() can run the
    # vision blocks before that, which FSDP2 rejects; a one-token text forward settles it.
    with torch.no_grad():
        model(input_ids=torch.zeros((1, 1), dtype=torch.long, device=device), use_cache=False)
    return model  # type: ignore[return-value]


def fsdp_modules(model: torch.nn.Module) -> list[FSDPModule]:
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


@contextmanager
def gathered(model: torch.nn.Module, fsdp: FSDPConfig) -> Iterator[torch.nn.Module]:
    """Keep every block's full parameters gathered for the duration (e.g. a whole ``generate``).

    Without this, each decoding step would all-gather every block again; with it, the blocks are
    gathered once and released at the end (the HybridEngine hand-over for the HF backend).
    """
    modules = fsdp_modules(model)
    for module in modules:
        module.set_reshard_after_forward(False, recurse=False)
        module.unshard()
    try:
        yield model
    finally:
        for module in modules:
            module.reshard()
            module.set_reshard_after_forward(fsdp.enable_full_shard, recurse=False)
