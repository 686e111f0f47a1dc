"""Gradient checkpointing of the first N decoder blocks (``apply_recompute`` with N ``full`` blocks, as
``enable_gradient_checkpointing=auto`` plans on GPUs with the memory estimate's N): the recomputed
blocks run their forward again in backward, the others do not, the vision tower's blocks are always
recomputed, and the gradients are those of every block recomputed. How many blocks ``auto`` picks
is tested with the estimate (tests/engine/test_memory.py)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from easyr1.models.architecture import FULL, KEEP
from easyr1.models.loading import load_model
from easyr1.models.recompute import apply_recompute
from easyr1.models.structure import shard_units, text_blocks, vision_tower
from easyr1.workers.config import FSDPConfig
from easyr1.workers.fsdp import compile_blocks, parallelize
from easyr1.workers.logprobs import install_scoring_head, token_logprobs
from tests.block_utils import two_samples


def _recompute_first(model: torch.nn.Module, recomputed: int | None) -> None:
    """The first ``recomputed`` decoder blocks recompute wholly, the others keep (None: every block)."""
    layers = len(text_blocks(model))
    apply_recompute(
        model, None if recomputed is None else [FULL] * recomputed + [KEEP] * (layers - recomputed)
    )


def _counted(
    forward: Callable[..., torch.Tensor], calls: Counter[int], key: int
) -> Callable[..., torch.Tensor]:
    def counting(*args: object, **kwargs: object) -> torch.Tensor:
        calls[key] += 1
        return forward(*args, **kwargs)

    return counting


@pytest.mark.parametrize("arch", ["qwen2", "qwen2_5_vl"])
def test_the_first_blocks_recompute_and_the_gradients_do_not_change(
    tiny_model: Callable[[str], Path], one_rank: None, arch: str
) -> None:
    torch.manual_seed(0)
    exp = two_samples()
    grads = {}
    for recomputed in (None, 1, 0):
        model = load_model(tiny_model(arch))
        install_scoring_head(model)
        _recompute_first(model, recomputed)
        blocks = text_blocks(model)
        assert len(blocks) == model.config.get_text_config().num_hidden_layers >= 2
        tower = vision_tower(model)
        if tower is not None:  # the tower's blocks are recomputed whatever N is
            in_tower = [u for u in shard_units(model) if u not in blocks]
            assert in_tower and all(u.gradient_checkpointing for u in in_tower)
        # A block's MLP runs once in the forward pass, and again in backward if the block recomputes
        # (counted in its forward: module hooks do not fire in a recompute).
        calls: Counter[int] = Counter()
        for i, block in enumerate(blocks):
            block.mlp.forward = _counted(block.mlp.forward, calls, i)
        model = parallelize(
            model,
            FSDPConfig(torch_dtype="fp32", mp_param_dtype="fp32"),
            trainable=True,
            device=torch.device("cpu"),
        )
        model.train()
        calls.clear()  # parallelize's own forward pass
        logp, entropy = token_logprobs(
            model, exp, temperature=1.0, pad_id=0, device=torch.device("cpu"), packed=False
        )
        ((logp + 0.1 * entropy) * exp.response_mask).sum().backward()
        first = len(blocks) if recomputed is None else recomputed
        assert [calls[i] for i in range(len(blocks))] == [2] * first + [1] * (len(blocks) - first)
        grads[recomputed] = {
            n: p.grad.full_tensor() for n, p in model.named_parameters() if p.grad is not None
        }
    for recomputed in (1, 0):
        assert grads[recomputed].keys() == grads[None].keys()
        for name, grad in grads[None].items():
            torch.testing.assert_close(grads[recomputed][name], grad, rtol=1e-5, atol=1e-7, msg=name)


def test_compiled_blocks_keep_their_checkpointing(tiny_model: Callable[[str], Path]) -> None:
    # The trainer compiles after checkpointing: the blocks' classes change, their flags must not.
    model = load_model(tiny_model("qwen2"))
    _recompute_first(model, 1)
    compile_blocks(model)
    blocks = text_blocks(model)
    assert all("Compiled" in type(b).__name__ for b in blocks)
    assert [b.gradient_checkpointing for b in blocks] == [True] + [False] * (len(blocks) - 1)
