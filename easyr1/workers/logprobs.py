"""Log-probs and entropies of the sampled response tokens, without full-vocabulary logits.

A language model's head turns each position's hidden state into ``V`` logits (152k for Qwen):
in float32 that is 600 KB per token, 20 GB for the anchor step's 32k response tokens, and
autograd would keep several such tensors alive for the backward pass. RL needs only two numbers
per response token, its log-prob and the entropy of the next-token distribution. So the model's
``lm_head`` is replaced by a ``ScoringHead``: a plain linear layer for ``generate``, but while
``scoring(...)`` is active it returns ``[B, R, 2]`` (log-prob, entropy) at the response positions,
computed chunk by chunk (``TokenLogProbs``), with the backward pass recomputing each chunk's
logits instead of storing them. The head keeps ``lm_head``'s name and weight (tied embeddings
stay tied), so checkpoints, merging and the weight hand-over do not change.

The work on each chunk's logits besides the matmuls (the cast to float32, the row maximum, the
log-sum-exp, the entropy, and in the backward pass the gradient of both) reads and writes the chunk
a dozen times or more in eager PyTorch: on the H200's anchor step, by that traffic, about a third
of a second over the reference pass, the update's forward and its backward. On CUDA
(``compile_scoring``, with the compiled decoder blocks) that work is compiled, so inductor fuses it
into a few passes over the matmul's output.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any

import torch
from torch import Tensor

from easyr1.distributed import ulysses
from easyr1.experience import Experience, scoring_batch
from easyr1.workers.config import LOGPROB_CHUNK_ELEMENTS


def _shifted(logits: Tensor, shift: Tensor | None, temperature: float) -> tuple[Tensor, Tensor]:
    """A chunk's matmul output in at least float32 (float64 stays float64, for gradient checks), over
    the temperature, minus each row's maximum (``shift``, computed when None); and the shift."""
    z = logits.to(torch.promote_types(logits.dtype, torch.float32)) / temperature
    if shift is None:
        shift = z.amax(dim=-1)
    return z - shift[:, None], shift


