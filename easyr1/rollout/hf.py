"""Rollout with Hugging Face models: the backend that runs anywhere, CPU included.

Text decoders sample with ``decode.sample`` (a static KV cache, each decoding step a CUDA graph on
GPUs); vision-language models with ``generate``, whose multimodal position handling they need.
Sampling log-probs are ``log_softmax(logits / temperature)`` of the sampled tokens, taken from the
raw logits (before suppression and top-p/top-k truncation), which is exactly what the actor
recomputes, so the two can be compared token by token. The processors (suppressed vision tokens,
the minimum length under ``ignore_eos``, temperature, top-k, top-p) are built here, in order,
and both paths apply them after recording the raw logits.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers.generation.logits_process import (
    LogitsProcessor,
    LogitsProcessorList,
    MinNewTokensLengthLogitsProcessor,
    SuppressTokensLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from easyr1.models.inputs import multimodal_kwargs, pad, vision_token_ids
from easyr1.models.lora import folded
from easyr1.models.structure import vision_tower
from easyr1.rollout import decode
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


class SampledLogProbs(LogitsProcessor):
    """First in a ``generate`` call's processor list, so it sees each step's raw logits.

    It keeps ``log_softmax(logits / temperature)`` of the latest step only; at the next step,
    whose input ends with the token just sampled, it takes that token's log-prob. One ``[B, V]``
    step is alive at a time, where ``output_logits`` would keep every step's (B * steps * V * 4
    bytes: 20 GB for 64 x 512 tokens of a 152k vocabulary).
    """

    def __init__(self, temperature: float) -> None:
        self.temperature = temperature
        self.latest: torch.Tensor | None = None
        self.picked: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.latest is not None:
            self.picked.append(self.latest.gather(-1, input_ids[:, -1:]).squeeze(-1))
        self.latest = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        return scores

    def finish(self, sampled: torch.Tensor) -> torch.Tensor:
        """[B, steps] log-probs, given the [B, steps] sampled tokens (the last one is picked here)."""
        assert self.latest is not None and len(self.picked) == sampled.shape[1] - 1
        return torch.stack([*self.picked, self.latest.gather(-1, sampled[:, -1:]).squeeze(-1)], dim=1)


def _processors(
    params: SamplingParams,
    forbidden: list[int],
    prompt_width: int,
    eos_ids: Sequence[int],
    device: torch.device,
):
    """Suppression, the minimum length and the sampling warpers, in that order, after the recorder."""
    out: list[LogitsProcessor] = []
    if forbidden:
        out.append(SuppressTokensLogitsProcessor(forbidden, device=device))
    if params.ignore_eos:
        out.append(
            MinNewTokensLengthLogitsProcessor(prompt_width, params.max_tokens, list(eos_ids), device=device)
        )
    if not params.greedy:
        if params.temperature != 1.0:
            out.append(TemperatureLogitsWarper(params.temperature))
        if params.top_k > 0:
            out.append(TopKLogitsWarper(params.top_k))
        if params.top_p < 1.0:
            out.append(TopPLogitsWarper(params.top_p))
    return out


def _hf_generate(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    prompts: Sequence[dict[str, Any]],
    order: list[int],
    params: SamplingParams,
    processors: list[LogitsProcessor],
    pad_id: int,
    eos_ids: Sequence[int],
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``generate`` for vision-language models: (sampled tokens [B, T], with ``params.logprobs``
    their log-probs [B, T])."""
    device = next(model.parameters()).device
    mm = multimodal_kwargs(input_ids, [prompts[i].get("multi_modal_inputs", {}) for i in order], model.config)
    recorder = SampledLogProbs(1.0 if params.greedy else params.temperature) if params.logprobs else None
    out = model.generate(
        input_ids=input_ids.to(device),
        attention_mask=attention_mask.to(device),
        **{k: v.to(device) for k, v in mm.items()},
        do_sample=not params.greedy,
        # Neutral values, explicitly: generate fills unset ones from the checkpoint's
        # generation_config (e.g. Qwen's repetition_penalty 1.05), which the actor knows nothing of.
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        repetition_penalty=1.0,
        logits_processor=LogitsProcessorList([recorder, *processors] if recorder else processors),
        max_new_tokens=params.max_tokens,
        eos_token_id=list(eos_ids),
        pad_token_id=pad_id,
        return_dict_in_generate=True,
    )
    sampled = out.sequences[:, input_ids.shape[1] :]
    return sampled, recorder.finish(sampled) if recorder else None


