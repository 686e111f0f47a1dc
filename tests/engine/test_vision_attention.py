"""A Qwen-VL vision tower's attention in one call over every image (``VISION``) instead of
transformers' Python loop of one SDPA call per image or window: the same outputs and gradients."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from easyr1.models.attention import VISION, use_vision_attention
from easyr1.models.loading import load_model
from easyr1.models.structure import vision_tower
from easyr1.workers.fsdp import _float_tensors


def _tower_pass(model: torch.nn.Module) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The tower's outputs and its parameters' gradients on two images of different sizes (Qwen2.5-VL:
    several attention windows each)."""
    tower = vision_tower(model)
    cfg = tower.config
    grid = torch.tensor([[1, 16, 16], [1, 8, 12]])
    features = cfg.in_channels * cfg.temporal_patch_size * cfg.patch_size**2
    pixels = torch.randn(int(grid.prod(-1).sum()), features, generator=torch.Generator().manual_seed(0))
    tower.zero_grad()
    outputs = _float_tensors(tower(pixels, grid_thw=grid))
    sum((o * torch.linspace(-1, 1, o.numel()).view_as(o)).sum() for o in outputs).backward()
    return [o.detach() for o in outputs], [p.grad.clone() for p in tower.parameters()]


@pytest.mark.parametrize("arch", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_one_call_equals_the_loop_over_images(tiny_model: Callable[[str], Path], arch: str) -> None:
    model = load_model(tiny_model(arch))
    want_out, want_grads = _tower_pass(model)
    use_vision_attention(model)
    assert vision_tower(model).config._attn_implementation == VISION
    assert model.config.get_text_config()._attn_implementation != VISION
    got_out, got_grads = _tower_pass(model)
    for got, want in zip(got_out + got_grads, want_out + want_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_text_models_are_left_alone_and_checkpoints_do_not_name_it(
    tiny_model: Callable[[str], Path], tmp_path: Path
) -> None:
    text = load_model(tiny_model("qwen2"))
    use_vision_attention(text)
    assert text.config._attn_implementation != VISION
    model = load_model(tiny_model("qwen2_5_vl"))
    use_vision_attention(model)
    model.save_pretrained(tmp_path)  # a checkpoint must load where VISION was never registered (merge, vLLM)
    assert VISION not in (tmp_path / "config.json").read_text()
