"""``assets/hardware.md``: EasyR1's hardware table checked against this engine's estimator and measurements.

EasyR1 publishes GPU counts per model size and precision for its example config, marked
"estimated". For each cell this page puts beside it the estimator's prediction
(``easyr1/memory.py``: peak memory per GPU at EasyR1's count, and the smallest power-of-two count
of that GPU size that fits) and, where a record exists, what a run measured under a simulated GPU of
the cell's size (``easyr1 bench --workload easyr1_SIZE --precision P --gpu-memory G``, records under
``baselines/gpu/memory/``). A second table checks the estimator against every measured phase peak,
and a plot shows predicted against measured. The same records give the same bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from easyr1.config import PPOConfig, load_config, override_value  # noqa: E402
from easyr1.memory import GIB, NCCL_GIB, Estimate, estimate, smallest_fit  # noqa: E402
from easyr1.models.architecture import Architecture  # noqa: E402
from easyr1.workloads import PRECISIONS, WORKLOADS, workload_config  # noqa: E402
from reports.records import BENCH_RECORD, MEMORY_RECORD, check_record, read_json  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
EASYR1_CONFIG = REPO / "configs/engine/easyr1.yaml"
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
TOLERANCE = 0.10  # the estimator's target: every measured peak within 10%
PNG = {"Software": None}  # no matplotlib version in the file: byte-stable output

# EasyR1's README, "Hardware Requirements" (marked "estimated"), copied exactly: (GPUs, GB each).
SIZES = ("1.5b", "3b", "7b", "32b", "72b")
EASYR1_TABLE: dict[tuple[str, str], tuple[tuple[int, int], ...]] = {
    ("GRPO Full Fine-Tuning", "AMP"): ((2, 24), (4, 40), (8, 40), (16, 80), (32, 80)),
    ("GRPO Full Fine-Tuning", "BF16"): ((1, 24), (1, 40), (4, 40), (8, 80), (16, 80)),
    ("GRPO LoRA Fine-Tuning", "AMP"): ((1, 12), (1, 24), (2, 32), (2, 80), (4, 80)),
}
PRECISION = {
    ("GRPO Full Fine-Tuning", "AMP"): "amp",
    ("GRPO Full Fine-Tuning", "BF16"): "bf16",
    ("GRPO LoRA Fine-Tuning", "AMP"): "lora",
}
# What the bench's --precision sets, beyond EasyR1's example config (workloads.PRECISIONS' keys).
PHASES = {"rollout": "gen", "experience": "ref_log_prob", "update_actor": "update_actor"}


def _args(overrides: dict[str, Any]) -> list[str]:
    return [f"{k}={override_value(v)}" for k, v in overrides.items()]


def _precision_overrides(precision: str) -> dict[str, Any]:
    return PRECISIONS[precision]


def easyr1_cell_config(precision: str, gpus: int, tp: int) -> PPOConfig:
    """EasyR1's example config (``configs/engine/easyr1.yaml``) at a cell's precision and GPU count."""
    overrides = {
        **_precision_overrides(precision),
        "trainer.n_gpus_per_node": gpus,
        "worker.rollout.name": "vllm",
        "worker.rollout.tensor_parallel_size": tp,
        "data.train_files": "x",
        "worker.actor.model.model_path": "x",
    }
    return load_config([f"config={EASYR1_CONFIG}", *_args(overrides)])


def predict_cell(
    arch: Architecture, precision: str, gpus: int, gpu_gb: int
) -> tuple[Estimate, Estimate | None, int]:
    """The estimate at EasyR1's count, the smallest count that fits, and the rollout's TP: EasyR1's
    2, raised (up to the count) where the model's weights would leave vLLM no KV cache."""
    tp = min(2, gpus)
    while True:
        config = easyr1_cell_config(precision, gpus, tp)
        at_count = estimate(config, arch, gpus=gpus, gpu_memory_gib=gpu_gb)
        if not at_count.blockers or tp >= gpus:
            break
        tp *= 2
    return at_count, smallest_fit(easyr1_cell_config(precision, gpus, tp), arch, gpu_gb), tp


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
        return f"{_gib(self.needed)} GiB needed"

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
        return load_config(_args(overrides) + list(self.record.get("overrides") or []))

    def recomputed(self, config: PPOConfig, arch: Architecture) -> int | None:
        """The actor's blocks the run recomputed: as the record says (under "auto", what the estimator
        of its day planned), every block for a record from before "auto" (the default was true), else
        None (the config decides)."""
        blocks = self.record.get("recomputed_blocks")
        if blocks is not None:
            return int(blocks)
        setting = config.worker.actor.model.enable_gradient_checkpointing
        if setting == "auto" and self.record.get("date", "") < GC_AUTO_SINCE:
            return arch.layers
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


