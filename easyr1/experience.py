"""The samples of one RL step on one rank, and how they become model inputs.

Samples are kept as lists of 1-D token tensors (prompt and response apart) plus per-token
tensors padded on the right to the longest response, ``[B, R]`` with ``response_mask``. Every
per-token quantity (log-probs, advantages, KL) lives in that ``[B, R]`` frame.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Sequence

import torch

from easyr1.models.inputs import multimodal_kwargs, pad


@dataclass
class Experience:
    prompt_ids: list[torch.Tensor]
    response_ids: list[torch.Tensor]
    multi_modal_inputs: list[dict[str, torch.Tensor]]
    group: torch.Tensor  # [B] prompt id of each sample: the n samples of a prompt share it
    response_mask: torch.Tensor  # [B, R] float, 1 on response tokens
    scores: torch.Tensor = field(default_factory=lambda: torch.empty(0))  # [B] outcome reward ("overall")
    baseline_scores: torch.Tensor = field(default_factory=lambda: torch.empty(0))  # [B] ReMax: greedy reply's score
    rollout_logp: torch.Tensor | None = None  # [B, R] as the rollout sampled
    old_logp: torch.Tensor | None = None  # [B, R] actor before the update
    ref_logp: torch.Tensor | None = None  # [B, R] reference policy
    values: torch.Tensor | None = None  # [B, R] critic before the update
    advantages: torch.Tensor | None = None  # [B, R]
    returns: torch.Tensor | None = None  # [B, R]

    def __len__(self) -> int:
        return len(self.prompt_ids)

    def select(self, rows: Sequence[int]) -> "Experience":
        """The sub-batch of ``rows`` (lists and tensors alike)."""
        index = torch.as_tensor(list(rows), dtype=torch.long)
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, list):
                out[f.name] = [value[i] for i in rows]
            elif isinstance(value, torch.Tensor) and value.numel() > 0:
                out[f.name] = value.index_select(0, index)
            else:
                out[f.name] = value
        return Experience(**out)

    @property
    def response_lengths(self) -> torch.Tensor:
        return self.response_mask.sum(-1).long()


def response_tensor(seqs: Sequence[torch.Tensor], fill: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad per-sample response vectors into ``([B, R] values, [B, R] float mask)``."""
    width = max(1, max(int(s.numel()) for s in seqs))
    values = torch.full((len(seqs), width), fill, dtype=torch.float32)
    mask = torch.zeros((len(seqs), width), dtype=torch.float32)
    for row, seq in enumerate(seqs):
        values[row, : seq.numel()] = seq.float()
        mask[row, : seq.numel()] = 1.0
    return values, mask


def model_inputs(exp: Experience, pad_id: int, model_config: Any) -> dict[str, torch.Tensor]:
    """Prompt + response, right-padded, with the images of each sample."""
    seqs = [torch.cat([p, r]) for p, r in zip(exp.prompt_ids, exp.response_ids)]
    input_ids, attention_mask = pad(seqs, pad_id, side="right")
    kwargs = {"input_ids": input_ids, "attention_mask": attention_mask}
    kwargs.update(multimodal_kwargs(input_ids, exp.multi_modal_inputs, model_config))
    return kwargs


def scoring_inputs(exp: Experience, pad_id: int, model_config: Any, device: torch.device) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The model inputs on ``device``, and the ``[B, R]`` positions whose outputs score each
    response token (clamped into the sequence: padding positions past the end read the last one)."""
    inputs = {k: v.to(device) for k, v in model_inputs(exp, pad_id, model_config).items()}
    positions = response_positions(exp).clamp(max=inputs["input_ids"].shape[1] - 1).to(device)
    return inputs, positions


def response_positions(exp: Experience) -> torch.Tensor:
    """[B, R] index of the logit that predicts each response token (prompt_len + j - 1)."""
    width = exp.response_mask.shape[1]
    starts = torch.tensor([int(p.numel()) - 1 for p in exp.prompt_ids], dtype=torch.long)
    return starts[:, None] + torch.arange(width)[None, :]
