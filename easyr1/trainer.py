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
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from easyr1.algorithms.advantages import ADVANTAGE_ESTIMATORS
from easyr1.algorithms.filtering import batch_layout, fill_batch, keep_group, split_groups
from easyr1.algorithms.kl import apply_kl_penalty, make_kl_controller
from easyr1.checkpoint import (
    BEST_METRIC,
    MARKER,
    TRAINER_STATE,
    best_checkpoint,
    find_last_checkpoint,
    load_checkpoint,
    prune_checkpoints,
    save_checkpoint,
)
from easyr1.config import ConfigError, PPOConfig
from easyr1.config_checks import check_config, check_runnable, config_warnings
from easyr1.data.dataset import ResumableBatchSampler, RLDataset
from easyr1.distributed.simulated import check_simulated, simulated_ranks
from easyr1.evaluate import score_rollout
from easyr1.experience import Experience, Group, experience
from easyr1.loggers import Tracker, check_loggers, set_aside_jsonl, truncate_jsonl
from easyr1.metrics import all_reduce_sums, length_means, length_sums, score_means, score_sums
from easyr1.models.loading import load_processor, load_tokenizer
from easyr1.models.structure import text_blocks
from easyr1.profiling import host_sampled, profiled
from easyr1.resume import Change, config_changes, data_change, saved_config
from easyr1.rewards.worker import RewardWorker
from easyr1.rollout.backend import build_rollout, sampling_params, settle_rollout_with_data
from easyr1.rollout.base import RolloutEngine
from easyr1.rollout.hf import HFRollout
from easyr1.stalls import progress
from easyr1.telemetry import StepTelemetry, dense_flops_per_token, max_over_ranks, on_every_rank
from easyr1.workers.actor import Actor
from easyr1.workers.build import build_offloaders, build_workers
from easyr1.workers.critic import Critic
from easyr1.workers.optim import follow_config


@dataclass
class Dist:
    """Where this process stands in the run (``launch/rank.py`` joins the process group and makes it)."""

    rank: int
    world: int
    local_rank: int
    device: torch.device


