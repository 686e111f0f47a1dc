"""The baselines page, its history page and plots, from records only.

Records are this run's cells (``runs/results.csv`` and ``runs/curves.csv``, written by the
collect rule) and the committed records a matrix lists under ``recorded:``: CPU runs snapshotted
under ``baselines/cpu/{date}-{revision}/`` (``results.csv`` + ``curves.csv``) and GPU benchmark
records ``baselines/gpu/*.json`` (``easyr1 bench``). Every record has a *kind*, what it measures:
a cell (by name), or a benchmark's workload, backend, GPUs and settings. The page shows one
current row per kind, the latest; older ones go to the history page, and a current row more than
5% worse than the previous record of its kind on any headline metric is flagged. Each row names
the engine revision it ran with, flagged when the engine changed since. Output is byte-stable:
the same records give the same files.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import subprocess
import textwrap
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from statistics import mean, median, stdev
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from reports.records import (  # noqa: E402
    BENCH_RECORD,
    CELL_RECORD,
    CURVE_RECORD,
    RecordError as RecordError,  # the error a caller of the page catches
    check_csv,
    read_json,
    unreadable,
)

REGRESSION = 0.05  # a metric this much worse (relative) than the previous record is flagged
THIS_RUN = "this run"
STOPPED = "stopped"  # a cell's status when a signal (Ctrl-C, a scheduler's SIGTERM) ended its run
PNG = {"Software": None}  # no matplotlib version in the files: the same records give the same bytes


@dataclass(frozen=True)
class Report:
    results: str  # this run's cells (runs/results.csv)
    curves: str  # their curves (runs/curves.csv)
    recorded: list[str]  # committed records: baselines/cpu/*/results.csv, baselines/gpu/*.json
    matrix: str  # the matrix file, as the page names it
    engine: str  # the current engine's fingerprint (`easyr1 version`)
    repo: Path


# ---------------------------------------------------------------------------------------------
# Records


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or value == ""


def _overrides(record: dict) -> dict[str, str]:
    return dict(item.partition("=")[::2] for item in record.get("overrides") or [])


def _other(other: Any) -> dict[str, str]:
    """A row's other settings (``KEY=VALUE ...``, as ``_settings`` spells them) as a mapping."""
    return dict(item.partition("=")[::2] for item in str(other or "").split())