def _gib(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}"


def cell_verdicts(records: list[Measured], archs: dict[str, Architecture]) -> list[dict[str, str]]:
    """EasyR1's table, cell by cell: its claim, the prediction, the measurement ("" where none) and
    the verdict (``matches``, ``optimistic: ...``, ``pessimistic: ...``)."""
    cells = []
    for (method, bits), row in EASYR1_TABLE.items():
        precision = PRECISION[(method, bits)]
        for size, (gpus, gb) in zip(SIZES, row, strict=True):
            at_count, fit, tp = predict_cell(archs[size], precision, gpus, gb)
            ours = f"{at_count.device / GIB:.1f} GiB/GPU ({at_count.peak_phase}){'' if tp == min(2, gpus) else f', TP {tp}'}"
            ours += " - fits" if at_count.fits(gb) else " - does not fit"
            smallest = f"{fit.gpus}*{gb}GB" if fit else "none up to 1024"
            measured = [
                m
                for m in records
                if m.in_table
                and m.size == size
                and m.record["precision"] == precision
                and m.cap == gb
                and m.record["gpus"] == gpus
                and not m.changes
            ]
            seen = ""
            if measured:  # the real GPUs' verdict where there is one, else the simulated ranks'
                m = sorted(measured, key=lambda m: not m.simulated)[-1]
                seen = f"{m.verdict}, {m.needed_text()} ({m.name}{'' if m.compiled_scoring else ', before the compiled scoring head'})"
            if fit is None or fit.gpus > gpus:
                verdict = f"optimistic: needs {smallest}"
            elif fit.gpus < gpus:
                verdict = f"pessimistic: {smallest} suffice ({gpus // fit.gpus}x fewer)"
            else:
                verdict = "matches"
            cells.append(
                {
                    "method": method,
                    "bits": bits,
                    "size": size.upper(),
                    "easyr1": f"{gpus}*{gb}GB",
                    "gpus": str(gpus),
                    "ours": ours,
                    "smallest": smallest,
                    "measured": seen,
                    "verdict": verdict,
                }
            )
    return cells


def cell_table(records: list[Measured], archs: dict[str, Architecture]) -> tuple[str, list[str]]:
    """EasyR1's table, cell by cell; and the sentences on where it is optimistic or pessimistic."""
    cells = cell_verdicts(records, archs)
    rows = [
        [
            c["method"],
            c["bits"],
            c["size"],
            c["easyr1"],
            c["ours"],
            c["smallest"],
            c["measured"] or "not measured" + (f": needs {c['gpus']} GPUs" if int(c["gpus"]) > 1 else ""),
            c["verdict"],
        ]
        for c in cells
    ]
    findings = [
        f"{c['method']} {c['bits']} {c['size']}: EasyR1 says {c['easyr1']}; {c['verdict']}."
        for c in cells
        if c["verdict"] != "matches"
    ]
    header = [
        "Method",
        "Bits",
        "Size",
        "EasyR1 (estimated)",
        "our prediction at EasyR1's count",
        "smallest that fits (predicted)",
        "measured (GPUs capped to the size; or simulated ranks)",
        "verdict",
    ]
    return _table(header, rows), findings


def check_table(records: list[Measured]) -> tuple[str, list[tuple[float, float, str]]]:
    """Every measured phase peak against its prediction, on the record's own workload (EasyR1's
    example or another: each record is a case the estimator must hold on)."""
    rows, points = [], []
    for m in records:
        predicted, _ = predict(m)
        for phase, (seen, pred, error) in phase_errors(m).items():
            points.append((seen, pred, f"{m.label} {m.record['precision']} {phase}"))
            rows.append(
                [
                    m.name,
                    m.label,
                    m.record["precision"],
                    m.changes,
                    _gib(m.cap) or "whole",
                    phase,
                    f"{seen:.2f}",
                    f"{pred:.2f}",
                    f"{error:+.1%}",
                ]
            )
        rows.append(
            [
                m.name,
                m.label,
                m.record["precision"],
                m.changes,
                _gib(m.cap) or "whole",
                "device (verdict)",
                f"{m.needed_text()} ({m.verdict})",
                f"{predicted.device / GIB:.2f} ({'fits' if predicted.fits(m.size_gib) else 'does not fit'})",
                "",
            ]
        )
    header = [
        "record",
        "size",
        "precision",
        "changed from the workload (EasyR1's example but where named)",
        "GPU GiB",
        "phase",
        "measured allocated GiB",
        "predicted GiB",
        "error",
    ]
    return _table(header, rows), points


