"""The RL loop, run identically by every rank (SPMD).

One step: prompts (this rank's share) -> rollout (n samples each, with the actor's current weights) ->
rewards [-> ReMax: a greedy rollout's reward as the baseline] [-> DAPO: drop groups with equal
scores, generate more until the batch is full] -> old and reference log-probs [-> critic values]
-> [KL in the reward] -> advantages -> [critic update] -> actor update -> metrics -> [validation].
All n samples of a prompt stay on one rank, so group statistics are local; global statistics
(token counts, whitening, metric means) are all-reduced.
"""

from __future__ import annotations

import itertools
import logging
import math
import sys
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist

from easyr1.activations import RecomputePlan
from easyr1.algorithms.advantages import estimate
from easyr1.algorithms.filtering import batch_layout, fill_batch, keep_group, split_groups
from easyr1.algorithms.kl import apply_kl_penalty, make_kl_controller
from easyr1.config import ConfigError, PPOConfig
from easyr1.config_checks import check_config, check_runnable, config_warnings
from easyr1.data.dataset import ResumableBatchSampler, RLDataset
from easyr1.distributed.simulated import check_simulated, simulated_ranks
from easyr1.evaluate import score_rollout
from easyr1.experience import Experience, Group, experience
from easyr1.loggers import Tracker, check_loggers
from easyr1.metrics import all_reduce_sums, sample_metrics, val_metrics
from easyr1.models.loading import load_processor, load_tokenizer
from easyr1.models.structure import text_blocks
from easyr1.profiling import host_sampled, profiled
from easyr1.rewards.worker import RewardWorker
from easyr1.rollout.backend import build_rollout, sampling_params, settle_rollout_with_data
from easyr1.rollout.base import RolloutEngine
from easyr1.rollout.hf import HFRollout
from easyr1.run_folder import checkpoint_to_resume, nothing_to_train, open_run_folder, restore, run_dir, save
from easyr1.stalls import progress
from easyr1.telemetry import StepTelemetry, dense_flops_per_token, max_over_ranks, on_every_rank
from easyr1.workers.actor import Actor
from easyr1.workers.build import build_offloaders, build_workers
from easyr1.workers.critic import Critic


@dataclass
class Dist:
    """Where this process stands in the run (``launch/rank.py`` joins the process group and makes it)."""

    rank: int
    world: int
    local_rank: int
    device: torch.device


