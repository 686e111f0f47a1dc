"""The worker sections of the run config: the actor, the critic and the reference (``worker.actor.*``,
``worker.critic.*``, ``worker.ref.*``), with their model, optimizer, FSDP and offload settings.
(``easyr1/config.py`` composes them with the rollout and the reward into ``worker``.)

Each field's docstring is its documentation (``easyr1 config --explain worker.actor.KEY`` prints it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

# Float32 logits per chunk of the log-prob pass (workers/logprobs.py), which the memory model counts:
# 1 GiB, 1,766 tokens of a 152k vocabulary. A setting of the engine, not of a run.
LOGPROB_CHUNK_ELEMENTS = 1 << 28

DType = Literal["fp32", "bf16", "fp16"]


@dataclass
class LoraConfig:
    rank: int = 0
    """LoRA's rank; 0: no LoRA, every weight trains."""
    alpha: int = 64
    """LoRA's alpha: the adapters' output is scaled by alpha / rank."""
    target_modules: str = "all-linear"
    """The linear layers that get adapters: ``all-linear``, or a comma-separated list of module names."""
    exclude_modules: str | None = None
    """A regular expression of module names left without adapters (e.g. ``.*visual.*``); null: none."""


@dataclass
class ModelConfig:
    model_path: str | None = None
    """The model: a local Hugging Face folder or a hub id."""
    tokenizer_path: str | None = None
    """The tokenizer's folder or hub id; null: ``model_path``'s."""
    override_config: dict[str, Any] = field(default_factory=dict)
    """Entries that replace the model's ``config.json`` values when it loads."""
    # EasyR1's key. True: every decoder block recomputes its activations in backward (the least
    # memory); False: none does (the least compute). "auto": on GPUs, the actor recomputes only the
    # fewest first blocks with which the memory estimate fits the GPU with 15% to spare, vLLM's share
    # decided first (easyr1/memory.py, recompute_plan); every block on CPUs and for the critic.
    # The log line "gradient checkpointing auto: ..." says how many.
    enable_gradient_checkpointing: bool | Literal["auto"] = "auto"
    """Recompute decoder blocks' activations in backward: true (all), false (none), or auto (as few as fit)."""
    # Not EasyR1's. Off until GPU records show what it buys (on CPUs "auto" recomputes every block).
    partial_recompute: bool = False
    """Let ``auto`` plan blocks that recompute only their elementwise work or their attention (compiled, no LoRA)."""
    trust_remote_code: bool = True
    """Let a model folder's own Python code load (Hugging Face's ``trust_remote_code``)."""
    freeze_vision_tower: bool = False
    """Keep a vision-language model's vision tower's weights fixed; only the language model trains."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA adapters (the actor only)."""


@dataclass
class OptimConfig:
    lr: float = 1e-6
    """The learning rate (after warmup)."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW's beta1 and beta2."""
    weight_decay: float = 1e-2
    """AdamW's decoupled weight decay."""
    strategy: Literal["adamw", "adamw_bf16"] = "adamw"
    """``adamw``: fp32 state; ``adamw_bf16``: bf16 weights and moments with Kahan-compensated updates."""
    lr_warmup_ratio: float = 0.0
    """The share of the run's steps over which the learning rate rises linearly from 0."""
    lr_warmup_steps: int | None = None
    """Warmup steps; null: ``lr_warmup_ratio`` of the run's steps."""
    min_lr_ratio: float | None = None
    """The cosine schedule's floor, as a share of ``lr``; null: 0."""
    lr_scheduler_type: Literal["constant", "cosine"] = "constant"
    """The learning rate after warmup: constant, or cosine decay to ``min_lr_ratio``."""


@dataclass
class FSDPConfig:
    enable_full_shard: bool = True
    """Free each block's gathered weights after its forward (ZeRO-3); false: keep them to the backward."""
    enable_cpu_offload: bool = False
    """Keep the parameter shards (and the optimizer's state) in host memory (FSDP's ``CPUOffloadPolicy``, GPUs)."""
    enable_rank0_init: bool = True
    """Only rank 0 reads the weights from disk; the other ranks receive their shards from it."""
    use_orig_params: bool = False
    """FSDP1's flat-parameter switch; FSDP2 always shards the original parameters, so either value trains the same."""
    torch_dtype: DType | None = None
    """The stored weights' dtype; null: fp32 for a trained model (AMP), bf16 for the frozen reference."""
    fsdp_size: int = -1
    """Ranks a model is sharded over; -1: all of them, else groups of this many, replicated across groups (HSDP)."""
    mp_param_dtype: DType = "bf16"
    """The dtype fp32-stored weights are computed in (mixed precision)."""
    mp_reduce_dtype: DType = "fp32"
    """The dtype gradients are reduced across ranks in."""
    mp_buffer_dtype: DType = "fp32"
    """The dtype of the model's buffers."""