def _spelled(settings: dict[str, str]) -> str:
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
    lora = int(overrides.pop("worker.actor.model.lora.rank", LORA_PRECISION_RANK if record.get("precision") == "lora" else 0))
    if lora:
        overrides.pop("worker.actor.model.lora.alpha", None)
    # Records from before the engines' size was kept ran one engine over all their GPUs.
    tp = overrides.pop("worker.rollout.tensor_parallel_size", record.get("tensor_parallel_size") or record.get("gpus") or 1)
    fce = overrides.pop("worker.rollout.free_cache_engine", "auto")
    if fce == "auto":  # what the run decided (records from before "auto" existed slept)
        fce = "false" if record.get("vllm_awake") else "true"
    runner = "V2" if _ran_v2_runner(record) else "own"
    return {
        "tp": int(tp) if vllm else None,
        "free_cache_engine": fce if vllm else "",
        "model_runner": runner if vllm else "",
        "lora": lora,
        "other": _spelled(dict(sorted(overrides.items()))),
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
    timed = [s for s in record.get("per_step", []) if "perf/time_per_step" in s and s["step"] <= record["steps"]]
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
            record["workload"], record["backend"], f"{gpus} GPU", _bits(record), record.get("gpu"),
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
    df["committed"] = df["source"] != THIS_RUN
    df["in_matrix"] = df["kind"].isin(df.loc[~df["committed"], "kind"])  # a cell of this run, wherever recorded
    df = df.sort_values(["date", "committed"], ascending=False, kind="stable").drop_duplicates(["kind", "date"])
    df["current"] = ~df.duplicated("kind")  # the first of a kind, newest first, is its latest record
    df = df.sort_index().reset_index(drop=True)  # back to input order: the matrix's, then the records'
    curve = pd.concat(curves, ignore_index=True).drop_duplicates(["cell", "date", "step"])
    return df, curve


# ---------------------------------------------------------------------------------------------
# Engine revisions and regressions


@cache
def _engine_at(repo: Path, revision: str) -> str:
    """Whether the engine (``easyr1/``) at a git revision is today's, for records without a fingerprint."""
    if not revision or revision == "unknown" or revision.endswith("-dirty"):
        return "unknown"
    result = subprocess.run(
        ["git", "-C", str(repo), "diff", "--quiet", revision, "--", "easyr1"], capture_output=True
    )
    return {0: "current", 1: "changed since"}.get(result.returncode, "unknown")


def engine_state(row: pd.Series, report: Report) -> str:
    if not _missing(row.get("engine")):
        return "current" if row["engine"] == report.engine else "changed since"
    return _engine_at(report.repo, str(row.get("git", "")))


def _engine(row: pd.Series, report: Report) -> str:
    revision = "?" if _missing(row.get("git")) else str(row["git"])[:7] + ("-dirty" if "dirty" in str(row["git"]) else "")
    state = engine_state(row, report)
    return revision if state == "current" else f"{revision} ({state})"


# (column, label, higher is better, compared only on the same hardware). A seed's held-out accuracy
# too: a tiny model's RL run follows the CPU's floating-point paths, and on another CPU model the same
# code lands each seed elsewhere (2026-12-03: two Xeon models, one seed 22% apart, every text cell's
# seed mean within 1.5 pooled standard deviations); across hardware the page's mean ± std over seeds is what compares.
CELL_METRICS = [
    ("val_after", "held-out acc.", True, True),
    ("throughput", "tokens/s", True, True),
    ("time_per_step", "s/step", False, True),
]
BENCH_METRICS = [
    ("time_per_step", "s/step", False, True),
    ("throughput", "tokens/s", True, True),
    ("peer_ratio", "vs TRL", True, True),
    ("mfu_actor", "MFU", True, True),
]


def regressions(current: pd.Series, previous: pd.Series | None) -> str:
    """The current record's headline metrics against the previous record of its kind."""
    if previous is None:
        return "-"
    if current["type"] == "cell" and current.get("config_hash") != previous.get("config_hash"):
        return "-"  # another config (a new setting, not a regression): nothing to compare with
    flags = []
    for column, label, higher, same_hardware in CELL_METRICS if current["type"] == "cell" else BENCH_METRICS:
        if same_hardware and current.get("hardware") != previous.get("hardware"):
            continue
        now, before = current.get(column), previous.get(column)
        if _missing(now) or _missing(before) or before == 0:
            continue
        change = (now - before) / abs(before)
        if (-change if higher else change) > REGRESSION:
            flags.append(f"{label} {change:+.1%} vs {str(previous['date'])[:10]}")
    return "; ".join(flags) if flags else "ok"


# Across hardware, a configuration's seeds compare as a sample: its held-out accuracy over seeds is
# flagged when its mean is more than REGRESSION lower than the latest records of the same cells
# (same config hashes) on other hardware, and lower by more than this many standard errors of the
# difference. (2026-12-03's change of CPU model moved every text cell's mean by less than 1.5 pooled
# standard deviations, and the VL cell's, of tiny spread, by 2.7%: neither is flagged.)
SEED_MEAN_SE = 3.0


def seed_mean_shift(group: pd.DataFrame, cells: pd.DataFrame) -> str | None:
    """A flag when the held-out accuracy of ``group`` (a configuration's current seeds, on one
    hardware) fell, as a mean over seeds, against the same cells' latest records on other
    hardware in ``cells`` (every cell record, current or not); None when it did not or cannot say."""
    now = group.dropna(subset=["val_after"])
    if len(now) < 2:
        return None  # no spread to weigh a difference by
    earlier = cells[
        cells["kind"].isin(now["kind"]) & cells["config_hash"].isin(now["config_hash"])
        & (cells["hardware"] != now["hardware"].iloc[0]) & (cells["date"] < now["date"].min())
    ].dropna(subset=["val_after"])
    before = earlier.sort_values("date", kind="stable").drop_duplicates("kind", keep="last")
    if len(before) < 2:
        return None
    reference = before["val_after"].mean()
    drop = reference - now["val_after"].mean()
    error = math.sqrt(now["val_after"].var() / len(now) + before["val_after"].var() / len(before))
    if drop <= REGRESSION * abs(reference) or drop <= SEED_MEAN_SE * error:
        return None
    errors = f", {drop / error:.1f} standard errors" if error else ""
    return (
        f"seed mean: held-out acc. {-drop / abs(reference):+.1%} vs {str(before['date'].max())[:10]} "
        f"on {', '.join(sorted(set(before['hardware'])))}{errors}"
    )


def _revision_medians(group: pd.DataFrame) -> pd.Series:
    """A revision's repeat invocations of one benchmark kind as one measurement: the newest record
    with each headline metric the median over the invocations."""
    row = group.iloc[0].copy()
    for column, *_ in BENCH_METRICS:
        values = [v for v in group[column] if not _missing(v)]
        row[column] = median(values) if values else None
    return row


def with_regressions(df: pd.DataFrame) -> pd.DataFrame:
    """Each row's regression flags. A benchmark is run several times at one revision (a claim holds
    once it holds in three invocations): those repeats measure the host's noise, not a change, so a
    benchmark row compares its revision's invocations (their medians) with the previous revision's."""
    df = df.copy()
    df["regression"] = ""
    for _, group in df.groupby("kind", sort=False):
        group = group.sort_values("date", ascending=False, kind="stable")
        if group["type"].iloc[0] == "bench":
            revisions = [rev for _, rev in group.groupby("git", sort=False)]  # newest revision first
            for i, rev in enumerate(revisions):
                previous = _revision_medians(revisions[i + 1]) if i + 1 < len(revisions) else None
                flags = regressions(_revision_medians(rev), previous)
                df.loc[rev.index, "regression"] = flags
            continue
        for i, index in enumerate(group.index):
            previous = group.iloc[i + 1] if i + 1 < len(group) else None
            df.loc[index, "regression"] = regressions(df.loc[index], previous)
    return df


def invocations(df: pd.DataFrame) -> pd.Series:
    """For each benchmark row, the step and peer ratio of every invocation of its kind at its
    revision, oldest first ("2.83 / 2.86 / 3.19 s; 4.20x / 4.92x / 4.02x"); "1" for a single one."""
    out = pd.Series("", index=df.index, dtype=object)
    for _, group in df[df["type"] == "bench"].groupby(["kind", "git"], sort=False):
        group = group.sort_values("date", kind="stable")
        text = "1"
        if len(group) > 1:
            steps = " / ".join(_num(v, ".2f") for v in group["time_per_step"])
            ratios = [f"{v:.2f}x" for v in group["peer_ratio"] if not _missing(v)]
            text = f"{len(group)}: {steps} s" + (f"; {' / '.join(ratios)}" if ratios else "")
        out[group.index] = text
    return out


# ---------------------------------------------------------------------------------------------
# Formatting


def _num(value: Any, fmt: str, unit: str = "") -> str:
    return "-" if _missing(value) else f"{value:{fmt}}{unit}"


def _int(value: Any) -> str:
    return "-" if _missing(value) else str(int(value))


def _pct(value: Any) -> str:
    return "-" if _missing(value) else f"{100 * value:.1f}%"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _mean_std(values: list[float], fmt: str) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:{fmt}}"
    return f"{mean(values):{fmt}} ± {stdev(values):{fmt.lstrip('+')}}"


def _lora(value: Any) -> str:
    return f" LoRA {int(value)}" if not _missing(value) and int(value) > 0 else ""