def run_dir(config: PPOConfig) -> Path:
    """Where a run's metrics, checkpoints and failure reports go."""
    trainer = config.trainer
    return Path(
        trainer.save_checkpoint_path or Path("checkpoints") / trainer.project_name / trainer.experiment_name
    )


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
        self.resume_from, self.config_changes = self._checkpoint_to_resume()
        self.tracker: Tracker | None = None
        # Rank 0 creates the run folder, before any model loads; every rank learns whether it could,
        # so that all stop with the same message (not rank 1 in a broken collective later).
        unwritable = None
        if ctx.rank == 0:
            doing = "cannot create it"
            try:
                self.run_dir.mkdir(parents=True, exist_ok=True)
                doing = "cannot write in it"
                if self.resume_from is None:
                    for path in set_aside_jsonl(self.run_dir):
                        print(
                            f"starting from step 0: the earlier run's {path.name.split('.')[0]} log kept as {path}",
                            flush=True,
                        )
                (self.run_dir / "config.yaml").write_text(config.to_yaml())
            except OSError as exc:
                unwritable = f"trainer.save_checkpoint_path={self.run_dir}: {doing}: {exc.strerror or exc}"
        if dist.is_initialized() and ctx.world > 1:
            box = [unwritable]
            dist.broadcast_object_list(box, src=0)
            unwritable = box[0]
        if unwritable is not None:
            raise ConfigError(unwritable)
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
        if model_cfg.enable_gradient_checkpointing:  # as applied (auto: as the memory estimate decided)
            recomputed = sum(block.gradient_checkpointing for block in text_blocks(self.actor_model))
            self._data_metrics["perf/recomputed_blocks"] = float(recomputed)
        self.kl_controller = make_kl_controller(algo)
        self.start_step = self._resume()
        self.offloaders = build_offloaders(self._workers(), ctx.device)
        self.rollout: RolloutEngine = build_rollout(config, self.actor_model, self.tokenizer, ctx)

    # ------------------------------------------------------------------ checkpoints

    def _checkpoint_to_resume(self) -> tuple[Path | None, list[Change]]:
        """``load_checkpoint_path``, else the newest complete checkpoint of the run folder, and how
        the config differs from the one it was saved with; refused (before any model loads, and
        before config.yaml is overwritten) when it differs in a key that fixes what the checkpoint
        means (``easyr1.resume``)."""
        trainer = self.config.trainer
        path = trainer.load_checkpoint_path
        if path is not None and not (Path(path) / MARKER).is_file():  # found out before any model loads
            key = f"trainer.load_checkpoint_path={path}"
            if not Path(path).is_dir():
                raise ConfigError(f"{key}: no such folder")
            if any(Path(path).glob("global_step_*")):
                raise ConfigError(f"{key} is a run folder: pass one of its global_step_N folders")
            raise ConfigError(
                f"{key}: no completion marker ({MARKER}): not a checkpoint, or its save did not finish"
            )
        if path is None and trainer.find_last_checkpoint:
            path = find_last_checkpoint(self.run_dir)  # every rank: the checksums are split among them
        if path is None:
            return None, []
        path = Path(path)
        note = data_change(
            path / TRAINER_STATE,
            self.data_fingerprint,
            train_files=self.config.data.train_files,
            allowed=trainer.allow_changed_data,
            checkpoint=path,
        )
        if note is not None and self.ctx.rank == 0:
            print(f"[checkpoint] {note}", file=sys.stderr, flush=True)
        try:
            saved = saved_config(path / TRAINER_STATE)
        except (OSError, ValueError):
            saved = None  # load_checkpoint says what is wrong with the checkpoint
        if saved is None:
            if self.ctx.rank == 0:
                print(
                    f"[checkpoint] {path} holds no config: the config is not compared with it",
                    file=sys.stderr,
                    flush=True,
                )
            return path, []
        critic = self.config.algorithm.adv_estimator == "gae"
        return path, config_changes(saved, self.config, critic=critic, checkpoint=path)

    def _resume(self) -> int:
        """Restore the checkpoint ``_checkpoint_to_resume`` chose; the step it holds (0: none)."""
        path = self.resume_from
        if path is None:
            return 0
        state = load_checkpoint(path, **self._components())
        self.sampler.load_state_dict(state["sampler"])
        self.kl_controller.value = state["kl_coef"]
        self._apply_config(self.config_changes)
        self._data_metrics = {}  # logged by the run that started at step 0
        step = int(state["step"])
        if self.ctx.rank == 0:
            truncate_jsonl(self.run_dir, step)  # the steps after it are about to be logged again
            print(f"resumed from {path} (step {step})", flush=True)
        return step

    def _apply_config(self, changes: list[Change]) -> None:
        """Make the restored state follow the config where the checkpoint would override it, and say
        what changed. The optimizers get the config's peak lr, betas and weight decay at the restored
        schedule position; a changed ``algorithm.kl_coef`` replaces the restored KL coefficient."""
        for worker in self._workers().values():
            follow_config(worker.optimizer, worker.scheduler, worker.config.optim)
        if any(change.key == "algorithm.kl_coef" for change in changes):
            self.kl_controller.value = self.config.algorithm.kl_coef
        if self.ctx.rank == 0:
            for change in changes:
                print(f"[checkpoint] resuming with {change} (applied)", file=sys.stderr, flush=True)

    def _workers(self) -> dict[str, Actor | Critic]:
        """The trained models by checkpoint component name: the actor, and the critic when there is one."""
        workers: dict[str, Actor | Critic] = {"actor": self.actor}
        if self.critic is not None:
            workers["critic"] = self.critic
        return workers

    def _components(self) -> dict[str, dict[str, Any]]:
        """What a checkpoint holds: each trained model with its optimizer and LR schedule."""
        workers = self._workers()
        return {
            "models": {name: worker.model for name, worker in workers.items()},
            "optimizers": {name: worker.optimizer for name, worker in workers.items()},
            "schedulers": {name: worker.scheduler for name, worker in workers.items()},
        }

    def _save(self, step: int, metrics: dict[str, float]) -> None:
        trainer = self.config.trainer
        model = self.config.worker.actor.model
        save_checkpoint(
            self.run_dir,
            step,
            **self._components(),
            trainer_state={
                "sampler": self.sampler.state_dict(),
                "kl_coef": self.kl_controller.value,
                "data_fingerprint": self.data_fingerprint,  # compared with the data of a run that resumes from it
                "metrics": metrics,
                "config": self.config.to_dict(),  # compared with the config of a run that resumes from it
            },
            hf_source=model.model_path,
            tokenizer_source=model.tokenizer_path,
            model_only=trainer.save_model_only,
        )
        if trainer.save_limit > 0:
            prune_checkpoints(
                self.run_dir, trainer.save_limit, keep=best_checkpoint(self.run_dir, BEST_METRIC)
            )

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
        name, mask = algo.adv_estimator, exp.response_mask
        estimator = ADVANTAGE_ESTIMATORS[name]
        if name in ("grpo", "grpo_passk"):
            exp.advantages, exp.returns = estimator(
                token_rewards.sum(-1), mask, exp.group, norm_by_std=algo.norm_adv_by_std_in_grpo
            )
        elif name == "rloo":
            exp.advantages, exp.returns = estimator(token_rewards.sum(-1), mask, exp.group)
        elif name == "remax":
            exp.advantages, exp.returns = estimator(token_rewards.sum(-1), exp.baseline_scores, mask)
        elif name == "reinforce_plus_plus":
            exp.advantages, exp.returns = estimator(token_rewards, mask, algo.gamma)
        else:  # gae
            exp.advantages, exp.returns = estimator(token_rewards, exp.values, mask, algo.gamma, algo.lam)

    def _sample_metrics(self, exp: Experience, scores: list[dict[str, float]]) -> dict[str, float]:
        """``reward/*`` are means over ``scores``, the rest over the samples of the batch."""
        sums = score_sums(scores, "reward/")
        lengths, extremes = length_sums(
            exp.response_lengths.tolist(), self.config.data.max_response_length, "response_length/"
        )
        sums.update(lengths)
        mask = exp.response_mask
        if exp.rollout_logp is not None:  # worker.rollout.calculate_log_probs
            diff = (exp.old_logp - exp.rollout_logp).abs() * mask
            sums["rollout/logp_diff_mean"] = float(diff.sum())
            ratio = torch.exp(exp.old_logp - exp.rollout_logp) * mask
            sums["rollout/ratio_mean"] = float(ratio.sum())
            extremes.update(
                {"rollout/ratio_max": float(ratio.max()), "rollout/logp_diff_max": float(diff.max())}
            )
        totals = all_reduce_sums({**sums, "_samples": float(len(exp)), "_tokens": float(mask.sum())})
        out = score_means(totals, "reward/")
        out.update(
            {
                key: value / max(totals["_tokens"], 1.0)
                for key, value in totals.items()
                if key.startswith("rollout/")
            }
        )
        extremes = max_over_ranks(extremes)
        out.update({key: value for key, value in extremes.items() if key.startswith("rollout/")})
        return {**out, **length_means(totals, extremes, "response_length/")}

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
        return self._val_metrics(scored, lengths), samples

    def _val_metrics(self, scores: list[dict[str, float]], lengths: list[int]) -> dict[str, float]:
        """EasyR1's validation metrics: ``val/{score}_reward`` for each key of the reward's dicts,
        ``val/reward_score`` (the overall score's mean, which picks the best checkpoint) and
        ``val_response_length/*``; means over the whole validation set."""
        sums, extremes = length_sums(lengths, self.config.data.max_response_length, "val_response_length/")
        totals = all_reduce_sums({**score_sums(scores, "val/"), **sums, "_samples": float(len(lengths))})
        out = {f"{key}_reward": value for key, value in score_means(totals, "val/").items()}
        out["val/reward_score"] = out["val/overall_reward"]
        return {**out, **length_means(totals, max_over_ranks(extremes), "val_response_length/")}

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
        metrics.update(self._sample_metrics(exp, scores))
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
                limit = (
                    f"trainer.max_steps={trainer.max_steps}"
                    if trainer.max_steps
                    else f"trainer.total_epochs={trainer.total_epochs}"
                )
                where = f"the checkpoint resumed ({self.resume_from}) is at step {self.start_step}"
                print(
                    f"easyr1 train: {where}, beyond the {self.total_steps} steps of {limit}: nothing to train"
                    if self.start_step > self.total_steps
                    else f"easyr1 train: {where}, the last of {limit}: nothing left to train",
                    file=sys.stderr,
                    flush=True,
                )
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
                val_metrics, samples = self.validate(step)
                metrics.update(val_metrics)
            self._log(step, metrics, samples)
            if trainer.save_freq > 0 and (step % trainer.save_freq == 0 or last):
                with self._on_device(*self.offloaders, optimizer=True):  # as EasyR1 saves
                    self._save(step, {k: v for k, v in metrics.items() if k.startswith("val/")})

    def close(self) -> None:
        self.reward_fn.close()
        if self.tracker is not None:
            self.tracker.close()
