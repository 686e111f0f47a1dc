"""``easyr1 memory CONFIG --gpus N --measure``: whether a config fits N GPUs, measured on this one.

Rank 0 of the N-rank job runs alone on this machine's GPU for two steps as simulated ranks
(``distributed/simulated.py``: parameters, gradients and optimizer state sharded N ways, every
allocation real, no communication), with the Hugging Face rollout, no validation and no
checkpoint; its peak per phase is printed beside the estimate's (``easyr1/memory.py``), with the
verdict: it fits when both steps ran and the allocated peak, plus what lies outside PyTorch's
allocator (the CUDA context, measured) and NCCL's buffers (which only a real job has: the
estimate's figure), stays within a GPU (``--gpu-memory``, else this GPU's size). A GPU of the
job's kind is what makes the figures true: rank 0 measures its own GPU's memory.

On a CPU there is no GPU memory to measure: it refuses, unless ``$EASYR1_MEASURE_ON_CPU=1`` (for
the tests), where the run goes through the same path and measures nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from easyr1.bench import memory_summary
from easyr1.config import ConfigError, load_config, override_value
from easyr1.distributed.simulated import SIMULATED_RANKS_ENV
from easyr1.memory import CONTEXT_GIB, GIB, NCCL_GIB, estimate
from easyr1.models.architecture import Architecture
from easyr1.telemetry import GPU_MEMORY_ENV

CPU_ENV = "EASYR1_MEASURE_ON_CPU"  # tests only: run the path on a CPU, measuring nothing
# The estimator's phases and the trainer's (telemetry's) phases that make each one up.
PHASES = {
    "rollout": ("gen",),
    "experience": ("old_log_prob", "ref_log_prob", "values"),
    "update_actor": ("update_actor",),
    "update_critic": ("update_critic",),
}


def measured_overrides(gpus: int, steps: int, root: Path) -> dict[str, Any]:
    """What the measuring run changes in the user's config: the job's rank count, a few steps in a
    folder of its own, the Hugging Face rollout, no validation, checkpoint or loggers but the file."""
    return {
        "trainer.n_gpus_per_node": gpus,
        "trainer.nnodes": 1,
        "trainer.max_steps": steps,
        "trainer.save_freq": -1,
        "trainer.val_freq": -1,
        "trainer.val_before_train": False,
        "trainer.find_last_checkpoint": False,
        "trainer.load_checkpoint_path": None,
        "trainer.logger": ["file"],
        "trainer.save_checkpoint_path": str(root / "run"),
        "worker.rollout.name": "hf",
    }


def measured_phases(memory_phases: dict[str, dict[str, float]]) -> dict[str, float]:
    """The allocated peak (GiB) of each estimator phase the run had, from the trainer's phases."""
    out = {}
    for phase, parts in PHASES.items():
        seen = [memory_phases[p]["allocated"] for p in parts if "allocated" in memory_phases.get(p, {})]
        if seen:
            out[phase] = max(seen)
    return out


def build_parser() -> argparse.ArgumentParser:
    """``easyr1 memory --measure``'s flags; the arguments it leaves configure the run."""
    parser = argparse.ArgumentParser(
        prog="easyr1 memory --measure",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="The remaining arguments configure the run as for `easyr1 train`: config=FILE.yaml key=value ...",
    )
    parser.add_argument("--measure", action="store_true", required=True)
    parser.add_argument(
        "--gpus", type=int, help="the job's GPUs; default trainer.nnodes x trainer.n_gpus_per_node"
    )
    parser.add_argument(
        "--gpu-memory",
        type=float,
        metavar="GIB",
        help="each GPU's memory (default: this GPU's); this one is capped to it",
    )
    parser.add_argument("--steps", type=int, default=2, help="steps to run (memory peaks by the second)")
    parser.add_argument("--root", type=Path, help="where the run writes (default: a temporary folder)")
    return parser


