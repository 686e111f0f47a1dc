"""Rollout with Hugging Face ``generate``: the backend that runs anywhere, CPU included.

Sampling log-probs are ``log_softmax(logits / temperature)`` of the sampled tokens, taken from the
raw logits (before top-p/top-k truncation), which is exactly what the actor recomputes, so the
two can be compared token by token.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from easyr1.models.inputs import multimodal_kwargs, pad, vision_token_ids
from easyr1.rollout.base import Rollout, SamplingParams
from easyr1.workers.fsdp import gathered


def forbidden_token_ids(model_config: Any) -> list[int]:
    """Vision placeholders must never be sampled: re-scoring a response holding them fails."""
    ids = set(vision_token_ids(model_config).values())
    for name in ("vision_start_token_id", "vision_end_token_id"):
        value = getattr(model_config, name, None)
        if value is not None:
            ids.add(int(value))
    return sorted(ids)


@torch.no_grad()
def generate(
    model: torch.nn.Module,
    prompts: Sequence[dict[str, Any]],
    params: SamplingParams,
    *,
    pad_id: int,
    eos_ids: Sequence[int],
) -> Rollout:
    """Sample ``params.n`` responses for each prompt (dataset items with ``input_ids`` and
    ``multi_modal_inputs``) in one batched ``generate`` call."""
    device = next(model.parameters()).device
    order = [i for i in range(len(prompts)) for _ in range(params.n)]
    prompt_ids = [prompts[i]["input_ids"] for i in order]
    input_ids, attention_mask = pad(prompt_ids, pad_id, side="left")
    mm = multimodal_kwargs(input_ids, [prompts[i].get("multi_modal_inputs", {}) for i in order], model.config)
    forbidden = forbidden_token_ids(model.config)
    sampling: dict[str, Any] = (
        {"do_sample": False}
        if params.greedy
        else {
            "do_sample": True,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k if params.top_k > 0 else 0,
        }
    )
    out = model.generate(
        input_ids=input_ids.to(device),
        attention_mask=attention_mask.to(device),
        **{k: v.to(device) for k, v in mm.items()},
        **sampling,
        max_new_tokens=params.max_tokens,
        min_new_tokens=params.max_tokens if params.ignore_eos else 0,
        eos_token_id=list(eos_ids),
        pad_token_id=pad_id,
        suppress_tokens=forbidden or None,
        output_logits=True,
        return_dict_in_generate=True,
    )
    width = input_ids.shape[1]
    sampled = out.sequences[:, width:]
    scale = 1.0 if params.greedy else params.temperature
    # Step by step on the device: stacking every step's [B, V] logits in fp32 (and copying them
    # to the host) would cost B * steps * V * 4 bytes, 20 GB for 64 x 512 tokens of a 152k vocabulary.
    token_logprobs = torch.stack(
        [
            torch.log_softmax(step_logits.float() / scale, dim=-1).gather(-1, sampled[:, t : t + 1]).squeeze(-1)
            for t, step_logits in enumerate(out.logits)
        ],
        dim=1,
    ).cpu()
    new_tokens = sampled.cpu()

    eos = torch.tensor(list(eos_ids), dtype=torch.long)
    rollout = Rollout([], [], [], [], [])
    for row, index in enumerate(order):
        tokens = new_tokens[row]
        hits = torch.isin(tokens, eos).nonzero()
        length = int(hits[0]) + 1 if len(hits) and not params.ignore_eos else int(tokens.numel())
        rollout.prompt_index.append(index)
        rollout.prompt_ids.append(prompt_ids[row])
        rollout.response_ids.append(tokens[:length].clone())
        rollout.logprobs.append(token_logprobs[row, :length].clone())
        rollout.finished.append(bool(len(hits)) and not params.ignore_eos)
    return rollout


class HFRollout:
    """``generate`` on the FSDP actor itself: the HybridEngine hand-over is gathering its shards.

    Nothing to hand over or free between rollouts, so ``prepare`` and ``release`` do nothing; the
    shards are gathered for exactly the duration of ``generate``.
    """

    def __init__(self, model: torch.nn.Module, fsdp_config: Any, *, pad_id: int, eos_ids: Sequence[int]) -> None:
        self.model, self.fsdp_config = model, fsdp_config
        self.pad_id, self.eos_ids = pad_id, list(eos_ids)

    def prepare(self, step: int) -> dict[str, float]:
        return {}

    def generate(self, prompts: Sequence[dict[str, Any]], params: SamplingParams, seed: int) -> Rollout:
        torch.manual_seed(seed)
        with gathered(self.model, self.fsdp_config):
            self.model.eval()
            return generate(self.model, prompts, params, pad_id=self.pad_id, eos_ids=self.eos_ids)

    def release(self) -> None:
        return None
