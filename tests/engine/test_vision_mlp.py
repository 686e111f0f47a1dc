"""The Qwen2.5-VL tower's MLP at a padded width (``align_vision_mlp``, on GPUs): the same outputs
and gradients as Hugging Face's at the model's own odd width (3,420 in the 3B and 7B; 36 here), on
CPU. That the padded matmuls are faster is a GPU fact (the VL anchor's records)."""

from __future__ import annotations

import copy

import torch
from torch import nn
from transformers import Qwen2_5_VLConfig
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLMLP

from easyr1.models.vision_mlp import align_vision_mlp


def _tower_model(width: int) -> nn.Module:
    """A stand-in with a Qwen2.5-VL vision MLP where ``vision_tower`` looks (``model.model.visual``)."""
    vision = Qwen2_5_VLConfig(
        vision_config=dict(hidden_size=16, intermediate_size=width, hidden_act="silu")
    ).vision_config
    torch.manual_seed(0)
    outer, inner = nn.Module(), nn.Module()
    inner.visual = nn.Sequential(Qwen2_5_VLMLP(vision, bias=True))
    outer.model = inner
    return outer


def _run(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad()
    out = model.model.visual(x)
    (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
    return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_padded_width_gives_the_same_outputs_and_gradients() -> None:
    eager = _tower_model(36)
    aligned = copy.deepcopy(eager)
    assert align_vision_mlp(aligned) == 1 and type(aligned.model.visual[0]).__name__ == "AlignedQwen2_5_VLMLP"
    assert aligned.model.visual[0].gate_proj.weight.shape == (36, 16)  # the parameters keep their shapes
    x = torch.randn(10, 16)
    (out, grads), (ref_out, ref_grads) = _run(aligned, x), _run(eager, x)
    torch.testing.assert_close(out, ref_out, rtol=1e-6, atol=1e-6)
    assert grads.keys() == ref_grads.keys()
    for name, grad in ref_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-6, atol=1e-6, msg=name)


def test_aligned_towers_and_text_models_are_left_alone() -> None:
    assert align_vision_mlp(_tower_model(64)) == 0
    assert align_vision_mlp(_tower_model(3420)) == 1  # the 3B's and 7B's width is padded
    assert align_vision_mlp(nn.Linear(4, 4)) == 0  # no vision tower


def test_a_lora_wrapped_mlp_keeps_its_own_forward() -> None:
    class Adapted(nn.Linear):  # what peft puts in a linear layer's place: its forward adds the adapter
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(x) + 1.0

    eager = _tower_model(36)
    mlp = eager.model.visual[0]
    adapted = Adapted(16, 36)
    adapted.load_state_dict(mlp.gate_proj.state_dict())
    mlp.gate_proj = adapted
    aligned = copy.deepcopy(eager)
    align_vision_mlp(aligned)
    x = torch.randn(3, 16)
    assert torch.equal(aligned.model.visual(x), eager.model.visual(x))
