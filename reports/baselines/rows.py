"""Records read into rows: this run's cells and curves, committed CPU runs, GPU benchmark records;
one row per record, with its kind (what it measures)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any

import pandas as pd

from reports.records import BENCH_RECORD, CELL_RECORD, CURVE_RECORD, check_csv, read_json, unreadable

THIS_RUN = "this run"
STOPPED = "stopped"  # a cell's status when a signal (Ctrl-C, a scheduler's SIGTERM) ended its run


@dataclass(frozen=True)
class Report:
    """What the pages are made from: the records, and what the page names and flags rows against."""

    results: str  # this run's cells (runs/results.csv)
    curves: str  # their curves (runs/curves.csv)
    recorded: list[str]  # committed records: baselines/cpu/*/results.csv, baselines/gpu/*.json
    matrix: str  # the matrix file, as the page names it
    engine: str  # the current engine's fingerprint (`easyr1 version`)
    repo: Path
    memory_records: tuple[
        str, ...
    ] = ()  # the hardware page's records (baselines/gpu/memory/*/*.json), for the summary
    deps: str = ""  # the dependency matrix's results (baselines/deps.csv), for the summary


def _overrides(record: dict) -> dict[str, str]:
    return dict(item.partition("=")[::2] for item in record.get("overrides") or [])


def other_settings(other: Any) -> dict[str, str]:
    """A row's other settings (``KEY=VALUE ...``, as ``_settings`` spells them) as a mapping."""
    return dict(item.partition("=")[::2] for item in str(other or "").split())