@torch.no_grad()
def generate(
    model: torch.nn.Module,
    prompts: Sequence[dict[str, Any]],
    params: SamplingParams,
    *,
    pad_id: int,
    eos_ids: Sequence[int],
    cuda_graph: bool = True,
    decode_steps: int | None = None,
) -> Rollout:
    """Sample ``params.n`` responses for each prompt (dataset items with ``input_ids`` and
    ``multi_modal_inputs``) as one batch. ``cuda_graph``: replay text decoders' steps as a CUDA
    graph on GPUs (``worker.rollout.enforce_eager`` turns it off). ``decode_steps``: text decoders
    decode that many steps and fast-forward the rest (``decode.sample``; simulated ranks)."""
    device = next(model.parameters()).device
    order = [i for i in range(len(prompts)) for _ in range(params.n)]
    prompt_ids = [prompts[i]["input_ids"] for i in order]
    input_ids, attention_mask = pad(prompt_ids, pad_id, side="left")
    temperature = 1.0 if params.greedy else params.temperature
    processors = _processors(params, forbidden_token_ids(model.config), input_ids.shape[1], eos_ids, device)
    if vision_tower(model) is None:
        sampled, token_logprobs = decode.sample(
            model,
            input_ids.to(device),
            attention_mask.to(device),
            max_new_tokens=params.max_tokens,
            processors=processors,
            temperature=temperature,
            greedy=params.greedy,
            eos_ids=eos_ids,
            pad_id=pad_id,
            cuda_graph=cuda_graph,
            logprobs=params.logprobs,
            decode_steps=decode_steps,
        )
    else:
        sampled, token_logprobs = _hf_generate(
            model, input_ids, attention_mask, prompts, order, params, processors, pad_id, eos_ids
        )
    token_logprobs = None if token_logprobs is None else token_logprobs.cpu()
    new_tokens = sampled.cpu()

    eos = torch.tensor(list(eos_ids), dtype=torch.long)
    rollout = Rollout([], [], [], [], [] if params.logprobs else None)
    for row, index in enumerate(order):
        tokens = new_tokens[row]
        hits = torch.isin(tokens, eos).nonzero()
        length = int(hits[0]) + 1 if len(hits) and not params.ignore_eos else int(tokens.numel())
        rollout.prompt_index.append(index)
        rollout.prompt_ids.append(prompt_ids[row])
        rollout.response_ids.append(tokens[:length].clone())
        rollout.finished.append(bool(len(hits)) and not params.ignore_eos)
        if token_logprobs is not None:
            rollout.logprobs.append(token_logprobs[row, :length].clone())
    return rollout


class HFRollout:
    """``generate`` on the FSDP actor itself: the HybridEngine hand-over is gathering its shards
    (and folding LoRA adapters into the gathered weights).

    Nothing to hand over or free between rollouts, so ``prepare`` and ``release`` do nothing; the
    shards are gathered for exactly the duration of ``generate``. With ``gather_full_model`` false
    nothing is gathered beforehand: FSDP gathers each block at each decoding step, as in training
    (a model whose full weights do not fit the GPU; no CUDA graph, LoRA adapters unfolded).
    ``decode_steps``: as ``generate`` takes it (simulated ranks).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        fsdp_config: Any,
        *,
        pad_id: int,
        eos_ids: Sequence[int],
        cuda_graph: bool = True,
        gather_full_model: bool = True,
        decode_steps: int | None = None,
    ) -> None:
        self.model, self.fsdp_config, self.cuda_graph = model, fsdp_config, cuda_graph
        self.pad_id, self.eos_ids = pad_id, list(eos_ids)
        self.gather_full_model, self.decode_steps = gather_full_model, decode_steps

    def prepare(self, step: int) -> dict[str, float]:
        return {}

    def generate(self, prompts: Sequence[dict[str, Any]], params: SamplingParams, seed: int) -> Rollout:
        torch.manual_seed(seed)
        if not self.gather_full_model:
            self.model.eval()
            return generate(
                self.model,
                prompts,
                params,
                pad_id=self.pad_id,
                eos_ids=self.eos_ids,
                cuda_graph=False,
                decode_steps=self.decode_steps,
            )
        with gathered(self.model, self.fsdp_config), folded(self.model):
            self.model.eval()
            return generate(
                self.model,
                prompts,
                params,
                pad_id=self.pad_id,
                eos_ids=self.eos_ids,
                cuda_graph=self.cuda_graph,
                decode_steps=self.decode_steps,
            )

    def release(self) -> None:
        return None