# ---------------------------------------------------------------------------------------------
# The CPU matrix (cells): one row per configuration, seeds aggregated

CONFIG = ["model", "size", "dataset", "algorithm", "bits", "lora", "hardware", "devices", "nodes", "launcher", "steps"]


# Text axes a row may lack (a model with no ``size``, a cell whose cell.json could not be read): an
# empty CSV field reads back as NaN, which the page would print as "nan".
TEXT_AXES = ["model", "size", "dataset", "algorithm", "bits", "hardware", "launcher"]


def _configurations(cells: pd.DataFrame) -> list[tuple[tuple, pd.DataFrame]]:
    text = {c: cells[c].map(lambda v: "-" if _missing(v) else str(v)) for c in TEXT_AXES}
    cells = cells.assign(lora=cells["lora"].fillna(0).astype(int), steps=cells["steps"].fillna(0).astype(int), **text)
    return list(cells.groupby(CONFIG, sort=False, dropna=False))


def _ranks(devices: Any, nodes: int, launcher: str) -> str:
    """A node's ranks, or ``nodes x ranks (launcher)`` for a cell on several nodes."""
    return _int(devices) if nodes == 1 else f"{nodes} x {_int(devices)} ({launcher})"


def _seed_label(cell: str, base: str) -> str:
    return cell[len(base):].lstrip("-") or "default seed"


def algorithm_table(cells: pd.DataFrame, report: Report, every_cell: pd.DataFrame) -> str:
    """The current CPU cells, one row per configuration; ``every_cell``: all cell records, for the
    comparison of seed means across hardware."""
    header = [
        "Model", "Size", "Dataset", "Algorithm", "Bits", "Hardware", "Ranks", "Steps", "LR", "KL", "Seeds",
        "Held-out acc. before", "after", "gain (mean ± std)", "s/step", "Tokens/s/device", "Peak CPU mem",
        "Engine", "Regression", "Cells (config hash)",
    ]
    rows = []
    for key, group in _configurations(cells):
        model, size, dataset, algorithm, bits, lora, hardware, devices, nodes, launcher, steps = key
        ok = group[group["status"] == "ok"]
        scored = ok[ok["val_before"].notna() & ok["val_after"].notna()]
        stopped = int((group["status"] == STOPPED).sum())
        failed = len(group) - len(ok) - stopped
        not_ok = ", ".join(f"{n} {what}" for n, what in ((failed, "FAILED"), (stopped, "STOPPED")) if n)
        gains = list(scored["val_after"] - scored["val_before"])
        base = min(group["cell"], key=len)
        flags = [
            f"{_seed_label(r['cell'], base)}: {r['regression']}"
            for _, r in group.iterrows()
            if r["regression"] not in ("ok", "-")
        ]
        shift = seed_mean_shift(ok, every_cell)
        flags += [shift] if shift else []
        engines = sorted({_engine(r, report) for _, r in group.iterrows()})
        rows.append(
            [
                model, size, dataset, algorithm + _lora(lora), bits, hardware, _ranks(devices, nodes, launcher), _int(steps),
                _num(group["lr"].iloc[0], ".0e"), _num(group["kl_coef"].iloc[0], ".0e"),
                str(len(group)) + (f" ({not_ok})" if not_ok else ""),
                _mean_std(list(scored["val_before"]), ".3f"),
                _mean_std(list(scored["val_after"]), ".3f"),
                _mean_std(gains, "+.3f") if len(scored) else "FAILED",
                _num(ok["time_per_step"].median(), ".2f"),
                _num(ok["throughput"].median(), ",.0f"),
                _num(ok["peak_cpu_memory_gb"].max(), ".2f", " GiB"),
                ", ".join(engines),
                "; ".join(flags) if flags else ("ok" if (group["regression"] == "ok").any() else "-"),
                ", ".join(f"`{r['cell']}` ({r['config_hash']})" for _, r in group.iterrows()),
            ]
        )
    return _table(header, rows)


def on_gpus(cells: pd.DataFrame) -> pd.Series:
    """Cells whose job ran on GPUs; one whose status.json could not be read has no hardware, and
    stays with the CPU cells' table rather than making a GPU row of blanks."""
    hardware = cells["hardware"].fillna("").astype(str)
    return (hardware != "") & ~hardware.str.startswith("CPU")


def _rollout(row: pd.Series) -> str:
    return f"vllm (TP {_int(row['rollout_tp'])})" if row["rollout"] == "vllm" else str(row["rollout"])


def gpu_cell_table(cells: pd.DataFrame, report: Report) -> str:
    """Cells the harness ran on GPUs, one row each: what they cost (time, memory as torch and
    nvidia-smi saw it) and whether their checkpoint merged and reloaded."""
    if not len(cells):
        return "None recorded yet: run a GPU matrix (`configs/matrix/h200.yaml`, or `h200-offline.yaml` without the hub)."
    header = [
        "Cell", "Size", "Bits", "GPU", "Ranks", "Rollout", "Steps", "Status", "s/step", "Tokens/s/GPU", "Actor MFU",
        "Peak allocated (torch)", "Peak reserved (torch)", "Peak used (nvidia-smi)", "Merged", "Engine", "Regression",
    ]
    rows = [
        [
            f"`{r['cell']}`", str(r["size"]), r["bits"] + _lora(r["lora"]), r["hardware"],
            _ranks(r["devices"], r["nodes"], r["launcher"]), _rollout(r), _int(r["steps_done"]), r["status"],
            _num(r["time_per_step"], ".2f"), _num(r["throughput"], ",.0f"), _pct(r["mfu_actor"]),
            _num(r["peak_gpu_memory_gb"], ".1f", " GiB"), _num(r["peak_gpu_reserved_gb"], ".1f", " GiB"),
            _num(r["peak_gpu_memory_smi_gb"], ".1f", " GiB"), _setting(r["merged"]), _engine(r, report), r["regression"],
        ]
        for _, r in cells.iterrows()
    ]
    return _table(header, rows)


