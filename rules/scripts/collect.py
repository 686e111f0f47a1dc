"""Collect: one row per cell, read back from the files its run wrote, with provenance, and the
cells' learning curves (training reward and held-out accuracy per step) in a second table, so
the report reads only these two files.

Accuracy is the reward function's ``accuracy`` score on the test split (``overall`` when the
reward has none), at step 0 (before RL) and at the last validated step. Performance figures
are medians over the training steps, leaving out the first (warm-up) when there are three or
more; peak memories are maxima over all steps.

A cell whose folder holds a file that cannot be read (cut by a killed job, or edited) is one FAILED
row whose error names the file and what to delete; the other cells and the page are still written.
"""

from __future__ import annotations

import csv
import json
import re
import struct
import sys
from pathlib import Path
from statistics import median
from typing import Any

import yaml

from rules.scripts.cell import DamagedFile, read_json, read_status, retrain

COLUMNS = [
    "cell",
    "model",
    "size",
    "dataset",
    "algorithm",
    "bits",
    "lora",
    "seed",
    "steps",
    "status",
    "val_metric",
    "val_before",
    "val_after",
    "lr",
    "kl_coef",
    "hardware",
    "devices",
    "nodes",
    "launcher",
    "micro_batch_update",
    "micro_batch_experience",
    "rollout",
    "rollout_tp",
    "peak_cpu_memory_gb",
    "peak_gpu_memory_gb",
    "peak_gpu_reserved_gb",
    "peak_gpu_memory_smi_gb",
    "throughput",
    "time_per_step",
    "calibrated_cpu_step",
    "mfu_actor",
    "wall_s",
    "steps_done",
    "merged",
    "config_hash",
    "engine",
    "environment",
    "image",
    "image_id",
    "git",
    "versions",
    "date",
    "host",
    "source",
    "run_dir",
    "error_tail",
]


def _metric(line: bytes) -> dict[str, Any]:
    value = json.loads(line)
    if not isinstance(value, dict) or "step" not in value:
        raise ValueError("no step")
    return value


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The engine's metrics, one object a step. A torn last line (a rank died while writing it) is
    left out, as the engine's own reader does (``easyr1/loggers.py``); a bad line before it is damage."""
    path = Path(path)
    if not path.is_file():
        return []
    lines = [(number, line) for number, line in enumerate(path.read_bytes().splitlines(), 1) if line.strip()]
    metrics = []
    for number, line in lines:
        try:
            metrics.append(_metric(line))
        except ValueError as exc:  # JSONDecodeError, bytes that are not UTF-8, or no step
            if number == lines[-1][0]:
                break
            raise DamagedFile(
                f"{path} cannot be read (line {number} is not a step's JSON object: {exc}); {retrain(path.parent)}"
            ) from exc
    return metrics


def read_config(run_dir: Path) -> dict[str, Any]:
    """The run's config: the engine's resolved ``config.yaml``, or the harness's ``cell.yaml`` when
    the run never started."""
    resolved = run_dir / "config.yaml"
    path = resolved if resolved.is_file() else run_dir / "cell.yaml"
    try:
        config = yaml.safe_load(path.read_bytes())
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise DamagedFile(f"{path} cannot be read ({exc}); {retrain(run_dir)}") from exc
    if not isinstance(config, dict):
        raise DamagedFile(f"{path} cannot be read (not a YAML mapping); {retrain(run_dir)}")
    return config


