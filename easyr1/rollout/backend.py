"""Rollout backends: which one runs (``worker.rollout.name``) and building it.

``auto`` takes vLLM when a CUDA GPU is there and vLLM imports, Hugging Face ``generate``
otherwise; asking for ``vllm`` where it cannot run is an error that says what is missing.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import torch
from torch import nn

from easyr1.config import ConfigError, PPOConfig
from easyr1.distributed.simulated import DECODE_STEPS, simulated_ranks
from easyr1.rollout.base import RolloutEngine, SamplingParams
from easyr1.rollout.config import RolloutConfig
from easyr1.rollout.hf import HFRollout
from easyr1.telemetry import smallest_gpu_memory_gib

INSTALL_HINT = "install it with: pip install -e '.[gpu]' (vllm==0.24.0, built for torch 2.11)"


class ProcessInfo(Protocol):
    """Where this process stands in the run (the trainer's ``Dist``)."""

    rank: int
    world: int
    local_rank: int


def vllm_import_error() -> str | None:
    """Why ``import vllm`` fails here, or None when it works."""
    try:
        import vllm  # noqa: F401
    except Exception as exc:  # a broken install fails in many ways; any of them rules vLLM out
        return f"{type(exc).__name__}: {exc}"
    return None


def _decide(name: str) -> tuple[str, str]:
    """(backend, why) for ``worker.rollout.name``."""
    if name == "hf":
        return "hf", "worker.rollout.name=hf"
    cuda = torch.cuda.is_available()
    error = vllm_import_error() if cuda or name == "vllm" else None
    if name == "vllm":
        problems = [] if cuda else ["it needs a CUDA GPU and torch.cuda.is_available() is False"]
        if error is not None:
            problems.append(f"vllm cannot be imported ({error}); {INSTALL_HINT}")
        if problems:
            raise ConfigError("worker.rollout.name='vllm' cannot run here: " + "; ".join(problems))
        return "vllm", "worker.rollout.name=vllm"
    if name != "auto":
        raise ConfigError(f"worker.rollout.name: {name!r} is not allowed; choose one of 'auto', 'hf', 'vllm'")
    if not cuda:
        return "hf", "auto: no CUDA GPU"
    if error is not None:
        return "hf", f"auto: vllm cannot be imported ({error})"
    return "vllm", "auto: CUDA GPU and vllm available"


def settle_rollout_with_data(config: PPOConfig, world: int, most_images: int, most_videos: int) -> None:
    """The rollout's checks that need only the config and the data, run before any model loads (vLLM
    would otherwise refuse them after minutes of loading): vLLM's tensor-parallel size against the
    ranks, and its per-prompt image and video limits against the most one prompt of the data holds.
    A limit of 0 is EasyR1's "not set": here it becomes that most (or vLLM's default of 4 images for
    data without any), written into ``config``; a limit below it is an error."""
    if _decide(config.worker.rollout.name)[0] != "vllm":
        return  # the Hugging Face rollout has neither setting
    from easyr1.rollout.vllm import check_tensor_parallel

    rollout = config.worker.rollout
    check_tensor_parallel(rollout.tensor_parallel_size, world)
    for key, most in (("limit_images", most_images), ("limit_videos", most_videos)):
        limit = getattr(rollout, key)
        if limit == 0:
            setattr(rollout, key, most)
        elif limit < most:
            raise ConfigError(
                f"worker.rollout.{key}={limit}: a prompt of the data holds {most}; raise it, or leave it at 0 "
                "to size it from the data"
            )


def choose_backend(name: str, *, rank: int = 0) -> str:
    """``"hf"`` or ``"vllm"`` for ``worker.rollout.name``; rank 0 prints which and why."""
    backend, why = _decide(name)
    if rank == 0:
        print(f"rollout backend: {backend} ({why})", flush=True)
    return backend


def vllm_model_settings(config: PPOConfig) -> dict[str, Any]:
    """What the vLLM engine is told about the model: its folders, context length (the longest
    prompt plus response unless ``worker.rollout.max_model_len`` says otherwise) and code trust."""
    rollout, model = config.worker.rollout, config.worker.actor.model
    if model.model_path is None:
        raise ConfigError("worker.actor.model.model_path is required")
    return {
        "model_path": model.model_path,
        "tokenizer_path": model.tokenizer_path or model.model_path,
        "max_model_len": rollout.max_model_len
        or config.data.max_prompt_length + config.data.max_response_length,
        "trust_remote_code": model.trust_remote_code,
    }


def settle_free_cache_engine(
    config: PPOConfig, world: int, gpu_memory_gib: float
) -> tuple[RolloutConfig, str]:
    """The vLLM rollout's config with ``free_cache_engine`` decided, and why: ``auto`` keeps the engine
    awake through training when the memory estimate says it fits (``memory.stays_awake``)."""
    from easyr1.memory import stays_awake
    from easyr1.models.architecture import Architecture

    rollout = config.worker.rollout
    if rollout.free_cache_engine != "auto":
        return rollout, f"free_cache_engine={str(rollout.free_cache_engine).lower()}"
    try:
        arch = Architecture.load(vllm_model_settings(config)["model_path"])
        awake, why = stays_awake(config, arch, gpus=world, gpu_memory_gib=gpu_memory_gib)
    except (OSError, ValueError, KeyError, AttributeError) as exc:  # a model the estimator cannot size
        awake, why = False, f"free_cache_engine=auto: asleep while training (no memory estimate: {exc})"
    return dataclasses.replace(rollout, free_cache_engine=not awake), why


def settle_gather_full_model(config: PPOConfig, ctx: ProcessInfo) -> tuple[bool, str]:
    """Whether the Hugging Face rollout gathers the whole actor (``gather_full_model``), and why:
    ``auto`` gathers unless the full weights take more than half of the GPU (``memory.gathers_full_model``)."""
    from easyr1.memory import GIB, HF_GATHER_SHARE, gathers_full_model
    from easyr1.models.architecture import Architecture

    setting = config.worker.rollout.gather_full_model
    if setting != "auto":
        return bool(setting), f"gather_full_model={str(setting).lower()}"
    if not torch.cuda.is_available():
        return True, "gather_full_model=auto: the whole model, gathered for each rollout (CPU ranks)"
    gpu = smallest_gpu_memory_gib(torch.device("cuda", ctx.local_rank))
    try:
        arch = Architecture.load(config.worker.actor.model.model_path)
    except (OSError, ValueError, KeyError, AttributeError) as exc:  # a model the estimator cannot size
        return True, f"gather_full_model=auto: the whole model (no size to plan on: {exc})"
    whole = gathers_full_model(config, arch, gpu)
    return whole, (
        f"gather_full_model=auto: {'the whole model' if whole else 'block by block at each decoding step'}, "
        f"{arch.params * 2 / GIB:.1f} GiB of full weights against {HF_GATHER_SHARE:.0%} of {gpu:.1f} GiB"
    )


def check_context(config: PPOConfig, model_config: Any) -> None:
    """Refuse prompts plus responses longer than the model's positions, unless its RoPE is scaled to
    reach past them: vLLM refuses such a context when it starts, Hugging Face's ``generate`` would
    run past the positions the model was trained on without a word."""
    text = model_config.get_text_config()
    limit = getattr(text, "max_position_embeddings", None)
    rope = getattr(text, "rope_parameters", None) or {}
    context = config.data.max_prompt_length + config.data.max_response_length
    if limit is None or rope.get("rope_type") != "default" or context <= limit:
        return  # no limit, a scaled (or per-layer) RoPE, or within it
    raise ConfigError(
        f"data.max_prompt_length + data.max_response_length = {context} tokens is more than the model's "
        f"max_position_embeddings of {limit} ({config.worker.actor.model.model_path}): shorten them, or scale "
        "its RoPE (rope_parameters in worker.actor.model.override_config)"
    )


def sampling_params(rollout: RolloutConfig, max_tokens: int, *, validation: bool) -> SamplingParams:
    """What one generate call asks for: ``worker.rollout``'s sampling keys in training; in validation,
    ``val_override_config`` over them, EOS respected and no log-probs."""
    values = {
        "n": rollout.n,
        "temperature": rollout.temperature,
        "top_p": rollout.top_p,
        "top_k": rollout.top_k,
    }
    if validation:
        values.update({k: v for k, v in rollout.val_override_config.items() if k in values})
    return SamplingParams(
        max_tokens=max_tokens,
        ignore_eos=rollout.ignore_eos and not validation,
        logprobs=rollout.calculate_log_probs and not validation,
        **values,
    )


def build_rollout(
    config: PPOConfig, actor_model: nn.Module, tokenizer: Any, ctx: ProcessInfo
) -> RolloutEngine:
    """The rollout engine of this run, sharing the GPUs with ``actor_model`` (the FSDP actor)."""
    check_context(config, actor_model.config)
    rollout = config.worker.rollout
    eos = actor_model.generation_config.eos_token_id
    eos_ids = [eos] if isinstance(eos, int) else list(eos)
    if choose_backend(rollout.name, rank=ctx.rank) == "hf":
        whole, why = settle_gather_full_model(config, ctx)
        simulated = simulated_ranks() is not None
        if ctx.rank == 0:
            print(f"Hugging Face rollout: {why}", flush=True)
            if simulated:
                print(
                    f"Hugging Face rollout: simulated ranks decode {DECODE_STEPS} steps, then continue each "
                    "response with its last token to the length limit (the KV cache is whole from the prefill)",
                    flush=True,
                )
        return HFRollout(
            actor_model,
            config.worker.actor.fsdp,
            pad_id=tokenizer.pad_token_id,
            eos_ids=eos_ids,
            cuda_graph=not rollout.enforce_eager,
            gather_full_model=whole,
            decode_steps=DECODE_STEPS if simulated else None,
        )
    from easyr1.rollout.vllm import VLLMRollout

    device = torch.device("cuda", ctx.local_rank)
    rollout, why = settle_free_cache_engine(config, ctx.world, smallest_gpu_memory_gib(device))
    if ctx.rank == 0:
        print(f"vLLM rollout: {why}", flush=True)
    return VLLMRollout(
        rollout,
        actor_model,
        **vllm_model_settings(config),
        eos_ids=eos_ids,
        rank=ctx.rank,
        world=ctx.world,
        local_rank=ctx.local_rank,
    )