def _png(fig: plt.Figure) -> bytes:
    """A figure's PNG, kept in memory until the page is written with it."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, metadata=PNG)
    plt.close(fig)
    return buffer.getvalue()


def curves(cells: pd.DataFrame, points: pd.DataFrame, out_dir: Path) -> dict[Path, bytes]:
    """Per model and data set: training reward and held-out accuracy per step, the mean over seeds
    with the range across seeds shaded, one colour per configuration."""
    files = {}
    ok = cells[cells["status"] == "ok"]
    joined = ok[["cell", "date", *CONFIG]].merge(points, on=["cell", "date"])
    for (model, dataset), data in joined.groupby(["model", "dataset"], sort=False):
        configs = list(data.groupby(["algorithm", "bits", "lora"], sort=False))
        fig, axes = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
        colors = plt.get_cmap("tab10" if len(configs) <= 10 else "tab20")
        for i, ((algorithm, bits, lora), config) in enumerate(configs):
            for ax, column in zip(axes, ("reward", "val")):
                per_step = config[config[column].notna()].groupby("step")[column]
                stats = per_step.agg(["mean", "min", "max"])
                style = "-" if column == "reward" else "o-"
                label = f"{algorithm}{_lora(lora)} {bits} ({config['cell'].nunique()} seeds)" if column == "reward" else None
                ax.plot(stats.index, stats["mean"], style, color=colors(i), label=label, markersize=3)
                ax.fill_between(stats.index, stats["min"], stats["max"], color=colors(i), alpha=0.12, linewidth=0)
        reward, val = data["reward_metric"].iloc[0], data["val_metric"].iloc[0]
        axes[0].set(title=f"{model} on {dataset}: training {reward}", xlabel="step", ylabel=reward)
        axes[1].set(title=f"held-out {val}, greedy (step 0: before RL)", xlabel="step", ylabel=val)
        for ax in axes:
            ax.set_ylim(-0.02, 1.02)
            ax.xaxis.get_major_locator().set_params(integer=True)
            ax.grid(alpha=0.3)
        fig.legend(loc="outside right center", fontsize="small")
        files[out_dir / f"curves-{model}-{dataset}.png"] = _png(fig)
    return files


# ---------------------------------------------------------------------------------------------
# Benchmark records (GPU)


def _step(row: pd.Series) -> str:
    spread = "" if _missing(row["step_min"]) else f" ({row['step_min']:.2f}-{row['step_max']:.2f})"
    return _num(row["time_per_step"], ".2f") + spread


def _phases(row: pd.Series) -> str:
    if _missing(row["gen_s"]):
        return "-"
    return " / ".join(_num(row[c], ".2f") for c in ("gen_s", "update_s", "ref_s"))


def _gen_busy(row: pd.Series) -> str:
    """The share of generation's time the GPU ran kernels: the rest it waited on the host's loop."""
    if _missing(row["gen_busy_s"]) or _missing(row["gen_s"]) or not row["gen_s"]:
        return "-"
    return _pct(row["gen_busy_s"] / row["gen_s"])


def _setting(value: Any) -> str:
    return "-" if _missing(value) else str(value)


def _allocated(row: pd.Series) -> str:
    """Torch's peak, unless it exceeds what the device held: then it counted vLLM's pool while
    sleep mode had released it, and is not a measure of anything resident."""
    return "n/a (see note)" if row["allocated_counts_pool"] is True else _num(row["peak_gpu_memory_gb"], ".1f", " GiB")


def benchmark_table(bench: pd.DataFrame, report: Report) -> str:
    header = [
        "Workload", "Model", "Bits", "GPU", "GPUs", "Rollout", "TP", "free_cache_engine", "Model runner", "LoRA",
        "Other settings", "s/step, median (min-max)", "Invocations at this revision", "Tokens/s/GPU", "vs TRL (same run)",
        "gen / update / ref (s)", "GPU busy in gen", "Actor MFU", "Peak allocated (torch)", "Peak device (incl. rollout pool)",
        "Engine", "Regression",
    ]
    rows = [
        [
            r["workload"], r["model"], r["bits"], r["hardware"], _int(r["devices"]), r["rollout"], _int(r["tp"]),
            _setting(r["free_cache_engine"]), _setting(r["model_runner"]), _int(r["lora"]) if r["lora"] else "-",
            _setting(r["other"]), _step(r), r["invocations"], _num(r["throughput"], ",.0f"),
            "-" if _missing(r["peer_ratio"]) else f"{r['peer_ratio']:.2f}x ({r['peer']} {r['peer_step_s']:.2f} s)",
            _phases(r), _gen_busy(r), _pct(r["mfu_actor"]), _allocated(r),
            _num(r["peak_gpu_device_gb"], ".1f", " GiB"), _engine(r, report), r["regression"],
        ]
        for _, r in bench.iterrows()
    ]
    return _table(header, rows)


# Overrides that lay the same work out differently over the GPUs: a run that sets one is compared
# with the one-GPU run of the same work (the tensor-parallel size is a column of its own).
LAYOUT_KEYS = ("worker.actor.ulysses_size",)


def _work(other: Any) -> str:
    """A row's other settings without the layout ones: the work, however it is spread."""
    return _spelled({k: v for k, v in _other(other).items() if k not in LAYOUT_KEYS})


