"""Simulated ranks: rank 0 of an N-rank job, alone in one process, with every allocation real.

``EASYR1_SIMULATED_RANKS=N`` (set by ``easyr1 bench --simulated-ranks N`` and ``easyr1 memory
--measure``; the launcher then starts one process, rank 0 of N) makes the rank join torch's fake
process group (``torch.testing._internal.distributed.fake_pg``: collectives return at once and talk
to no one) as rank 0 of N. FSDP2 then shards parameters, gradients and optimizer state as for N
ranks, and allocates its all-gather and reduce-scatter buffers at their N-rank sizes: what one GPU
of the real job holds, measured on one GPU.

What the others' data would have been is made up, so that a random model stays finite:

- FSDP2's all-gather (``ZeroedAllGather``): the output buffer is allocated as FSDP2 allocates it;
  rank 0's own shards are already in their slot (FSDP2 copies them in before the collective) and
  every other rank's slot is zero-filled. Torch's fake all-gather instead copies rank 0's input
  into every slot (or, in older releases, nothing), which ``torch.empty`` leaves as whatever the
  allocator held: zeros make every gathered parameter a defined, finite tensor whatever the release.
- FSDP2's reduce-scatter (``OwnReduceScatter``): rank 0's gradient shard is its own contribution,
  as if every rank had computed the same gradient (the fake group writes nothing into the output,
  which FSDP2 allocates uninitialised).
- The trainer's own collectives: under the fake group an all-reduce leaves rank 0's value, a
  broadcast from rank 0 keeps it, and an all-gather (of objects too) gives every rank rank 0's
  value, so the batch layout sees N equal ranks and rank 0 trains on its 1/N share of the global
  batch. A maximum or minimum over ranks (peaks, ``dynamic_batching``'s agreed count, the smallest
  GPU) is rank 0's own, as it is for N equal ranks; so is a loss's global token count (rank 0's
  loss normalised by its own tokens: gradients of the same shapes, at another scale). The metric sums (``metrics.all_reduce_sums``) are multiplied
  by N, the sums of N ranks like rank 0, so that means and per-GPU rates come out as rank 0's.
- The Hugging Face rollout of a text model decodes ``DECODE_STEPS`` steps and continues each response
  with its last token up to the length limit (``rollout.decode.fast_forward``): its static KV cache is
  whole from the prefill on, so the rest of the decoding would allocate nothing new, and at 32B it
  took 329 s of a step (every block gathered at every token), past what a ten-minute run of two
  steps holds. The responses keep their full length, so every later phase allocates as it would.
- Ulysses' all-to-all would leave other ranks' sequence parts unwritten: refused, with vLLM, whose
  engine would need the other ranks' processes (``check_simulated``).

The model is never whole: it is built on the meta device, sharded, and only rank 0's shards are
allocated and randomly initialised (``randomize_shards``), so a 72B model as rank 0 of 16 needs a
sixteenth of its bytes.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from easyr1.config import ConfigError, PPOConfig

# torch is imported where a rank uses it: the launcher reads this module to start the one rank, and
# starts sooner without torch.
if TYPE_CHECKING:
    import torch
    import torch.distributed as dist

SIMULATED_RANKS_ENV = "EASYR1_SIMULATED_RANKS"
# Decoding steps a simulated rank runs before fast-forwarding its responses (the module's docstring).
DECODE_STEPS = 32


def simulated_ranks() -> int | None:
    """N where this process simulates rank 0 of N ranks (``$EASYR1_SIMULATED_RANKS``), else None."""
    value = os.environ.get(SIMULATED_RANKS_ENV)
    if not value:
        return None
    try:
        ranks = int(value)
    except ValueError:
        ranks = 0
    if ranks < 1:
        raise ValueError(f"{SIMULATED_RANKS_ENV}={value!r}: expected a number of ranks (1 or more)")
    return ranks


def check_simulated(config: PPOConfig) -> None:
    """What simulated ranks cannot run, refused before any model loads."""
    rollout = config.worker.rollout.name
    if rollout != "hf":
        raise ConfigError(
            f"worker.rollout.name={rollout}: simulated ranks run the Hugging Face rollout only (vLLM would need "
            "the other ranks' processes): set worker.rollout.name=hf"
        )
    for worker in ("actor", "critic"):
        size = getattr(config.worker, worker).ulysses_size
        if size > 1:
            raise ConfigError(
                f"worker.{worker}.ulysses_size={size}: simulated ranks cannot run Ulysses sequence parallelism "
                "(its all-to-all would leave the other ranks' parts unwritten)"
            )
    if config.trainer.save_freq > 0:
        raise ConfigError(
            f"trainer.save_freq={config.trainer.save_freq}: simulated ranks save no checkpoint (rank 0 holds "
            "only its shards of a random model): set trainer.save_freq=-1"
        )


def init_fake_group(world: int) -> None:
    """Join torch's fake process group as rank 0 of ``world``."""
    import torch.distributed as dist
    import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers the "fake" backend)
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)


