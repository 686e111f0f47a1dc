"""The critic of PPO with GAE: a value model under FSDP2 and its clipped value-loss update.

The value of response token t is read at the position whose logits predict token t (the last
prompt token for t = 0), the same positions the actor's log-probs come from. The update walks
``worker.critic.global_batch_size`` prompts (times ``n``) per mini-batch with the update loop it shares
with the actor (``workers/update.py``).
"""

from __future__ import annotations

from typing import Any

import torch

from easyr1.algorithms.losses import aggregate, value_loss
from easyr1.distributed import ulysses
from easyr1.experience import Experience, scoring_batch
from easyr1.workers.config import CriticConfig
from easyr1.workers.update import Counts, TrainedWorker, pool, split


class Critic(TrainedWorker):
    """Owns the sharded value model, its optimizer and LR schedule."""

    def __init__(
        self,
        model: torch.nn.Module,
        config: CriticConfig,
        *,
        samples_per_prompt: int,
        pad_id: int,
        total_steps: int,
        device: torch.device,
    ):
        super().__init__(model, config, samples_per_prompt=samples_per_prompt, total_steps=total_steps)
        self.config, self.pad_id, self.device = config, pad_id, device

    def _forward(self, exp: Experience) -> torch.Tensor:
        """[B, R] float32 values of the response tokens (with gradients in training)."""
        batch = scoring_batch(
            exp, self.pad_id, self.model, self.device, packed=self.config.padding_free, shard=self.shard
        )
        values = self.model(**batch.inputs, use_cache=False).logits.squeeze(-1).float()
        if batch.shard is not None:  # this rank's slice of the row: share the values it holds
            mine, local = ulysses.owned(batch.positions[0], batch.shard, values.shape[1] * batch.shard.size)
            return batch.to_frame(ulysses.gather_outputs(values[0, local], mine, batch.shard)[None])
        return batch.to_frame(values.gather(1, batch.positions))

    @torch.no_grad()
    def values(self, exp: Experience) -> torch.Tensor:
        """[B, R] values before the update (zeros on padding), in micro-batches."""
        self.model.eval()
        pooled, mine = pool(exp, self.shard)
        out = torch.zeros(pooled.response_mask.shape, dtype=torch.float32)
        config = self.config
        for rows in split(
            pooled,
            config.micro_batch_size_per_device_for_experience,
            config.dynamic_batching,
            config.padding_free,
        ):
            micro = pooled.select(rows)
            out[rows] = self._forward(micro).cpu() * micro.response_mask
        return out[mine, : exp.response_mask.shape[1]]

    def _micro_loss(
        self, micro: Experience, rows: list[int], totals: Counts
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        mask = micro.response_mask.to(self.device)
        vpred = self._forward(micro)
        loss_mat, metrics = value_loss(
            vpred,
            micro.values.to(self.device),
            micro.returns.to(self.device),
            mask,
            self.config.cliprange_value,
        )
        mode = self.config.loss_avg_mode
        loss = aggregate(loss_mat, mask, mode, global_tokens=totals.tokens, global_seqs=totals.seqs)
        metrics = {f"critic/{k}": v for k, v in metrics.items()}
        metrics["critic/vf_loss"] = aggregate(loss_mat.detach(), mask, mode)
        metrics["critic/vpred_mean"] = (vpred.detach() * mask).sum() / mask.sum().clamp(min=1)
        return loss, metrics

    def update(self, exp: Experience, step: int) -> dict[str, float]:
        """``ppo_epochs`` over mini-batches, regressing the values on ``exp.returns``."""
        assert exp.values is not None and exp.returns is not None
        _, _, metrics = self._train(exp, self.config, "critic", step)
        return metrics