def bench_groups(records: list[Measured]) -> list[list[Measured]]:
    """The bench records by configuration (``Measured.configuration``), each group in date order."""
    groups: dict[tuple[Any, ...], list[Measured]] = {}
    for m in records:
        groups.setdefault(m.configuration, []).append(m)
    return sorted(groups.values(), key=lambda g: (g[0].record["workload"], g[0].record["gpus"], g[0].name))


def _gpu(record: dict[str, Any]) -> str:
    return (record.get("gpu") or "").replace("NVIDIA ", "").split(" ")[0]


def _describe(m: Measured) -> str:
    """A bench configuration in words: workload, precision, GPUs, what was changed, vLLM and the blocks."""
    r = m.record
    config = m.config()
    parts = [f"{r['workload']} {m.size.upper()} {r['precision']}, {r['gpus']}x {_gpu(r)}"]
    changed = [o for o in r.get("overrides") or [] if not o.startswith(INERT_OVERRIDES)]
    parts += [f"`{o}`" for o in changed]
    if r["backend"] == "vllm":
        rollout = config.worker.rollout
        parts.append(
            f"vLLM {rollout.gpu_memory_utilization:g} TP {rollout.tensor_parallel_size} {m.vllm_runner} runner "
            + ("asleep" if m.vllm_slept else "awake")
        )
    blocks = m.recomputed(config, Architecture.load(m.model))
    parts.append(f"{'?' if blocks is None else blocks} blocks recomputed")
    if r.get("allocator_env"):
        parts.append(", ".join(f"{k}={v}" for k, v in r["allocator_env"].items()))
    if not m.compiled_scoring:
        parts.append("eager scoring head")
    return ", ".join(parts)


def bench_table(records: list[Measured]) -> tuple[str, list[tuple[float, float, str]]]:
    """One row per configuration and phase: the group's record farthest from its prediction, and the
    errors' range over the group."""
    rows, points = [], []
    for group in bench_groups(records):
        errors = [(m, phase_errors(m)) for m in group]
        for phase in PHASES:
            seen = [(m, e[phase]) for m, e in errors if phase in e]
            if not seen:
                continue
            far, (measured, pred, error) = max(seen, key=lambda item: abs(item[1][2]))
            low, high = min(e[2] for _, e in seen), max(e[2] for _, e in seen)
            points.append((measured, pred, f"{far.record['workload']} {far.record['precision']} {phase}"))
            rows.append(
                [
                    far.name + (f", 1 of {len(group)} alike" if len(group) > 1 else ""),
                    _describe(far),
                    f"{low:+.1%} to {high:+.1%}" if len(seen) > 1 else "",
                    phase,
                    f"{measured:.2f}",
                    f"{pred:.2f}",
                    f"{error:+.1%}",
                ]
            )
    header = [
        "record (the configuration's farthest from its prediction)",
        "configuration",
        "errors over its records",
        "phase",
        "measured allocated GiB",
        "predicted GiB",
        "error",
    ]
    return _table(header, rows), points


def feature_table(records: list[Measured]) -> str:
    """Whole-GPU runs with a setting changed, beside the same size and precision with EasyR1's
    example as it is (the latest such run: records come in date order): what each feature saves (or
    costs) in memory and time."""
    records = [m for m in records if m.in_table]
    base = {
        (m.size, m.record["precision"]): m for m in records if m.cap is None and not m.changes and m.needed
    }
    rows = []
    for m in sorted(records, key=lambda m: (SIZES.index(m.size), m.record["precision"], m.changes)):
        ref = base.get((m.size, m.record["precision"]))
        if m.cap is not None or not m.changes or ref is None:
            continue
        if m.record.get("oom"):  # what the feature turned off made the run not fit
            rows.append(
                [m.size.upper(), m.record["precision"], m.changes, m.verdict, "", "", "", m.name, ref.name]
            )
            continue
        if m.needed is None:
            continue
        step = m.record.get("step_s")
        rows.append(
            [
                m.size.upper(),
                m.record["precision"],
                m.changes,
                f"{m.needed:.1f}",
                f"{m.needed - ref.needed:+.1f}",
                f"{step:.1f}" if step else "",
                f"{step / ref.record['step_s']:.2f}x" if step and ref.record.get("step_s") else "",
                m.name,
                ref.name,
            ]
        )
    if not rows:
        return "No whole-GPU run with a changed setting has been recorded yet."
    # The example's record is named: a time compares two engines when the records' revisions differ.
    header = [
        "size",
        "precision",
        "changed from EasyR1's example",
        "GiB needed",
        "vs the example",
        "s/step",
        "vs the example",
        "record",
        "the example's record",
    ]
    return _table(header, rows)