def count_parameters(model_dir: str | None) -> int | None:
    """Parameters in a model folder's safetensors files, from their headers (no weights are read)."""
    if not model_dir or not Path(model_dir).is_dir():
        return None
    total = 0
    for file in sorted(Path(model_dir).glob("*.safetensors")):
        with file.open("rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
        for name, tensor in header.items():
            if name != "__metadata__":
                count = 1
                for dim in tensor["shape"]:
                    count *= dim
                total += count
    return total or None


def human_size(parameters: int | None) -> str:
    if parameters is None:
        return ""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if parameters >= scale:
            return f"{parameters / scale:.3g}{unit}"
    return str(parameters)


def _median(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if key in r]
    if len(values) >= 3:
        values = values[1:]
    return median(values) if values else None


def _calibrated(rows: list[dict[str, Any]]) -> float | None:
    """A rank's CPU seconds a step over the calibration's (``perf/calibration_cpu_s``, easyr1/telemetry.py),
    summed over the steps ``_median`` takes: the speed that compares across runs of a shared host
    (reports/baselines/regressions.py). None for runs on GPUs and from engines without it."""
    timed = [r for r in rows if r.get("perf/calibration_cpu_s") and "perf/cpu_process_s" in r]
    timed = timed[1:] if len(timed) >= 3 else timed
    if not timed:
        return None
    return sum(r["perf/cpu_process_s"] for r in timed) / sum(r["perf/calibration_cpu_s"] for r in timed)


def _peak(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if key in r]
    return max(values) if values else None


def _smi_peak_gb(path: Path) -> float | None:
    """Peak used memory of any one GPU in nvidia-smi's readings (index, MiB per line)."""
    if not path.is_file():
        return None
    values = []
    for line in path.read_text().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[1].isdigit():
            values.append(int(parts[1]))
    return max(values) / 1024 if values else None


def _kl_coef(config: dict[str, Any]) -> float | None:
    """The KL coefficient when a KL term is used (as a loss or in the reward), else None."""
    coef = _get(config, "algorithm.kl_coef")
    return None if _get(config, "algorithm.disable_kl") or not coef or coef <= 0 else coef


def _get(config: dict[str, Any], dotted: str) -> Any:
    """A value of the run's config; None where a cell that never started left it unresolved."""
    node: Any = config
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def rollout_backend(run_dir: Path, config: dict[str, Any], on_gpus: bool) -> str:
    """The backend the run used: the engine's own line in ``train.log`` (``auto`` resolves to vllm
    only where it imports), else the configured name (``auto`` means hf where there is no GPU)."""
    log = run_dir / "train.log"
    found = (
        re.search(r"^rollout backend: (\w+)", log.read_text(errors="replace"), re.M)
        if log.is_file()
        else None
    )
    if found:
        return found.group(1)
    name = _get(config, "worker.rollout.name") or "auto"
    return name if name != "auto" or on_gpus else "hf"


def _hardware(hw: dict[str, Any]) -> str:
    if hw.get("gpus"):
        return hw["gpus"][0]
    return f"CPU: {hw.get('cpu', '?')}"


# The keys collect needs in a cell's cell.json and status.json; the others it reads have defaults
# (older harnesses did not write them).
CELL_KEYS = (
    "name",
    "model",
    "size",
    "dataset",
    "algorithm",
    "precision",
    "lora",
    "seed",
    "steps",
    "hash",
    "environment",
)
STATUS_KEYS = ("status", "hardware", "wall_s", "engine", "git", "versions", "started", "error_tail")


def _cell_fields(cell: dict[str, Any]) -> dict[str, Any]:
    """The cell's axes and identity, as its ``cell.json`` gives them."""
    return {
        "cell": cell["name"],
        "model": cell["model"],
        "size": cell["size"],
        "dataset": cell["dataset"],
        "algorithm": cell["algorithm"],
        "bits": cell["precision"].upper(),
        "lora": cell["lora"],
        "seed": cell["seed"],
        "steps": cell["steps"],
        "nodes": cell.get("nodes", 1),  # cells run before several nodes were possible have none
        "launcher": cell.get("launcher", "local"),
        "config_hash": cell["hash"],
        "environment": cell["environment"],
        "image": cell.get("image") or "",  # a reference: a path or docker://...
    }


def _status_fields(status: dict[str, Any]) -> dict[str, Any]:
    """Where, when and with what the cell's job ran, as its ``status.json`` gives them."""
    hw = status["hardware"]
    return {
        "status": status["status"],
        "hardware": _hardware(hw),
        "devices": len(hw["gpus"]) if hw.get("gpus") else None,
        "wall_s": status["wall_s"],
        "engine": status["engine"],
        "image_id": status.get("image_id", ""),  # its digest or definition's hash, where it has one
        "git": status["git"],
        "versions": " ".join(f"{k}={v}" for k, v in status["versions"].items()),
        "date": status["started"],
        "host": hw["host"],
        "error_tail": status["error_tail"],
    }


def row(run_dir: Path) -> dict[str, Any]:
    cell = read_json(run_dir / "cell.json", retrain(run_dir), CELL_KEYS)
    status = read_status(run_dir / "status.json", STATUS_KEYS)
    config = read_config(run_dir)
    metrics = read_metrics(run_dir / "metrics.jsonl")
    steps = [m for m in metrics if m["step"] > 0]
    validated = [m for m in metrics if any(k.startswith("val/") for k in m)]
    val_key = (
        "val/accuracy_reward" if any("val/accuracy_reward" in m for m in validated) else "val/reward_score"
    )
    hw = status["hardware"]
    rollout = rollout_backend(run_dir, config, bool(hw.get("gpus")))
    merge = read_status(run_dir / "merge.json")
    fields = {**_cell_fields(cell), **_status_fields(status)}
    return {
        **fields,
        "size": fields["size"] or human_size(count_parameters(_get(config, "worker.actor.model.model_path"))),
        "val_metric": val_key,
        "val_before": validated[0].get(val_key) if validated and validated[0]["step"] == 0 else None,
        "val_after": validated[-1].get(val_key) if validated and validated[-1]["step"] > 0 else None,
        "lr": _get(config, "worker.actor.optim.lr"),
        "kl_coef": _kl_coef(config),
        "devices": fields["devices"] or _get(config, "trainer.n_gpus_per_node"),
        "micro_batch_update": _get(config, "worker.actor.micro_batch_size_per_device_for_update"),
        "micro_batch_experience": _get(config, "worker.actor.micro_batch_size_per_device_for_experience"),
        "rollout": rollout,
        "rollout_tp": _get(config, "worker.rollout.tensor_parallel_size") if rollout == "vllm" else None,
        "peak_cpu_memory_gb": _peak(steps, "perf/cpu_memory_used_gb"),
        "peak_gpu_memory_gb": _peak(steps, "perf/max_memory_allocated_gb"),
        "peak_gpu_reserved_gb": _peak(steps, "perf/max_memory_reserved_gb"),
        "peak_gpu_memory_smi_gb": _smi_peak_gb(run_dir / "gpu_memory.csv"),
        "throughput": _median(steps, "perf/throughput"),
        "time_per_step": _median(steps, "perf/time_per_step"),
        "calibrated_cpu_step": _calibrated(steps),
        "mfu_actor": _median(steps, "perf/mfu_actor"),
        "steps_done": max((m["step"] for m in steps), default=0),
        "merged": merge["status"] if merge else "",
        "source": "this run",
        "run_dir": str(run_dir),
    }


# A failed row's axes where its cell.json cannot be read: the page joins them as text.
UNKNOWN_AXES = dict.fromkeys(("model", "dataset", "algorithm", "bits"), "?")


def failed_row(run_dir: Path, error: DamagedFile) -> dict[str, Any]:
    """The row of a cell whose run left a file that cannot be read: FAILED with the error as its
    tail, and what its ``cell.json`` and ``status.json`` still say where they are readable."""
    known: dict[str, Any] = {"cell": run_dir.name, **UNKNOWN_AXES}
    for name, keys, fields in (
        ("cell.json", CELL_KEYS, _cell_fields),
        ("status.json", STATUS_KEYS, _status_fields),
    ):
        try:
            known |= fields(read_json(run_dir / name, "", keys))
        except DamagedFile:
            pass  # named by ``error``, the first file that could not be read
    return {
        **known,
        "status": "failed",
        "error_tail": str(error),
        "source": "this run",
        "run_dir": str(run_dir),
    }


CURVE_COLUMNS = ["cell", "date", "step", "reward_metric", "reward", "val_metric", "val"]


def curve(run_dir: Path, row: dict[str, Any]) -> list[dict[str, Any]]:
    """Per step: the training reward (accuracy where the reward has it) and the held-out score."""
    metrics = read_metrics(run_dir / "metrics.jsonl")
    reward = "reward/accuracy" if any("reward/accuracy" in m for m in metrics) else "reward/overall"
    return [
        {
            "cell": row["cell"],
            "date": row["date"],
            "step": m["step"],
            "reward_metric": reward,
            "reward": m.get(reward),
            "val_metric": row["val_metric"],
            "val": m.get(row["val_metric"]),
        }
        for m in metrics
        if reward in m or row["val_metric"] in m
    ]


def write_csv(path: str, columns: list[str], rows: list[dict[str, Any]]) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)


