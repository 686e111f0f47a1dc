"""Compiled decoder blocks and scoring head (``worker.actor.use_torch_compile`` on CUDA), checked on
CPU: the same log-probs and gradients as eager ones under FSDP2 with gradient checkpointing, and
``generate`` (cached calls, left eager) still works. The trainer compiles only on CUDA; inductor runs
on CPU too."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from easyr1.models.loading import load_model
from easyr1.models.structure import shard_units, vision_tower
from easyr1.workers.config import FSDPConfig
from easyr1.workers.fsdp import compile_blocks, parallelize
from easyr1.workers.logprobs import compile_scoring, install_scoring_head, token_logprobs
from tests.block_utils import two_samples


def _model(path: Path, compiled: bool) -> torch.nn.Module:
    model = load_model(path)
    install_scoring_head(model)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if compiled:
        compile_blocks(model)
        compile_scoring(model)
    fsdp = FSDPConfig(torch_dtype="fp32", mp_param_dtype="fp32")
    return parallelize(model, fsdp, trainable=True, device=torch.device("cpu"))


@pytest.mark.parametrize(
    "arch", ["qwen2", "qwen2_5_vl"]
)  # the VL decoder blocks take multimodal rotary positions
def test_compiled_blocks_match_eager(tiny_model: Callable[[str], Path], one_rank: None, arch: str) -> None:
    torch.manual_seed(0)
    path = tiny_model(arch)
    exp = two_samples()
    results = []
    for compiled in (False, True):
        model = _model(path, compiled)
        tower = set(map(id, vision_tower(model).modules())) if vision_tower(model) is not None else set()
        for unit in shard_units(model):  # text blocks compiled, vision blocks eager
            assert ("Compiled" in type(unit).__name__) == (compiled and id(unit) not in tower)
        model.train()
        logp, entropy = token_logprobs(
            model, exp, temperature=1.0, pad_id=0, device=torch.device("cpu"), packed=False
        )
        ((logp + 0.1 * entropy) * exp.response_mask).sum().backward()
        grads = {n: p.grad.full_tensor().clone() for n, p in model.named_parameters()}
        results.append((logp.detach() * exp.response_mask, grads))
        if compiled:
            model.eval()
            frames = torch._dynamo.utils.counters["frames"]["total"]
            out = model.generate(input_ids=torch.randint(1, 200, (2, 4)), max_new_tokens=3, do_sample=False)
            assert out.shape == (2, 7)
            assert torch._dynamo.utils.counters["frames"]["total"] == frames  # cached calls stayed eager
    (eager_logp, eager_grads), (comp_logp, comp_grads) = results
    assert torch.allclose(eager_logp, comp_logp, atol=1e-5)
    for name in eager_grads:
        assert torch.allclose(eager_grads[name], comp_grads[name], atol=1e-5, rtol=1e-4), name


def _saved_bytes(model: torch.nn.Module, input_ids: torch.Tensor) -> int:
    """Bytes autograd saves for backward in one training forward."""
    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=input_ids).logits.sum().backward()
    return total


def test_compiled_blocks_keep_gradient_checkpointing(
    tiny_model: Callable[[str], Path], one_rank: None
) -> None:
    """Compiling must not switch checkpointing off (it did, silently, with transformers 5.24, which
    wraps the block class's forward and checkpoints only in the outermost wrapper)."""
    input_ids = torch.randint(1, 200, (2, 64))
    saved = {}
    for checkpointing in (False, True):
        model = load_model(tiny_model("qwen2"))
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        compile_blocks(model)
        model = parallelize(
            model,
            FSDPConfig(torch_dtype="fp32", mp_param_dtype="fp32"),
            trainable=True,
            device=torch.device("cpu"),
        )
        model.train()
        saved[checkpointing] = _saved_bytes(model, input_ids)
    assert saved[True] < 0.5 * saved[False], saved