def figure(points: list[tuple[float, float, str]], out: Path) -> None:
    fig, ax = plt.subplots(figsize=(5.5, 5))
    top = max([p for pair in points for p in pair[:2]] + [1.0]) * 1.1
    ax.plot([0, top], [0, top], color="black", lw=0.8, label="prediction = measurement")
    ax.fill_between(
        [0, top],
        [0, top * (1 - TOLERANCE)],
        [0, top * (1 + TOLERANCE)],
        color="0.9",
        label=f"±{TOLERANCE:.0%}",
    )
    for phase, marker in (("rollout", "o"), ("experience", "s"), ("update_actor", "^")):
        chosen = [(s, p) for s, p, label in points if label.endswith(phase)]
        if chosen:
            ax.scatter(*zip(*chosen, strict=True), marker=marker, label=phase, zorder=3)
    ax.set(
        xlim=(0, top),
        ylim=(0, top),
        xlabel="measured peak allocated (GiB)",
        ylabel="predicted (GiB)",
        title="easyr1 memory: predicted vs measured, per phase",
    )
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, metadata=PNG)
    plt.close(fig)


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


def provenance(records: list[Measured]) -> str:
    rows = []
    for m in records:
        r = m.record
        rows.append(
            [
                m.source,
                r.get("date", ""),
                r.get("gpu", ""),
                f"torch {r.get('torch')}, transformers {r.get('transformers')}",
                str(r.get("git_revision", "")),
                r.get("notes", ""),
            ]
        )
    return _table(["record", "date", "GPU", "packages", "revision", "notes"], rows)


