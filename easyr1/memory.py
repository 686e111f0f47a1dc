"""Predicted peak GPU memory per device of a training run, term by term and phase by phase.

``easyr1 memory config=FILE.yaml key=value ... [--gpu-memory GIB] [--gpus N]`` answers "how many
GPUs of this size does this run need?" before a cluster allocation is spent finding out. It is pure
arithmetic on the architecture (``config.json``: shapes only, the weights are never read) and the
run's config. Every term below is what this engine allocates, and the constants that are not plain
sizes were calibrated against the H200 records of EasyR1's example workload
(``baselines/gpu/memory/``; ``bench/README.md``, "Memory"): the peaks measured there lie within
±10% of these predictions (``assets/hardware.md`` shows each one).

Sizes: P parameters (every parameter, vision tower included), h hidden size, i MLP width, q and kv
the query and key/value widths (heads x head_dim), V vocabulary, L decoder layers, S the ranks a
model is sharded over (``fsdp.fsdp_size``, else the world), T tokens of a micro-batch (its size times
prompt + response length: dynamic batching's budget), R its response tokens.

The phases are the trainer's: ``rollout`` (generation), ``experience`` (old and reference log-probs,
values), ``update_actor`` and ``update_critic``. A model whose parameters (``offload.offload_params``)
or optimizer state (``offload.offload_optimizer``) are offloaded has them on the device only in the
phases that use them; FSDP's CPU offload (``fsdp.enable_cpu_offload``) keeps them in host memory
throughout. The device must hold the highest phase plus what lives outside PyTorch's allocator (the
CUDA context and NCCL's buffers, ``context_gib``). PyTorch's cache adds 6-11% of reserved memory on
top of the allocated peak (measured); it is given back before an allocation fails, so it is not
counted against the GPU's size.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from easyr1.activations import RecomputePlan, activation_share, block_activations
from easyr1.config import PPOConfig
from easyr1.models.architecture import ATTENTION, FULL, POINTWISE, Architecture
from easyr1.workers.config import LOGPROB_CHUNK_ELEMENTS

GIB = 1024**3

# Outside PyTorch's allocator on each device: the CUDA context, 0.83 GiB on an H200 with torch 2.11 /
# CUDA 13 (perf/gpu_other_memory_gb of the one-GPU records), and with more than one rank NCCL's
# communicator buffers besides: 1.60 and 1.61 GiB in all on the two-GPU records of 2026-12-04.
CONTEXT_GIB = 0.85
NCCL_GIB = 0.77
# Inside the allocator whatever the models: what every phase holds with every model offloaded, the
# advantage phase's allocated peak, 0.161 GiB on 41 of the 42 memory records (1.5B to 7B, one to
# eight ranks, H100 and H200; 0.097 on one). The reference pass of several ranks showed it first:
# 0.16-0.17 GiB short on the 1.5B, 3B and 7B records alike, whatever the model (issue 55).
WORKSPACE_GIB = 0.161
WORKSPACE = "resident workspaces (every phase: the advantage phase's peak with every model offloaded)"

# The scoring head (workers/logprobs.py) works on chunks of LOGPROB_CHUNK_ELEMENTS float32 logits. Forward:
# the bf16 product and its float32 copy, the scaled logits, then the probabilities and their
# product with the logits: 4.05 chunk-sized float32 buffers at the highest (calibrated on the
# experience phase, where the head runs after the decoder blocks have released theirs, beside the
# workspaces: 4.04, 4.05 and 4.08 on the 1.5B, 3B and 7B records). Backward recomputes the chunk and
# adds the centred logits, the logits' gradient and its temporaries: 4.85 (calibrated: 4.74 on the
# 1.5B and 5.04 on the 3B records), plus the head's float32 weight gradient, V x h.
SCORING_FORWARD_CHUNKS = 4.05
SCORING_BACKWARD_CHUNKS = 4.85
# With ``worker.actor.use_torch_compile`` (GPUs) that work is compiled and fused (``compile_scoring``,
# since 2026-12-03, after the records above): the bf16 product and the fused passes' outputs, and
# the weight gradient accumulates without a float32 copy. Backward: 1.16 chunks in all (1.14 and 1.19
# on the two-GPU 1.5B AMP and 7B LoRA records of 2026-12-04, the first made with it). Forward: 0.54,
# the bf16 product's half chunk and its float32 rows (the one-GPU 1.5B records of 2026-12-04, where
# the head is the larger moment: 0.536 BF16, 0.538 LoRA).
SCORING_FORWARD_CHUNKS_COMPILED = 0.54
SCORING_BACKWARD_CHUNKS_COMPILED = 1.16

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
# The terms of a pass whose size is the larger of two moments (an estimate's phases name them).
IN_FLIGHT = (
    "blocks in flight and their intermediates, the scoring head, or the first block's gathering (the largest)"
)
ACTIVATIONS = "activations, or the scoring head's backward over them (the larger)"


@dataclass
class Model:
    """One model's share of a device: what it keeps, and where."""

    name: str
    params: float  # stored parameters' bytes on this device
    grads: float
    optimizer: float
    trained: bool
    offload_params: bool  # on the device only in its own phases
    offload_optimizer: bool
    host: bool  # FSDP's CPU offload: never resident


