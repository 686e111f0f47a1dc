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

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from easyr1.config import PPOConfig, load_config  # noqa: E402
from easyr1.memory import GIB, NCCL_GIB, Estimate, estimate, smallest_fit  # noqa: E402
from easyr1.models.architecture import Architecture  # noqa: E402
from easyr1.workloads import PRECISIONS  # noqa: E402
from reports.hardware_records import (  # noqa: E402
    COMPILED_SCORING_SINCE,
    GC_AUTO_SINCE,
    INERT_OVERRIDES,
    PHASES,
    REPO,
    Measured,
    bench_groups,
    bench_paths,
    gib_text,
    load_bench_records,
    load_records,
    override_args,
    phase_errors,
    predict,
)

EASYR1_CONFIG = REPO / "configs/engine/easyr1.yaml"
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
    return load_config([f"config={EASYR1_CONFIG}", *override_args(overrides)])


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


def measures_cell(m: Measured, gb: int) -> bool:
    """Whether a record measures a cell of ``gb`` GiB: capped to that size, or run on a whole GPU of
    less (an H100's 79.2 GiB for an 80 GB cell) and fitting there with what it needed, NCCL's share
    included, within the cell's size; a run that did not fit on less proves nothing about the cell."""
    if m.cap is not None:
        return m.cap == gb
    return m.size_gib < gb and m.needed is not None and m.needed <= gb


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
                and measures_cell(m, gb)
                and m.record["gpus"] == gpus
                and not m.changes
            ]
            seen = ""
            if measured:  # the real GPUs' verdict where there is one, else the simulated ranks'
                m = sorted(measured, key=lambda m: (not m.simulated, m.cap is not None))[-1]
                whole = "" if m.cap is not None else f", on a whole {m.size_gib:.1f} GiB GPU"
                seen = f"{m.verdict}, {m.needed_text()} ({m.name}{whole}{'' if m.compiled_scoring else ', before the compiled scoring head'})"
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
                    gib_text(m.cap) or "whole",
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
                gib_text(m.cap) or "whole",
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
    arch = Architecture.load(m.model)
    plan = m.recomputed(config, arch)
    parts.append("? blocks recomputed" if plan is None else plan.describe(arch.layers))
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
there, are added to its verdict at the {NCCL_GIB:.2f} GiB the two-GPU records held; its rollout
decodes 32 steps and fast-forwards the rest, its KV cache whole from the prefill; an 80 GB cell may
run on a whole H100 of 79.2 GiB, a verdict where it fits with that share within 80); random-init
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