def write_hardware(
    paths: list[str], page: Path, plot: Path, log: Path | None = None, bench: list[str] | None = None
) -> None:
    """The page and its plot from the memory records ``paths`` and the bench records ``bench`` (by
    default the committed ones, ``bench_paths``)."""
    records = load_records(paths)
    benched, left_out = load_bench_records(bench_paths() if bench is None else bench)
    archs = {size: Architecture.load(f"qwen2:{size}") for size in SIZES}
    cells, findings = cell_table(records, archs)
    checks, points = check_table(records)
    bench_checks, bench_points = bench_table(benched)
    points += bench_points
    groups = len(bench_groups(benched))
    not_cases = "; ".join(f"{len(names)} {why}" for why, names in sorted(left_out.items())) or "none"
    worst = max(points, key=lambda p: abs(p[1] - p[0]) / p[0]) if points else None
    worst_line = (
        f"The largest prediction error is {(worst[1] - worst[0]) / worst[0]:+.1%} ({worst[2]}: {worst[1]:.2f} GiB predicted, {worst[0]:.2f} measured)."
        if worst
        else "No measurements yet."
    )
    text = f"""# GPU memory: EasyR1's hardware table, predicted and measured

Generated by `reports/hardware.py` (Snakemake rule `hardware`) from the estimator (`easyr1 memory`,
`easyr1/memory.py`) and the records under `baselines/gpu/memory/` and `baselines/gpu/`. Do not edit by hand.

EasyR1's README gives GPU counts for its example config (`examples/config.yaml`: 2048-token
prompts and responses, micro-batches of 1 for the update and 2 for experience, vLLM at
`gpu_memory_utilization` 0.6 with TP 2, the actor's parameters and optimizer offloaded, the
reference model in host memory, gradient checkpointing, padding-free) and marks them "estimated".
Here each cell gets this engine's prediction on that config (`configs/engine/easyr1.yaml`) and
a measurement: the same settings on as many GPUs (H200s, and H100s since 2026-12-07), each capped to the cell's size (`easyr1 bench
--workload easyr1_SIZE --precision P --gpus N --gpu-memory G --steps 2`), or, for a cell of more
GPUs than the machine had, rank 0 of its N ranks alone on one capped GPU against a process group
that does not communicate ("simulated ranks": `--gpus 1 --simulated-ranks N`; parameters,
gradients and optimizer state sharded N ways as on each GPU of the job; NCCL's buffers, absent
there, are added to its verdict at the {NCCL_GIB:.2f} GiB the two-GPU records held); random-init
Qwen2.5 architectures, one prompt x 2 samples a GPU instead of 512 x 5,
since memory depends on the micro-batches; the Hugging Face rollout instead of vLLM, whose share is fixed by
`gpu_memory_utilization` and binds no cell but the 72B ones). A run fits when it finishes both
steps and its allocated peak plus the CUDA context and NCCL stays within the size. GB in
EasyR1's table is read as GiB, as the cards' memory is (a 24 GB card has 23.99 GiB).

## EasyR1's table, cell by cell

{cells}

{chr(10).join(f"- {f}" for f in findings) if findings else "- Every cell matches."}

## The estimator against the measurements

{worst_line} Target: ±{TOLERANCE:.0%}. Measured: PyTorch's allocated peak per phase, the
highest over the run's steps (`memory_phases`); `device` adds what lies outside the allocator
(`gpu_other_memory_gib`).

{checks}

### The GPU bench records

The bench records (`baselines/gpu/*.json`, `easyr1 bench` on whole GPUs; and
`baselines/gpu/features/*/`, its feature comparisons) are cases too: the anchor workloads, text
(`anchor`: 1.5B, micro-batches of 64 sequences of 768 tokens; `anchor_varied`: prompts of 64 to 1024
tokens), images (`anchor_vl`: Qwen2.5-VL-3B) and video (`anchor_video`), and 16,384-token responses
(`long_16k`), on one and two GPUs (H200, H100), with vLLM's rollout. A record's name says what it
was made for: `-trl` and `-trl-vllm` ran TRL beside it (TRL's own figures are not set against the
estimator), `-v1runner`/`-v2runner` vLLM's model runner, `-tp2` tensor parallelism 2, `-ulysses`
sequence parallelism, `-expandable` the allocator's expandable segments, `-maxseqs64` vLLM's
`max_num_seqs`, `-logprobs` vLLM's log-probs, `-hostprof` the host profiler; letters (`-b`, `-c`)
are repeats. Each is estimated as its engine ran it: vLLM's share, tensor-parallel size and sleep
(awake, or as an older record's phases show: vLLM's pool is unmapped while it sleeps but still
counted by PyTorch's allocator, so it is added to every later phase) as the record says; the
decoder blocks it recomputed (`recomputed_blocks`; before {GC_AUTO_SINCE[:10]}, when every block
was, all of them); the eager scoring head before {COMPILED_SCORING_SINCE[:10]}.

{len(benched)} records that are cases, in {groups} configurations: records alike in everything their
memory depends on (workload, GPUs, precision, changed settings other than
{", ".join(f"`{o}`" for o in INERT_OVERRIDES)}, vLLM's share, tensor-parallel size, runner and
sleep, the blocks recomputed, the allocator's settings, the scoring head) are one row per phase,
which shows the record farthest from its prediction and the range of the group's errors (they differ
by the engine's revision). Not cases: {not_cases}.

{bench_checks}

![predicted vs measured](hardware/predicted-vs-measured.png)

## What each feature saves (whole GPU)

EasyR1's example turns on offload (the actor's parameters and optimizer, the reference model),
padding-free training and gradient checkpointing; these runs change one setting (`whole_gpu.variants` in
`configs/matrix/hardware.yaml`) and are set beside the run of the same size and precision without
the change. Memory is the allocated peak plus the CUDA context; time is the median step.
Padding-free training has nothing to remove here: a random-init model answers up to the length
limit, so every sequence of a micro-batch is equally long; `baselines/gpu/features/` measures it on
varied lengths.

{feature_table(records)}

## Records

{provenance(records)}
"""
    figure(points, plot)  # the files last, when everything is computed
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(text)
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(f"{len(records)} memory records, {len(benched)} bench records; {worst_line}\n")


if __name__ == "__main__":
    import glob
    import sys

    write_hardware(
        sorted(glob.glob(str(REPO / "baselines/gpu/memory/*/*.json"))), Path(sys.argv[1]), Path(sys.argv[2])
    )