def _one_gpu_reference(row: pd.Series, records: pd.DataFrame) -> pd.Series | None:
    """The one-GPU record a multi-GPU row is measured against, current or superseded: the same
    workload, rollout, precision, GPU, LoRA and work; of several, one with the same model runner and
    ``free_cache_engine`` first, then the one nearest in time (the same machine's, where the scaling
    run recorded one beside it: hosts differ more than repeats on one)."""
    same = records[
        (records["devices"] == 1) & (records["workload"] == row["workload"]) & (records["rollout"] == row["rollout"])
        & (records["bits"] == row["bits"]) & (records["hardware"] == row["hardware"]) & (records["lora"] == row["lora"])
        & (records["other"].map(_work) == _work(row["other"]))
    ]
    if same.empty:
        return None
    apart = (pd.to_datetime(same["date"], utc=True) - pd.to_datetime(row["date"], utc=True)).abs()
    rank = same.assign(
        _runner=same["model_runner"] != row["model_runner"], _awake=same["free_cache_engine"] != row["free_cache_engine"],
        _apart=apart,
    ).sort_values(["_runner", "_awake", "_apart"], kind="stable")
    return records.loc[rank.index[0]]


def _file(row: pd.Series) -> str:
    return f"`{Path(row['source'].removeprefix('recorded: ')).name}`"


def scaling_table(bench: pd.DataFrame, records: pd.DataFrame) -> str:
    """Each current multi-GPU row's tokens/s per GPU against its one-GPU reference's among all
    ``records``: the scaling efficiency (1.0: every GPU as fast as one alone)."""
    if bench.empty:
        return "No multi-GPU record yet."
    rows = []
    # Simulated ranks ran one GPU of the job without communicating: no scaling to speak of.
    spread = bench[(bench["devices"] > 1) & ~bench["simulated_ranks"].fillna(False).astype(bool)]
    for _, r in spread.sort_values(["workload", "devices", "date"], kind="stable").iterrows():
        ref = _one_gpu_reference(r, records)
        reference = "none with the same work" if ref is None else (
            f"{_bench_label(ref)}: {_num(ref['throughput'], ',.0f')} tokens/s ({str(ref['date'])[:16]}, {_file(ref)})"
        )
        efficiency = "-" if ref is None else f"{r['throughput'] / ref['throughput']:.2f}"
        rows.append([
            _bench_label(r), _int(r["devices"]), _step(r), _num(r["throughput"], ",.0f"), reference, efficiency,
            f"{str(r['date'])[:16]}, {_file(r)}",
        ])
    if not rows:
        return "No multi-GPU record yet."
    header = ["Run", "GPUs", "s/step, median (min-max)", "Tokens/s/GPU", "One-GPU reference", "Efficiency", "Record"]
    return _table(header, rows)


# EasyR1's published performance rows (its assets/baselines.md at v0.3.2: Qwen2.5-VL-7B-Instruct on
# Geometry3k, 8 x H100 80GB, vLLM TP 2, its example config otherwise): bits, micro-batches (update,
# experience), tokens/s per GPU, seconds a step, actor MFU, peak GPU memory (GB). The workload of
# their shape here runs on random-init weights with responses of 2048 tokens (bench/README.md).
EASYR1_PUBLISHED = [
    ("AMP", (1, 2), 1600, 145, 0.160, 68),
    ("AMP", (4, 8), 2000, 120, 0.232, 72),
    ("BF16", (1, 2), 1600, 145, 0.160, 58),
]
PUBLISHED_WORKLOAD, PUBLISHED_GPUS = "easyr1_scale_vl_7b", 8
MICRO_BATCH_KEYS = (
    "worker.actor.micro_batch_size_per_device_for_update", "worker.actor.micro_batch_size_per_device_for_experience",
)


def _micro_batches(other: Any) -> tuple[tuple[int, int], str]:
    """A row's update and experience micro-batches (the workload's 1 and 2 unless set) and its other
    settings besides them."""
    settings = _other(other)
    update, experience = (int(settings.pop(key, default)) for key, default in zip(MICRO_BATCH_KEYS, (1, 2)))
    return (update, experience), _spelled(settings)


def published_table(bench: pd.DataFrame) -> str:
    """Each of EasyR1's published rows beside the current record of its configuration here: the same
    bits and micro-batches on eight GPUs with vLLM at TP 2, full fine-tuning, nothing else changed."""
    ours = bench[
        (bench["workload"] == PUBLISHED_WORKLOAD) & (bench["devices"] == PUBLISHED_GPUS) & (bench["rollout"] == "vllm")
        & (bench["tp"] == 2) & (bench["lora"] == 0)
    ] if not bench.empty else bench
    rows = []
    for bits, micro, tokens, step, mfu, memory in EASYR1_PUBLISHED:
        same = [r for _, r in ours.iterrows() if r["bits"] == bits and _micro_batches(r["other"]) == (micro, "")]
        easyr1 = [bits, f"{micro[0]} / {micro[1]}", f"{tokens:,}", f"{step} s", _pct(mfu), f"{memory} GB"]
        if not same:
            rows.append([*easyr1, "not run yet", "-", "-", "-", "-", "-"])
            continue
        r = max(same, key=lambda row: row["date"])
        rows.append([
            *easyr1, r["hardware"], _num(r["throughput"], ",.0f"), _step(r), _pct(r["mfu_actor"]),
            _num(r["peak_gpu_device_gb"], ".1f", " GiB"), f"{str(r['date'])[:10]}, {_file(r)}",
        ])
    header = [
        "Bits", "Micro-batches (update / experience)", "EasyR1: tokens/s/GPU", "EasyR1: s/step", "EasyR1: actor MFU",
        "EasyR1: peak GPU memory", "Ours: GPU", "Ours: tokens/s/GPU", "Ours: s/step, median (min-max)", "Ours: actor MFU",
        "Ours: peak device", "Record",
    ]
    return _table(header, rows)


def reproduce_table(bench: pd.DataFrame) -> str:
    rows = [[f"{r['workload']}, {r['rollout']}", f"`{r['reproduce']}`", r["source"]] for _, r in bench.iterrows()]
    return _table(["Row", "Command", "Record"], rows)


PROFILE_TOP = 3  # the costliest kernels or functions named per phase
PROFILE_NAME = 72  # a kernel's templated name cut to this many characters


