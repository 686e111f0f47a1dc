"""The records ``assets/hardware.md`` sets against the estimator, and their predictions.

A memory record (``easyr1 bench`` under a simulated GPU of a cell's size, ``baselines/gpu/memory/``) or
a bench record (the anchor workloads on whole GPUs, ``baselines/gpu/``) is a ``Measured``: the run's
config and architecture as its engine ran them, and the GiB it measured per phase. ``predict`` gives
the estimator's bytes for the same run, ``phase_errors`` the two side by side; ``reports/hardware.py``
writes them as tables.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from easyr1.activations import RecomputePlan
from easyr1.config import PPOConfig, load_config, override_value
from easyr1.memory import GIB, NCCL_GIB, Estimate, estimate
from easyr1.models.architecture import Architecture
from easyr1.workloads import WORKLOADS, workload_config
from reports.records import BENCH_RECORD, MEMORY_RECORD, check_record, read_json

REPO = Path(__file__).resolve().parents[1]
# The GPU bench records (``easyr1 bench`` on the anchor workloads, whole GPUs), estimator cases beside
# the memory records: LoRA and full fine-tuning at the anchor's micro-batches, vision-language and
# video prompts, 16k-token responses, Ulysses, one and two GPUs.
BENCH_GLOBS = ("baselines/gpu/*.json", "baselines/gpu/features/*/*.json")
# Overrides that change neither what the estimator sees nor what the allocator holds: records that
# differ only by them are one configuration.
INERT_OVERRIDES = ("trainer.stall_report_s=",)
# Device memory of the GPUs records were made on, for records from before `easyr1 bench` wrote it
# (`gpu_total_gib`): torch.cuda.get_device_properties(0).total_memory on the H200.
GPU_TOTAL_GIB = {"NVIDIA H200": 139.8}
# The estimator's phases that the records measure, by the records' names for them (``memory_phases``).
PHASES = {"rollout": "gen", "experience": "ref_log_prob", "update_actor": "update_actor"}


def override_args(overrides: dict[str, Any]) -> list[str]:
    """``overrides`` as the ``key=value`` arguments ``load_config`` takes."""
    return [f"{k}={override_value(v)}" for k, v in overrides.items()]


def gib_text(value: float | None) -> str:
    """GiB as a table cell shows them: one decimal, "" for none."""
    return "" if value is None else f"{value:.1f}"


# When the engine began compiling the scoring head on GPUs (commit d19f88e): records made before it
# ran the eager head, whose buffers the estimator still models for use_torch_compile=false.
COMPILED_SCORING_SINCE = "2026-12-03T09:39:41+00:00"
# When ``enable_gradient_checkpointing`` became ``auto`` by default (commit d55c41b): records made before
# it recomputed every block (the default was true) and say nothing of it (``recomputed_blocks``).
GC_AUTO_SINCE = "2026-12-03T17:09:56+00:00"


@dataclass
class Measured:
    """One memory record (``easyr1 bench`` on a memory workload), or a bench record (``bench``: the
    anchor workloads on whole GPUs, ``baselines/gpu/*.json``)."""

    source: str
    record: dict[str, Any]
    bench: bool = False

    @property
    def size(self) -> str:
        return WORKLOADS[self.record["workload"]].size

    @property
    def model(self) -> str:
        """The architecture as ``Architecture.load`` names it (``qwen2:7b``)."""
        work = WORKLOADS[self.record["workload"]]
        return f"{work.arch}:{work.size}"

    @property
    def in_table(self) -> bool:
        """Whether the record runs EasyR1's example (a cell of its table, or a variant of one), rather
        than another workload that only checks the estimator (the anchor's micro-batches, say)."""
        return self.record["workload"].startswith("easyr1_")

    @property
    def label(self) -> str:
        """The size, and the workload where it is not EasyR1's example (``anchor 1.5B``)."""
        return self.size.upper() if self.in_table else f"{self.record['workload']} {self.size.upper()}"

    @property
    def cap(self) -> float | None:
        return self.record.get("gpu_memory_gib")

    @property
    def needed(self) -> float | None:
        """Allocated peak plus what lies outside the allocator: what the GPU must have (PyTorch's
        cache above it is given back before an allocation fails). Simulated ranks had no NCCL
        communicators: NCCL's share (``memory.NCCL_GIB``, what the two-GPU records held outside the
        allocator beyond the one-GPU records' context) is added."""
        phases = self.record.get("memory_phases") or {}
        if not phases or self.record.get("oom"):  # a run that failed needs more than any step it finished
            return None
        allocated = max(p.get("allocated", 0.0) for p in phases.values())
        return (
            allocated
            + (self.record.get("gpu_other_memory_gib") or 0.0)
            + (NCCL_GIB if self.simulated else 0.0)
        )

    def needed_text(self) -> str:
        oom = self.record.get("oom")
        if oom:  # the report the trainer wrote at the failure
            return f"{oom.get('max_allocated_gib', 0.0):.1f} GiB allocated when it failed"
        return f"{gib_text(self.needed)} GiB needed"

    @property
    def verdict(self) -> str:
        if self.record.get("oom"):
            return f"out of memory ({self.record['oom']['phase']})"
        return "fits" if self.cap is None or (self.needed or 0.0) <= self.cap else "over the cap"

    @property
    def size_gib(self) -> float:
        """The GPU memory the run had: its cap, else the whole device (older records name the GPU only)."""
        return self.cap or self.record.get("gpu_total_gib") or GPU_TOTAL_GIB[self.record["gpu"]]

    @property
    def simulated(self) -> bool:
        """Whether the run was rank 0 of its ``gpus`` ranks alone on one GPU, against a fake process
        group (``easyr1 bench --simulated-ranks``), rather than the job on as many GPUs."""
        return bool(self.record.get("simulated_ranks"))

    @property
    def name(self) -> str:
        """The record's file name, as the page's tables show it (simulated ranks said)."""
        return self.source.rsplit("/", 1)[-1] + (", simulated ranks" if self.simulated else "")

    @property
    def changes(self) -> str:
        """The config overrides on top of EasyR1's example (a whole-GPU variant), or ''."""
        return ", ".join(f"`{o}`" for o in self.record.get("overrides") or [])

    @property
    def cell(self) -> tuple[Any, ...]:
        """What a record measures: size, precision, GPU count, cap and changed settings, and whether
        as simulated ranks (a measurement of its own: never replaced by, or replacing, a real run's)."""
        return (
            self.record["workload"],
            self.record["precision"],
            self.record["gpus"],
            self.cap,
            self.changes,
            self.simulated,
        )

    @property
    def compiled_scoring(self) -> bool:
        """Whether the engine that made the record compiled the scoring head's chunk work (the
        estimator's head terms differ): every record made since that landed."""
        return self.record.get("date", "") >= COMPILED_SCORING_SINCE

    @property
    def vllm_slept(self) -> bool:
        """Whether vLLM slept between rollouts: as the record says, or (records from before it said) as
        its phases show: a phase's allocated peak above what the device held, which only vLLM's pool,
        unmapped while it sleeps and still counted by PyTorch's allocator, explains."""
        if self.record["backend"] != "vllm":
            return False
        awake = self.record.get("vllm_awake")
        if awake is not None:
            return not awake
        phases = (self.record.get("memory_phases") or {}).values()
        return any(p.get("allocated", 0.0) > p.get("device", math.inf) for p in phases)

    @property
    def planning_gib(self) -> float | None:
        """The GPU size the estimate plans on: the cap, else for vLLM (whose share is of the GPU) the device."""
        return self.cap if self.record["backend"] != "vllm" else self.size_gib

    def config(self) -> PPOConfig:
        overrides = {
            **workload_config(
                self.record["workload"], self.record["backend"], self.record["gpus"], self.record["precision"]
            )
        }
        overrides.update({"data.train_files": "x", "worker.actor.model.model_path": "x"})
        if self.record["backend"] == "vllm":  # vLLM's settings as the run had them, where it says
            share, tp = (
                self.record.get("vllm_gpu_memory_utilization"),
                self.record.get("tensor_parallel_size"),
            )
            if share is not None:
                overrides["worker.rollout.gpu_memory_utilization"] = share
            if tp is not None:
                overrides["worker.rollout.tensor_parallel_size"] = tp
            overrides["worker.rollout.free_cache_engine"] = self.vllm_slept
        return load_config(override_args(overrides) + list(self.record.get("overrides") or []))

    def recomputed(self, config: PPOConfig, arch: Architecture) -> RecomputePlan | None:
        """The actor's blocks the run recomputed: as the record says (under "auto", what the estimator
        of its day planned; whole blocks, and with ``partial_recompute`` those that recomputed their
        attention or elementwise work only), every block for a record from before "auto" (the default
        was true), else None (the config decides)."""
        blocks = self.record.get("recomputed_blocks")
        if blocks is not None:
            return RecomputePlan(
                int(blocks),
                attention=int(self.record.get("recomputed_attention_blocks") or 0),
                pointwise=int(self.record.get("recomputed_pointwise_blocks") or 0),
            )
        setting = config.worker.actor.model.enable_gradient_checkpointing
        if setting == "auto" and self.record.get("date", "") < GC_AUTO_SINCE:
            return RecomputePlan(arch.layers)
        return None

    @property
    def configuration(self) -> tuple[Any, ...]:
        """What a bench record's memory depends on: records alike in it are one configuration (repeats,
        timing variants, the same run beside TRL's) and differ only by the engine's revision."""
        r = self.record
        return (
            r["workload"],
            r["backend"],
            r["gpus"],
            self.simulated,
            r["precision"],
            r.get("gpu"),
            tuple(sorted(o for o in r.get("overrides") or [] if not o.startswith(INERT_OVERRIDES))),
            r.get("vllm_gpu_memory_utilization"),
            r.get("tensor_parallel_size"),
            r.get("recomputed_blocks"),
            self.vllm_slept,
            self.vllm_runner,
            tuple(sorted((r.get("allocator_env") or {}).items())),
            self.compiled_scoring,
        )

    @property
    def vllm_runner(self) -> str:
        """vLLM's model runner: its V2 runner (``VLLM_USE_V2_MODEL_RUNNER=1``, the engine's choice on one
        GPU since 2026-12-04) or vLLM's default; "" for the Hugging Face rollout."""
        if self.record["backend"] != "vllm":
            return ""
        return (
            "V2" if (self.record.get("vllm_env") or {}).get("VLLM_USE_V2_MODEL_RUNNER") == "1" else "default"
        )


def load_records(paths: list[str]) -> list[Measured]:
    """The memory records in the order they were made, the latest of each cell only: a cell measured
    again at a later revision replaces its earlier record, which measured an engine that is gone and
    would set today's prediction against it. Each is checked as it is read: RecordError names a damaged one."""
    records = [
        Measured(
            str(Path(p).relative_to(REPO)) if Path(p).is_relative_to(REPO) else p, read_json(p, MEMORY_RECORD)
        )
        for p in sorted(paths)
    ]
    records.sort(key=lambda m: m.record.get("date", ""))
    # A tiny model's record (a CPU smoke cell of the workflow) is no case for the estimator, which
    # sizes the real architectures only.
    records = [m for m in records if m.size != "tiny"]
    latest = {m.cell: m for m in records}
    return [m for m in records if latest[m.cell] is m]


def bench_paths() -> list[str]:
    """The committed GPU bench records (``BENCH_GLOBS``)."""
    return sorted(str(path) for pattern in BENCH_GLOBS for path in REPO.glob(pattern))


def load_bench_records(paths: list[str]) -> tuple[list[Measured], dict[str, list[str]]]:
    """The bench records that are estimator cases, in date order, and the others by why they are not
    (each record is one or the other). Each is checked as it is read: RecordError names a damaged one."""
    cases: list[Measured] = []
    left: dict[str, list[str]] = {}
    for p in sorted(paths):
        source = str(Path(p).relative_to(REPO)) if Path(p).is_relative_to(REPO) else p
        record = read_json(p, BENCH_RECORD)
        if not record.get("memory_phases"):
            left.setdefault("made before the bench recorded memory phase by phase (2026-12-02)", []).append(
                source
            )
            continue
        if WORKLOADS[record["workload"]].size == "tiny":
            left.setdefault("a tiny model's: the estimator sizes real architectures", []).append(source)
            continue
        cases.append(Measured(source, check_record(record, MEMORY_RECORD, p), bench=True))
    cases.sort(key=lambda m: m.record.get("date", ""))
    return cases, left


def predict(m: Measured) -> tuple[Estimate, dict[str, float]]:
    """The estimate of a record's run, as its engine ran it, and the GiB per phase it sets against
    PyTorch's allocated peaks: where vLLM slept, its pool, unmapped but still counted by the allocator
    (easyr1/telemetry.py reads ``max_memory_allocated``), is added to every phase after the rollout."""
    config, arch = m.config(), Architecture.load(m.model)
    predicted = estimate(
        config,
        arch,
        gpus=m.record["gpus"],
        gpu_memory_gib=m.planning_gib,
        compiled_scoring=m.compiled_scoring,
        actor_checkpointed=m.recomputed(config, arch),
    )
    asleep = config.worker.rollout.gpu_memory_utilization * m.size_gib if m.vllm_slept else 0.0
    phases = {
        phase: predicted.phase_total(phase) / GIB + (asleep if phase != "rollout" else 0.0)
        for phase in PHASES
        if phase in predicted.phases
    }
    return predicted, phases


def phase_errors(m: Measured) -> dict[str, tuple[float, float, float]]:
    """Per phase measured: (measured GiB, predicted GiB, relative error). The phase that ran out of
    memory has no peak to compare: the run's recorded one is an earlier step's (the first update has
    no optimizer state yet), below the one that failed."""
    _, predicted = predict(m)
    phases = m.record.get("memory_phases") or {}
    failed = (m.record.get("oom") or {}).get("phase")
    out = {}
    for phase, key in PHASES.items():
        seen = phases.get(key, {}).get("allocated")
        if phase in predicted and seen is not None and key != failed:
            out[phase] = (seen, predicted[phase], (predicted[phase] - seen) / seen)
    return out


def bench_groups(records: list[Measured]) -> list[list[Measured]]:
    """The bench records by configuration (``Measured.configuration``), each group in date order."""
    groups: dict[tuple[Any, ...], list[Measured]] = {}
    for m in records:
        groups.setdefault(m.configuration, []).append(m)
    return sorted(groups.values(), key=lambda g: (g[0].record["workload"], g[0].record["gpus"], g[0].name))
