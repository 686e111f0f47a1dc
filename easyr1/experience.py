"""The samples of one RL step on one rank, and how they become model inputs.

Samples are kept as lists of 1-D token tensors (prompt and response apart) plus per-token
tensors padded on the right to the longest response, ``[B, R]`` with ``response_mask``. Every
per-token quantity (log-probs, advantages, KL) lives in that ``[B, R]`` frame.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from easyr1.distributed.ulysses import Shard
from easyr1.models.inputs import multimodal_kwargs, pad, vision_token_ids
from easyr1.models.structure import base_model


@dataclass
class Experience:
    prompt_ids: list[torch.Tensor]
    response_ids: list[torch.Tensor]
    multi_modal_inputs: list[dict[str, torch.Tensor]]
    group: torch.Tensor  # [B] prompt id of each sample: the n samples of a prompt share it
    response_mask: torch.Tensor  # [B, R] float, 1 on response tokens
    scores: torch.Tensor = field(default_factory=lambda: torch.empty(0))  # [B] outcome reward ("overall")
    baseline_scores: torch.Tensor = field(
        default_factory=lambda: torch.empty(0)
    )  # [B] ReMax: greedy reply's score
    rollout_logp: torch.Tensor | None = None  # [B, R] as the rollout sampled
    old_logp: torch.Tensor | None = None  # [B, R] actor before the update
    ref_logp: torch.Tensor | None = None  # [B, R] reference policy
    values: torch.Tensor | None = None  # [B, R] critic before the update
    advantages: torch.Tensor | None = None  # [B, R]
    returns: torch.Tensor | None = None  # [B, R]

    def __len__(self) -> int:
        return len(self.prompt_ids)

    def select(self, rows: Sequence[int]) -> Experience:
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


def concat(parts: Sequence[Experience]) -> Experience:
    """The samples of ``parts`` in order; ``[B, R]`` tensors padded with zeros to the widest."""
    width = max(p.response_mask.shape[1] for p in parts)
    out: dict[str, Any] = {}
    for f in fields(Experience):
        values = [getattr(p, f.name) for p in parts]
        if isinstance(values[0], list):
            out[f.name] = [item for value in values for item in value]
        elif values[0] is None or (isinstance(values[0], torch.Tensor) and values[0].numel() == 0):
            out[f.name] = values[0]
        elif values[0].dim() == 2:
            out[f.name] = torch.cat([torch.nn.functional.pad(v, (0, width - v.shape[1])) for v in values])
        else:
            out[f.name] = torch.cat(values)
    return Experience(**out)


def response_mask(lengths: Sequence[int]) -> torch.Tensor:
    """[B, R] float mask, 1 on each sample's response tokens (R: the longest response, at least 1)."""
    width = max(1, max(lengths))
    return (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).float()


def response_tensor(seqs: Sequence[torch.Tensor]) -> torch.Tensor:
    """Per-sample response vectors right-padded with zeros into ``[B, R]`` float values."""
    values = torch.zeros(response_mask([int(s.numel()) for s in seqs]).shape)
    for row, seq in enumerate(seqs):
        values[row, : seq.numel()] = seq.float()
    return values


@dataclass
class Group:
    """The n samples of one prompt as generated and scored: the unit online filtering keeps or
    drops, and the unit that may move to another rank to even out the batch."""

    row: int  # the prompt's dataset index
    rank: int  # the rank that generated it
    prompt: dict[str, Any] | None  # the dataset item (None while the group travels to another rank)
    response_ids: list[torch.Tensor]
    logprobs: list[torch.Tensor]  # the rollout's, where worker.rollout.calculate_log_probs asks for them
    scores: list[dict[str, float]]
    baseline: float = 0.0  # ReMax: the score of the prompt's greedy response


def experience(groups: list[Group], *, first: int, rollout_logprobs: bool) -> Experience:
    """The samples of ``groups``, group by group; the groups are numbered from ``first`` (the ranks
    number theirs apart), and with ``rollout_logprobs`` the rollout's log-probs come along."""
    samples = [(i, group, j) for i, group in enumerate(groups) for j in range(len(group.response_ids))]
    return Experience(
        prompt_ids=[group.prompt["input_ids"] for _, group, _ in samples],
        response_ids=[group.response_ids[j] for _, group, j in samples],
        multi_modal_inputs=[group.prompt["multi_modal_inputs"] for _, group, _ in samples],
        group=torch.tensor([first + i for i, _, _ in samples], dtype=torch.long),
        response_mask=response_mask([len(group.response_ids[j]) for _, group, j in samples]),
        scores=torch.tensor([group.scores[j]["overall"] for _, group, j in samples], dtype=torch.float32),
        baseline_scores=torch.tensor([group.baseline for _, group, _ in samples], dtype=torch.float32),
        rollout_logp=(
            response_tensor([group.logprobs[j] for _, group, j in samples]) if rollout_logprobs else None
        ),
    )


def model_inputs(exp: Experience, pad_id: int, model_config: Any) -> dict[str, torch.Tensor]:
    """Prompt + response, right-padded, with the images and videos of each sample."""
    seqs = [torch.cat([p, r]) for p, r in zip(exp.prompt_ids, exp.response_ids, strict=True)]
    input_ids, attention_mask = pad(seqs, pad_id, side="right")
    kwargs = {"input_ids": input_ids, "attention_mask": attention_mask}
    kwargs.update(multimodal_kwargs(input_ids, exp.multi_modal_inputs, model_config))
    return kwargs