def _named_shares(entries: list[dict[str, Any]], key: str) -> str:
    def name(text: str) -> str:
        return (text if len(text) <= PROFILE_NAME else text[: PROFILE_NAME - 3] + "...").replace("|", "\\|")

    return "; ".join(f"`{name(e[key])}` {100 * e['share']:.0f}%" for e in entries[:PROFILE_TOP]) or "-"


def profile_tables(bench: pd.DataFrame, report: Report) -> str:
    """For each workload, the newest of the latest records that profiled a step (``easyr1 bench
    --profile``; one per invocation, whose records share it): each phase's wall time under
    torch.profiler beside its kernels' time and costliest kernels, and where the host sampler's step
    spent each phase's Python time."""
    newest: dict[str, tuple[str, pd.Series, Path, dict]] = {}
    for _, r in bench.iterrows():
        path = report.repo / r["source"].removeprefix("recorded: ")
        record = json.loads(path.read_text()) if path.suffix == ".json" and path.is_file() else {}
        if (record.get("profile") or record.get("host_profile")) and r["date"] >= newest.get(r["workload"], ("",))[0]:
            newest[r["workload"]] = (r["date"], r, path, record)
    blocks = []
    for _, r, path, record in newest.values():
        profile, host = record.get("profile"), record.get("host_profile")
        blocks.append(f"**{_bench_label(r)}** (`{path.relative_to(report.repo)}`, {str(r['date'])[:10]})")
        if profile:
            rows = [
                [phase, _num(p["wall_s"], ".2f"), _num(p["ops_s"], ".2f"),
                 _pct(p["ops_s"] / p["wall_s"]) if p.get("wall_s") else "-", _named_shares(p["top"], "op")]
                for phase, p in profile["phases"].items()
            ]
            blocks.append(_table(
                [f"phase (step {profile['step']}, profiled)", "wall (s)", f"{profile['time']} (s)", "busy", "costliest (share)"], rows))
        if host:
            rows = [[phase, _num(p["s"], ".2f"), _named_shares(p["self"], "function")] for phase, p in host["phases"].items()]
            blocks.append(_table([f"phase (step {host['step']}, host sampled)", "sampled (s)", "Python time in (share)"], rows))
    return "\n\n".join(blocks) or "No latest record profiled a step."


def _bench_label(r: pd.Series) -> str:
    settings = [f"TP {int(r['tp'])}" if not _missing(r["tp"]) and r["tp"] > 1 else ""]
    if r["rollout"] == "vllm":
        settings += ["awake" if str(r["free_cache_engine"]).lower() == "false" else "sleep", f"{r['model_runner']} runner"]
    settings += [_lora(r["lora"]).strip(), str(r["other"])]
    return " ".join([r["workload"], r["rollout"], ", ".join(s for s in settings if s)]).strip()


FIGURE_LABEL = 70  # characters a line of a figure's row label


