"""The actor (and the frozen reference): log-probs of responses, and the policy update (its loop and
set-up, shared with the critic, are ``workers/update.py``'s)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from easyr1.algorithms.config import AlgorithmConfig
from easyr1.algorithms.kl import kl_estimate
from easyr1.algorithms.losses import POLICY_LOSSES, aggregate
from easyr1.distributed import ulysses
from easyr1.experience import Experience
from easyr1.models.lora import reference_mode
from easyr1.workers.config import ActorConfig
from easyr1.workers.logprobs import token_logprobs
from easyr1.workers.update import Counts, TrainedWorker, pool, split


@torch.no_grad()
def compute_log_probs(
    model: torch.nn.Module,
    exp: Experience,
    *,
    micro_batch_size: int,
    dynamic_batching: bool,
    padding_free: bool,
    temperature: float,
    pad_id: int,
    device: torch.device,
    shard: ulysses.Shard | None = None,
) -> torch.Tensor:
    """[B, R] log-probs of the sampled response tokens under ``model`` (zeros on padding); with a
    Ulysses ``shard``, computed over the group's pooled samples."""
    model.eval()
    pooled, mine = pool(exp, shard)
    out = torch.zeros(pooled.response_mask.shape, dtype=torch.float32)
    for rows in split(pooled, micro_batch_size, dynamic_batching, padding_free):
        micro = pooled.select(rows)
        logp, _ = token_logprobs(
            model,
            micro,
            temperature=temperature,
            pad_id=pad_id,
            device=device,
            packed=padding_free,
            shard=shard,
        )
        out[rows] = logp.cpu() * micro.response_mask
    return out[mine, : exp.response_mask.shape[1]]


class Actor(TrainedWorker):
    """Owns the sharded policy, its optimizer and LR schedule."""

    def __init__(
        self,
        model: torch.nn.Module,
        config: ActorConfig,
        algorithm: AlgorithmConfig,
        *,
        samples_per_prompt: int,
        max_response_length: int,
        temperature: float,
        pad_id: int,
        total_steps: int,
        device: torch.device,
    ):
        super().__init__(model, config, samples_per_prompt=samples_per_prompt, total_steps=total_steps)
        self.config, self.algorithm = config, algorithm
        self.temperature, self.pad_id, self.device = temperature, pad_id, device
        self.max_response_length = max_response_length
        self.policy_loss: Callable[..., Any] = POLICY_LOSSES[config.loss_type]
        # On-policy updates: (rows, log-probs) of their forward passes.
        self._fresh_logp: list[tuple[list[int], torch.Tensor]] = []

    def log_probs(self, exp: Experience) -> torch.Tensor:
        return self._log_probs(self.model, exp)

    def ref_log_probs(self, exp: Experience, ref_model: torch.nn.Module | None) -> torch.Tensor:
        """The reference policy's log-probs: ``ref_model``'s, or without one this LoRA actor's with
        its adapters off."""
        if ref_model is not None:
            return self._log_probs(ref_model, exp)
        with reference_mode(self.model):
            return self._log_probs(self.model, exp)

    def _log_probs(self, model: torch.nn.Module, exp: Experience) -> torch.Tensor:
        """[B, R] log-probs under ``model``: the actor, or the reference, which follows the actor's
        micro-batching (as in EasyR1)."""
        return compute_log_probs(
            model,
            exp,
            micro_batch_size=self.config.micro_batch_size_per_device_for_experience,
            dynamic_batching=self.config.dynamic_batching,
            padding_free=self.config.padding_free,
            temperature=self.temperature,
            pad_id=self.pad_id,
            device=self.device,
            shard=self.shard,
        )

    def _aggregate(
        self, loss_mat: torch.Tensor, mask: torch.Tensor, totals: Counts | None = None
    ) -> torch.Tensor:
        """The configured aggregation: over the whole mini-batch given its ``totals``, else over ``mask``."""
        if totals is None:
            return aggregate(loss_mat, mask, self.config.loss_avg_mode, max_len=self.max_response_length)
        return aggregate(
            loss_mat,
            mask,
            self.config.loss_avg_mode,
            global_tokens=totals.tokens,
            global_seqs=totals.seqs,
            max_len=self.max_response_length,
        )

    def _micro_loss(
        self, micro: Experience, rows: list[int], totals: Counts
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """Policy loss [+ KL loss] [- entropy bonus] of one micro-batch, as a share of the mini-batch's."""
        use_kl = self.algorithm.use_kl_loss and not self.algorithm.disable_kl and micro.ref_logp is not None
        mask = micro.response_mask.to(self.device)
        logp, entropy = token_logprobs(
            self.model,
            micro,
            temperature=self.temperature,
            pad_id=self.pad_id,
            device=self.device,
            packed=self.config.padding_free,
            shard=self.shard,
        )
        if micro.old_logp is None:  # on-policy: the policy has not moved yet, so old == current
            self._fresh_logp.append((rows, logp.detach().cpu() * micro.response_mask))
            old_logp = logp.detach()
        else:
            old_logp = micro.old_logp.to(self.device)
        loss_mat, metrics = self.policy_loss(
            old_logp, logp, micro.advantages.to(self.device), mask, self.config
        )
        loss = self._aggregate(loss_mat, mask, totals)
        metrics = {f"actor/{k}": v for k, v in metrics.items()}
        metrics["actor/pg_loss"] = self._aggregate(loss_mat.detach(), mask)
        if use_kl:
            kl_mat = kl_estimate(logp, micro.ref_logp.to(self.device), self.algorithm.kl_penalty)
            loss = loss + self.algorithm.kl_coef * self._aggregate(kl_mat, mask, totals)
            metrics["actor/kl_loss"] = self._aggregate(kl_mat.detach(), mask)
        if self.config.entropy_coeff != 0.0:
            # The bonus rewards spread-out next-token distributions, aggregated like the policy loss.
            loss = loss - self.config.entropy_coeff * self._aggregate(entropy, mask, totals)
        entropy = entropy.detach()
        metrics["actor/entropy"] = (entropy * mask).sum() / mask.sum().clamp(min=1)
        return loss, metrics

    def on_policy(self, rows: int) -> bool:
        """Whether an update of ``rows`` samples per rank is one optimizer step in one epoch: then
        every micro-batch sees the weights that sampled it, and the old log-probs can come from
        the update's own forward pass instead of a separate pass (as TRL and veRL do)."""
        return self.config.ppo_epochs == 1 and rows <= self.mini_batch_per_rank

    def update(self, exp: Experience, step: int) -> dict[str, float]:
        """PPO epochs over mini-batches; returns the mean of each metric over micro-batches.

        Without ``exp.old_logp`` the update must be ``on_policy``; it then fills ``exp.old_logp``
        with the log-probs of its own forward pass (before any weight changed).
        """
        assert exp.advantages is not None
        fresh = exp.old_logp is None
        if fresh and not self.on_policy(len(exp)):
            raise ValueError("an update without old log-probs must be on-policy (one epoch, one mini-batch)")
        self._fresh_logp = []
        pooled, mine, metrics = self._train(exp, self.config, "actor", step)
        if fresh:  # one epoch of one mini-batch: its rows are the pooled samples'
            old_logp = torch.zeros(pooled.response_mask.shape, dtype=torch.float32)
            for rows, logp in self._fresh_logp:
                old_logp[rows, : logp.shape[1]] = logp
            exp.old_logp = old_logp[mine, : exp.response_mask.shape[1]]
        return metrics