@dataclass
class Estimate:
    """Per phase, the allocated bytes of each term; the peak phase and what the device must hold."""

    phases: dict[str, dict[str, float]]
    context: float
    gpus: int
    notes: list[str]
    blockers: list[str]  # what fails whatever the GPU's size (vLLM's weights outgrowing its share)

    def phase_total(self, phase: str) -> float:
        return sum(self.phases[phase].values())

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=self.phase_total)

    @property
    def allocated(self) -> float:
        return self.phase_total(self.peak_phase)

    @property
    def device(self) -> float:
        """What the device must hold: the allocated peak plus the context."""
        return self.allocated + self.context

    def fits(self, gpu_memory_gib: float) -> bool:
        return not self.blockers and self.device <= gpu_memory_gib * GIB

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpus": self.gpus,
            "peak_phase": self.peak_phase,
            "allocated_gib": self.allocated / GIB,
            "device_gib": self.device / GIB,
            "context_gib": self.context / GIB,
            "blockers": self.blockers,
            "phases": {p: {k: v / GIB for k, v in terms.items()} for p, terms in self.phases.items()},
            "notes": self.notes,
        }


# ``rollout.gather_full_model=auto``: the Hugging Face rollout gathers the whole model only where its
# full weights (in the compute dtype) take at most this share of the GPU; the rest holds the resident
# shards, the KV cache and the prefill. Below it every cell of EasyR1's table measured so far gathers,
# as it did before the setting existed (7B on 32 GiB: 14.2 GiB of weights).
HF_GATHER_SHARE = 0.5


def gathers_full_model(config: PPOConfig, arch: Architecture, gpu_memory_gib: float | None) -> bool:
    """Whether the Hugging Face rollout gathers the whole actor for a rollout (``gather_full_model``
    decided): where the GPU's size is unknown (CPUs), always."""
    setting = config.worker.rollout.gather_full_model
    if setting != "auto":
        return bool(setting)
    return gpu_memory_gib is None or arch.params * 2 <= HF_GATHER_SHARE * gpu_memory_gib * GIB


def _stored_bytes(torch_dtype: str | None, trainable: bool) -> int:
    """fp32 master weights for a trained model under AMP (``torch_dtype`` unset), bf16 for a frozen one."""
    if torch_dtype is not None:
        return DTYPE_BYTES[torch_dtype]
    return 4 if trainable else 2


def _shards(fsdp_size: int, world: int) -> int:
    return world if fsdp_size <= 0 else min(fsdp_size, world)