def bench_figures(bench: pd.DataFrame, out_dir: Path) -> dict[Path, bytes]:
    """Step time split into its phases (with TRL's step in the same run), and peak memory by definition."""
    if bench.empty:
        return {}
    # Labels wrapped, so that a row with several settings does not squeeze the plot to nothing.
    # The peer named too: records of one setting that ran beside different peers are rows of their own.
    labels = pd.Series(
        [textwrap.fill(_bench_label(r) + (f", beside {r['peer']}" if r["peer"] else ""), FIGURE_LABEL) for _, r in bench.iterrows()],
        index=bench.index,
    )
    lines = labels.str.count("\n") + 1.5
    height = 1.5 + 0.3 * float(lines.sum())
    # One panel a workload, each with its own time axis: a 76 s step would flatten a 3 s one.
    workloads = list(dict.fromkeys(bench["workload"]))
    panels = [float(lines[bench["workload"] == w].sum()) + 1.5 for w in workloads]
    fig, axes = plt.subplots(
        len(workloads), 1, figsize=(10, height + 0.3 * len(workloads)), constrained_layout=True, squeeze=False,
        gridspec_kw={"height_ratios": panels},
    )
    for ax, workload in zip(axes[:, 0], workloads):
        rows = bench[bench["workload"] == workload].iloc[::-1]
        y = list(range(len(rows)))  # positions, not the labels: two rows may still read alike
        left = pd.Series(0.0, index=rows.index)
        for column, name, color in (("gen_s", "generation", "tab:blue"), ("update_s", "update", "tab:orange"),
                                    ("ref_s", "reference log-probs", "tab:green")):
            values = rows[column].fillna(0.0).astype(float)
            ax.barh(y, values, left=left, color=color, label=name)
            left += values
        other = (rows["time_per_step"].astype(float) - left).clip(lower=0)
        ax.barh(y, other, left=left, color="tab:gray", label="other / not split")
        ax.scatter(rows["peer_step_s"], y, marker="|", s=200, color="black", label="the peer, same run", zorder=3)
        ax.set_yticks(y, list(labels[rows.index]))
        ax.set(title=workload, xlabel="seconds")
        ax.grid(axis="x", alpha=0.3)
    axes[0, 0].legend(fontsize="small", loc="lower right")
    fig.suptitle("Step time (median over steps)")
    step_time = _png(fig)

    rows = bench.iloc[::-1]
    fig, ax = plt.subplots(figsize=(10, height), constrained_layout=True)
    y = range(len(rows))
    ax.barh([i + 0.2 for i in y], rows["peak_gpu_memory_gb"].fillna(0.0), height=0.4, color="tab:green",
            label="torch peak allocated")
    ax.barh([i - 0.2 for i in y], rows["peak_gpu_device_gb"].fillna(0.0), height=0.4, color="tab:purple",
            label="device peak (rollout pool included)")
    ax.set_yticks(list(y), list(labels[rows.index]))
    ax.set(title="Peak GPU memory per GPU (0: not recorded)", xlabel="GiB")
    ax.legend(fontsize="small", loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    return {out_dir / "gpu-step-time.png": step_time, out_dir / "gpu-memory.png": _png(fig)}


# ---------------------------------------------------------------------------------------------
# The pages


def failures(cells: pd.DataFrame) -> str:
    failed = cells[cells["status"] != "ok"]
    if failed.empty:
        return "None."
    blocks = []
    for _, r in failed.iterrows():
        tail = "" if _missing(r.get("error_tail")) else str(r["error_tail"])
        label = str(r["status"]).upper()  # FAILED, or STOPPED by a signal (it resumes at the next run)
        blocks.append(f"<details><summary>{r['cell']}: {label}</summary>\n\n```\n{tail}\n```\n</details>")
    return "\n\n".join(blocks)


def _environment(row: pd.Series) -> str:
    """Where a row ran: native, or apptainer with its image and, where known, the image's digest or
    definition hash (shortened to 12 digits)."""
    if _missing(row.get("image")):
        return "" if _missing(row.get("environment")) else str(row["environment"])
    identity = "" if _missing(row.get("image_id")) else str(row["image_id"])
    identity = re.sub(r"(sha256:[0-9a-f]{12})[0-9a-f]+", r"\1", identity)
    return f"{row['environment']}: {row['image']}" + (f" ({identity})" if identity else "")


def provenance(df: pd.DataFrame, report: Report) -> str:
    df = df.assign(engine_rev=[_engine(r, report) for _, r in df.iterrows()])
    df = df.assign(environment=[_environment(r) for _, r in df.iterrows()])
    keys = ["source", "engine_rev", "hardware", "host", "environment", "versions"]
    groups = df.astype(object).where(df.notna(), "").groupby(keys, sort=False)
    rows = [[*key, f"{g['date'].min()} .. {g['date'].max()}", len(g)] for key, g in groups]
    table = _table(
        ["Source", "Engine", "Hardware", "Host", "Environment", "Versions", "Dates (UTC)", "Rows"], rows
    )
    notes = df[df["notes"].fillna("") != ""] if "notes" in df else df.iloc[0:0]
    lines = [f"- {r['source']}: {r['notes']}" for _, r in notes.iterrows()]
    return "\n\n".join([table, "\n".join(lines)]) if lines else table


def history_table(old: pd.DataFrame, current: pd.DataFrame, report: Report) -> str:
    latest = current.set_index("kind")
    rows = []
    for _, r in old.iterrows():
        newer = latest.loc[r["kind"]]
        if r["type"] == "cell":
            what = f"`{r['cell']}`"
            figures = f"held-out {_num(r['val_before'], '.3f')} -> {_num(r['val_after'], '.3f')}, " + _num(
                r["time_per_step"], ".2f", " s/step"
            )
        else:
            what = _bench_label(r)
            ratio = "" if _missing(r["peer_ratio"]) else f", {r['peer_ratio']:.2f}x {r['peer']}"
            figures = f"{_step(r)} s/step, {_num(r['throughput'], ',.0f')} tokens/s/GPU{ratio}"
        rows.append(
            [what, str(r["date"])[:16], r["status"], figures, _engine(r, report), r["source"], newer["source"]]
        )
    return _table(["Record", "Date (UTC)", "Status", "Figures", "Engine", "Source", "Superseded by"], rows)


def _images(files: dict[Path, bytes], page: Path) -> str:
    return "\n\n".join(f"![{f.stem}]({os.path.relpath(f, page.parent)})" for f in files)


def _n(count: int, noun: str) -> str:
    """``1 cell``, ``2 cells``."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _counts(df: pd.DataFrame) -> str:
    here = df[df["in_matrix"] & df["current"]]
    ok = int((here["status"] == "ok").sum())
    stopped = int((here["status"] == STOPPED).sum())
    configs = len(_configurations(here)) if len(here) else 0
    bench = df[df["type"] == "bench"]
    recorded_cells = df[(df["type"] == "cell") & df["current"] & ~df["in_matrix"]]
    return (
        f"This matrix: {_n(len(here), 'cell')} ({_n(configs, 'configuration')} x seeds), {ok} finished, "
        f"{len(here) - ok - stopped} failed{f', {stopped} stopped' if stopped else ''}. "
        f"Recorded: {_n(len(bench), 'benchmark record')}, {int(bench['current'].sum())} "
        f"current and {int((~bench['current']).sum())} superseded; {_n(len(recorded_cells), 'current cell row')} "
        f"{'is' if len(recorded_cells) == 1 else 'are'} not {'a cell' if len(recorded_cells) == 1 else 'cells'} "
        f"of this matrix (committed CPU records of cells it no longer has)."
    )


def _write(files: dict[Path, str | bytes]) -> None:
    for path, content in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)


def write_report(report: Report, page: str, history: str, figures: str, log: str) -> None:
    """The page, its history and figures. Every file is made in memory first and written only when
    all are made: a record that cannot be read, or a figure that fails, leaves the previous ones whole."""
    records, points = load(report)
    df = with_regressions(records)
    df["invocations"] = invocations(df)
    current = df[df["current"]]
    all_cells, bench = current[current["type"] == "cell"], current[current["type"] == "bench"]
    cells, gpu_cells = all_cells[~on_gpus(all_cells)], all_cells[on_gpus(all_cells)]
    page_path, figure_dir = Path(page), Path(figures)
    curve_files, bench_files = curves(cells, points, figure_dir), bench_figures(bench, figure_dir)
    history_link = os.path.relpath(history, page_path.parent)
    text = f"""# Baselines

Generated by the harness (`make baselines`) from the matrix `{report.matrix}` and the committed
records it lists; do not edit by hand. {_counts(df)} Each kind of measurement (a cell, or a
benchmark workload with its backend, GPUs and settings) shows its latest record; older ones are
in [the history]({history_link}). "Regression" compares a row with the previous record of its
kind (for a cell: of the same config hash; for a benchmark, the medians over its revision's
invocations with those of the previous revision, as repeats at one revision measure the host's
noise) and flags a headline metric more than
{REGRESSION:.0%} worse, on the same hardware only (on another CPU model the same code lands a seed's
accuracy elsewhere); across hardware a configuration's held-out accuracy is flagged as a mean over
seeds, when it is {REGRESSION:.0%} lower than the same cells' latest records on other hardware and
lower by more than {SEED_MEAN_SE:g} standard errors of the difference. "Engine" is the git revision a row ran with, marked "changed since" when the engine's
code differs from today's (fingerprint `{report.engine}`).

## Algorithm baselines (the CPU matrix)

Held-out accuracy is the reward's accuracy on the test split with greedy decoding, before RL
(step 0) and after the last step, mean ± standard deviation over seeds; s/step and tokens/s are
medians over cells of each cell's median over its steps (the first left out); peak CPU memory
is a rank's resident peak. Reproduce a row with `make baselines`, or one cell with
`.venv/bin/snakemake runs/CELL/status.json --profile configs/profiles/local --configfile {report.matrix}` (the target first: `--configfile` takes every word after it).

{algorithm_table(cells, report, df[df["type"] == "cell"])}

{_images(curve_files, page_path)}

## GPU cells (the harness on GPUs)

Cells of a GPU matrix that the harness ran end to end (Snakemake, `easyr1 train`, nvidia-smi
read every 0.5 s, the last checkpoint merged with `easyr1 merge --verify`, which loads it back
with `from_pretrained` and checks every tensor). s/step, tokens/s and MFU are medians over the
steps, the first left out; memory in GiB, the peak over the run. Random-init models learn
nothing, so their accuracy is not shown.

{gpu_cell_table(gpu_cells, report)}

## Performance baselines (GPU benchmark records)

`easyr1 bench` on a named workload (see `bench/README.md`), TRL's GRPOTrainer on the same
workload in the same invocation where "vs TRL" is given: the ratio of the two step times, each
the median of the timed steps (the first step left out); min-max across those steps in brackets.
A row is its kind's newest invocation; "Invocations at this revision" lists every invocation of
the kind at the row's revision, oldest first, with its ratio to the peer (a speed claim holds once
it holds in three). Phases are medians of the timed steps; "GPU busy in gen" is the share of generation's
time the GPU ran kernels (NVML's performance monitoring, on Hopper and later; records from revision 7149c10 on),
the rest being time it waited on the rollout engine's host loop. Peak allocated is torch's allocator peak; peak device is
what the GPU held (the rollout engine's pool included): the device's reading, or torch's reserved
peak plus the memory outside torch where that is lower (records before 2026-12-04's fix overstated
the reading when the allocator's cache was warm). Memory in GiB. "n/a (see note)": under
vLLM's sleep mode torch's counter also counts vLLM's pool while it is released, so it exceeded
what the device held and measures nothing resident.

{benchmark_table(bench, report)}

{_images(bench_files, page_path)}

How to reproduce each row (on the GPU host: `bash bench/h200.sh NAME ARGS`, see `bench/README.md`):

{reproduce_table(bench)}

### Scaling over GPUs

Each multi-GPU row's tokens/s per GPU against a one-GPU record of the same work (workload, rollout,
precision, GPU, LoRA and settings, the parallel layout apart: tensor-parallel size, Ulysses), current or
superseded: one with the same model runner and vLLM sleep setting first, then the one nearest in time,
which is the same machine's where the scaling run recorded one beside it (hosts have measured up to 20%
apart on the same configuration; times in UTC). The efficiency is the ratio, 1.0 when every GPU is as fast
as one alone. The text and image workloads keep their prompts per step on more GPUs (each GPU trains
on a share); the memory workloads and `long_16k` take one prompt a GPU.

{scaling_table(bench, df[df["type"] == "bench"])}

### Against EasyR1's published rows

EasyR1's own performance table (its `assets/baselines.md` at v0.3.2: Qwen2.5-VL-7B-Instruct trained on
Geometry3k on eight H100s of 80 GB, vLLM at TP 2, its example config) beside the newest record here of
each of its configurations: `{PUBLISHED_WORKLOAD}` on eight GPUs with the same bits and micro-batches and
nothing else changed (`bench/README.md`, "EasyR1 at its own scale"). Ours runs a random-init model
whose responses are all 2048 tokens, EasyR1's real ones vary in length: compare tokens/s per GPU and
MFU, not seconds a step. EasyR1's memory is as its table gives it (GB).

