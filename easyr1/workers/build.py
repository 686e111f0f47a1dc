"""Building what a run trains and scores with: each model loaded, adapted (attention, Ulysses,
gradient checkpointing, LoRA, compile) and sharded (``sharded_model``); the actor, the reference
and the critic as workers with their optimizers (``build_workers``); and the offloaders that move
the trained ones between host and device around the phases (``build_offloaders``).

Everything random at the start (LoRA adapters, the critic's value head) is seeded from
``data.seed`` before the first model loads, and the models load in one order (actor, reference,
critic), so that every run starts the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from easyr1.activations import RecomputePlan
from easyr1.config import ConfigError, PPOConfig
from easyr1.memory import recompute_plan
from easyr1.models import ulysses
from easyr1.models.architecture import Architecture
from easyr1.models.attention import use_packed_attention, use_vision_attention
from easyr1.models.loading import load_model, load_value_model
from easyr1.models.lora import apply_lora, is_lora
from easyr1.models.recompute import apply_recompute
from easyr1.models.structure import text_blocks, vision_tower
from easyr1.models.vision_mlp import align_vision_mlp
from easyr1.telemetry import smallest_gpu_memory_gib
from easyr1.workers.actor import Actor
from easyr1.workers.config import ModelConfig, OffloadConfig
from easyr1.workers.critic import Critic
from easyr1.workers.fsdp import (
    compile_blocks,
    loads_weights,
    parallelize,
    param_dtype,
    rank0_init,
)
from easyr1.workers.logprobs import compile_scoring, install_scoring_head
from easyr1.workers.offload import Offloader


@dataclass
class Workers:
    """The models of a run: the actor (its model is ``actor.model``), the reference model where it
    is a model of its own, the critic where there is one."""

    actor: Actor
    ref_model: torch.nn.Module | None  # None: no reference, or the LoRA actor with its adapters off
    critic: Critic | None
    checkpointed: RecomputePlan | None  # how the actor's decoder blocks recompute (None: every block)


def actor_checkpointed_blocks(
    config: PPOConfig, device: torch.device, *, rank: int, world: int
) -> RecomputePlan | None:
    """How the actor's decoder blocks recompute their activations (None: every block wholly): under
    ``enable_gradient_checkpointing=auto`` on GPUs, as the memory estimate plans."""
    if config.worker.actor.model.enable_gradient_checkpointing != "auto" or device.type != "cuda":
        return None
    gpu_gib = smallest_gpu_memory_gib(device)  # a collective: before anything can fail on one rank
    try:
        arch = Architecture.load(config.worker.actor.model.model_path)
        plan, why = recompute_plan(config, arch, gpus=world, gpu_memory_gib=gpu_gib)
    except (OSError, ValueError, KeyError, AttributeError) as exc:  # a model the estimator cannot size
        plan, why = None, f"gradient checkpointing auto: every block (no memory estimate: {exc})"
    if rank == 0:
        print(why, flush=True)
    return plan


def sharded_model(
    config: PPOConfig,
    path: str,
    fsdp_cfg: Any,
    model_cfg: ModelConfig | None,
    *,
    device: torch.device,
    value_head: bool = False,
    checkpointed: RecomputePlan | None = None,
) -> torch.nn.Module:
    """Load and shard a model; ``model_cfg`` None means frozen (the reference). Under
    ``fsdp.enable_rank0_init`` only rank 0 reads the weights (see ``parallelize``). ``checkpointed``:
    how the decoder blocks recompute their activations, where gradient checkpointing is on (None: every
    block wholly)."""
    trainable = model_cfg is not None
    dtype = param_dtype(fsdp_cfg, trainable=trainable)
    own = model_cfg or config.worker.actor.model  # the reference is the actor's model
    trust, overrides = own.trust_remote_code, own.override_config
    weights = loads_weights(fsdp_cfg)
    if value_head:
        try:
            model = load_value_model(
                path, dtype=dtype, trust_remote_code=trust, weights=weights, override_config=overrides
            )
        except ConfigError:  # an override_config key, named
            raise
        except ValueError as exc:
            raise ConfigError(
                f"worker.critic.model.model_path: {exc}; the gae critic needs a text model"
            ) from None
    else:
        model = load_model(
            path, dtype=dtype, trust_remote_code=trust, weights=weights, override_config=overrides
        )
        install_scoring_head(model)
    worker = config.worker.critic if value_head else config.worker.actor  # the reference follows the actor
    # The language model first: from transformers 5.25 on, set_attn_implementation checks every
    # sub-model again, and the tower's flash-named implementation has no flash package behind it.
    if worker.padding_free:
        use_packed_attention(model)
    use_vision_attention(model)
    if device.type == "cuda":  # the same sums, at aligned widths: kept off CPU runs' numbers
        align_vision_mlp(model)
    if worker.ulysses_size > 1:
        try:
            ulysses.enable(model, worker.ulysses_size)
        except ValueError as exc:
            raise ConfigError(
                f"worker.{'critic' if value_head else 'actor'}.ulysses_size={worker.ulysses_size}: {exc}"
            ) from None
    if not rank0_init(
        fsdp_cfg
    ):  # else rank 0's full weights stay in host memory; fully_shard moves the shards
        model = model.to(device)
    if model_cfg is not None:
        if model_cfg.enable_gradient_checkpointing:
            layers = len(text_blocks(model))
            apply_recompute(model, None if checkpointed is None else checkpointed.modes(layers))
        if model_cfg.freeze_vision_tower:
            visual = vision_tower(model)
            if visual is not None:
                visual.requires_grad_(False)
        if model_cfg.lora.rank > 0 and not value_head:
            model = apply_lora(model, model_cfg.lora)
    else:
        model.requires_grad_(False)
    # EasyR1's key; on CUDA only, where compiling pays for itself within a step or two.
    if config.worker.actor.use_torch_compile and device.type == "cuda" and not value_head:
        compile_blocks(model)
        compile_scoring(model)
    ref_offload = model_cfg is None and config.worker.ref.offload.offload_params
    return parallelize(model, fsdp_cfg, trainable=trainable, device=device, offload_params=ref_offload)


def build_workers(
    config: PPOConfig,
    *,
    rank: int,
    world: int,
    device: torch.device,
    needs_ref: bool,
    total_steps: int,
    pad_id: int,
) -> Workers:
    """The actor, the reference (with ``needs_ref``) and, for ``gae``, the critic, loaded and sharded."""
    actor_cfg = config.worker.actor
    model_cfg = actor_cfg.model
    # What starts random (LoRA adapters, the critic's value head) starts the same in every run.
    torch.manual_seed(config.data.seed)
    checkpointed = actor_checkpointed_blocks(config, device, rank=rank, world=world)
    actor_model = sharded_model(
        config, model_cfg.model_path, actor_cfg.fsdp, model_cfg, device=device, checkpointed=checkpointed
    )
    # A LoRA actor with its adapters off is the reference (as in EasyR1): no second model.
    ref_model = (
        sharded_model(config, model_cfg.model_path, config.worker.ref.fsdp, None, device=device)
        if needs_ref and not is_lora(actor_model)
        else None
    )
    if needs_ref and ref_model is None and rank == 0:
        print("reference: the actor with its LoRA adapters off", flush=True)
    algo = config.algorithm
    actor = Actor(
        actor_model,
        actor_cfg,
        algo,
        samples_per_prompt=config.worker.rollout.n,
        max_response_length=config.data.max_response_length,
        temperature=config.worker.rollout.temperature,
        pad_id=pad_id,
        total_steps=total_steps,
        device=device,
    )
    critic: Critic | None = None
    if algo.adv_estimator == "gae":
        critic_cfg = config.worker.critic
        critic = Critic(
            sharded_model(
                config,
                critic_cfg.model.model_path or model_cfg.model_path,
                critic_cfg.fsdp,
                critic_cfg.model,
                device=device,
                value_head=True,
            ),
            critic_cfg,
            samples_per_prompt=config.worker.rollout.n,
            pad_id=pad_id,
            total_steps=total_steps,
            device=device,
        )
    return Workers(actor, ref_model, critic, checkpointed)


def build_offloaders(workers: dict[str, Actor | Critic], device: torch.device) -> dict[str, Offloader]:
    """EasyR1's worker.*.offload: host memory between phases, from here on (FSDP's CPU offload,
    fsdp.enable_cpu_offload, keeps parameters and optimizer state there already). Each trained
    model starts offloaded, its optimizer state too."""
    offloaders = {
        name: Offloader(
            worker.model,
            worker.optimizer,
            OffloadConfig() if worker.config.fsdp.enable_cpu_offload else worker.config.offload,
            device,
        )
        for name, worker in workers.items()
    }
    for offloader in offloaders.values():
        offloader.offload(optimizer=True)
    return offloaders