@dataclass
class OffloadConfig:
    offload_params: bool = False
    """Move the model's weights to host memory while the rollout runs, and back for training."""
    offload_optimizer: bool = False
    """Move the optimizer's state to host memory between updates."""


@dataclass
class ActorConfig:
    strategy: Literal["fsdp"] = "fsdp"
    """The training backend; FSDP2 is the one here."""
    global_batch_size: int = 256
    """Prompts per optimizer step (each with its ``worker.rollout.n`` responses), over all ranks."""
    micro_batch_size_per_device_for_update: int = 4
    """Samples per forward/backward pass of the update on each rank (dynamic batching: a token budget of this times the longest sample)."""
    micro_batch_size_per_device_for_experience: int = 16
    """Samples per forward pass when computing log-probs on each rank (dynamic batching: a token budget of this times the longest sample)."""
    max_grad_norm: float = 1.0
    """Gradients are clipped to this global norm."""
    clip_ratio_low: float = 0.2
    """PPO's clip below: the ratio is clipped at 1 - clip_ratio_low."""
    clip_ratio_high: float = 0.3
    """PPO's clip above: the ratio is clipped at 1 + clip_ratio_high (DAPO's clip-higher)."""
    clip_ratio_dual: float = 3.0
    """Dual-clip PPO: a negative advantage's loss is capped at clip_ratio_dual times its size."""
    loss_avg_mode: Literal[
        "token", "seq", "token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"
    ] = "token"
    """How per-token losses are averaged into the batch's loss (``algorithms/losses.py``)."""
    loss_type: Literal["default", "gspo", "gspo_token", "cispo", "sapo"] = "default"
    """The policy loss: PPO's clipped loss, GSPO (sequence ratios), CISPO or SAPO."""
    ppo_epochs: int = 1
    """Passes over each step's samples in the update."""
    padding_free: bool = True
    """Pack each micro-batch's sequences into one row without padding (varlen attention)."""
    dynamic_batching: bool = True
    """Fill micro-batches up to a token budget instead of a fixed count of samples."""
    ulysses_size: int = 1
    """Ranks one sequence is split over (Ulysses sequence parallelism); 1: off."""
    use_torch_compile: bool = True
    """``torch.compile`` the decoder blocks and the log-prob head (GPUs only)."""
    tau_positive: float = 1.0
    """SAPO's temperature for positive advantages."""
    tau_negative: float = 1.05
    """SAPO's temperature for negative advantages."""
    entropy_coeff: float = 0.0
    """The loss gets -entropy_coeff * entropy: a bonus for exploring (veRL's key)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The actor's model."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """The actor's optimizer and learning rate schedule."""
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)
    """How the actor is sharded and in what precision."""
    offload: OffloadConfig = field(default_factory=OffloadConfig)
    """What of the actor waits in host memory while it is not needed."""


@dataclass
class CriticConfig:
    strategy: Literal["fsdp"] = "fsdp"
    """The training backend; FSDP2 is the one here."""
    global_batch_size: int = 256
    """Prompts per optimizer step of the critic (each with its responses), over all ranks."""
    micro_batch_size_per_device_for_update: int = 4
    """Samples per forward/backward pass of the critic's update on each rank."""
    micro_batch_size_per_device_for_experience: int = 16
    """Samples per forward pass when computing values on each rank."""
    max_grad_norm: float = 1.0
    """The critic's gradients are clipped to this global norm."""
    cliprange_value: float = 0.5
    """New values are clipped to within this of the old ones in the value loss."""
    loss_avg_mode: Literal["token", "seq"] = "token"
    """How per-token value losses are averaged into the batch's loss."""
    ppo_epochs: int = 1
    """Passes over each step's samples in the critic's update."""
    padding_free: bool = False
    """Pack each micro-batch's sequences into one row without padding."""
    dynamic_batching: bool = True
    """Fill micro-batches up to a token budget instead of a fixed count of samples."""
    ulysses_size: int = 1
    """Ranks one sequence is split over in the critic (Ulysses); 1: off."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The critic's model (a value head on it replaces the language-model head)."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """The critic's optimizer and learning rate schedule."""
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)
    """How the critic is sharded and in what precision."""
    offload: OffloadConfig = field(default_factory=OffloadConfig)
    """What of the critic waits in host memory while it is not needed."""


@dataclass
class RefConfig:
    strategy: Literal["fsdp"] = "fsdp"
    """The backend of the reference's forward passes; FSDP2 is the one here."""
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)
    """How the reference is sharded and in what precision."""
    offload: OffloadConfig = field(default_factory=OffloadConfig)
    """Whether the reference's weights wait in host memory between its passes."""
