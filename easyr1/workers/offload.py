"""Parameters and optimizer state in host memory between the phases that use them
(``worker.{actor,critic}.offload``), as EasyR1 and veRL do.

A trained model's sharded parameters (and gradients, if any) go to the host after the weight
hand-over to the rollout engine and after each pass over the batch (log-probs, values, update),
and come back to the device before the next; its optimizer state is on the device for the update
only. The device memory they free goes to the rollout engine's KV cache and to activations.

FSDP2 supports moving a sharded module: ``FSDPModule._apply`` reshards first and re-registers the
moved local shards, and the parameter objects stay the same, so the optimizer still holds them.
Every function takes the target device explicitly; on CPU ranks the compute device is host
memory, so there a move changes nothing (after the first offload the host buffers are the
parameters and the optimizer state themselves).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from easyr1.workers.config import OffloadConfig

HOST = torch.device("cpu")


# Host copies kept across steps, by (id of the parameter, what): allocated at the first offload,
# page-locked where CUDA is present, so each later offload is an asynchronous copy at the bus's
# speed instead of a fresh pageable allocation (about 3 GB/s on the H200 host: 15.6 s of the AMP
# anchor's 16.9 s update). On CPU ranks a tensor becomes its buffer at the first offload, and
# each later copy is onto itself.
HostBuffers = dict[tuple[int, str], torch.Tensor]


def _unregister(pointer: int) -> None:
    torch.cuda.synchronize()  # no copy may still be reading or writing the range
    torch.cuda.cudart().cudaHostUnregister(pointer)


def _register(tensor: torch.Tensor, owner: object) -> None:
    """Page-lock ``tensor``'s host memory in place (all of its storage) until ``owner`` is freed."""
    storage = tensor.untyped_storage()
    pointer, nbytes = storage.data_ptr(), storage.nbytes()
    cudart = torch.cuda.cudart()
    error = cudart.cudaHostRegister(pointer, nbytes, 0)
    if error != cudart.cudaError.success:
        raise RuntimeError(
            f"cudaHostRegister of {nbytes} bytes of host memory: {cudart.cudaGetErrorString(error)}"
        )
    # At exit the process's memory goes anyway, and CUDA may be gone before the finalizer runs.
    weakref.finalize(owner, _unregister, pointer).atexit = False


def register_host_shards(model: nn.Module) -> None:
    """Page-lock a frozen model's FSDP2 shards kept in host memory (``CPUOffloadPolicy(pin_memory=False)``)
    at their exact size, for the same reason as ``host_buffer``: FSDP2's own pinning rounds each shard
    up to a power of two. Each shard's storage is registered once, for as long as its parameter lives."""
    seen: set[int] = set()
    for param in model.parameters():
        local = param.to_local() if isinstance(param, DTensor) else param
        pointer = local.untyped_storage().data_ptr()
        if local.device.type == "cpu" and local.numel() and pointer not in seen:
            seen.add(pointer)
            _register(local, param)


def host_buffer(shape: torch.Size, dtype: torch.dtype, pinned: bool) -> torch.Tensor:
    """An empty host tensor of exactly its size, page-locked when ``pinned``. Not ``pin_memory=True``:
    torch's pinned allocator rounds every block up to a power of two, so a 7B model's 272 MB MLP
    weights took 512 MiB each (the 7B LoRA run held 59 GiB of host memory for 28 GiB of parameters,
    2026-12-02). Plain memory registered with CUDA is as fast to copy and costs its size; it is
    unregistered when the buffer is freed."""
    buffer = torch.empty(shape, dtype=dtype)
    if pinned and buffer.numel():
        _register(buffer, buffer)
    return buffer


def _into_buffer(
    value: torch.Tensor, buffers: HostBuffers, key: tuple[int, str], pinned: bool
) -> torch.Tensor:
    """``value`` copied into its host buffer, as the same kind of tensor (FSDP2's DTensors: this
    rank's shard goes into the buffer, wrapped with the same spec: mesh, placements and global
    shape). Not ``DTensor.from_local``: it moves a local tensor onto the mesh's device, so on CUDA
    the "offloaded" shard would be a fresh device copy and nothing would leave the GPU."""
    local = value.to_local() if isinstance(value, DTensor) else value
    buffer = buffers.get(key)
    if buffer is None or buffer.shape != local.shape or buffer.dtype != local.dtype:
        buffer = buffers[key] = host_buffer(local.shape, local.dtype, pinned)
    buffer.copy_(local, non_blocking=pinned)
    if not isinstance(value, DTensor):
        return buffer
    return DTensor(buffer, value._spec, requires_grad=False)  # what DTensor.to("cpu") returns, in our buffer


