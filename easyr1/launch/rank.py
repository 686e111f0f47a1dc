"""One rank's process, from joining the process group to leaving it: ``run`` sets the process up
(the process group, GPU memory cap, log records on stderr), trains with ``Trainer(config, ctx).fit()``
and turns what can end a rank into one line that says what happened and what to do: a user error
(a checkpoint, data row or reward input named), Ctrl-C, running out of GPU memory (with a report
in the run folder), or another rank gone.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from easyr1.activations import RecomputePlan
from easyr1.checkpoint import CheckpointError
from easyr1.config import PPOConfig
from easyr1.data.dataset import DatasetError
from easyr1.distributed.simulated import init_fake_group, simulated_ranks
from easyr1.models.loading import ModelLoadError
from easyr1.models.structure import text_blocks
from easyr1.rewards.loader import RewardFunctionError
from easyr1.run_folder import run_dir
from easyr1.runlock import RunFolderBusy, hold_run_folder
from easyr1.stalls import stall_reports
from easyr1.telemetry import GIB, GPU_MEMORY_ENV, cap_gpu_memory
from easyr1.trainer import Dist, Trainer


def init_distributed() -> Dist:
    """Join the process group the launcher described in the environment (nccl on GPUs, gloo on CPUs)."""
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    if torch.cuda.is_available():
        # srun --gpus-per-task shows each task its own GPU only: then the local rank is not an index.
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        backend = "cpu:gloo,cuda:nccl"  # small CPU reductions (counts, metrics) go over gloo
    else:
        device = torch.device("cpu")
        backend = "gloo"
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        # The cores this process may use (a SLURM job may get fewer than the node has), or fewer
        # where OMP_NUM_THREADS says so (the harness sets it to a job's threads), split over the
        # node's ranks, which inherit the same value: a job never oversubscribes its cores.
        cores = len(os.sched_getaffinity(0))
        budget = min(cores, int(os.environ.get("OMP_NUM_THREADS") or cores))
        torch.set_num_threads(max(1, budget // local_world))
    if (
        not dist.is_initialized() and simulated_ranks() is not None
    ):  # rank 0 of N, alone (distributed/simulated.py)
        init_fake_group(world)
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, rank=rank, world_size=world)
    return Dist(rank, world, local_rank, device)


_LOG_HANDLER = "easyr1-stderr"


def configure_logging(rank: int) -> None:
    """Show the engine's log records (the ``easyr1.*`` loggers) on stderr: INFO on rank 0, so that
    a data set losing rows to the length filter says so; WARNING on the others, which would only
    repeat rank 0. A second call (another Trainer in the same process) replaces its handler."""
    engine = logging.getLogger("easyr1")
    engine.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    for handler in [h for h in engine.handlers if h.get_name() == _LOG_HANDLER]:
        engine.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler.set_name(_LOG_HANDLER)
    handler.setFormatter(logging.Formatter(f"[rank {rank}] %(levelname)s %(name)s: %(message)s"))
    engine.addHandler(handler)


# Errors whose message already names what to fix (the checkpoint file, the data row, the reward
# input): one line, not a traceback through the engine.
_USER_ERRORS = (CheckpointError, DatasetError, ModelLoadError, RewardFunctionError, RunFolderBusy)


def report_out_of_memory(config: PPOConfig, ctx: Dist, exc: torch.OutOfMemoryError) -> Path:
    """``oom-rank{R}.json`` in the run folder: the phase that ran out and the memory at that moment,
    for the memory benchmarks and for a user sizing a run; checkpoints and metrics stay as they were."""
    phase = getattr(exc, "easyr1_phase", "setup")  # outside every step's phases: loading the models
    report: dict[str, Any] = {
        "rank": ctx.rank,
        "phase": phase,
        "error": str(exc).splitlines()[0] if str(exc) else "",
    }
    if ctx.device.type == "cuda":
        free, total = torch.cuda.mem_get_info(ctx.device)
        report.update(
            device_used_gib=(total - free) / GIB,
            allocated_gib=torch.cuda.memory_allocated(ctx.device) / GIB,
            reserved_gib=torch.cuda.memory_reserved(ctx.device) / GIB,
            max_allocated_gib=torch.cuda.max_memory_allocated(ctx.device) / GIB,
            max_reserved_gib=torch.cuda.max_memory_reserved(ctx.device) / GIB,
            gpu_memory_cap_gib=float(os.environ[GPU_MEMORY_ENV]) if os.environ.get(GPU_MEMORY_ENV) else None,
        )
    path = run_dir(config) / f"oom-rank{ctx.rank}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    return path


def checkpointing_advice(plan: RecomputePlan | None, blocks: int) -> str:
    """What to change after running out of memory when ``enable_gradient_checkpointing=auto`` kept
    some blocks' activations (``plan`` over ``blocks``; None: every block recomputed, nothing to add)."""
    if plan is None or plan.full >= blocks:
        return ""
    return (
        f"; enable_gradient_checkpointing=auto planned {plan.describe(blocks)}, as the memory "
        "estimate did: worker.actor.model.enable_gradient_checkpointing=true recomputes every block"
    )


