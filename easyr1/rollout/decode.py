"""Sampling loop for text decoders with a static KV cache, one decoding step captured as a CUDA graph.

Hugging Face ``generate`` launches every kernel of every layer from Python at every decoding step,
so on a GPU a small model's decoding is bound by the host (the anchor's 1.5B model: about 40 ms a
step for 64 sequences, where the GPU needs 2-3 ms). Here the prompt is prefilled once into a
``StaticCache`` sized for prompt and response; every later step has the same shapes and the same
buffers, so on CUDA it is captured once as a graph and replayed, one launch a step. Sampling stays
outside the graph and uses the same processors as the ``generate`` path (``hf.py``).

Slots of the cache are shared by the batch: slot ``width + t`` holds every row's step ``t``. Rows are
left-padded; the attention mask hides each row's padding slots and every slot after the current one,
and position ids count each row's real tokens from 0, as ``generate`` does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from transformers import StaticCache
from transformers.generation.logits_process import LogitsProcessor

from easyr1.models.attention import PACKED

# Host syncs (to stop once every row has ended) every this many steps; a sync each step would make
# the host wait for the GPU instead of queueing the next steps.
FINISH_CHECK_EVERY = 32


class GraphedStep:
    """Runs ``fn`` (no arguments, static input buffers) as a CUDA graph after one eager warm-up call.

    The warm-up runs on a side stream, as capture requires; it is a real step, so its output is
    used. The graph is captured at the second call and replayed from then on. Off CUDA, ``fn`` runs
    eagerly every time.
    """

    def __init__(self, fn: Callable[[], torch.Tensor], use_graph: bool) -> None:
        self.fn, self.use_graph = fn, use_graph
        self.graph: torch.cuda.CUDAGraph | None = None
        self.output: torch.Tensor | None = None
        self.warmed = False

    def __call__(self) -> torch.Tensor:
        if not self.use_graph:
            return self.fn()
        if not self.warmed:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                out = self.fn()
            torch.cuda.current_stream().wait_stream(side)
            self.warmed = True
            return out
        if self.graph is None:
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.output = self.fn()
        self.graph.replay()
        assert self.output is not None
        return self.output


def _attention_mask(model: torch.nn.Module, allowed: torch.Tensor) -> torch.Tensor:
    """[B, L] booleans -> the 4D mask the model's attention takes as is (SDPA, and the packed
    attention that hands padded batches to it: booleans; others: additive)."""
    mask = allowed[:, None, None, :]
    if model.config._attn_implementation in ("sdpa", PACKED):
        return mask
    dtype = next(model.parameters()).dtype
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)


@torch.no_grad()
def sample(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    max_new_tokens: int,
    processors: Sequence[LogitsProcessor],
    temperature: float,
    greedy: bool,
    eos_ids: Sequence[int],
    pad_id: int,
    cuda_graph: bool,
    logprobs: bool,
    decode_steps: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Left-padded prompts [B, W] -> (sampled tokens [B, T], with ``logprobs`` their log-probs [B, T]),
    T <= max_new_tokens.

    Log-probs are ``log_softmax(raw logits / temperature)`` of the sampled tokens, before the
    processors (suppression, truncation), which is what the actor recomputes. A row that has ended
    (an EOS token) is continued with ``pad_id``; the loop stops when every row has ended.

    ``decode_steps``: decode that many steps only, then continue each row that has not ended with its
    last token (and its log-prob) up to ``max_new_tokens``, as simulated ranks do (``fast_forward``).
    """
    device = input_ids.device
    batch, width = input_ids.shape
    total = width + max_new_tokens
    cache = StaticCache(config=model.config, max_cache_len=total)
    tokens = torch.full((batch, total), pad_id, dtype=torch.long, device=device)
    tokens[:, :width] = input_ids
    allowed = torch.ones((batch, total), dtype=torch.bool, device=device)
    allowed[:, :width] = attention_mask.bool()
    positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    # ``cache_position`` places the states in transformers < 5.24; 5.24's StaticCache counts slots itself.
    logits = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=positions,
        past_key_values=cache,
        cache_position=torch.arange(width, device=device),
        use_cache=True,
        logits_to_keep=1,
    ).logits[:, -1]

    # The step's static inputs: its token, each row's position, and the cache slot it writes; both
    # are advanced before each step, from the prompt's last.
    step_token = torch.zeros((batch, 1), dtype=torch.long, device=device)
    step_position = positions[:, -1:].clone()
    step_slot = torch.tensor([width - 1], dtype=torch.long, device=device)
    slots = torch.arange(total, device=device)

    def step() -> torch.Tensor:
        mask = _attention_mask(model, allowed & (slots <= step_slot))
        out = model(
            input_ids=step_token,
            position_ids=step_position,
            past_key_values=cache,
            cache_position=step_slot,
            attention_mask=mask,
            use_cache=True,
        )
        return out.logits[:, -1]

    run_step = GraphedStep(step, use_graph=cuda_graph and device.type == "cuda")
    eos = torch.tensor(list(eos_ids), dtype=torch.long, device=device)
    ended = torch.zeros(batch, dtype=torch.bool, device=device)
    picked = torch.zeros((batch, max_new_tokens), dtype=torch.float32, device=device) if logprobs else None
    steps = 0
    while True:
        scores = logits.float()
        logp = torch.log_softmax(scores / temperature, dim=-1) if picked is not None else None
        for processor in processors:
            scores = processor(tokens[:, : width + steps], scores)
        if greedy:
            chosen = scores.argmax(-1)
        else:
            chosen = torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1).squeeze(1)
        chosen = torch.where(ended, pad_id, chosen)
        tokens[:, width + steps] = chosen
        if picked is not None:
            picked[:, steps] = logp.gather(-1, chosen[:, None]).squeeze(1)
        ended |= torch.isin(chosen, eos)
        steps += 1
        if steps == max_new_tokens or (steps % FINISH_CHECK_EVERY == 0 and bool(ended.all())):
            break
        if steps == decode_steps:
            return fast_forward(tokens[:, width:], picked, steps, ended, pad_id)
        step_token.copy_(chosen[:, None])
        step_position.add_(1)
        step_slot.add_(1)
        logits = run_step()
    return tokens[:, width : width + steps], None if picked is None else picked[:, :steps]


def fast_forward(
    sampled: torch.Tensor, picked: torch.Tensor | None, steps: int, ended: torch.Tensor, pad_id: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Responses [B, T] whose first ``steps`` tokens were decoded, completed without decoding: a row
    that has ended keeps ``pad_id``, another repeats its last token (never an EOS: it would have ended
    the row) and that token's log-prob. For simulated ranks (``easyr1.distributed.simulated``): the
    static cache holds every slot from the prefill on, so each later step allocates what the first
    ones did and only takes time; a simulated 32B rank spent 329 s of a 368 s step decoding 2,048
    tokens block by block (2026-12-08), which no ten-minute run of two steps can hold."""
    last = sampled[:, steps - 1 : steps]
    sampled[:, steps:] = torch.where(ended[:, None], pad_id, last)
    if picked is not None:
        picked[:, steps:] = torch.where(ended[:, None], 0.0, picked[:, steps - 1 : steps])
    return sampled, picked