class ZeroedAllGather:
    """FSDP2's all-gather under the fake group: the output allocated as FSDP2's default does, this
    rank's slot left as FSDP2 filled it, every other slot zeroed (``FSDPModule.set_custom_all_gather``)."""

    def allocate(self, size: Sequence[int], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        import torch

        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: dist.ProcessGroup,
        async_op: bool = False,
    ) -> None:
        own = input_tensor.numel()
        rank = group.rank()
        output_tensor[: rank * own].zero_()
        output_tensor[(rank + 1) * own :].zero_()
        return None  # done on the current stream: nothing to wait for


class OwnReduceScatter:
    """FSDP2's reduce-scatter under the fake group: this rank's shard of its own gradient, as if
    every rank had computed the same one (``FSDPModule.set_custom_reduce_scatter``)."""

    def allocate(self, size: Sequence[int], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        import torch

        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: dist.ProcessGroup,
        op: Any,
        async_op: bool = False,
    ) -> None:
        import torch.distributed as dist

        own = output_tensor.numel()
        shard = input_tensor[group.rank() * own : (group.rank() + 1) * own]
        # An average of N equal gradients is the gradient; a sum (pre- and post-divided by FSDP2) is N of them.
        output_tensor.copy_(shard)
        if op != dist.ReduceOp.AVG:
            output_tensor.mul_(group.size())
        return None


def use_simulated_collectives(model: torch.nn.Module) -> None:
    """FSDP2's all-gathers and reduce-scatters of every FSDP module of ``model`` as above."""
    import torch
    from torch.distributed.fsdp import FSDPModule

    gather, scatter = ZeroedAllGather(), OwnReduceScatter()
    for module in model.modules():
        if isinstance(module, FSDPModule):
            if not hasattr(module, "set_custom_reduce_scatter"):
                raise RuntimeError(
                    f"simulated ranks need FSDP2's custom collectives, which torch {torch.__version__} lacks"
                )
            module.set_custom_all_gather(gather)  # type: ignore[arg-type]
            module.set_custom_reduce_scatter(scatter)  # type: ignore[arg-type]


def buffer_values(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The values of ``model``'s buffers, which are on the meta device: each module that owns one is
    copied to the host and initialised as Hugging Face initialises it (rotary frequencies).
    Call before the model is materialised; ``ValueError`` names a buffer nothing initialises."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    values: dict[str, torch.Tensor] = {}
    for path, module in model.named_modules():
        own = dict(module.named_buffers(recurse=False))
        if not own:
            continue
        twin = copy.deepcopy(module).to_empty(device="cpu", recurse=False)
        for buffer in twin.buffers(recurse=False):
            buffer.fill_(float("nan") if buffer.is_floating_point() else -1)
        base._init_weights(twin)
        for name, buffer in twin.named_buffers(recurse=False):
            unset = buffer.isnan().any() if buffer.is_floating_point() else (buffer == -1).any()
            if unset:
                raise ValueError(
                    f"simulated ranks: nothing initialises buffer {path}.{name} of {type(module).__name__}"
                )
            values[f"{path}.{name}" if path else name] = buffer
    return values


def randomize_shards(model: torch.nn.Module, buffers: dict[str, torch.Tensor], device: torch.device) -> None:
    """Random values in this rank's shards of a materialised (``to_empty``) sharded model, as Hugging
    Face initialises a new model: normal(0, initializer_range) weights, zero biases, unit norm
    weights, zero LoRA B (the adapters start as the base model); and ``buffers`` copied in.
    Shards in host memory are drawn on ``device`` and copied over."""
    import torch
    from torch.distributed.tensor import DTensor

    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    std = getattr(config, "initializer_range", None) or 0.02
    with torch.no_grad():
        for path, module in model.named_modules():
            norm = "Norm" in type(module).__name__
            for name, param in module.named_parameters(recurse=False):
                local = param.to_local() if isinstance(param, DTensor) else param
                if name == "bias" or ".lora_B." in f".{path}.":
                    local.zero_()
                elif norm:
                    local.fill_(1.0)
                elif local.device == device:
                    local.normal_(0.0, std)
                else:
                    local.copy_(torch.empty(local.shape, dtype=local.dtype, device=device).normal_(0.0, std))
        for name, buffer in model.named_buffers():
            buffer.copy_(buffers[name])
