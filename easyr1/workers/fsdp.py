"""FSDP2 wrapping: one ``fully_shard`` per decoder block, then the root (with the vision tower).

Precision follows EasyR1's keys. AMP (the default, ``fsdp.torch_dtype`` unset for the actor):
parameters and optimizer state stay fp32 and FSDP casts the gathered parameters to
``mp_param_dtype`` (bf16) for compute, reducing gradients in ``mp_reduce_dtype`` (fp32). BF16
(``torch_dtype=bf16``): parameters are bf16 and no casting happens. Floating buffers (rotary
``inv_freq``) are kept in ``mp_buffer_dtype``, as EasyR1's FSDP ``MixedPrecision`` keeps them.

The other EasyR1 keys: ``fsdp_size`` shards over groups of that many ranks and replicates across
the groups (HSDP); ``enable_rank0_init`` has only rank 0 read the weights (see ``parallelize``);
``enable_cpu_offload`` keeps the shards in host memory (FSDP's ``CPUOffloadPolicy``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.utils.checkpoint import checkpoint

from easyr1.distributed.simulated import (
    buffer_values,
    randomize_shards,
    simulated_ranks,
    use_simulated_collectives,
)
from easyr1.models.structure import fsdp_modules, shard_units, text_blocks, vision_tower
from easyr1.workers.config import FSDPConfig
from easyr1.workers.offload import register_host_shards

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def param_dtype(fsdp: FSDPConfig, *, trainable: bool) -> torch.dtype:
    """Storage dtype: fp32 master weights for a trained model under AMP, bf16 for a frozen one."""
    if fsdp.torch_dtype is not None:
        return DTYPES[fsdp.torch_dtype]
    return torch.float32 if trainable else torch.bfloat16


def compute_dtype(fsdp: FSDPConfig, *, trainable: bool) -> torch.dtype:
    stored = param_dtype(fsdp, trainable=trainable)
    return DTYPES[fsdp.mp_param_dtype] if stored == torch.float32 else stored


def compile_blocks(model: torch.nn.Module) -> None:
    """``torch.compile`` each text decoder block's forward, for calls without a KV cache.

    Training and log-prob passes run whole sequences through the blocks, where inductor fuses
    the elementwise work between the matmuls (RMSNorm, rotary embedding, SiLU-and-multiply).
    Decoding calls them one token at a time with a cache, which would recompile at every length,
    so those calls stay eager, as do the vision blocks (their shapes follow the images).

    Each block's class becomes a subclass whose ``forward`` dispatches, so everything Hugging Face
    wraps around a block's ``forward`` stays around it: gradient checkpointing (transformers 5.24
    wraps the class's ``forward``, and checkpoints only in the outermost wrapper) and FSDP's hooks
    stay outside the compiled code, and parameter names (checkpoints, hand-over) do not change.
    A block that recomputes only part of its forward (``models.recompute``) is the exception: its
    checkpoint moves inside the compiled code, where the partitioner sees which outputs to save
    (outside, torch.compile would run the block eagerly under the checkpoint's dispatch mode).
    Call after ``apply_recompute`` and before ``parallelize``.
    """
    classes: dict[type, type] = {}
    for unit in text_blocks(model):
        base = type(unit)
        if base not in classes:
            classes[base] = type(
                f"Compiled{base.__name__}", (base,), {"forward": _dispatching_forward(base.forward)}
            )
        unit.__class__ = classes[base]
        if getattr(unit, "recompute_context", None) is not None:
            unit.gradient_checkpointing = False  # checkpointed inside, by ``_dispatching_forward``


def _dispatching_forward(eager: Any) -> Any:
    compiled = torch.compile(eager)

    def checkpointed(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        return checkpoint(
            partial(eager, self, **kwargs), *args, use_reentrant=False, context_fn=self.recompute_context
        )

    partially_recomputed = torch.compile(checkpointed)

    def forward(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        # transformers 5.24 names the cache ``cache``; earlier 5.x, ``past_key_values``.
        if kwargs.get("cache", kwargs.get("past_key_values")) is not None:
            return eager(self, *args, **kwargs)
        if self.training and torch.is_grad_enabled() and getattr(self, "recompute_context", None) is not None:
            return partially_recomputed(self, *args, **kwargs)
        return compiled(self, *args, **kwargs)

    return forward


def _vision_keepalive(model: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
    """Forward hook: in a training forward without images or videos, run the vision tower on one blank
    2x2-patch image and add 0 * (its output) to the logits.

    The tower's parameters live in the root's FSDP group (see ``parallelize``). In backward the
    root reduce-scatters the gradients of its group; a rank whose batch had no images would have
    no tower gradients, a different size than a rank with images. The zero gives the tower a
    gradient on every rank. The hook runs before FSDP's own post-forward hook, while the root's
    parameters are still gathered.
    """
    if not (torch.is_grad_enabled() and model.training) or any(
        kwargs.get(key) is not None for key in ("pixel_values", "pixel_values_videos")
    ):
        return output
    tower = vision_tower(model)
    cfg = tower.config
    features = cfg.in_channels * cfg.temporal_patch_size * cfg.patch_size**2
    device = output.logits.device
    pixels = torch.zeros((4, features), device=device, dtype=next(tower.parameters()).dtype)
    out = tower(pixels, grid_thw=torch.tensor([[1, 2, 2]], device=device))
    output.logits = output.logits + 0.0 * sum(t.float().sum() for t in _float_tensors(out))
    return output


def _logits_only(model: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
    """Forward hook of a trained model's root, before FSDP's post-forward hook: in a training
    forward, an output that holds no view besides fresh ``logits``, the one field the engine reads.

    FSDP2 warns of each view among a module's outputs (an in-place op on one would skip its
    pre-backward hook). Two outputs held some: a Hugging Face VL model's carries the vision tower's
    own outputs (per-image features split from one tensor), which are dropped; a value head's or a
    Ulysses rank's ``[B, T, k]`` logits are a view of a 2-D result, copied (a few floats a token).
    """
    if not torch.is_grad_enabled() or not hasattr(output, "logits"):
        return output
    tower_outputs = ("image_outputs", "video_outputs")
    if any(output.get(key) is not None for key in tower_outputs):
        output = type(output)(**{key: value for key, value in output.items() if key not in tower_outputs})
    if output.logits._base is not None:
        output.logits = output.logits.clone()
    return output


def _float_tensors(value: Any) -> list[torch.Tensor]:
    """Every floating tensor in a (nested) model output; Qwen3-VL's deepstack features are a list."""
    if isinstance(value, torch.Tensor):
        return [value] if value.is_floating_point() else []
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else []
    return [t for item in items for t in _float_tensors(item)]


