"""Score a model on a data set: generate, decode, apply the reward function, average.

Used by the warm start to report before/after accuracy; the trainer's validation scores its
rollouts with the same ``score_rollout``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import torch

from easyr1.rewards.loader import RewardFunction
from easyr1.rewards.worker import RewardWorker
from easyr1.rollout.base import Rollout, SamplingParams
from easyr1.rollout.hf import generate


def score_rollout(
    rollout: Rollout,
    prompts: Sequence[dict[str, Any]],
    tokenizer: Any,
    reward: RewardFunction | RewardWorker,
    skip_special_tokens: bool = True,
) -> tuple[list[str], list[dict[str, float]]]:
    """Decoded responses and their reward dicts, in rollout order."""
    texts = tokenizer.batch_decode(
        [ids.tolist() for ids in rollout.response_ids], skip_special_tokens=skip_special_tokens
    )
    inputs = [
        {"response": text, "response_length": int(ids.numel()), "ground_truth": prompts[i]["ground_truth"]}
        for text, ids, i in zip(texts, rollout.response_ids, rollout.prompt_index, strict=True)
    ]
    return texts, reward(inputs)


def mean_scores(scores: Sequence[dict[str, float]]) -> dict[str, float]:
    sums: dict[str, float] = defaultdict(float)
    for item in scores:
        for key, value in item.items():
            sums[key] += value
    return {key: total / len(scores) for key, total in sums.items()}


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    tokenizer: Any,
    dataset: Any,
    reward: RewardFunction | RewardWorker,
    *,
    max_tokens: int,
    batch_size: int = 32,
    limit: int | None = None,
) -> dict[str, float]:
    """Greedy decoding over the first ``limit`` rows (all by default); mean of every reward key."""
    model.eval()
    rows = range(len(dataset) if limit is None else min(limit, len(dataset)))
    params = SamplingParams(n=1, temperature=0.0, max_tokens=max_tokens)
    eos_ids = model.generation_config.eos_token_id
    eos_ids = [eos_ids] if isinstance(eos_ids, int) else list(eos_ids)
    scores: list[dict[str, float]] = []
    for start in range(0, len(rows), batch_size):
        prompts = [dataset[i] for i in rows[start : start + batch_size]]
        rollout = generate(model, prompts, params, pad_id=tokenizer.pad_token_id, eos_ids=eos_ids)
        scores += score_rollout(rollout, prompts, tokenizer, reward)[1]
    return mean_scores(scores)