def spelled(settings: dict[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in settings.items())


def _timed(values: list[float]) -> list[float]:
    """The steps that count: all but the first (which pays for warm-up) when there are two or more."""
    return values[1:] or values


def _spread(values: list[float]) -> tuple[float | None, float | None, float | None]:
    return (min(values), median(values), max(values)) if values else (None, None, None)


def _peer_mode(record: dict) -> str | None:
    """Which TRL peer ran in the record's invocation: its Hugging Face generate (records from before
    the vLLM peer name no mode) or vLLM colocate; None without a peer."""
    trl = record.get("trl")
    return (trl.get("mode") or "hf") if trl else None


PEER_NAMES = {"hf": "TRL", "vllm": "TRL+vLLM"}


def _peer_steps(record: dict) -> list[float]:
    """The TRL peer's timed step times, from the per-step list it recorded."""
    trl = record.get("trl") or {}
    steps = trl.get("step_times") or trl.get("steps")
    return _timed(list(steps)) if isinstance(steps, list) else []


# Keys that change what a run reports about itself, not what it computes: a record that sets one is
# the same kind of measurement as one that does not (its reproduction command still names it).
DIAGNOSTIC_KEYS = ("trainer.stall_report_s",)


# ``easyr1 bench --precision lora``: AMP with adapters of this rank (easyr1.bench.PRECISIONS).
LORA_PRECISION_RANK = 64


def _bits(record: dict) -> str:
    """The record's precision as EasyR1's tables name it: AMP (LoRA's too: its rank is a column of
    its own), BF16, FP32; records from before ``precision`` was kept: their compute dtype (bf16)."""
    precision = record.get("precision") or record.get("dtype") or "bf16"
    return "AMP" if precision == "lora" else precision.upper()


def _settings(record: dict) -> dict[str, Any]:
    """What distinguishes one benchmark configuration from another, spelled out."""
    overrides = _overrides(record)
    for key in DIAGNOSTIC_KEYS:
        overrides.pop(key, None)
    vllm = record["backend"] == "vllm"
    lora = int(
        overrides.pop(
            "worker.actor.model.lora.rank", LORA_PRECISION_RANK if record.get("precision") == "lora" else 0
        )
    )
    if lora:
        overrides.pop("worker.actor.model.lora.alpha", None)
    # Records from before the engines' size was kept ran one engine over all their GPUs.
    tp = overrides.pop(
        "worker.rollout.tensor_parallel_size", record.get("tensor_parallel_size") or record.get("gpus") or 1
    )
    fce = overrides.pop("worker.rollout.free_cache_engine", "auto")
    if fce == "auto":  # what the run decided (records from before "auto" existed slept)
        fce = "false" if record.get("vllm_awake") else "true"
    runner = "V2" if _ran_v2_runner(record) else "own"
    return {
        "tp": int(tp) if vllm else None,
        "free_cache_engine": fce if vllm else "",
        "model_runner": runner if vllm else "",
        "lora": lora,
        "other": spelled(dict(sorted(overrides.items()))),
    }


def _ran_v2_runner(record: dict) -> bool:
    """Whether vLLM ran its V2 model runner (``VLLM_USE_V2_MODEL_RUNNER=1``) rather than its own."""
    return (record.get("vllm_env") or {}).get("VLLM_USE_V2_MODEL_RUNNER") == "1"


def _runner_env(record: dict, tp: int) -> str:
    """The variable that makes today's engine run the record's model runner: the V2 runner is the
    default with one GPU per engine (``easyr1.rollout.vllm.set_vllm_env``), vLLM's own otherwise."""
    v2 = _ran_v2_runner(record)
    return "" if v2 == (tp == 1) else f"VLLM_USE_V2_MODEL_RUNNER={int(v2)} "


def _reproduce(record: dict, gpus: int) -> str:
    env = _runner_env(record, _settings(record)["tp"]) if record["backend"] == "vllm" else ""
    trl = {None: "", "hf": " --trl", "vllm": " --trl-vllm"}[_peer_mode(record)]
    overrides = "".join(f" {o}" for o in record.get("overrides") or [])
    layout = f"--gpus 1 --simulated-ranks {gpus}" if record.get("simulated_ranks") else f"--gpus {gpus}"
    return (
        f"{env}easyr1 bench --workload {record['workload']} --backend {record['backend']} {layout} "
        f"--steps {record['steps']}{trl}{overrides}"
    )


def from_benchmark(record: dict, source: str) -> dict[str, Any]:
    """A benchmark record (``easyr1 bench``) as a row: step-time spread from its per-step list, the
    peer's true median, phases, memory with one definition per column, settings and a command."""
    gpus = int(record.get("gpus") or 1)
    # Steps past the timed ones ran under the profiler or the host sampler (easyr1 bench --profile).
    timed = [
        s for s in record.get("per_step", []) if "perf/time_per_step" in s and s["step"] <= record["steps"]
    ]
    ours = _timed([s["perf/time_per_step"] for s in timed])
    low, _, high = _spread(ours)
    peer = _peer_steps(record)
    peer_step = median(peer) if peer else None
    phases = record.get("phases") or {}
    device_counted = "perf/max_memory_device_gb" in phases
    device = record.get("peak_mem_gib") if device_counted else None
    # Before 2026-12-04's fix (easyr1/telemetry.py) the device reading added a phase's allocations
    # to a start that already held the cached blocks they reused (147.5 GiB on a 139.8 GiB H200).
    # What torch reserved plus what was outside it also bounds the device's peak, and is right with
    # vLLM awake; asleep, it counts vLLM's released pool, and the device reading is the lower.
    held = record.get("peak_held_gib")
    if device is not None and held is not None:
        device = min(device, held)
    allocated = record.get("peak_mem_allocated_gib")
    if allocated is None and device_counted:
        allocated = phases.get("perf/max_memory_allocated_gb")
    elif allocated is None and record["backend"] == "hf":  # older records: torch's counter, no vLLM pool
        allocated = record.get("peak_mem_gib")
    # Under vLLM's sleep mode torch's counter also counts vLLM's pool while it is released.
    counts_pool = bool(device and allocated and allocated > device)
    settings = _settings(record)
    kind = " | ".join(
        str(v)
        for v in (
            record["workload"],
            record["backend"],
            f"{gpus} GPU",
            _bits(record),
            record.get("gpu"),
            *settings.values(),
        )
    ) + (" | peer TRL+vLLM" if _peer_mode(record) == "vllm" else "")  # the HF peer's records keep their kinds
    # Rank 0 of the job alone against a fake process group (easyr1 bench --simulated-ranks): a kind of
    # its own, never compared with (or flagged against) a run on as many real GPUs.
    kind += " | simulated ranks" if record.get("simulated_ranks") else ""
    return {
        "type": "bench",
        "kind": kind,
        "cell": Path(source).stem,
        "workload": record["workload"],
        "model": record["model"],
        "bits": _bits(record),
        "status": "ok",
        "steps": record["steps"],
        "hardware": record.get("gpu") or "",
        "devices": gpus,
        "simulated_ranks": bool(record.get("simulated_ranks")),
        "rollout": record["backend"],
        **settings,
        "time_per_step": record["step_s"],
        "step_min": low,
        "step_max": high,
        "throughput": record["tokens_per_s"],
        "mfu_actor": record.get("mfu_actor"),
        "gen_s": phases.get("timing_s/gen"),
        "update_s": phases.get("timing_s/update_actor"),
        "ref_s": phases.get("timing_s/ref_log_prob"),
        # NVML's GPM reading (records from revision 7149c10 on): the seconds generation kept the GPU busy.
        "gen_busy_s": phases.get("perf/gpu_busy_s/gen"),
        "peer": PEER_NAMES.get(_peer_mode(record), ""),
        "peer_step_s": peer_step,
        "peer_ratio": peer_step / record["step_s"] if peer_step else None,
        "peak_gpu_memory_gb": None if counts_pool else allocated,
        "allocated_counts_pool": counts_pool,
        "peak_gpu_device_gb": device,
        "engine": record.get("engine", ""),
        "git": str(record.get("git_revision", "")).split(" ")[0],
        "versions": " ".join(
            f"{k}={record[k]}" for k in ("python", "torch", "transformers", "vllm") if record.get(k)
        ),
        "date": record.get("date", ""),
        "host": "",
        "environment": "",
        "notes": record.get("notes", ""),
        "reproduce": _reproduce(record, gpus),
        "source": source,
    }


# Identifiers that may be all digits (a hex fingerprint or revision): read as text, never as numbers.
IDENTIFIERS = {"engine": str, "config_hash": str, "git": str}


def _cells(frame: pd.DataFrame, source: str) -> pd.DataFrame:
    frame = frame.copy()
    frame["type"] = "cell"
    frame["kind"] = "cell " + frame["cell"].astype(str)
    frame["source"] = source
    return frame


def _read_cells(path: str | Path, source: str) -> pd.DataFrame:
    check_csv(path, CELL_RECORD)
    return _cells(pd.read_csv(path, dtype=IDENTIFIERS), source)


def _read_curves(path: str | Path) -> pd.DataFrame:
    check_csv(path, CURVE_RECORD)
    return pd.read_csv(path)


def _read_benchmark(path: Path, source: str) -> pd.DataFrame:
    record = read_json(path, BENCH_RECORD)
    try:
        return pd.DataFrame([from_benchmark(record, source)])
    except (ValueError, KeyError, TypeError) as exc:  # a value no schema names (an override that is not one)
        raise unreadable(path, f"{type(exc).__name__}: {exc}") from exc


def load(report: Report) -> tuple[pd.DataFrame, pd.DataFrame]:
    """All records as rows, each marked current or not, and all cell curves, keyed by (cell, date).
    Each file is checked as it is read (``reports/records.py``): RecordError names a damaged one.

    A record that appears twice (a run that was also snapshotted) is kept once, as the committed one.
    """
    rows = [_read_cells(report.results, THIS_RUN)]
    curves = [_read_curves(report.curves)]
    for file in report.recorded:
        path = Path(file)
        source = f"recorded: {os.path.relpath(path, report.repo)}"
        if path.suffix == ".json":
            rows.append(_read_benchmark(path, source))
            continue
        rows.append(_read_cells(path, source))
        if path.with_name("curves.csv").is_file():
            curves.append(_read_curves(path.with_name("curves.csv")))
    df = pd.concat(rows, ignore_index=True)
    # Records from before a cell could span nodes have no nodes or launcher: one node, local ranks.
    df["nodes"] = df.get("nodes", pd.Series(1, index=df.index)).fillna(1).astype(int)
    df["launcher"] = [v if isinstance(v, str) else "local" for v in df.get("launcher", [None] * len(df))]
    # A cell's CPU seconds a step: records from before it was collected have none, benchmarks neither.
    df["calibrated_cpu_step"] = pd.to_numeric(
        df.get("calibrated_cpu_step", pd.Series(None, index=df.index)), errors="coerce"
    )
    df["committed"] = df["source"] != THIS_RUN
    df["in_matrix"] = df["kind"].isin(
        df.loc[~df["committed"], "kind"]
    )  # a cell of this run, wherever recorded
    df = df.sort_values(["date", "committed"], ascending=False, kind="stable").drop_duplicates(
        ["kind", "date"]
    )
    df["current"] = ~df.duplicated("kind")  # the first of a kind, newest first, is its latest record
    df = df.sort_index().reset_index(drop=True)  # back to input order: the matrix's, then the records'
    curve = pd.concat(curves, ignore_index=True).drop_duplicates(["cell", "date", "step"])
    return df, curve