{published_table(bench)}

### Where a step's time goes (profiled records)

The newest profiled record of each workload. The step after the timed ones ran under
torch.profiler (`easyr1 bench --profile`): per phase its
wall time, which the profiler lengthens (most where the host is busiest: vLLM's decoding loop), the
time of the work itself (on GPUs the kernels, each counted once) and what took the most. Newer
records add one more step with the profiler off and the main thread's Python stack sampled every
5 ms: where each phase's host time went. `bench/README.md` says what each field is. Profiles
recorded before 2026-12-04's fix also count the optimizer's named range (`Optimizer.step#...`)
beside its kernels, outside the phases.

{profile_tables(bench, report)}

## Failed and stopped cells

{failures(all_cells)}

## Provenance

{provenance(current, report)}
"""
    old = df[~df["current"]]
    history_text = f"""# Baselines: superseded records

Records of each kind older than the one `baselines.md` shows, newest first. Generated with the page.

{history_table(old, current, report) if len(old) else "None."}
"""
    figure_dir.mkdir(parents=True, exist_ok=True)  # a folder of figures, empty where there are none
    _write({page_path: text, Path(history): history_text, **curve_files, **bench_files})
    Path(log).write_text("".join(f"{f}\n" for f in [page_path, Path(history), *curve_files, *bench_files]))