def collected(run_dir: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A cell's row and curve. A cell with a file that cannot be read is a FAILED row naming it
    (and no curve), so that one damaged folder does not stop the page of every other cell."""
    try:
        cell_row = row(run_dir)
    except DamagedFile as error:
        print(f"collect: {run_dir.name} is FAILED: {error}", file=sys.stderr)
        return failed_row(run_dir, error), []
    return cell_row, curve(run_dir, cell_row)


def collect(status_files: list[str], results: str, curves: str, log: str) -> None:
    cells = [collected(Path(status).parent) for status in status_files]
    rows = [cell_row for cell_row, _ in cells]
    write_csv(results, COLUMNS, rows)
    write_csv(curves, CURVE_COLUMNS, [point for _, points in cells for point in points])
    Path(log).write_text("".join(f"{r['cell']}: {r['status']}\n" for r in rows))


def summary(status_files: list[str], page: str) -> tuple[str, bool]:
    """The workflow's last line, and whether any cell failed or was stopped. A failed cell is a row
    of the page, not an error (Snakemake exits 0 so the other cells and the page are made): this
    line is where a run that failed whole says so. Cells not run yet (a narrower target) are left out."""
    states = []
    for path in status_files:
        try:
            status = read_status(path)
        except DamagedFile:
            status = {"status": "failed"}  # the collect row names the file
        if status is not None:
            states.append(status["status"])
    bad = [s for s in states if s != "ok"]
    where = Path(page).resolve()
    if not bad:
        return f"matrix: all {len(states)} cells finished; the page: {where}", False
    kinds = ", ".join(f"{bad.count(s)} {s}" for s in sorted(set(bad)))
    return (
        f"matrix: {len(bad)} of {len(states)} cells failed or stopped ({kinds}): see {where} "
        f"(Failed and stopped cells) and each cell's runs/CELL/train.log",
        True,
    )
