"""What every rollout backend offers the trainer, and the records it returns.

A backend samples ``n`` responses per prompt. Under the HybridEngine the rollout engine shares
the GPUs with training, so a step brackets generation with ``prepare`` (hand the current actor
weights over, take memory back) and ``release`` (give the memory back to training).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 512
    ignore_eos: bool = False
    logprobs: bool = False  # return each sampled token's log-prob (worker.rollout.calculate_log_probs)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass
class Rollout:
    """One entry per sample: ``n`` consecutive samples per prompt, in prompt order."""

    prompt_index: list[int]
    prompt_ids: list[torch.Tensor]
    response_ids: list[torch.Tensor]  # up to and including the EOS token when one was produced
    finished: list[bool]  # ended with an EOS token (False: cut at max_tokens)
    # With ``SamplingParams.logprobs``, one per response token: log_softmax(logits / temperature) of
    # the sampled token (the vLLM backend's differ under top-p/top-k truncation; see rollout/vllm.py).
    logprobs: list[torch.Tensor] | None = None


class RolloutEngine(Protocol):
    """A rollout backend; every rank calls each method, in the same order (SPMD)."""

    def prepare(self, step: int) -> dict[str, float]:
        """Before a rollout: make the engine hold the actor's current weights; returns metrics."""
        ...

    def generate(self, prompts: Sequence[dict[str, Any]], params: SamplingParams, seed: int) -> Rollout:
        """Sample ``params.n`` responses for each of this rank's prompts (dataset items)."""
        ...

    def release(self) -> None:
        """After a rollout: give the engine's memory back to training."""
        ...
