"""The scoring head: log-probs and entropies without full logits, equal to the plain computation
in values and gradients; and the on-policy update that takes its old log-probs from itself."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from easyr1.algorithms.config import AlgorithmConfig
from easyr1.experience import Experience
from easyr1.models.attention import use_packed_attention
from easyr1.models.loading import load_model
from easyr1.workers import logprobs
from easyr1.workers.actor import Actor, compute_log_probs
from easyr1.workers.config import ActorConfig, FSDPConfig
from easyr1.workers.fsdp import parallelize
from easyr1.workers.logprobs import TokenLogProbs, install_scoring_head, token_logprobs
from tests.trainer_utils import sharded_actor


def _reference(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temperature: float):
    """Log-prob and entropy from the full float64 distribution."""
    logits = (hidden.double() @ weight.double().t()) / temperature
    log_p = logits - logits.exp().sum(-1, keepdim=True).log()
    picked = log_p[torch.arange(len(targets)), targets]
    entropy = -(log_p.exp() * log_p).sum(-1)
    return picked, entropy


def test_values_match_the_full_distribution_across_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    hidden, weight = torch.randn(13, 8), torch.randn(50, 8)
    targets = torch.randint(0, 50, (13,))
    monkeypatch.setattr(
        logprobs, "LOGPROB_CHUNK_ELEMENTS", 50 * 4
    )  # 4 tokens per chunk: 4 chunks, the last short
    logp, entropy = TokenLogProbs.apply(hidden, weight, targets, 0.7)
    want_logp, want_entropy = _reference(hidden, weight, targets, 0.7)
    assert torch.allclose(logp.double(), want_logp, atol=1e-5)
    assert torch.allclose(entropy.double(), want_entropy, atol=1e-5)
    assert logp.dtype == entropy.dtype == torch.float32


def test_stable_for_huge_logits_and_float32_from_bf16() -> None:
    """Logits of 1e4 give the same distribution as the shifted ones (no overflow in exp), and bf16
    inputs give float32 results equal to the float32 computation when bf16 holds them exactly."""
    weight = torch.tensor([[1e4], [1e4 - 1.0], [-1e4]])
    targets = torch.tensor([1])
    huge = TokenLogProbs.apply(torch.ones(1, 1), weight, targets, 1.0)
    shifted = TokenLogProbs.apply(torch.ones(1, 1), weight - 1e4, targets, 1.0)
    for a, b in zip(huge, shifted, strict=True):
        assert torch.isfinite(a).all() and torch.allclose(a, b, atol=2e-3)
    exact = torch.tensor([[3.0], [1.0], [-2.0]])
    in_bf16 = TokenLogProbs.apply(torch.ones(1, 1, dtype=torch.bfloat16), exact.bfloat16(), targets, 1.0)
    in_fp32 = TokenLogProbs.apply(torch.ones(1, 1), exact, targets, 1.0)
    assert all(t.dtype == torch.float32 for t in in_bf16)
    assert all(torch.equal(a, b) for a, b in zip(in_bf16, in_fp32, strict=True))


def test_gradients_match_finite_differences(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both outputs feed the check, through hidden states and weight, over several chunks."""
    torch.manual_seed(0)
    monkeypatch.setattr(logprobs, "LOGPROB_CHUNK_ELEMENTS", 11 * 3)
    hidden = torch.randn(7, 5, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(11, 5, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 11, (7,))

    def fn(h: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return TokenLogProbs.apply(h, w, targets, 1.3)

    assert torch.autograd.gradcheck(fn, (hidden, weight), eps=1e-6, atol=1e-5)


def test_compiled_chunks_equal_the_eager_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled per-chunk work (``compile_scoring``: the trainer compiles it on CUDA only;
    inductor runs on CPU too) gives the eager values and gradients, in bf16 as the anchor runs it,
    over chunks of two sizes (the last one short) and a temperature."""
    torch.manual_seed(0)
    monkeypatch.setattr(logprobs, "LOGPROB_CHUNK_ELEMENTS", 64 * 5)  # 5 tokens a chunk: 5, 5, 3
    weight = torch.randn(64, 16, dtype=torch.bfloat16)
    hidden = torch.randn(13, 16, dtype=torch.bfloat16)
    targets = torch.randint(0, 64, (13,))
    grads = torch.randn(13), torch.randn(13)
    results = []
    for compiled in (False, True):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        logp, entropy = TokenLogProbs.apply(h, w, targets, 0.7, compiled)
        torch.autograd.backward((logp, entropy), grads)
        results.append((logp, entropy, h.grad, w.grad))
    for eager, compiled in zip(*results, strict=True):
        assert compiled.dtype == eager.dtype
        assert torch.allclose(compiled.float(), eager.float(), rtol=1e-2, atol=1e-2), (
            (compiled - eager).abs().max()
        )
    assert torch.allclose(results[1][0], results[0][0], atol=1e-5)  # the float32 outputs closely
    assert torch.allclose(results[1][1], results[0][1], atol=1e-5)


def test_only_the_used_output_drives_the_gradient() -> None:
    torch.manual_seed(0)
    hidden = torch.randn(6, 4, requires_grad=True)
    weight = torch.randn(9, 4, requires_grad=True)
    targets = torch.randint(0, 9, (6,))
    logp, _ = TokenLogProbs.apply(hidden, weight, targets, 1.0)
    logp.sum().backward()
    ref_h, ref_w = hidden.detach().clone().requires_grad_(), weight.detach().clone().requires_grad_()
    torch.log_softmax(ref_h @ ref_w.t(), -1)[torch.arange(6), targets].sum().backward()
    assert torch.allclose(hidden.grad, ref_h.grad, atol=1e-5)
    assert torch.allclose(weight.grad, ref_w.grad, atol=1e-5)


def _experience(rows: int, vocab: int) -> Experience:
    torch.manual_seed(1)
    lengths = [3, 5, 2, 4][:rows]
    mask = torch.zeros(rows, max(lengths))
    for row, n in enumerate(lengths):
        mask[row, :n] = 1
    return Experience(
        prompt_ids=[torch.randint(1, vocab, (4 + row,)) for row in range(rows)],
        response_ids=[torch.randint(1, vocab, (n,)) for n in lengths],
        multi_modal_inputs=[{} for _ in lengths],
        group=torch.zeros(rows, dtype=torch.long),
        response_mask=mask,
    )


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_scoring_head_equals_the_model_logits(tiny_model: Callable[[str], Path], packed: bool) -> None:
    """Installed on a tied tiny Qwen2: the weight stays tied, the state dict keeps its names, plain
    forwards still give logits, and scoring gives the log-probs and entropies of those logits, with
    the same gradients on every parameter; padded or packed into one row (padding-free)."""
    model = load_model(tiny_model("qwen2"))
    keys = list(model.state_dict())
    head = install_scoring_head(model)
    if packed:
        use_packed_attention(model)  # plain padded forwards (below) still work
    assert head.weight is model.get_input_embeddings().weight
    assert list(model.state_dict()) == keys
    exp = _experience(4, model.config.vocab_size)

    logp, entropy = token_logprobs(
        model, exp, temperature=0.9, pad_id=0, device=torch.device("cpu"), packed=packed
    )
    mask = exp.response_mask
    (logp * mask).sum().add((entropy * mask).sum() * 0.3).backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()

    seqs = [torch.cat([p, r]) for p, r in zip(exp.prompt_ids, exp.response_ids, strict=True)]
    width = max(len(s) for s in seqs)
    ids = torch.stack([torch.nn.functional.pad(s, (0, width - len(s))) for s in seqs])
    attention = torch.stack([torch.arange(width) < len(s) for s in seqs]).long()
    logits = model(input_ids=ids, attention_mask=attention).logits.float() / 0.9
    want_logp, want_entropy = torch.zeros_like(mask), torch.zeros_like(mask)
    for row, (prompt, response) in enumerate(zip(exp.prompt_ids, exp.response_ids, strict=True)):
        at = logits[row, len(prompt) - 1 : len(prompt) - 1 + len(response)]
        log_p = torch.log_softmax(at, -1)
        want_logp[row, : len(response)] = log_p[torch.arange(len(response)), response]
        want_entropy[row, : len(response)] = -(log_p.exp() * log_p).sum(-1)
    assert torch.allclose(logp * mask, want_logp, atol=1e-5)
    assert torch.allclose(entropy * mask, want_entropy, atol=1e-5)
    (want_logp.sum() + 0.3 * want_entropy.sum()).backward()
    for name, p in model.named_parameters():
        assert torch.allclose(grads[name], p.grad, atol=1e-5, rtol=1e-4), name


def test_install_refuses_an_unexpected_head() -> None:
    model = torch.nn.Module()
    model.get_output_embeddings = lambda: torch.nn.Linear(4, 9, bias=True)  # type: ignore[method-assign]
    with pytest.raises(TypeError, match="bias-free nn.Linear"):
        install_scoring_head(model)


def test_on_policy_update_equals_an_update_with_recomputed_old_log_probs(
    tiny_model: Callable[[str], Path], one_rank: None
) -> None:
    """One epoch, one mini-batch: the update that takes its old log-probs from its own forward
    pass moves the weights exactly as the one given a separate pass's log-probs, and fills them in."""
    fsdp = FSDPConfig(torch_dtype="fp32", mp_param_dtype="fp32")
    config = ActorConfig(global_batch_size=4, micro_batch_size_per_device_for_update=2, fsdp=fsdp)
    weights, filled = [], []
    for recompute in (True, False):
        model, actor = sharded_actor(tiny_model("qwen2"), config, max_response_length=5)
        exp = _experience(4, model.config.vocab_size)
        exp.advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])[:, None] * exp.response_mask
        assert actor.on_policy(len(exp))
        if recompute:
            exp.old_logp = compute_log_probs(
                model,
                exp,
                micro_batch_size=3,
                dynamic_batching=False,
                padding_free=False,
                temperature=1.0,
                pad_id=0,
                device=torch.device("cpu"),
            )
        metrics = actor.update(exp, step=1)
        assert metrics["actor/pg_clipfrac_higher"] == 0.0
        filled.append(exp.old_logp)
        weights.append({k: v.full_tensor().clone() for k, v in model.state_dict().items()})
    assert torch.allclose(filled[0], filled[1], atol=1e-6)
    for key in weights[0]:
        assert torch.allclose(weights[0][key], weights[1][key], atol=1e-6), key


def test_an_update_without_old_log_probs_must_be_on_policy(
    tiny_model: Callable[[str], Path], one_rank: None
) -> None:
    fsdp = FSDPConfig(torch_dtype="fp32", mp_param_dtype="fp32")
    model = load_model(tiny_model("qwen2"))
    install_scoring_head(model)
    model = parallelize(model, fsdp, trainable=True, device=torch.device("cpu"))
    config = ActorConfig(global_batch_size=2, ppo_epochs=1, fsdp=fsdp)
    actor = Actor(
        model,
        config,
        AlgorithmConfig(disable_kl=True),
        samples_per_prompt=1,
        max_response_length=5,
        temperature=1.0,
        pad_id=0,
        total_steps=1,
        device=torch.device("cpu"),
    )
    exp = _experience(4, model.config.vocab_size)
    exp.advantages = torch.zeros_like(exp.response_mask)
    assert not actor.on_policy(len(exp))  # 4 rows, mini-batches of 2: two optimizer steps
    with pytest.raises(ValueError, match="on-policy"):
        actor.update(exp, step=1)
