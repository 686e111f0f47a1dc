"""A run's folder and the training state the trainer keeps in it: where the folder is, creating it,
which checkpoint a run resumes from, restoring that checkpoint, and saving the next one.

The trainer orchestrates, in this order: ``checkpoint_to_resume`` (before any model loads, so that
a wrong path or a refused config change costs no loading), ``open_run_folder``, then, with the
models built, ``restore``; ``save`` after the steps ``trainer.save_freq`` names. How a checkpoint is
written and read is ``checkpoint.py``'s; which config changes a resumed run may make, ``resume.py``'s.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch.distributed as dist

from easyr1.algorithms.kl import KLController
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
from easyr1.data.dataset import ResumableBatchSampler
from easyr1.loggers import set_aside_jsonl, truncate_jsonl
from easyr1.resume import Change, config_changes, data_change, saved_config
from easyr1.workers.actor import Actor
from easyr1.workers.critic import Critic
from easyr1.workers.optim import follow_config


def run_dir(config: PPOConfig) -> Path:
    """Where a run's metrics, checkpoints and failure reports go."""
    trainer = config.trainer
    return Path(
        trainer.save_checkpoint_path or Path("checkpoints") / trainer.project_name / trainer.experiment_name
    )


def checkpoint_to_resume(
    config: PPOConfig, folder: Path, data_fingerprint: dict[str, Any], rank: int
) -> tuple[Path | None, list[Change]]:
    """``load_checkpoint_path``, else the newest complete checkpoint of the run folder, and how
    the config differs from the one it was saved with; refused (before any model loads, and
    before config.yaml is overwritten) when it differs in a key that fixes what the checkpoint
    means (``easyr1.resume``)."""
    trainer = config.trainer
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
        path = find_last_checkpoint(folder)  # every rank: the checksums are split among them
    if path is None:
        return None, []
    path = Path(path)
    note = data_change(
        path / TRAINER_STATE,
        data_fingerprint,
        train_files=config.data.train_files,
        allowed=trainer.allow_changed_data,
        checkpoint=path,
    )
    if note is not None and rank == 0:
        print(f"[checkpoint] {note}", file=sys.stderr, flush=True)
    try:
        saved = saved_config(path / TRAINER_STATE)
    except (OSError, ValueError):
        saved = None  # load_checkpoint says what is wrong with the checkpoint
    if saved is None:
        if rank == 0:
            print(
                f"[checkpoint] {path} holds no config: the config is not compared with it",
                file=sys.stderr,
                flush=True,
            )
        return path, []
    critic = config.algorithm.adv_estimator == "gae"
    return path, config_changes(saved, config, critic=critic, checkpoint=path)


def open_run_folder(config: PPOConfig, folder: Path, *, resuming: bool, rank: int, world: int) -> None:
    """Rank 0 creates the run folder, before any model loads, sets an earlier run's logs aside when
    this one starts from step 0, and writes the config; every rank learns whether it could, so that
    all stop with the same message (not rank 1 in a broken collective later)."""
    unwritable = None
    if rank == 0:
        doing = "cannot create it"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            doing = "cannot write in it"
            if not resuming:
                for path in set_aside_jsonl(folder):
                    print(
                        f"starting from step 0: the earlier run's {path.name.split('.')[0]} log kept as {path}",
                        flush=True,
                    )
            (folder / "config.yaml").write_text(config.to_yaml())
        except OSError as exc:
            unwritable = f"trainer.save_checkpoint_path={folder}: {doing}: {exc.strerror or exc}"
    if dist.is_initialized() and world > 1:
        box = [unwritable]
        dist.broadcast_object_list(box, src=0)
        unwritable = box[0]
    if unwritable is not None:
        raise ConfigError(unwritable)


def _components(workers: dict[str, Actor | Critic]) -> dict[str, dict[str, Any]]:
    """What a checkpoint holds: each trained model with its optimizer and LR schedule."""
    return {
        "models": {name: worker.model for name, worker in workers.items()},
        "optimizers": {name: worker.optimizer for name, worker in workers.items()},
        "schedulers": {name: worker.scheduler for name, worker in workers.items()},
    }


def restore(
    path: Path,
    changes: list[Change],
    config: PPOConfig,
    folder: Path,
    *,
    workers: dict[str, Actor | Critic],
    sampler: ResumableBatchSampler,
    kl_controller: KLController,
    rank: int,
) -> int:
    """Load the checkpoint ``checkpoint_to_resume`` chose into the workers, the sampler and the KL
    controller, make that state follow the config (``changes``), and drop the logged steps after
    it; the step it holds."""
    state = load_checkpoint(path, **_components(workers))
    sampler.load_state_dict(state["sampler"])
    kl_controller.value = state["kl_coef"]
    _apply_config(changes, config, workers, kl_controller, rank)
    step = int(state["step"])
    if rank == 0:
        truncate_jsonl(folder, step)  # the steps after it are about to be logged again
        print(f"resumed from {path} (step {step})", flush=True)
    return step


def nothing_to_train(config: PPOConfig, resumed: Path | None, start_step: int, total_steps: int) -> str:
    """Why a run resumed at ``start_step``, at or beyond the ``total_steps`` its config asks for, trains nothing."""
    trainer = config.trainer
    limit = (
        f"trainer.max_steps={trainer.max_steps}"
        if trainer.max_steps
        else f"trainer.total_epochs={trainer.total_epochs}"
    )
    where = f"the checkpoint resumed ({resumed}) is at step {start_step}"
    if start_step > total_steps:
        return f"easyr1 train: {where}, beyond the {total_steps} steps of {limit}: nothing to train"
    return f"easyr1 train: {where}, the last of {limit}: nothing left to train"


def _apply_config(
    changes: list[Change],
    config: PPOConfig,
    workers: dict[str, Actor | Critic],
    kl_controller: KLController,
    rank: int,
) -> None:
    """Make the restored state follow the config where the checkpoint would override it, and say
    what changed. The optimizers get the config's peak lr, betas and weight decay at the restored
    schedule position; a changed ``algorithm.kl_coef`` replaces the restored KL coefficient."""
    for worker in workers.values():
        follow_config(worker.optimizer, worker.scheduler, worker.config.optim)
    if any(change.key == "algorithm.kl_coef" for change in changes):
        kl_controller.value = config.algorithm.kl_coef
    if rank == 0:
        for change in changes:
            print(f"[checkpoint] resuming with {change} (applied)", file=sys.stderr, flush=True)


def save(
    config: PPOConfig,
    folder: Path,
    step: int,
    metrics: dict[str, float],
    *,
    workers: dict[str, Actor | Critic],
    sampler: ResumableBatchSampler,
    kl_controller: KLController,
    data_fingerprint: dict[str, Any],
) -> None:
    """Save step ``step``'s checkpoint (with its validation ``metrics``, which pick the best one),
    then prune the folder to ``trainer.save_limit`` checkpoints, the best kept."""
    trainer = config.trainer
    model = config.worker.actor.model
    save_checkpoint(
        folder,
        step,
        **_components(workers),
        trainer_state={
            "sampler": sampler.state_dict(),
            "kl_coef": kl_controller.value,
            "data_fingerprint": data_fingerprint,  # compared with the data of a run that resumes from it
            "metrics": metrics,
            "config": config.to_dict(),  # compared with the config of a run that resumes from it
        },
        hf_source=model.model_path,
        tokenizer_source=model.tokenizer_path,
        model_only=trainer.save_model_only,
    )
    if trainer.save_limit > 0:
        prune_checkpoints(folder, trainer.save_limit, keep=best_checkpoint(folder, BEST_METRIC))