@dataclass
class ScoringBatch:
    """A micro-batch as model inputs, and where the model's outputs score its response tokens.

    Padded: ``[B, S]`` rows, and ``positions``/``targets`` ``[B, R]``. Packed (padding-free): one
    row of all ``T`` tokens, and ``positions``/``targets`` ``[1, N]`` for the ``N`` response tokens
    in order. ``to_frame`` brings outputs at ``positions`` back to the ``[B, R]`` frame.
    """

    inputs: dict[str, Any]
    positions: torch.Tensor
    targets: torch.Tensor
    response_mask: torch.Tensor  # [B, R] bool, on the inputs' device
    packed: bool
    shard: Shard | None = None  # the packed row is split over this Ulysses group

    def to_frame(self, values: torch.Tensor) -> torch.Tensor:
        """``[rows, width, ...]`` outputs at ``positions`` -> ``[B, R, ...]`` (zeros on padding when packed)."""
        if not self.packed:
            return values
        out = values.new_zeros(self.response_mask.shape + values.shape[2:])
        out[self.response_mask] = values[0]
        return out


def scoring_batch(
    exp: Experience,
    pad_id: int,
    model: torch.nn.Module,
    device: torch.device,
    *,
    packed: bool,
    shard: Shard | None = None,
) -> ScoringBatch:
    """``exp`` as one packed row (``packed``, unless all its sequences have one length, when padding
    costs nothing) or right-padded rows, on ``device``; with a Ulysses ``shard``, the packed row to
    split over its group."""
    mask = exp.response_mask.bool()
    if shard is not None and not packed:
        raise ValueError("Ulysses sequence parallelism splits packed rows: padding_free must be on")
    lengths = {int(p.numel()) + int(r.numel()) for p, r in zip(exp.prompt_ids, exp.response_ids, strict=True)}
    if shard is None and len(lengths) == 1:  # nothing to save: padded rows, and SDPA's kernel as is
        packed = False
    if packed:
        inputs, positions, targets = _packed(exp, model, pad_id, shard)
    else:
        inputs = model_inputs(exp, pad_id, model.config)
        # Padding positions past a row's end read its last position (values there are masked).
        positions = response_positions(exp).clamp(max=inputs["input_ids"].shape[1] - 1)
        targets = torch.zeros(mask.shape, dtype=torch.long)
        for row, ids in enumerate(exp.response_ids):
            targets[row, : ids.numel()] = ids
    inputs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    return ScoringBatch(inputs, positions.to(device), targets.to(device), mask.to(device), packed, shard)


def _packed(
    exp: Experience, model: torch.nn.Module, pad_id: int, shard: Shard | None
) -> tuple[dict[str, Any], torch.Tensor, torch.Tensor]:
    """One row of every sample's prompt + response, each with its own positions from 0 (for
    Qwen-VL, its own multimodal rotary positions) and its bounds for ``models.attention``. To
    split over a Ulysses group, the row ends with a sequence of padding up to a multiple of its size."""
    seqs = [torch.cat([p, r]) for p, r in zip(exp.prompt_ids, exp.response_ids, strict=True)]
    multi_modal = list(exp.multi_modal_inputs)
    if shard is not None and sum(int(s.numel()) for s in seqs) % shard.size:
        seqs.append(torch.full((-sum(int(s.numel()) for s in seqs) % shard.size,), pad_id, dtype=torch.long))
        multi_modal.append({})
    lengths = torch.tensor([int(s.numel()) for s in seqs])
    starts = torch.cumsum(lengths, 0) - lengths
    input_ids = torch.cat(seqs)[None]
    text_positions = torch.cat([torch.arange(int(n)) for n in lengths])[None]
    inputs: dict[str, Any] = {"input_ids": input_ids}
    inputs.update(multimodal_kwargs(input_ids, multi_modal, model.config))
    if vision_token_ids(model.config):
        rope = [_rope_positions(model, seq, mm) for seq, mm in zip(seqs, multi_modal, strict=True)]
        inputs["position_ids"] = torch.cat([text_positions[None], torch.cat(rope, dim=-1)])  # [4, 1, T]
    else:
        inputs["position_ids"] = text_positions
    inputs["packed_cu_seqlens"] = torch.cat(
        [torch.zeros(1, dtype=torch.int32), torch.cumsum(lengths, 0).int()]
    )
    inputs["packed_max_seqlen"] = int(lengths.max())
    if shard is not None:
        inputs["packed_shard"] = shard
    positions = torch.cat(
        [
            start + p.numel() - 1 + torch.arange(r.numel())
            # the samples' starts (a padding row for the Ulysses shards, if any, comes last)
            for start, p, r in zip(
                starts.tolist()[: len(exp.prompt_ids)], exp.prompt_ids, exp.response_ids, strict=True
            )
        ]
    )
    return inputs, positions[None], torch.cat(list(exp.response_ids)).long()[None]


def _rope_positions(model: torch.nn.Module, seq: torch.Tensor, mm: dict[str, torch.Tensor]) -> torch.Tensor:
    """``[3, 1, L]`` multimodal rotary positions of one sequence, as the model computes them
    (text-only: the same position on all three axes)."""
    kwargs = multimodal_kwargs(seq[None], [mm], model.config)
    if not kwargs:
        return torch.arange(seq.numel()).expand(3, 1, -1)
    base = base_model(model)
    grids = {k: kwargs[k] for k in ("image_grid_thw", "video_grid_thw", "second_per_grid_ts") if k in kwargs}
    positions, _ = base.model.get_rope_index(seq[None], kwargs["mm_token_type_ids"], **grids)
    return positions


def response_positions(exp: Experience) -> torch.Tensor:
    """[B, R] index of the logit that predicts each response token (prompt_len + j - 1)."""
    width = exp.response_mask.shape[1]
    starts = torch.tensor([int(p.numel()) - 1 for p in exp.prompt_ids], dtype=torch.long)
    return starts[:, None] + torch.arange(width)[None, :]
