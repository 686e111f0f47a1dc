"""Parameters and optimizer state in host memory between the phases that use them
(``worker.{actor,critic}.offload``), as EasyR1 and veRL do.

A trained model's sharded parameters (and gradients, if any) go to the host after the weight
hand-over to the rollout engine and after each pass over the batch (log-probs, values, update),
and come back to the device before the next; its optimizer state is on the device for the update
only. The device memory they free goes to the rollout engine's KV cache and to activations.

FSDP2 supports moving a sharded module: ``FSDPModule._apply`` reshards first and re-registers the
moved local shards, and the parameter objects stay the same, so the optimizer still holds them.
Every function takes the target device explicitly; on CPU ranks the compute device is host
memory, so there every move is a no-op.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
from torch import nn

from easyr1.config import OffloadConfig

HOST = torch.device("cpu")


@torch.no_grad()
def offload_model(model: nn.Module) -> None:
    """Parameters, gradients and buffers to host memory."""
    model.to(HOST)
    _release_cached_memory()


@torch.no_grad()
def load_model(model: nn.Module, device: torch.device) -> None:
    model.to(device)


def offload_optimizer(optimizer: torch.optim.Optimizer) -> None:
    _move_state(optimizer, HOST)
    _release_cached_memory()


def load_optimizer(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    _move_state(optimizer, device)


@torch.no_grad()
def _move_state(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """Each state tensor to ``device``, one at a time (so at most one extra tensor is alive). Scalars
    (Adam's step counts) stay where the optimizer keeps them: on the host for the default AdamW, on
    the device for fused or capturable ones."""
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                state[key] = value.to(device)


def _release_cached_memory() -> None:
    """Hand the freed blocks back to the driver, so that the rollout engine can have them."""
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class Offloader:
    """One trained model's offload settings, applied around each phase that uses the model."""

    def __init__(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, config: OffloadConfig, device: torch.device
    ) -> None:
        self.model, self.optimizer, self.device = model, optimizer, device
        self.params, self.optimizer_state = config.offload_params, config.offload_optimizer

    def load(self, *, optimizer: bool = False) -> None:
        """The parameters, and with ``optimizer`` the optimizer state, to the device (where offloaded)."""
        if self.params:
            load_model(self.model, self.device)
        if optimizer and self.optimizer_state:
            load_optimizer(self.optimizer, self.device)

    def offload(self, *, optimizer: bool = False) -> None:
        """The parameters, and with ``optimizer`` the optimizer state, to the host (where offloaded)."""
        if self.params:
            offload_model(self.model)
        if optimizer and self.optimizer_state:
            offload_optimizer(self.optimizer)

    @contextmanager
    def on_device(self, *, optimizer: bool = False) -> Iterator[None]:
        """``load`` for the duration, then ``offload``."""
        self.load(optimizer=optimizer)
        yield
        self.offload(optimizer=optimizer)
