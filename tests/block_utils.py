"""Decoder blocks in tests: a one-layer Qwen2 config of given shapes, the storages one block's forward
saves for backward, and the two-sample batch the gradient tests score."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from easyr1.experience import Experience


def qwen2_layer_config(
    hidden: int, intermediate: int, heads: int, kv_heads: int, head_dim: int | None = None, vocab: int = 256
) -> Any:
    """A Qwen2 config of one decoder layer of these shapes, with SDPA attention."""
    from transformers import Qwen2Config

    config = Qwen2Config(
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=1,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim or hidden // heads,
        vocab_size=vocab,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6},
    )
    config._attn_implementation = "sdpa"
    return config


def saved_for_backward(
    layer: torch.nn.Module,
    rotary: torch.nn.Module,
    hidden: int,
    tokens: int,
    run: Callable[..., Any] | None = None,
) -> tuple[list[torch.Tensor], dict[str, int]]:
    """The distinct storages one decoder layer's forward saves for backward (bf16, [1, tokens, hidden]
    input, the model's rotary embeddings, sdpa attention, no mask: causal, as padding-free rows are),
    less the layer's parameters and the rotary cos/sin (computed once per forward, shared by every
    layer). ``run(x, positions, cos_sin)`` calls the layer (default: the layer itself)."""
    torch.manual_seed(0)
    x = torch.randn(1, tokens, hidden, dtype=torch.bfloat16, requires_grad=True)  # a previous layer's output
    positions = torch.arange(tokens)[None]
    with torch.no_grad():
        cos, sin = rotary(x, positions)
    params = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    shared = {cos.untyped_storage().data_ptr(): "cos", sin.untyped_storage().data_ptr(): "sin"}
    saved: dict[int, torch.Tensor] = {}
    other: dict[str, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key in params:  # the weights: counted as parameters, not activations
            pass
        elif key in shared:
            other[shared[key]] = storage.nbytes()
        else:
            saved.setdefault(key, t)
        return t

    def call(x: torch.Tensor, positions: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor]) -> Any:
        return layer(x, attention_mask=None, position_ids=positions, position_embeddings=cos_sin)

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = (run or call)(x, positions, (cos, sin))
    out = out[0] if isinstance(out, tuple) else out
    out.float().sum().backward()  # the graph is whole: every saved tensor was needed
    return list(saved.values()), other


def two_samples() -> Experience:
    """Two prompts with their responses (random tokens from the global generator), the second response
    two tokens longer: padding in one row, none in the other."""
    return Experience(
        prompt_ids=[torch.randint(1, 200, (6,)), torch.randint(1, 200, (4,))],
        response_ids=[torch.randint(1, 200, (5,)), torch.randint(1, 200, (7,))],
        multi_modal_inputs=[{}, {}],
        group=torch.zeros(2, dtype=torch.long),
        response_mask=torch.tensor([[1.0] * 5 + [0.0] * 2, [1.0] * 7]),
    )