def hsdp_mesh(fsdp: FSDPConfig, device: torch.device) -> DeviceMesh | None:
    """HSDP's 2-D mesh for ``fsdp_size``: world / fsdp_size replicas, each sharded over fsdp_size
    ranks; None (FSDP's default, one group of every rank) for -1 or the whole world."""
    world = dist.get_world_size()
    if fsdp.fsdp_size in (-1, world):
        return None
    shape = (world // fsdp.fsdp_size, fsdp.fsdp_size)
    return init_device_mesh(device.type, shape, mesh_dim_names=("replicate", "shard"))


def rank0_init(fsdp: FSDPConfig) -> bool:
    """Whether some ranks build the model on the meta device: all but rank 0, which alone reads the
    weights (``enable_rank0_init``, with more than one rank), or every rank of simulated ranks
    (``distributed/simulated.py``: random shards, no weight file read)."""
    if simulated_ranks() is not None:
        return True
    return fsdp.enable_rank0_init and dist.is_initialized() and dist.get_world_size() > 1


def loads_weights(fsdp: FSDPConfig) -> bool:
    """Whether this rank reads the model's weights; the others build it on the meta device."""
    return not rank0_init(fsdp) or (dist.get_rank() == 0 and simulated_ranks() is None)


def parallelize(
    model: torch.nn.Module,
    fsdp: FSDPConfig,
    *,
    trainable: bool,
    device: torch.device,
    offload_params: bool = False,
) -> FSDPModule:
    """Shard ``model`` in place over the default process group.

    Under ``rank0_init`` only rank 0's ``model`` holds weights; every other rank's is on the meta
    device. Rank 0's full state dict is then scattered into the shards, so no other rank ever holds
    a full copy of the model.

    ``fsdp.enable_cpu_offload``, or ``offload_params`` (the reference's ``offload.offload_params``,
    as EasyR1 maps it): FSDP's ``CPUOffloadPolicy``, the shards in host memory, copied to the
    device for each all-gather. On CPU ranks the shards are in host memory anyway, so it is off.
    A frozen model's host shards are page-locked at their exact size (``register_host_shards``).
    """
    stored = param_dtype(fsdp, trainable=trainable)
    compute = compute_dtype(fsdp, trainable=trainable)
    mp = MixedPrecisionPolicy(
        param_dtype=compute if compute != stored else None,
        reduce_dtype=DTYPES[fsdp.mp_reduce_dtype] if trainable else None,
        output_dtype=None,
    )
    cpu_offload = (fsdp.enable_cpu_offload or offload_params) and device.type == "cuda"
    kwargs = {
        "mesh": hsdp_mesh(fsdp, device),
        "mp_policy": mp,
        "reshard_after_forward": fsdp.enable_full_shard,
        # A frozen model's shards are page-locked at their exact size afterwards (register_host_shards);
        # a trained one's gradients need FSDP's own pinned copies.
        "offload_policy": CPUOffloadPolicy(pin_memory=trainable) if cpu_offload else None,
    }
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    _buffers_to(model, dtype=DTYPES[fsdp.mp_buffer_dtype])
    simulated = simulated_ranks() is not None
    buffers = buffer_values(model) if simulated else {}  # while the modules that compute them are whole
    # Rank 0's full tensors, kept (in host memory when it loaded them there) until they are scattered.
    full_state = model.state_dict() if rank0_init(fsdp) and loads_weights(fsdp) else {}
    # Vision blocks stay in the root's group: with mixed text and image batches, a rank without
    # images would skip their all-gathers while another rank runs them, a collective mismatch.
    # The root's group is gathered on every rank at every forward, whatever the batch holds.
    tower = vision_tower(model)
    in_tower = set(map(id, tower.modules())) if tower is not None else set()
    for unit in shard_units(model):
        if id(unit) not in in_tower:
            fully_shard(unit, **kwargs)
    fully_shard(model, **kwargs)
    if simulated:
        _materialize(model, device, shards_on_host=cpu_offload)
        randomize_shards(model, buffers, device)
        use_simulated_collectives(model)
    elif rank0_init(fsdp):
        _scatter_from_rank0(model, full_state, device, shards_on_host=cpu_offload)
        del full_state
    if trainable:
        model.register_forward_hook(_logits_only, with_kwargs=True, prepend=True)
    if tower is not None and trainable:  # registered last, so it runs first: it adds to the logits
        model.register_forward_hook(_vision_keepalive, with_kwargs=True, prepend=True)
    # FSDP2 initialises lazily at the root's first forward. A VLM's generate() can run the
    # vision blocks before that, which FSDP2 rejects; a one-token text forward settles it.
    with torch.no_grad():
        model(input_ids=torch.zeros((1, 1), dtype=torch.long, device=device), use_cache=False)
    if cpu_offload and not trainable:  # after lazy initialisation, which may replace the shards
        register_host_shards(model)
    return model  # type: ignore[return-value]


def _buffers_to(
    model: torch.nn.Module, *, device: torch.device | None = None, dtype: torch.dtype | None = None
) -> None:
    """Every buffer to ``device``, the floating ones also to ``dtype``."""
    for module in model.modules():
        for name, buffer in module.named_buffers(recurse=False):
            cast = dtype if dtype is not None and buffer.is_floating_point() else buffer.dtype
            setattr(module, name, buffer.to(device=device or buffer.device, dtype=cast))


def _materialize(model: torch.nn.Module, device: torch.device, *, shards_on_host: bool) -> None:
    """Allocate (uninitialised) this rank's shards of a model sharded on the meta device, in host
    memory under CPU offload, and its buffers on ``device``."""
    model.to_empty(device=torch.device("cpu") if shards_on_host else device)
    if shards_on_host:  # buffers live on the device, whatever the policy does with the shards
        _buffers_to(model, device=device)


def _scatter_from_rank0(
    model: torch.nn.Module, full_state: dict[str, torch.Tensor], device: torch.device, *, shards_on_host: bool
) -> None:
    """Fill every rank's shards from rank 0's ``full_state`` (one tensor at a time), then copy rank
    0's buffers: the non-persistent ones (rotary ``inv_freq``) are in no state dict, and on the
    other ranks they are still uninitialised."""
    if dist.get_rank() != 0:
        _materialize(model, device, shards_on_host=shards_on_host)
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, full_state, options=options)
    with torch.no_grad():
        for buffer in model.buffers():
            dist.broadcast(buffer, src=0)