# What gloo raises in a rank's collective when another rank has gone (failed, or its machine): that
# rank's own error is the one to read, and this rank's traceback would only bury it.
_PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")


def peer_gone(exc: BaseException, world: int) -> str | None:
    """Which of ``_PEER_GONE`` ended ``exc``, a rank's error, when it has peers; else None."""
    if world < 2 or not isinstance(exc, RuntimeError):
        return None
    return next((text for text in _PEER_GONE if text in str(exc)), None)


def run(config: PPOConfig) -> None:
    several = int(os.environ.get("WORLD_SIZE", 1)) > 1
    label = f"[rank {os.environ['RANK']}] " if several else ""
    with stall_reports(config.trainer.stall_report_s, label):  # from the process group's start to its end
        ctx = init_distributed()
        cap_gpu_memory(ctx.device)
        trainer = lock = None
        try:
            configure_logging(ctx.rank)
            lock = hold_run_folder(
                run_dir(config), ctx.rank, ctx.world
            )  # one run per folder, before anything else
            trainer = Trainer(config, ctx)
            trainer.fit()
        except _USER_ERRORS as exc:
            notes = "".join(
                f"\n{note}" for note in getattr(exc, "__notes__", [])
            )  # e.g. the reward function's traceback
            print(
                f"easyr1 train: rank {ctx.rank}: {type(exc).__name__}: {exc}{notes}",
                file=sys.stderr,
                flush=True,
            )
            raise SystemExit(1) from None
        except KeyboardInterrupt:  # Ctrl-C reaches every rank: one line, not a traceback from each
            if ctx.rank == 0:
                print(
                    "easyr1 train: interrupted; the last complete checkpoint stays, and the same command resumes from it",
                    file=sys.stderr,
                    flush=True,
                )
            raise SystemExit(128 + signal.SIGINT) from None
        except torch.OutOfMemoryError as exc:
            path = report_out_of_memory(config, ctx, exc)
            advice = (
                ""
                if trainer is None
                else checkpointing_advice(trainer.actor_checkpointed, len(text_blocks(trainer.actor_model)))
            )
            print(
                f"easyr1 train: rank {ctx.rank}: out of GPU memory in phase {getattr(exc, 'easyr1_phase', 'setup')!r} "
                f"(report: {path}; `easyr1 memory` estimates what a config needs per phase{advice})",
                file=sys.stderr,
                flush=True,
            )
            raise
        except RuntimeError as exc:
            if (reason := peer_gone(exc, ctx.world)) is None:
                raise
            print(
                f"easyr1 train: rank {ctx.rank}: stopped, another rank is gone ({type(exc).__name__}: {reason}); "
                "a rank that failed says why above",
                file=sys.stderr,
                flush=True,
            )
            raise SystemExit(1) from None
        finally:
            if trainer is not None:
                trainer.close()
            if lock is not None:
                lock.release()
            if dist.is_initialized():
                dist.destroy_process_group()
