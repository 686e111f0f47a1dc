"""Partial recomputation (``models.recompute``), checked on CPU: blocks that recompute only their
attention or their elementwise work give the gradients of blocks that keep everything, eager and
compiled, under FSDP2; and a compiled block of each mode saves what ``Architecture.
partial_recompute_bytes`` says, tensor by tensor (the figure the memory estimate plans with)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from easyr1.models.architecture import ATTENTION, FULL, KEEP, POINTWISE, Architecture
from easyr1.models.loading import load_model
from easyr1.models.recompute import apply_recompute, selective_context
from easyr1.models.structure import text_blocks
from easyr1.workers.config import FSDPConfig
from easyr1.workers.fsdp import compile_blocks, parallelize
from easyr1.workers.logprobs import install_scoring_head, token_logprobs
from tests.block_utils import qwen2_layer_config, saved_for_backward, two_samples


def _gradients(path: Path, modes: list[str], compiled: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    model = load_model(path)
    install_scoring_head(model)
    apply_recompute(model, modes)
    if compiled:
        compile_blocks(model)
    model = parallelize(
        model,
        FSDPConfig(torch_dtype="fp32", mp_param_dtype="fp32"),
        trainable=True,
        device=torch.device("cpu"),
    )
    model.train()
    exp = two_samples()
    logp, entropy = token_logprobs(
        model, exp, temperature=1.0, pad_id=0, device=torch.device("cpu"), packed=False
    )
    ((logp + 0.1 * entropy) * exp.response_mask).sum().backward()
    grads = {n: p.grad.full_tensor().clone() for n, p in model.named_parameters()}
    return logp.detach() * exp.response_mask, grads


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("arch", ["qwen2", "qwen2_5_vl"])
def test_partial_modes_give_the_gradients_of_keeping_everything(
    tiny_model: Callable[[str], Path], one_rank: None, arch: str, compiled: bool
) -> None:
    path = tiny_model(arch)
    kept_logp, kept = _gradients(path, [KEEP, KEEP], compiled)
    for modes in ([ATTENTION, POINTWISE], [FULL, ATTENTION]):
        torch._dynamo.reset()
        logp, grads = _gradients(path, modes, compiled)
        if compiled:  # different graphs: the same sums, fused differently
            assert torch.allclose(logp, kept_logp, atol=1e-5)
            for name in kept:
                assert torch.allclose(grads[name], kept[name], atol=1e-5, rtol=1e-4), (modes, name)
        else:  # the same kernels run again: the same bits
            assert torch.equal(logp, kept_logp)
            assert all(torch.equal(grads[name], kept[name]) for name in kept), modes


def test_a_plan_sets_each_block_and_compiling_moves_its_checkpoint_inside(
    tiny_model: Callable[[str], Path],
) -> None:
    model = load_model(tiny_model("qwen2"))
    apply_recompute(model, [POINTWISE, KEEP])
    first, second = text_blocks(model)
    assert first.gradient_checkpointing and not second.gradient_checkpointing
    assert first.recompute_context is selective_context(POINTWISE, model.config.intermediate_size)
    assert second.recompute_context is None
    compile_blocks(model)  # the compiled forward checkpoints the partial block itself
    assert not first.gradient_checkpointing and first.recompute_context is not None
    apply_recompute(model)  # every block whole
    assert all(b.gradient_checkpointing and b.recompute_context is None for b in text_blocks(model))
    with pytest.raises(ValueError, match="not a partial recompute mode"):
        selective_context(FULL, 8)


TOKENS = 64


def _saved_by_compiled_block(
    layer: torch.nn.Module, rotary: torch.nn.Module, mode: str, hidden: int
) -> float:
    """Bytes per token a compiled block of ``mode`` saves for backward, as ``saved_for_backward`` counts
    them: the growth from ``TOKENS`` tokens to twice as many, which leaves out what does not grow with
    them (the compiled graph's own state)."""
    from torch.utils.checkpoint import checkpoint

    context = selective_context(mode, layer.mlp.intermediate_size)

    def block(x: torch.Tensor, positions: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor]) -> Any:
        return type(layer).forward(
            layer, x, attention_mask=None, position_ids=positions, position_embeddings=cos_sin
        )

    run = torch.compile(lambda *inputs: checkpoint(block, *inputs, use_reentrant=False, context_fn=context))
    totals = [
        sum(t.untyped_storage().nbytes() for t in saved_for_backward(layer, rotary, hidden, tokens, run)[0])
        for tokens in (TOKENS, 2 * TOKENS)
    ]
    return (totals[1] - totals[0]) / TOKENS


@pytest.mark.parametrize(
    "shape", [(64, 176, 4, 2, 32), (1536, 8960, 12, 2, 128)], ids=["q>h", "qwen2.5-1.5b"]
)
@pytest.mark.parametrize("mode", [POINTWISE, ATTENTION])
def test_compiled_partial_blocks_save_what_the_estimate_counts(shape: tuple[int, ...], mode: str) -> None:
    from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer, Qwen2RotaryEmbedding

    config = qwen2_layer_config(*shape)
    torch.manual_seed(0)
    layer = Qwen2DecoderLayer(config, 0).to(torch.bfloat16).train()
    arch = Architecture.from_config(config)
    torch._dynamo.reset()
    measured = _saved_by_compiled_block(layer, Qwen2RotaryEmbedding(config), mode, config.hidden_size)
    # The checkpoint keeps the block's input too (2h), which the estimate counts apart from the mode's bytes.
    assert measured == arch.partial_recompute_bytes(mode) + 2 * arch.hidden
    assert measured < 0.55 * arch.activation_bytes()  # about half of what an eager block keeps, or less