@contextmanager
def gathered(model: torch.nn.Module, fsdp: FSDPConfig) -> Iterator[torch.nn.Module]:
    """Keep every block's full parameters gathered for the duration (e.g. a whole ``generate``),
    with FSDP's forward hooks set aside.

    Without this, each decoding step would all-gather every block again; with it, the blocks are
    gathered once and released at the end (the HybridEngine hand-over for the HF backend). Once
    everything is gathered FSDP's hooks have nothing left to do, yet they would still run around
    every module at every decoding step: 0.45 ms per module per step on a CPU here, seconds per
    rollout for a 28-block model. So the modules' forward hook tables are swapped for empty ones
    and put back, unchanged, on exit. (Inputs then reach the model uncast: Hugging Face models
    cast pixel values to the vision tower's dtype themselves.)
    """
    modules = fsdp_modules(model)
    for module in modules:
        module.set_reshard_after_forward(False, recurse=False)
        module.unshard()
    hooks = [(module, module._forward_pre_hooks, module._forward_hooks) for module in modules]
    for module in modules:
        module._forward_pre_hooks, module._forward_hooks = OrderedDict(), OrderedDict()
    try:
        yield model
    finally:
        for module, pre, post in hooks:
            module._forward_pre_hooks, module._forward_hooks = pre, post
        for module in modules:
            module.reshard()
            module.set_reshard_after_forward(fsdp.enable_full_shard, recurse=False)