def estimate(
    config: PPOConfig,
    arch: Architecture,
    *,
    gpus: int,
    gpu_memory_gib: float | None = None,
    context_gib: float = CONTEXT_GIB,
    actor_checkpointed: int | RecomputePlan | None = None,
    compiled_scoring: bool | None = None,
) -> Estimate:
    """The peak of ``config`` on ``gpus`` devices (one node's or several: FSDP shards over all of them).
    ``actor_checkpointed``: how the actor's decoder blocks recompute their activations (a count: that
    many whole blocks), instead of what ``enable_gradient_checkpointing`` gives (``recompute_plan``
    tries plans).
    ``compiled_scoring``: whether the scoring head's chunk work is compiled, instead of what
    ``use_torch_compile`` gives (the records of an engine from before it was, ``reports/hardware.py``)."""
    cfg, actor = config, config.worker.actor
    notes: list[str] = []
    blockers: list[str] = []
    blocks_note = ""
    if actor_checkpointed is None:
        actor_checkpointed, blocks_note = recompute_plan(
            config, arch, gpus=gpus, gpu_memory_gib=gpu_memory_gib, context_gib=context_gib
        )
    if isinstance(actor_checkpointed, int):
        actor_checkpointed = RecomputePlan(actor_checkpointed)
    world = gpus
    shards = _shards(actor.fsdp.fsdp_size, world)
    max_len = cfg.data.max_prompt_length + cfg.data.max_response_length
    ulysses = max(1, actor.ulysses_size)
    lora = actor.model.lora
    compute = 2  # bf16 / fp16 compute (mp_param_dtype), as on every GPU run
    compiled_head = actor.use_torch_compile if compiled_scoring is None else compiled_scoring

    def head_compiled(name: str) -> bool:
        """The trainer compiles the policy models' scoring heads with their blocks (actor and
        reference), never the critic's."""
        return compiled_head and name != "critic"

    # --- the models' resident bytes per device
    stored = _stored_bytes(actor.fsdp.torch_dtype, trainable=True)
    trained = (
        arch.lora_params(lora.rank, lora.target_modules, lora.exclude_modules)
        if lora.rank > 0
        else arch.params
    )
    state = (
        3 * 2 if actor.optim.strategy == "adamw_bf16" else 2 * stored
    )  # bf16: Adam's two moments + the Kahan buffer
    base = arch.params if lora.rank > 0 else 0  # LoRA: the frozen base, stored like the adapters
    models = [
        Model(
            "actor",
            (base + trained) * stored / shards,
            trained * stored / shards,
            trained * state / shards,
            True,
            actor.offload.offload_params,
            actor.offload.offload_optimizer,
            actor.fsdp.enable_cpu_offload,
        ),
    ]
    needs_ref = not cfg.algorithm.disable_kl and (cfg.algorithm.use_kl_loss or cfg.algorithm.kl_coef > 0)
    if needs_ref and lora.rank == 0:  # with LoRA the reference is the actor with its adapters off
        ref = cfg.worker.ref
        ref_shards = _shards(ref.fsdp.fsdp_size, world)
        models.append(
            Model(
                "ref",
                arch.params * _stored_bytes(ref.fsdp.torch_dtype, False) / ref_shards,
                0,
                0,
                False,
                ref.offload.offload_params,
                False,
                ref.fsdp.enable_cpu_offload,
            )
        )
    if cfg.algorithm.adv_estimator == "gae":
        critic = cfg.worker.critic
        c_stored = _stored_bytes(critic.fsdp.torch_dtype, trainable=True)
        c_state = 3 * 2 if critic.optim.strategy == "adamw_bf16" else 2 * c_stored
        c_shards = _shards(critic.fsdp.fsdp_size, world)
        models.append(
            Model(
                "critic",
                arch.params * c_stored / c_shards,
                arch.params * c_stored / c_shards,
                arch.params * c_state / c_shards,
                True,
                critic.offload.offload_params,
                critic.offload.offload_optimizer,
                critic.fsdp.enable_cpu_offload,
            )
        )
        notes.append("the critic is taken to have the actor's architecture")

    def resident(active: set[str], optimizer_of: str | None = None) -> dict[str, float]:
        """Every model's bytes that stay on the device in a phase using ``active``."""
        terms: dict[str, float] = {}
        for m in models:
            if m.host:
                continue
            if m.name in active or not m.offload_params:
                terms[f"{m.name} parameters"] = m.params
            if m.trained and (m.name == optimizer_of or not m.offload_optimizer):
                terms[f"{m.name} optimizer state"] = m.optimizer
        return terms

    # --- per-micro-batch transients
    root = (
        arch.vocab * arch.hidden * (1 if arch.tied else 2) + arch.vision_params
    )  # gathered for a whole pass
    gathered = (root + 2 * arch.block_params) * compute  # FSDP2: the root and two blocks in flight

    def scoring_chunk(response_tokens: int) -> float:
        tokens = min(response_tokens, max(1, LOGPROB_CHUNK_ELEMENTS // arch.vocab))
        return tokens * arch.vocab * 4

    # peft keeps LoRA adapters in fp32 on a bf16 model and casts each adapted layer's input for them.
    fp32_adapters = lora.rank > 0 and _stored_bytes(actor.fsdp.torch_dtype, trainable=True) == 2
    fsdp_of = {"actor": actor.fsdp, "ref": cfg.worker.ref.fsdp, "critic": cfg.worker.critic.fsdp}

    def forward_pass(name: str, micro_batch: int) -> dict[str, float]:
        """Without autograd nothing outlives its block, so the pass peaks either in a block (two
        gathered, one's intermediates), in the scoring head after the last one, or, sharded over
        several ranks, as the first block is gathered: FSDP2 keeps each unit's all-gather buffer until
        the next unit's is copied out, so the root's (untied 7B: 2 GiB) is there twice then (the 7B
        and 3B records of 4 and 8 ranks; one rank all-gathers nothing). The largest counts."""
        tokens = micro_batch * max_len / ulysses
        # Compiled blocks fuse the MLP's product into the gate's buffer; with fp32 LoRA adapters they
        # hold what eager ones hold (the anchor's LoRA record: 1.9% over counted so, 9% under if fused).
        compiled_blocks = (
            actor.use_torch_compile and name != "critic" and not (name == "actor" and fp32_adapters)
        )
        in_blocks = 2 * arch.block_params * compute + tokens * arch.forward_bytes(compiled_blocks)
        chunks = SCORING_FORWARD_CHUNKS_COMPILED if head_compiled(name) else SCORING_FORWARD_CHUNKS
        in_head = chunks * scoring_chunk(micro_batch * cfg.data.max_response_length)
        first_gather = 0.0
        if _shards(fsdp_of[name].fsdp_size, world) > 1:  # the buffer, the block's and its copy, the input
            first_gather = (root + 2 * arch.block_params) * compute + tokens * arch.hidden * compute
        return {
            "gathered root parameters": root * compute,
            IN_FLIGHT: max(in_blocks, in_head, first_gather),
        }

    def backward_pass(name: str, model_cfg: Any, micro_batch: int, growing: float) -> dict[str, float]:
        """``growing``: gradients that backward creates block by block (a step of one micro-batch)."""
        tokens = micro_batch * max_len / ulysses
        head_chunk = scoring_chunk(micro_batch * cfg.data.max_response_length)
        # The trainer compiles the actor's blocks only; LoRA adapters stay fp32 on a bf16 model.
        compiled = model_cfg is actor and actor.use_torch_compile
        layer = (
            tokens
            * arch.activation_bytes()
            * activation_share(compiled, model_cfg is actor and fp32_adapters)
        )
        plan = (
            actor_checkpointed
            if model_cfg is actor
            else RecomputePlan(arch.layers if model_cfg.model.enable_gradient_checkpointing else 0)
        )
        # A recomputing block keeps its bf16 input (and a partial one what its mode names).
        partial = {mode: tokens * arch.partial_recompute_bytes(mode) for mode in (ATTENTION, POINTWISE)}
        # The head's backward runs first. Eager, its chunk buffers are freed before any block's backward
        # (the 2026-12-01..03 anchor records, every block recomputed: 18-32% over with them on top); its
        # float32 weight gradient waits for the root's reduce-scatter, at the end. Compiled, its 1.3
        # chunks were calibrated on top of a recomputed block (SCORING_BACKWARD_CHUNKS_COMPILED).
        compiled_head = head_compiled(name)
        head = 0.0 if compiled_head else SCORING_BACKWARD_CHUNKS * head_chunk
        block_input = tokens * arch.hidden * compute
        return {
            "gathered parameters": gathered,
            "block gradients": 2 * arch.block_params * compute,  # before their reduce-scatter
            ACTIVATIONS: block_activations(plan, arch.layers, layer, block_input, partial, head, growing),
            "scoring head": SCORING_BACKWARD_CHUNKS_COMPILED * head_chunk
            if compiled_head
            else arch.vocab * arch.hidden * 4,
        }

    phases: dict[str, dict[str, float]] = {}

    # --- rollout
    rollout = cfg.worker.rollout
    backend = rollout.name if rollout.name != "auto" else "vllm"
    tp = min(rollout.tensor_parallel_size, world)
    if backend == "vllm":
        if gpu_memory_gib is None:
            raise ValueError(
                "the vLLM rollout takes a share of the GPU (gpu_memory_utilization): give --gpu-memory"
            )
        share = rollout.gpu_memory_utilization * gpu_memory_gib * GIB
        weights = arch.params * compute / tp
        if weights >= share:
            blockers.append(
                f"vLLM's weights ({weights / GIB:.1f} GiB per GPU at tensor-parallel size {tp}) leave no room for its KV "
                f"cache in its share of {share / GIB:.1f} GiB: raise worker.rollout.tensor_parallel_size or gpu_memory_utilization"
            )
        phases["rollout"] = {**resident(set()), "vLLM (weights, KV cache; gpu_memory_utilization)": share}
    else:  # Hugging Face generate on the actor itself
        sequences = cfg.data.rollout_batch_size * rollout.n / world
        kv_cache = sequences * max_len * arch.layers * 2 * arch.kv * compute
        if gathers_full_model(cfg, arch, gpu_memory_gib):  # its shards gathered for the whole rollout
            weights = {
                "gathered actor (compute dtype)": (arch.params + (trained if lora.rank else 0)) * compute
            }
        else:  # FSDP gathers a block at a time (the next one prefetched), the root for the whole pass
            weights = {"gathered root and two blocks (compute dtype)": gathered}
        phases["rollout"] = {
            **resident({"actor"}),
            **weights,
            "KV cache": kv_cache,
            "prefill activations": sequences * cfg.data.max_prompt_length * arch.forward_bytes(),
        }
    # vLLM keeps its share through training unless it sleeps (free_cache_engine; "auto" decides here)
    awake = {k: v for k, v in phases["rollout"].items() if k.startswith("vLLM")}
    sleeps = rollout.free_cache_engine
    if awake and sleeps == "auto":
        assert gpu_memory_gib is not None  # a vLLM rollout needs it, checked above
        stay, why = stays_awake(
            config, arch, gpus=gpus, gpu_memory_gib=gpu_memory_gib, context_gib=context_gib
        )
        notes.append(why)
        sleeps = not stay
    kept = {} if sleeps else awake

    # --- experience: each model's forward pass, the highest. The actor's own (old log-probs) is
    # skipped when the update is one optimizer step of one epoch (it comes from the update's forward
    # pass), unless the KL is in the reward; with LoRA the reference pass is the actor's.
    on_policy = actor.ppo_epochs == 1 and actor.global_batch_size >= cfg.data.rollout_batch_size
    kl_in_reward = needs_ref and not cfg.algorithm.use_kl_loss
    scored = [m.name for m in models if m.name != "actor" or not on_policy or kl_in_reward]
    if needs_ref and lora.rank:
        scored.append("actor")
    passes = [
        {**resident({name}), **kept, **forward_pass(name, actor.micro_batch_size_per_device_for_experience)}
        for name in scored
    ]
    if passes:
        phases["experience"] = max(passes, key=lambda terms: sum(terms.values()))

    # --- updates
    for m in models:
        if not m.trained:
            continue
        model_cfg = actor if m.name == "actor" else cfg.worker.critic
        terms = {**resident({m.name}, optimizer_of=m.name), **kept}
        grads = 0.0 if m.host else m.grads  # FSDP CPU offload: only the gathered blocks reach the device
        # The optimizer step sets the gradients to None: with one micro-batch a step (at the length
        # limits), backward starts without them and they come block by block (``backward_pass``).
        micro = model_cfg.micro_batch_size_per_device_for_update
        samples = model_cfg.global_batch_size * rollout.n * ulysses / world
        accumulates = math.ceil(samples / micro) > 1
        terms[f"{m.name} gradients"] = grads if accumulates else 0.0
        # The optimizer step adds nothing: torch's AdamW is fused on GPUs and AdamWBF16 updates one
        # tensor at a time (workers/optim.py).
        terms.update(backward_pass(m.name, model_cfg, micro, 0.0 if accumulates else grads))
        phases[f"update_{m.name}"] = terms

    for terms in phases.values():
        terms[WORKSPACE] = WORKSPACE_GIB * GIB
    if actor.fsdp.enable_cpu_offload:
        notes.append("actor: FSDP CPU offload keeps parameters, gradients and optimizer state in host memory")
    if blocks_note:
        notes.append(blocks_note)
    return Estimate(phases, (context_gib + (NCCL_GIB if world > 1 else 0.0)) * GIB, gpus, notes, blockers)


AWAKE_SPARE = 0.10  # the estimator's tolerance: vLLM stays awake only with this share of the GPU to spare
# What ``enable_gradient_checkpointing=auto`` keeps free beyond the estimate. On the H200 the device's
# true peak (torch's reserved peak plus the memory outside it) was 52.1 GiB against 51.5 predicted
# with all 28 anchor blocks recomputed, 92.3 against 95.2 with 13, and 99.0 against 99.9 on the VL
# anchor (2026-12-03/04 records): within 5% of the estimate, which also overstates each kept block's
# activations (2.9 GiB predicted, 2.7 measured), so planning on 85% leaves room for that and more.
# What the margin must cover, from the records (assets/hardware.md): the largest under-prediction of
# an update phase, 1.0% (3B AMP on 4 simulated ranks; 188 phases of 37 memory and 101 bench records), and what the allocator cannot hand out at the moment it fails: on the H100 the LoRA anchor's
# 840 MiB request failed with 74.7 GiB allocated of 79.2 (0.85 the context, 3.7 cached in pieces too
# small: 4.7% of the card). 6% in all; 15% keeps more than twice that.
CHECKPOINT_SPARE = 0.15


def stays_awake(
    config: PPOConfig,
    arch: Architecture,
    *,
    gpus: int,
    gpu_memory_gib: float,
    context_gib: float = CONTEXT_GIB,
) -> tuple[bool, str]:
    """``free_cache_engine=auto``: whether the vLLM engine keeps its weights and KV cache through
    training, and why: it does when the run's peak with vLLM's share resident in every phase fits
    the GPU with ``AWAKE_SPARE`` to spare. Staying awake saves vLLM's sleep and wake-up at every
    step (0.5-1 s on the H200's anchor workload)."""
    rollout = config.worker.rollout
    kept = dataclasses.replace(
        config,
        worker=dataclasses.replace(
            config.worker, rollout=dataclasses.replace(rollout, free_cache_engine=False)
        ),
    )
    # Decided before the actor's checkpointed blocks, with each block recomputed under "auto".
    blocks = arch.layers if config.worker.actor.model.enable_gradient_checkpointing else 0
    peak = estimate(
        kept,
        arch,
        gpus=gpus,
        gpu_memory_gib=gpu_memory_gib,
        context_gib=context_gib,
        actor_checkpointed=RecomputePlan(blocks),
    )
    room = (1 - AWAKE_SPARE) * gpu_memory_gib
    fits = peak.device / GIB <= room and not peak.blockers
    verdict = "awake" if fits else "asleep while training"
    return fits, (
        f"free_cache_engine=auto: {verdict}, {peak.device / GIB:.1f} GiB predicted per GPU with vLLM's share kept"
        f"{' and every block recomputed' if blocks and config.worker.actor.model.enable_gradient_checkpointing == 'auto' else ''} "
        f"against {room:.1f} ({1 - AWAKE_SPARE:.0%} of {gpu_memory_gib:.1f} GiB)"
    )


def _candidate_plans(config: PPOConfig, arch: Architecture) -> list[RecomputePlan]:
    """The plans ``auto`` tries, each recomputing more than the one before, so that the first that fits
    recomputes the least. Whole blocks only, unless ``partial_recompute`` is on for compiled blocks
    without LoRA (the partial modes' saved bytes were measured on compiled blocks): then every block
    first turns ``pointwise`` (no matmul redone), then ``attention``, then ``full``; ``attention`` is
    skipped where its FLOPs per byte saved exceed those of going on to ``full``."""
    layers, actor = arch.layers, config.worker.actor
    if not (actor.model.partial_recompute and actor.use_torch_compile and actor.model.lora.rank == 0):
        return [RecomputePlan(n) for n in range(layers + 1)]
    sequence = config.data.max_prompt_length + config.data.max_response_length
    pointwise, attention = (arch.partial_recompute_bytes(m) for m in (POINTWISE, ATTENTION))
    to_attention = arch.recompute_flops(ATTENTION, sequence) / (pointwise - attention)
    on_to_full = (
        arch.recompute_flops(FULL, sequence) - arch.recompute_flops(ATTENTION, sequence)
    ) / attention
    plans = [RecomputePlan(0, pointwise=n) for n in range(layers + 1)]
    if to_attention < on_to_full:
        plans += [RecomputePlan(0, attention=n, pointwise=layers - n) for n in range(1, layers + 1)]
        return plans + [RecomputePlan(n, attention=layers - n) for n in range(1, layers + 1)]
    return plans + [RecomputePlan(n, pointwise=layers - n) for n in range(1, layers + 1)]


def recompute_plan(
    config: PPOConfig,
    arch: Architecture,
    *,
    gpus: int,
    gpu_memory_gib: float | None,
    context_gib: float = CONTEXT_GIB,
) -> tuple[RecomputePlan, str]:
    """How the actor's decoder blocks recompute their activations in backward, and why when
    ``enable_gradient_checkpointing=auto`` decided it. "auto": the first of ``_candidate_plans`` with
    which the run's peak fits the GPU with ``CHECKPOINT_SPARE`` to spare, vLLM awake or asleep as
    ``free_cache_engine`` decides (first, with every block recomputed); every block when none does or
    the GPU's size is unknown. A block not recomputed saves a quarter of its update's FLOPs."""
    setting = config.worker.actor.model.enable_gradient_checkpointing
    if setting != "auto":
        return RecomputePlan(arch.layers if setting else 0), ""
    if gpu_memory_gib is None:
        return RecomputePlan(arch.layers), "gradient checkpointing auto: every block (no GPU size to plan on)"
    rollout = config.worker.rollout
    if rollout.free_cache_engine == "auto":
        awake, _ = stays_awake(
            config, arch, gpus=gpus, gpu_memory_gib=gpu_memory_gib, context_gib=context_gib
        )
        config = dataclasses.replace(
            config,
            worker=dataclasses.replace(
                config.worker, rollout=dataclasses.replace(rollout, free_cache_engine=not awake)
            ),
        )
    room = (1 - CHECKPOINT_SPARE) * gpu_memory_gib
    for plan in _candidate_plans(config, arch):
        peak = estimate(
            config,
            arch,
            gpus=gpus,
            gpu_memory_gib=gpu_memory_gib,
            context_gib=context_gib,
            actor_checkpointed=plan,
        )
        if peak.device / GIB <= room and not peak.blockers:
            break
    return plan, (
        f"gradient checkpointing auto: {plan.describe(arch.layers)}, {peak.device / GIB:.1f} GiB "
        f"predicted per GPU against {room:.1f} ({1 - CHECKPOINT_SPARE:.0%} of {gpu_memory_gib:.1f} GiB)"
    )


def smallest_fit(
    config: PPOConfig,
    arch: Architecture,
    gpu_memory_gib: float,
    *,
    context_gib: float = CONTEXT_GIB,
    most: int = 1024,
) -> Estimate | None:
    """The estimate at the smallest power-of-two GPU count whose device peak fits ``gpu_memory_gib``
    (the rollout's tensor-parallel size capped at the count), or None up to ``most``."""
    gpus = 1
    while gpus <= most:
        result = estimate(config, arch, gpus=gpus, gpu_memory_gib=gpu_memory_gib, context_gib=context_gib)
        if result.fits(gpu_memory_gib):
            return result
        gpus *= 2
    return None