@torch.no_grad()
def offload_model(model: nn.Module, buffers: HostBuffers) -> None:
    """Parameters into their host buffers; gradients (rarely alive here) and module buffers to host
    memory. ``_apply`` is what ``Module.to`` runs: FSDP2 reshards first and re-registers the shards."""
    pinned = torch.cuda.is_available()

    def to_host(t: torch.Tensor) -> torch.Tensor:
        if isinstance(t, nn.Parameter):  # the same objects every step (tied ones twice: one buffer)
            return _into_buffer(t, buffers, (id(t), "param"), pinned)
        return t.to(HOST)

    model._apply(to_host)
    _check_on_host("parameter", model.parameters())
    _release_cached_memory()


@torch.no_grad()
def load_model(model: nn.Module, device: torch.device) -> None:
    model.to(device, non_blocking=True)  # from pinned buffers: asynchronous, ordered on the current stream


@torch.no_grad()
def offload_optimizer(optimizer: torch.optim.Optimizer, buffers: HostBuffers) -> None:
    """Each state tensor into its host buffer. Scalars (Adam's step counts) stay where the optimizer
    keeps them: on the host for the default AdamW, on the device for fused or capturable ones."""
    pinned = torch.cuda.is_available()
    for param, state in optimizer.state.items():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                state[key] = _into_buffer(value, buffers, (id(param), key), pinned)
    _check_on_host(
        "optimizer state",
        (
            v
            for state in optimizer.state.values()
            for v in state.values()
            if isinstance(v, torch.Tensor) and v.dim() > 0
        ),
    )
    _release_cached_memory()


def _check_on_host(what: str, tensors: Iterable[torch.Tensor]) -> None:
    """An offload that leaves a tensor on the device frees nothing and says nothing: refuse it (a
    wrapper that moved shards back once hid exactly this on the H200)."""
    for t in tensors:
        local = t.to_local() if isinstance(t, DTensor) else t
        if local.device.type != "cpu":
            raise RuntimeError(f"offload left a {what} of shape {tuple(local.shape)} on {local.device}")


@torch.no_grad()
def load_optimizer(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """Each state tensor to ``device``; from pinned buffers the copies are asynchronous, ordered on the
    current stream before the update that reads them (and before the next offload writes the buffers)."""
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                state[key] = value.to(device, non_blocking=True)


def _release_cached_memory() -> None:
    """Hand the freed blocks back to the driver, so that the rollout engine can have them, once the
    copies out of them have finished."""
    if torch.cuda.is_available():
        torch.cuda.current_stream().synchronize()
        torch.cuda.empty_cache()


class Offloader:
    """One trained model's offload settings, applied around each phase that uses the model."""

    def __init__(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, config: OffloadConfig, device: torch.device
    ) -> None:
        self.model, self.optimizer, self.device = model, optimizer, device
        self.params, self.optimizer_state = config.offload_params, config.offload_optimizer
        self.host: HostBuffers = {}  # the parameters' and optimizer state's host copies, kept across steps

    def load(self, *, optimizer: bool = False) -> None:
        """The parameters, and with ``optimizer`` the optimizer state, to the device (where offloaded)."""
        if self.params:
            load_model(self.model, self.device)
        if optimizer and self.optimizer_state:
            load_optimizer(self.optimizer, self.device)

    def offload(self, *, optimizer: bool = False) -> None:
        """The parameters, and with ``optimizer`` the optimizer state, to the host (where offloaded)."""
        if self.params:
            offload_model(self.model, self.host)
        if optimizer and self.optimizer_state:
            offload_optimizer(self.optimizer, self.host)

    @contextmanager
    def on_device(self, *, optimizer: bool = False) -> Iterator[None]:
        """``load`` for the duration, then ``offload``."""
        self.load(optimizer=optimizer)
        yield
        self.offload(optimizer=optimizer)
