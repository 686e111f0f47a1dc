"""Collect: one row per cell, read back from the files its run wrote, with provenance, and the
cells' learning curves (training reward and held-out accuracy per step) in a second table, so
the report reads only these two files.

Accuracy is the reward function's ``accuracy`` score on the test split (``overall`` when the
reward has none), at step 0 (before RL) and at the last validated step. Performance figures
are medians over the training steps, leaving out the first (warm-up) when there are three or
more; peak memories are maxima over all steps.
"""

from __future__ import annotations

import csv
import json
import re
import struct
from pathlib import Path
from statistics import median
from typing import Any

import yaml

from rules.scripts.cell import read_status

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


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    path = Path(path)
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


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
    found = re.search(r"^rollout backend: (\w+)", log.read_text(errors="replace"), re.M) if log.is_file() else None
    if found:
        return found.group(1)
    name = _get(config, "worker.rollout.name") or "auto"
    return name if name != "auto" or on_gpus else "hf"


def _hardware(hw: dict[str, Any]) -> str:
    if hw.get("gpus"):
        return hw["gpus"][0]
    return f"CPU: {hw.get('cpu', '?')}"


def row(run_dir: Path) -> dict[str, Any]:
    cell = json.loads((run_dir / "cell.json").read_text())
    status = read_status(run_dir / "status.json")
    resolved = run_dir / "config.yaml"  # written by the engine; the harness's own when it never started
    config = yaml.safe_load((resolved if resolved.is_file() else run_dir / "cell.yaml").read_text())
    metrics = read_metrics(run_dir / "metrics.jsonl")
    steps = [m for m in metrics if m["step"] > 0]
    validated = [m for m in metrics if any(k.startswith("val/") for k in m)]
    val_key = "val/accuracy" if any("val/accuracy" in m for m in validated) else "val/overall"
    hw = status["hardware"]
    rollout = rollout_backend(run_dir, config, bool(hw.get("gpus")))
    merge = read_status(run_dir / "merge.json")
    return {
        "cell": cell["name"],
        "model": cell["model"],
        "size": cell["size"] or human_size(count_parameters(_get(config, "worker.actor.model.model_path"))),
        "dataset": cell["dataset"],
        "algorithm": cell["algorithm"],
        "bits": cell["precision"].upper(),
        "lora": cell["lora"],
        "seed": cell["seed"],
        "steps": cell["steps"],
        "status": status["status"],
        "val_metric": val_key,
        "val_before": validated[0].get(val_key) if validated and validated[0]["step"] == 0 else None,
        "val_after": validated[-1].get(val_key) if validated and validated[-1]["step"] > 0 else None,
        "lr": _get(config, "worker.actor.optim.lr"),
        "kl_coef": _kl_coef(config),
        "hardware": _hardware(hw),
        "devices": len(hw["gpus"]) if hw.get("gpus") else _get(config, "trainer.n_gpus_per_node"),
        "nodes": cell.get("nodes", 1),  # cells run before several nodes were possible have none
        "launcher": cell.get("launcher", "local"),
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
        "mfu_actor": _median(steps, "perf/mfu_actor"),
        "wall_s": status["wall_s"],
        "steps_done": max((m["step"] for m in steps), default=0),
        "merged": merge["status"] if merge else "",
        "config_hash": cell["hash"],
        "engine": status["engine"],
        "environment": cell["environment"],
        "image": cell.get("image") or "",  # a reference: a path or docker://...
        "image_id": status.get("image_id", ""),  # its digest or definition's hash, where it has one
        "git": status["git"],
        "versions": " ".join(f"{k}={v}" for k, v in status["versions"].items()),
        "date": status["started"],
        "host": hw["host"],
        "source": "this run",
        "run_dir": str(run_dir),
        "error_tail": status["error_tail"],
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


def collect(status_files: list[str], results: str, curves: str, log: str) -> None:
    run_dirs = [Path(status).parent for status in status_files]
    rows = [row(run_dir) for run_dir in run_dirs]
    write_csv(results, COLUMNS, rows)
    write_csv(curves, CURVE_COLUMNS, [point for d, r in zip(run_dirs, rows) for point in curve(d, r)])
    Path(log).write_text("".join(f"{r['cell']}: {r['status']}\n" for r in rows))
