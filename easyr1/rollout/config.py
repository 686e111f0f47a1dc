"""The rollout section of the run config (``worker.rollout.*``): which backend generates, and how
it samples.

Each field's docstring is its documentation (``easyr1 config --explain worker.rollout.KEY`` prints it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from easyr1.workers.config import DType


@dataclass
class RolloutConfig:
    name: Literal["auto", "hf", "vllm"] = "auto"
    """The backend: ``vllm`` (GPUs), ``hf`` (Hugging Face models with a static-cache decoder, anywhere), or ``auto``."""
    n: int = 1
    """Responses sampled per prompt (the group size of GRPO and its relatives)."""
    temperature: float = 1.0
    """Sampling temperature; 0: greedy."""
    top_p: float = 1.0
    """Nucleus sampling: the smallest set of tokens whose probability reaches top_p; 1: off."""
    top_k: int = -1
    """Sample among the top_k likeliest tokens; -1: off."""
    seed: int = 1
    """The seed of the rollout's sampling."""
    # 0 is EasyR1's "not set": the most one prompt of the data holds, so no videos for data without
    # any (vLLM would profile them at start-up through the model folder's own video processor, which
    # image-only folders lack).
    limit_images: int = 0
    """vLLM's most images per prompt (``limit_mm_per_prompt``); 0: the most one prompt of the data holds."""
    limit_videos: int = 0
    """vLLM's most videos per prompt; 0: the most one prompt of the data holds."""
    dtype: DType = "bf16"
    """The dtype the rollout's weights and activations are in."""
    gpu_memory_utilization: float = 0.6
    """The share of a GPU's memory vLLM may take (its weights, activations and KV cache)."""
    ignore_eos: bool = False
    """Go on generating past the end-of-sequence token, up to ``data.max_response_length``."""
    enforce_eager: bool = False
    """vLLM without CUDA graphs (slower decoding, quicker start, less memory)."""
    enable_chunked_prefill: bool = False
    """vLLM's chunked prefill: long prompts are prefilled in pieces of ``max_num_batched_tokens``."""
    tensor_parallel_size: int = 2
    """GPUs one vLLM engine's model is split over."""
    max_model_len: int | None = None
    """vLLM's longest sequence; null: prompt plus response length."""
    max_num_batched_tokens: int = 8192
    """The most tokens vLLM's scheduler processes in one step."""
    # vLLM sizes its per-request buffers, which it copies to the GPU at each step, by it.
    max_num_seqs: int | None = None
    """The most sequences vLLM decodes at once; null: vLLM's default (veRL's key)."""
    disable_log_stats: bool = True
    """Silence vLLM's periodic statistics log."""
    disable_tqdm: bool = False
    """Hide the rollout's progress bar."""
    # It costs vLLM a pass over the vocabulary per token (7% of the anchor's decoding kernels);
    # nothing else reads them.
    calculate_log_probs: bool = False
    """Return each sampled token's log-prob and log the actor's distance from it (``rollout/logp_diff_*``; veRL's key)."""
    # True: vLLM's weights and KV cache are freed while the actor trains (sleep mode). False: they
    # stay on the GPU, which saves the sleep and wake-up at every step. "auto": False when the memory
    # estimate with vLLM's share kept through training fits the GPU with 10% to spare
    # (easyr1/memory.py, stays_awake), True otherwise; the log line naming the backend says which.
    free_cache_engine: bool | Literal["auto"] = "auto"
    """Free vLLM's memory while the actor trains: true, false, or auto (by the memory estimate; veRL's key)."""
    # The Hugging Face rollout generates on the FSDP actor itself. True: every block's full weights
    # are gathered once for the whole rollout (the fastest). False: FSDP gathers each block at each
    # decoding step, as in training (the least memory: for a model whose full weights outgrow a GPU;
    # LoRA adapters then run beside their base weights instead of folded into them). "auto": true
    # unless the full weights would take more than half of the GPU (easyr1/memory.py,
    # gathers_full_model); always true on CPUs.
    gather_full_model: bool | Literal["auto"] = "auto"
    """The HF rollout gathers the whole model for a rollout (true), each block at each step (false), or auto (by size)."""
    val_override_config: dict[str, Any] = field(default_factory=dict)
    """Rollout keys that validation uses instead (e.g. ``{temperature: 0.6, n: 1}``)."""