class Trainer:
    """One run on this rank: data, reward worker, run folder and models set up in ``__init__``, the
    steps in ``fit``."""

    def __init__(self, config: PPOConfig, ctx: Dist):
        self.config, self.ctx = config, ctx
        check_config(config, ctx.world)
        if simulated_ranks() is not None:
            check_simulated(config)
        if ctx.rank == 0:  # once per run
            for message in config_warnings(config):
                logging.getLogger(__name__).warning(message)
        check_runnable(config)
        model_cfg = config.worker.actor.model
        # Before any model loads: a missing reward file must not cost minutes of loading and sharding.
        reward = config.worker.reward
        # Scores in a process of its own, each call of the user's function timed.
        self.reward_fn = RewardWorker(
            reward.reward_function, reward.reward_function_kwargs, reward.timeout, reward.num_cpus
        )
        tokenizer_path = model_cfg.tokenizer_path or model_cfg.model_path
        self.tokenizer = load_tokenizer(tokenizer_path, trust_remote_code=model_cfg.trust_remote_code)
        self.processor = load_processor(tokenizer_path, trust_remote_code=model_cfg.trust_remote_code)
        self.train_set = RLDataset(config.data.train_files, self.tokenizer, self.processor, config.data)
        self.val_set = (
            RLDataset(config.data.val_files, self.tokenizer, self.processor, config.data)
            if config.data.val_files
            else None
        )
        # Logged with the run's first record (see _log), so that rows dropped as overlong reach metrics.jsonl.
        self._data_metrics = {"data/filtered_prompts": float(self.train_set.filtered)}
        self.data_fingerprint = (
            self.train_set.fingerprint()
        )  # recorded in each checkpoint, compared on resume
        if self.val_set is not None:
            self._data_metrics["data/filtered_val_prompts"] = float(self.val_set.filtered)
        # Prompts are drawn data.mini_rollout_batch_size at a time (EasyR1's loader batch), as many
        # times as a step needs; an epoch counts as the dataset's rows over rollout_batch_size steps.
        data = config.data
        draw = data.mini_rollout_batch_size or data.rollout_batch_size
        if len(self.train_set) < draw:
            key = (
                "data.mini_rollout_batch_size" if data.mini_rollout_batch_size else "data.rollout_batch_size"
            )
            raise ConfigError(
                f"data.train_files={data.train_files}: {len(self.train_set)} rows (after filtering overlong prompts), "
                f"fewer than one batch of {key}={draw}"
            )
        sets = [self.train_set] + ([self.val_set] if self.val_set is not None else [])
        most_images, most_videos = (
            max(counts) for counts in zip(*(dataset.most_media() for dataset in sets), strict=True)
        )
        settle_rollout_with_data(
            config, ctx.world, most_images, most_videos
        )  # vLLM's limits, before any model
        self.sampler = ResumableBatchSampler(
            len(self.train_set),
            data.mini_rollout_batch_size or data.rollout_batch_size,
            data.shuffle,
            data.seed,
            drop_last=True,
        )
        trainer = config.trainer
        steps_per_epoch = len(self.sampler) * self.sampler.batch_size // data.rollout_batch_size
        self.total_steps = trainer.max_steps or trainer.total_epochs * steps_per_epoch
        self.run_dir = run_dir(config)
        check_loggers(trainer.logger)
        self.resume_from, config_changes = checkpoint_to_resume(
            config, self.run_dir, self.data_fingerprint, ctx.rank
        )
        open_run_folder(
            config, self.run_dir, resuming=self.resume_from is not None, rank=ctx.rank, world=ctx.world
        )
        self.tracker: Tracker | None = None
        if ctx.rank == 0:
            self.tracker = Tracker(
                trainer.logger, self.run_dir, trainer.project_name, trainer.experiment_name, config.to_dict()
            )

        algo = config.algorithm
        self.needs_ref = not algo.disable_kl and (algo.use_kl_loss or algo.kl_coef > 0)
        workers = build_workers(
            config,
            rank=ctx.rank,
            world=ctx.world,
            device=ctx.device,
            needs_ref=self.needs_ref,
            total_steps=self.total_steps,
            pad_id=self.tokenizer.pad_token_id,
        )
        self.actor, self.ref_model, self.critic = workers.actor, workers.ref_model, workers.critic
        self.actor_model, self.actor_checkpointed = self.actor.model, workers.checkpointed
        self.num_params = sum(p.numel() for p in self.actor_model.parameters())
        if model_cfg.enable_gradient_checkpointing:  # as applied (auto: as the memory estimate planned)
            blocks = text_blocks(self.actor_model)
            plan = self.actor_checkpointed or RecomputePlan(len(blocks))
            self._data_metrics["perf/recomputed_blocks"] = float(plan.full)
            if plan.attention or plan.pointwise:
                self._data_metrics["perf/recomputed_attention_blocks"] = float(plan.attention)
                self._data_metrics["perf/recomputed_pointwise_blocks"] = float(plan.pointwise)
        self.kl_controller = make_kl_controller(algo)
        self.start_step = 0
        if self.resume_from is not None:
            self.start_step = restore(
                self.resume_from,
                config_changes,
                config,
                self.run_dir,
                workers=self._workers(),
                sampler=self.sampler,
                kl_controller=self.kl_controller,
                rank=ctx.rank,
            )
            self._data_metrics = {}  # logged by the run that started at step 0
        self.offloaders = build_offloaders(self._workers(), ctx.device)
        self.rollout: RolloutEngine = build_rollout(config, self.actor_model, self.tokenizer, ctx)

    def _workers(self) -> dict[str, Actor | Critic]:
        """The trained models by checkpoint component name: the actor, and the critic when there is one."""
        workers: dict[str, Actor | Critic] = {"actor": self.actor}
        if self.critic is not None:
            workers["critic"] = self.critic
        return workers

    def _log(self, step: int, metrics: dict[str, float], samples: list[dict[str, Any]] | None = None) -> None:
        metrics, self._data_metrics = (
            {**self._data_metrics, **metrics},
            {},
        )  # the data's counts go with the first record
        if self.tracker is not None:
            self.tracker.log(metrics, step)
            if samples:
                self.tracker.log_generations(samples, step)

    # ------------------------------------------------------------------ pieces of a step

    def _my_share(self, rows: Sequence[int]) -> list[int]:
        per = len(rows) // self.ctx.world
        return list(rows[self.ctx.rank * per : (self.ctx.rank + 1) * per])

    @contextmanager
    def _on_device(self, *names: str, optimizer: bool = False) -> Iterator[None]:
        """The named trained models' parameters, and with ``optimizer`` their optimizer state, on
        the device for the duration, where their config offloads them (``workers/offload.py``)."""
        with ExitStack() as stack:
            for name in names:
                stack.enter_context(self.offloaders[name].on_device(optimizer=optimizer))
            yield

    def _prepare_rollout(self, step: int) -> dict[str, float]:
        """``rollout.prepare`` (the weight hand-over) with the actor's parameters on the device. As
        in EasyR1 they go back to the host right after it, so that the rollout engine has their
        memory; the HF backend generates with the actor itself, so it keeps them until the release."""
        self.offloaders["actor"].load()
        handover = self.rollout.prepare(step)
        if not isinstance(self.rollout, HFRollout):
            self.offloaders["actor"].offload()
        return handover

    def _release_rollout(self) -> None:
        self.rollout.release()
        if isinstance(self.rollout, HFRollout):
            self.offloaders["actor"].offload()

    def _generate(
        self, rows: list[int], prompts: list[dict[str, Any]], seed: int, tele: StepTelemetry
    ) -> list[Group]:
        """One round on this rank: n samples per prompt, scored; for ReMax also the greedy baseline."""
        cfg = self.config
        params = sampling_params(cfg.worker.rollout, cfg.data.max_response_length, validation=False)
        skip = cfg.worker.reward.skip_special_tokens
        with tele.phase("gen"):
            rollout = self.rollout.generate(prompts, params, seed)
        with tele.phase("reward"):
            _, scores = score_rollout(rollout, prompts, self.tokenizer, self.reward_fn, skip)
        baselines = [0.0] * len(prompts)
        if cfg.algorithm.adv_estimator == "remax":
            # EasyR1/veRL: the same rollout call at temperature 0, one response per prompt.
            with tele.phase("gen"):
                greedy = self.rollout.generate(prompts, replace(params, n=1, temperature=0.0), seed)
            with tele.phase("reward"):
                _, greedy_scores = score_rollout(greedy, prompts, self.tokenizer, self.reward_fn, skip)
            baselines = [score["overall"] for score in greedy_scores]
        groups = [
            Group(row, self.ctx.rank, prompt, [], [], [], baseline)
            for row, prompt, baseline in zip(rows, prompts, baselines, strict=True)
        ]
        for k, (i, ids, score) in enumerate(
            zip(rollout.prompt_index, rollout.response_ids, scores, strict=True)
        ):
            groups[i].response_ids.append(ids)
            groups[i].scores.append(score)
            if rollout.logprobs is not None:
                groups[i].logprobs.append(rollout.logprobs[k])
        return groups

    def _make_batch(
        self, step: int, batches: Iterator[list[int]], tele: StepTelemetry
    ) -> tuple[list[Group], list[dict[str, float]], dict[str, float]]:
        """This rank's groups for the step, the scores of every sample generated on this rank, and
        the online-filter metrics.

        Rounds of ``data.mini_rollout_batch_size`` prompts are generated until
        ``data.rollout_batch_size`` groups are kept (all of them without online filtering). Each
        rank filters its own groups; an all-gather of the kept counts tells every rank the total.
        The batch is the first ``rollout_batch_size`` kept groups; each rank trains on an equal
        share, and only the groups that change rank are sent (without their prompt, which the
        receiver reads from the dataset).
        """
        cfg, ctx, algo = self.config, self.ctx, self.config.algorithm
        drawn: list[dict[str, float]] = []
        rounds = itertools.count()

        def draw() -> list[Group]:
            rows = self._my_share(next(batches))
            # One seed per (step, rank, round): rounds after the first come only with online filtering.
            seed = cfg.worker.rollout.seed + step * ctx.world + ctx.rank + 100_003 * next(rounds)
            groups = self._generate(rows, [self.train_set[i] for i in rows], seed, tele)
            drawn.extend(score for group in groups for score in group.scores)
            return groups

        def keep(group: Group) -> bool:
            return not algo.online_filtering or keep_group(
                group.scores, algo.filter_key, algo.filter_low, algo.filter_high
            )

        def all_counts(n: int) -> list[int]:
            counts: list[Any] = [None] * ctx.world
            dist.all_gather_object(counts, n)
            return counts

        target = cfg.data.rollout_batch_size
        filled = fill_batch(draw, keep, target, cfg.trainer.max_try_make_batch, all_counts)
        layout = batch_layout(filled.counts, target)  # (origin rank, index among its kept groups)
        shares = split_groups([origin for origin, _ in layout], ctx.world)
        owner = {i: rank for rank, share in enumerate(shares) for i in share}
        arrived: dict[int, Group] = {}
        if any(owner[i] != origin for i, (origin, _) in enumerate(layout)):  # the same answer on every rank
            outgoing = {
                i: replace(filled.kept[j], prompt=None)
                for i, (origin, j) in enumerate(layout)
                if origin == ctx.rank and owner[i] != origin
            }
            parts: list[Any] = [None] * ctx.world
            dist.all_gather_object(parts, outgoing)
            arrived = {
                i: replace(group, prompt=self.train_set[group.row])
                for part in parts
                for i, group in part.items()
                if owner[i] == ctx.rank
            }
        mine = [arrived[i] if i in arrived else filled.kept[layout[i][1]] for i in shares[ctx.rank]]
        metrics: dict[str, float] = {}
        if algo.online_filtering:
            drawn_groups = filled.tries * (cfg.data.mini_rollout_batch_size or target)
            metrics = {
                "filter/tries": float(filled.tries),
                "filter/kept_groups": float(filled.total_kept),
                "filter/dropped_groups": float(drawn_groups - filled.total_kept),
            }
        return mine, drawn, metrics

    def _advantages(self, exp: Experience, metrics: dict[str, float]) -> None:
        algo = self.config.algorithm
        token_rewards = torch.zeros_like(exp.response_mask)
        last = (exp.response_lengths - 1).clamp(min=0)
        token_rewards[torch.arange(len(exp)), last] = exp.scores
        if self.needs_ref and not algo.use_kl_loss:
            token_rewards, mean_kl = apply_kl_penalty(
                token_rewards,
                exp.old_logp,
                exp.ref_logp,
                exp.response_mask,
                self.kl_controller.value,
                algo.kl_penalty,
            )
            metrics["actor/reward_kl_penalty"] = float(mean_kl)
            metrics["actor/reward_kl_coef"] = self.kl_controller.value
            self.kl_controller.update(float(mean_kl), n_steps=len(exp))
        exp.advantages, exp.returns = estimate(
            algo,
            token_rewards,
            exp.response_mask,
            group=exp.group,
            baseline_scores=exp.baseline_scores,
            values=exp.values,
        )

    # ------------------------------------------------------------------ validation

    def validate(self, step: int) -> tuple[dict[str, float], list[dict[str, Any]]]:
        assert self.val_set is not None
        params = sampling_params(
            self.config.worker.rollout, self.config.data.max_response_length, validation=True
        )
        # EasyR1: the whole test set, in batches of data.val_batch_size prompts (-1: one batch).
        rows = list(range(self.ctx.rank, len(self.val_set), self.ctx.world))
        # Every rank generates as many batches of the same sizes (ranks of a tensor-parallel group
        # generate together): a rank with a row fewer repeats its first row, or row 0, unscored.
        share = -(-len(self.val_set) // self.ctx.world)
        padded = rows + [rows[0] if rows else 0] * (share - len(rows))
        batch = self.config.data.val_batch_size
        chunk = max(1, -(-batch // self.ctx.world) if batch > 0 else share)
        scored: list[dict[str, float]] = []
        lengths: list[int] = []
        samples: list[dict[str, Any]] = []
        self._prepare_rollout(step)
        for start in range(0, share, chunk):
            prompts = [self.val_set[i] for i in padded[start : start + chunk]]
            rollout = self.rollout.generate(
                prompts, params, seed=self.config.worker.rollout.seed + 7919 * step + self.ctx.rank
            )
            texts, scores = score_rollout(
                rollout,
                prompts,
                self.tokenizer,
                self.reward_fn,
                self.config.worker.reward.skip_special_tokens,
            )
            for ids, text, score, i in zip(
                rollout.response_ids, texts, scores, rollout.prompt_index, strict=True
            ):
                if start + i >= len(rows):  # a repeated row
                    continue
                scored.append(score)
                lengths.append(ids.numel())
                if len(samples) < self.config.trainer.val_generations_to_log:
                    samples.append(
                        {
                            "prompt": prompts[i]["prompt"],
                            "response": text,
                            "ground_truth": prompts[i]["ground_truth"],
                            **score,
                        }
                    )
        self._release_rollout()
        return val_metrics(scored, lengths, self.config.data.max_response_length), samples

    # ------------------------------------------------------------------ the loop

    def step(self, step: int, batches: Iterator[list[int]]) -> dict[str, float]:
        cfg = self.config
        tele = StepTelemetry(self.ctx.device)
        with tele.phase("gen"):
            handover = self._prepare_rollout(step)
        groups, drawn_scores, metrics = self._make_batch(step, batches, tele)
        with tele.phase("gen"):
            self._release_rollout()
        metrics.update(handover)
        logged = cfg.worker.rollout.calculate_log_probs
        exp = experience(groups, first=self.ctx.rank * len(groups), rollout_logprobs=logged)
        update_actor = step >= cfg.trainer.critic_warmup  # EasyR1: the actor waits while the critic warms up
        kl_in_reward = self.needs_ref and not cfg.algorithm.use_kl_loss
        # An on-policy update takes the old log-probs from its own forward pass (filled in by update).
        recompute_old = not (update_actor and not kl_in_reward and self.actor.on_policy(len(exp)))
        if recompute_old:
            with tele.phase("old_log_prob"), self._on_device("actor"):
                exp.old_logp = self.actor.log_probs(exp)
        if self.needs_ref:  # without a ref_model the reference is the LoRA actor's base
            with tele.phase("ref_log_prob"), self._on_device(*(["actor"] if self.ref_model is None else [])):
                exp.ref_logp = self.actor.ref_log_probs(exp, self.ref_model)
        if self.critic is not None:
            with tele.phase("values"), self._on_device("critic"):
                exp.values = self.critic.values(exp)
        with tele.phase("adv"):
            self._advantages(exp, metrics)
        if self.critic is not None:
            with tele.phase("update_critic"), self._on_device("critic", optimizer=True):
                metrics.update(self.critic.update(exp, step))
        if update_actor:
            with tele.phase("update_actor"), self._on_device("actor", optimizer=True):
                metrics.update(self.actor.update(exp, step))
        # EasyR1 logs the rewards of every generated sample, filtered out or not.
        scores = (
            drawn_scores if cfg.algorithm.online_filtering else [s for group in groups for s in group.scores]
        )
        lengths = exp.response_lengths.tolist()
        max_len = cfg.data.max_response_length
        metrics.update(
            sample_metrics(scores, lengths, exp.response_mask, exp.old_logp, exp.rollout_logp, max_len)
        )
        tokens = sum(
            int(p.numel()) + int(r.numel()) for p, r in zip(exp.prompt_ids, exp.response_ids, strict=True)
        )
        # update: forward + backward (2x) per epoch; the old log-prob pass, when there is one: forward
        passes = cfg.worker.actor.ppo_epochs * 3 * update_actor + int(recompute_old)
        flops = dense_flops_per_token(self.num_params) * tokens * passes
        perf = on_every_rank(tele.finish(tokens=tokens, actor_flops=flops))
        # Peaks (memory, the slowest rank's step time) are maxima over ranks; rates and phase times are means.
        peaks = max_over_ranks({k: v for k, v in perf.items() if "memory" in k or k == "perf/time_per_step"})
        sums = all_reduce_sums({k: v for k, v in perf.items() if k not in peaks})
        metrics.update(peaks)
        metrics.update({k: v / self.ctx.world for k, v in sums.items()})
        for key, value in metrics.items():
            if not key.startswith("val/") and isinstance(value, float) and not math.isfinite(value):
                raise FloatingPointError(f"step {step}: metric {key} is {value}")
        return metrics

    def fit(self) -> None:
        trainer = self.config.trainer
        # A resumed run does not validate again (its step's scores are logged already), unless
        # validating is all it does: EasyR1's way to evaluate a checkpoint.
        if self.val_set is not None and (
            trainer.val_only or (trainer.val_before_train and self.start_step == 0)
        ):
            self._log(self.start_step, *self.validate(self.start_step))
        if trainer.val_only:
            return
        if self.start_step >= self.total_steps:  # a resumed run with no step left: say why nothing trains
            if self.ctx.rank == 0:
                message = nothing_to_train(self.config, self.resume_from, self.start_step, self.total_steps)
                print(message, file=sys.stderr, flush=True)
            return
        batches = self.sampler.endless()
        for step in range(self.start_step + 1, self.total_steps + 1):
            progress()  # the iteration before ended: the stall report's timer restarts
            profile = run_dir(self.config) / "profile" / f"step{step}-rank{self.ctx.rank}.json"
            with (
                profiled(step in trainer.profile_steps, self.ctx.device, profile),
                host_sampled(
                    step in trainer.host_profile_steps, profile.with_name(f"{profile.stem}-host.json")
                ),
            ):
                metrics = self.step(step, batches)
            last = step == self.total_steps
            samples: list[dict[str, Any]] = []
            if self.val_set is not None and trainer.val_freq > 0 and (step % trainer.val_freq == 0 or last):
                validation, samples = self.validate(step)
                metrics.update(validation)
            self._log(step, metrics, samples)
            if trainer.save_freq > 0 and (step % trainer.save_freq == 0 or last):
                with self._on_device(*self.offloaders, optimizer=True):  # as EasyR1 saves
                    val = {k: v for k, v in metrics.items() if k.startswith("val/")}
                    save(
                        self.config,
                        self.run_dir,
                        step,
                        val,
                        workers=self._workers(),
                        sampler=self.sampler,
                        kl_controller=self.kl_controller,
                        data_fingerprint=self.data_fingerprint,
                    )

    def close(self) -> None:
        self.reward_fn.close()
        if self.tracker is not None:
            self.tracker.close()