def chunk_scores(
    logits: Tensor, targets: Tensor, temperature: float
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Of one chunk's matmul output: the targets' log-probs, the entropies, and what the backward
    pass needs again (each row's maximum, and the log-sum-exp of the shifted row)."""
    z, shift = _shifted(logits, None, temperature)
    lse = torch.logsumexp(z, dim=-1)
    logp = z.gather(-1, targets[:, None]).squeeze(-1) - lse
    probs = torch.exp(z - lse[:, None])
    entropy = lse - (probs * z).sum(-1)
    return logp, entropy, shift, lse


def chunk_grad(
    logits: Tensor,
    targets: Tensor,
    shift: Tensor,
    lse: Tensor,
    entropy: Tensor,
    grad_logp: Tensor,
    grad_entropy: Tensor,
    temperature: float,
    dtype: torch.dtype,
) -> Tensor:
    """The gradient with respect to one chunk's matmul output, in ``dtype``."""
    z, _ = _shifted(logits, shift, temperature)
    probs = torch.exp(z - lse[:, None])
    mean_z = (lse - entropy)[:, None]
    grad_z = -probs * (grad_logp[:, None] + grad_entropy[:, None] * (z - mean_z))
    target = torch.arange(z.shape[-1], device=z.device) == targets[:, None]  # one-hot, fused where compiled
    grad_z = grad_z + torch.where(target, grad_logp[:, None], 0.0)
    return (grad_z / temperature).to(dtype)


# Compiled on first use, on CUDA only (``compile_scoring``), and wrapped then too: torch.compile's
# import would slow every rank's start (easyr1.models.attention). A chunk's rows vary (the last
# chunk, the micro-batch), its vocabulary does not.
@cache
def _compiled(fn: Callable[..., Any]) -> Callable[..., Any]:
    return torch.compile(fn, dynamic=True)


class TokenLogProbs(torch.autograd.Function):
    """``(log softmax(z)[target], entropy(softmax(z)))`` with ``z = hidden @ weight.T / temperature``.

    Float32 from the (possibly bf16) matmul on, as ``log_softmax(logits.float())`` would be. Each
    row is shifted by its maximum first, so every intermediate is O(1) and the entropy, a small
    difference of two large sums, stays accurate for any logit scale. Gradients, with
    ``p = softmax(z)`` and ``E[z] = sum_v p_v z_v = logsumexp(z) - entropy``:
    d logp / dz = onehot(target) - p, and d entropy / dz = -p * (z - E[z]).
    """

    @staticmethod
    def forward(
        ctx: Any, hidden: Tensor, weight: Tensor, targets: Tensor, temperature: float, compiled: bool = False
    ) -> tuple[Tensor, Tensor]:
        tokens = hidden.shape[0]
        chunk = max(1, LOGPROB_CHUNK_ELEMENTS // weight.shape[0])
        dtype = torch.promote_types(hidden.dtype, torch.float32)
        logp, entropy, shift, lse = (hidden.new_empty(tokens, dtype=dtype) for _ in range(4))
        scores = _compiled(chunk_scores) if compiled else chunk_scores
        for start in range(0, tokens, chunk):
            part = slice(start, start + chunk)
            logp[part], entropy[part], shift[part], lse[part] = scores(
                hidden[part] @ weight.t(), targets[part], temperature
            )
        ctx.save_for_backward(hidden, weight, targets, shift, lse, entropy)
        ctx.temperature, ctx.chunk, ctx.compiled = temperature, chunk, compiled
        return logp, entropy

    @staticmethod
    def backward(
        ctx: Any, grad_logp: Tensor | None, grad_entropy: Tensor | None
    ) -> tuple[Tensor, Tensor, None, None, None]:
        hidden, weight, targets, shift, lse, entropy = ctx.saved_tensors
        tokens = hidden.shape[0]
        grad_logp = grad_logp if grad_logp is not None else lse.new_zeros(tokens)
        grad_entropy = grad_entropy if grad_entropy is not None else lse.new_zeros(tokens)
        grad_hidden = torch.empty_like(hidden)
        grad_weight = torch.zeros(weight.shape, dtype=lse.dtype, device=weight.device)
        grad = _compiled(chunk_grad) if ctx.compiled else chunk_grad
        for start in range(0, tokens, ctx.chunk):
            part = slice(start, start + ctx.chunk)
            grad_logits = grad(
                hidden[part] @ weight.t(),
                targets[part],
                shift[part],
                lse[part],
                entropy[part],
                grad_logp[part],
                grad_entropy[part],
                ctx.temperature,
                weight.dtype,
            )
            grad_hidden[part] = grad_logits @ weight
            grad_weight.add_(grad_logits.t() @ hidden[part])  # accumulated in float32 without a float32 copy
        return grad_hidden, grad_weight.to(weight.dtype), None, None, None


class ScoringHead(torch.nn.Linear):
    """``lm_head`` that scores given tokens at given positions while ``scoring`` is active."""

    _request: tuple[Tensor, Tensor, float, ulysses.Shard | None] | None = None
    compiled = False  # the chunks' elementwise work compiled (``compile_scoring``)

    @contextmanager
    def scoring(
        self, positions: Tensor, targets: Tensor, temperature: float, shard: ulysses.Shard | None = None
    ) -> Iterator[None]:
        """Within the block, the model's ``logits`` are ``[B, R, 2]``: the log-prob of ``targets``
        ([B, R]) predicted at ``positions`` ([B, R] sequence indices), and the entropy there.
        ``shard``: the hidden states are this rank's slice of one packed row (Ulysses)."""
        self._request = (positions, targets, temperature, shard)
        try:
            yield
        finally:
            self._request = None

    def forward(self, hidden: Tensor) -> Tensor:
        if self._request is None:
            return super().forward(hidden)
        positions, targets, temperature, shard = self._request
        if shard is not None:  # score the positions in this rank's slice, then share them
            mine, local = ulysses.owned(positions[0], shard, hidden.shape[1] * shard.size)
            logp, entropy = TokenLogProbs.apply(
                hidden[0, local], self.weight, targets[0, mine], temperature, self.compiled
            )
            return ulysses.gather_outputs(torch.stack([logp, entropy], dim=-1), mine, shard)[None]
        rows, width = positions.shape
        picked = hidden.gather(1, positions[..., None].expand(-1, -1, hidden.shape[-1]))
        flat = picked.reshape(rows * width, -1)
        logp, entropy = TokenLogProbs.apply(
            flat, self.weight, targets.reshape(-1), temperature, self.compiled
        )
        # Stacked last: a fresh tensor, not a view (FSDP2 warns about views as module outputs).
        return torch.stack([logp.view(rows, width), entropy.view(rows, width)], dim=-1)


def install_scoring_head(model: torch.nn.Module) -> ScoringHead:
    """Swap the model's output layer for a ``ScoringHead`` sharing its weight (call before sharding)."""
    old = model.get_output_embeddings()
    if type(old) is not torch.nn.Linear or old.bias is not None:
        raise TypeError(
            f"{type(model).__name__}: expected a bias-free nn.Linear output layer, found {type(old).__name__}"
        )
    head = ScoringHead(old.in_features, old.out_features, bias=False, device="meta")
    head.weight = old.weight  # the same Parameter: a tied embedding stays tied
    model.set_output_embeddings(head)
    return head


def compile_scoring(model: torch.nn.Module) -> None:
    """Compile the scoring head's per-chunk work (see the module docstring); with the compiled blocks."""
    scoring_head(model).compiled = True


def scoring_head(model: torch.nn.Module) -> ScoringHead:
    head = model.get_output_embeddings()
    if not isinstance(head, ScoringHead):
        raise TypeError(
            f"{type(model).__name__} has no ScoringHead; call install_scoring_head before sharding"
        )
    return head


def token_logprobs(
    model: torch.nn.Module,
    exp: Experience,
    *,
    temperature: float,
    pad_id: int,
    device: torch.device,
    packed: bool,
    shard: ulysses.Shard | None = None,
) -> tuple[Tensor, Tensor]:
    """``[B, R]`` log-probs of the sampled response tokens and the entropies where they were
    sampled (values on padding are meaningless: mask them). ``packed``: padding-free, the
    micro-batch as one row (``experience.scoring_batch``); ``shard``: that row split over a
    Ulysses group."""
    batch = scoring_batch(exp, pad_id, model, device, packed=packed, shard=shard)
    with scoring_head(model).scoring(batch.positions, batch.targets, temperature, batch.shard):
        scores = batch.to_frame(model(**batch.inputs, use_cache=False).logits)
    return scores[..., 0], scores[..., 1]