def main(argv: list[str]) -> int:
    parser = build_parser()
    ns, rest = parser.parse_known_args(argv)
    on_cpu = os.environ.get(CPU_ENV) == "1"
    if not torch.cuda.is_available() and not on_cpu:
        parser.error(
            "--measure runs rank 0 of the job on this machine's GPU, and there is no CUDA GPU here "
            "(easyr1 memory without --measure predicts)"
        )
    config = load_config(rest)
    gpus = ns.gpus or config.trainer.nnodes * config.trainer.n_gpus_per_node
    if config.worker.rollout.name != "hf":
        print(
            f"worker.rollout.name={config.worker.rollout.name}: measured with the Hugging Face rollout "
            "(vLLM's share is what gpu_memory_utilization gives it)",
            flush=True,
        )
    root = ns.root or Path(tempfile.mkdtemp(prefix="easyr1-memory-"))
    args = rest + [f"{k}={override_value(v)}" for k, v in measured_overrides(gpus, ns.steps, root).items()]
    try:
        config = load_config(args)
    except ConfigError as exc:
        parser.error(str(exc))
    arch = Architecture.load(config.worker.actor.model.model_path)
    predicted = estimate(config, arch, gpus=gpus, gpu_memory_gib=ns.gpu_memory)
    if gpus > 1:
        os.environ[SIMULATED_RANKS_ENV] = str(
            gpus
        )  # the launcher starts rank 0 alone, against the fake group
    if ns.gpu_memory is not None:
        os.environ[GPU_MEMORY_ENV] = str(ns.gpu_memory)
    from easyr1.launch.local import launch

    print(
        f"measuring: rank 0 of {gpus} for {ns.steps} steps"
        + (" as simulated ranks" if gpus > 1 else "")
        + f" in {root}",
        flush=True,
    )
    run_dir = root / "run"
    code = launch(config, args)
    metrics = run_dir / "metrics.jsonl"
    steps = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
    summary = memory_summary([s for s in steps if s["step"] >= 1], run_dir, ns.gpu_memory)
    if code and summary["oom"] is None:
        print(
            f"easyr1 memory --measure: the run failed other than by running out of memory (exit code {code}): see above"
        )
        return code
    print(report(predicted, summary, gpus, ns.gpu_memory, on_cpu))
    return 0


def report(predicted: Any, summary: dict[str, Any], gpus: int, gpu_memory: float | None, on_cpu: bool) -> str:
    """The phases' predicted and measured GiB side by side, and the verdict."""
    seen = measured_phases(summary["memory_phases"])
    lines = [f"{'phase':<14} {'predicted GiB':>14} {'measured GiB':>13}"]
    for phase in predicted.phases:
        value = f"{seen[phase]:.2f}" if phase in seen else "-"
        lines.append(f"{phase:<14} {predicted.phase_total(phase) / GIB:>14.2f} {value:>13}")
    if on_cpu and not torch.cuda.is_available():
        lines.append(
            f"measured on a CPU (${CPU_ENV}=1): the run went through every phase, but a CPU has no GPU memory "
            "to measure, so there is no verdict"
        )
        return "\n".join(lines)
    size = gpu_memory or torch.cuda.get_device_properties(0).total_memory / GIB
    oom = summary["oom"]
    if oom is not None:
        lines.append(
            f"does not fit {gpus} x {size:.1f} GiB: out of memory in {oom['phase']} "
            f"({oom.get('max_allocated_gib', 0.0):.1f} GiB allocated at the failure)"
        )
        return "\n".join(lines)
    nccl = NCCL_GIB if gpus > 1 else 0.0  # a real job's communicators; the simulated rank has none
    outside = summary["gpu_other_memory_gib"] or CONTEXT_GIB
    needed = max(seen.values(), default=0.0) + outside + nccl
    verdict = "fits" if needed <= size else "does not fit"
    lines.append(
        f"{verdict} {gpus} x {size:.1f} GiB: {needed:.1f} GiB needed per GPU (allocated peak {max(seen.values(), default=0.0):.1f}"
        f" + outside PyTorch {outside:.2f}" + (f" + NCCL {nccl:.2f}, estimated" if nccl else "") + ")"
    )
    return "\n".join(lines)
