"""The CPU matrix's cells: one row per configuration, seeds aggregated; cells on GPUs; the curves."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd

from reports.baselines.formatting import (
    integer,
    lora_label,
    markdown_table,
    mean_std,
    missing,
    num,
    pct,
    png_bytes,
    setting,
)
from reports.baselines.regressions import engine_label, seed_mean_shift, speed_shift
from reports.baselines.rows import STOPPED, Report

CONFIG = [
    "model",
    "size",
    "dataset",
    "algorithm",
    "bits",
    "lora",
    "hardware",
    "devices",
    "nodes",
    "launcher",
    "steps",
]


# Text axes a row may lack (a model with no ``size``, a cell whose cell.json could not be read): an
# empty CSV field reads back as NaN, which the page would print as "nan".
TEXT_AXES = ["model", "size", "dataset", "algorithm", "bits", "hardware", "launcher"]


def configurations(cells: pd.DataFrame) -> list[tuple[tuple, pd.DataFrame]]:
    text = {c: cells[c].map(lambda v: "-" if missing(v) else str(v)) for c in TEXT_AXES}
    cells = cells.assign(
        lora=cells["lora"].fillna(0).astype(int), steps=cells["steps"].fillna(0).astype(int), **text
    )
    return list(cells.groupby(CONFIG, sort=False, dropna=False))


def _ranks(devices: Any, nodes: int, launcher: str) -> str:
    """A node's ranks, or ``nodes x ranks (launcher)`` for a cell on several nodes."""
    return integer(devices) if nodes == 1 else f"{nodes} x {integer(devices)} ({launcher})"


def _seed_label(cell: str, base: str) -> str:
    return cell[len(base) :].lstrip("-") or "default seed"


def algorithm_table(cells: pd.DataFrame, report: Report, every_cell: pd.DataFrame) -> str:
    """The current CPU cells, one row per configuration; ``every_cell``: all cell records, for the
    comparison of seed means across hardware."""
    header = [
        "Model",
        "Size",
        "Dataset",
        "Algorithm",
        "Bits",
        "Hardware",
        "Ranks",
        "Steps",
        "LR",
        "KL",
        "Seeds",
        "Held-out acc. before",
        "after",
        "gain (mean ± std)",
        "s/step",
        "Calibrated CPU step",
        "Tokens/s/device",
        "Peak CPU mem",
        "Engine",
        "Regression",
        "Cells (config hash)",
    ]
    rows = []
    for key, group in configurations(cells):
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
        flags += [f for f in (seed_mean_shift(ok, every_cell), speed_shift(ok, every_cell)) if f]
        engines = sorted({engine_label(r, report) for _, r in group.iterrows()})
        rows.append(
            [
                model,
                size,
                dataset,
                algorithm + lora_label(lora),
                bits,
                hardware,
                _ranks(devices, nodes, launcher),
                integer(steps),
                num(group["lr"].iloc[0], ".0e"),
                num(group["kl_coef"].iloc[0], ".0e"),
                str(len(group)) + (f" ({not_ok})" if not_ok else ""),
                mean_std(list(scored["val_before"]), ".3f"),
                mean_std(list(scored["val_after"]), ".3f"),
                mean_std(gains, "+.3f") if len(scored) else "FAILED",
                num(ok["time_per_step"].median(), ".2f"),
                num(ok["calibrated_cpu_step"].median(), ".1f"),
                num(ok["throughput"].median(), ",.0f"),
                num(ok["peak_cpu_memory_gb"].max(), ".2f", " GiB"),
                ", ".join(engines),
                "; ".join(flags) if flags else ("ok" if (group["regression"] == "ok").any() else "-"),
                ", ".join(f"`{r['cell']}` ({r['config_hash']})" for _, r in group.iterrows()),
            ]
        )
    return markdown_table(header, rows)


def on_gpus(cells: pd.DataFrame) -> pd.Series:
    """Cells whose job ran on GPUs; one whose status.json could not be read has no hardware, and
    stays with the CPU cells' table rather than making a GPU row of blanks."""
    hardware = cells["hardware"].fillna("").astype(str)
    return (hardware != "") & ~hardware.str.startswith("CPU")


def _rollout(row: pd.Series) -> str:
    return f"vllm (TP {integer(row['rollout_tp'])})" if row["rollout"] == "vllm" else str(row["rollout"])


def gpu_cell_table(cells: pd.DataFrame, report: Report) -> str:
    """Cells the harness ran on GPUs, one row each: what they cost (time, memory as torch and
    nvidia-smi saw it) and whether their checkpoint merged and reloaded."""
    if not len(cells):
        return "None recorded yet: run a GPU matrix (`configs/matrix/h200.yaml`, or `h200-offline.yaml` without the hub)."
    header = [
        "Cell",
        "Size",
        "Bits",
        "GPU",
        "Ranks",
        "Rollout",
        "Steps",
        "Status",
        "s/step",
        "Tokens/s/GPU",
        "Actor MFU",
        "Peak allocated (torch)",
        "Peak reserved (torch)",
        "Peak used (nvidia-smi)",
        "Merged",
        "Engine",
        "Regression",
    ]
    rows = [
        [
            f"`{r['cell']}`",
            str(r["size"]),
            r["bits"] + lora_label(r["lora"]),
            r["hardware"],
            _ranks(r["devices"], r["nodes"], r["launcher"]),
            _rollout(r),
            integer(r["steps_done"]),
            r["status"],
            num(r["time_per_step"], ".2f"),
            num(r["throughput"], ",.0f"),
            pct(r["mfu_actor"]),
            num(r["peak_gpu_memory_gb"], ".1f", " GiB"),
            num(r["peak_gpu_reserved_gb"], ".1f", " GiB"),
            num(r["peak_gpu_memory_smi_gb"], ".1f", " GiB"),
            setting(r["merged"]),
            engine_label(r, report),
            r["regression"],
        ]
        for _, r in cells.iterrows()
    ]
    return markdown_table(header, rows)


def _metric_name(metric: str) -> str:
    """A logged metric as a title names it: ``val/accuracy_reward`` -> ``accuracy``."""
    return str(metric).split("/")[-1].removesuffix("_reward").replace("_", " ")


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
            for ax, column in zip(axes, ("reward", "val"), strict=True):
                per_step = config[config[column].notna()].groupby("step")[column]
                stats = per_step.agg(["mean", "min", "max"])
                style = "-" if column == "reward" else "o-"
                label = (
                    f"{algorithm}{lora_label(lora)} {bits} ({config['cell'].nunique()} seeds)"
                    if column == "reward"
                    else None
                )
                ax.plot(stats.index, stats["mean"], style, color=colors(i), label=label, markersize=3)
                ax.fill_between(
                    stats.index, stats["min"], stats["max"], color=colors(i), alpha=0.12, linewidth=0
                )
        reward, val = _metric_name(data["reward_metric"].iloc[0]), _metric_name(data["val_metric"].iloc[0])
        size = data["size"].iloc[0]
        fig.suptitle(
            f"{model}{'' if missing(size) or size == '-' else f' ({size} parameters)'} on {dataset}: "
            f"mean over seeds, their range shaded"
        )
        axes[0].set(title=f"Training {reward} (sampled rollouts)", xlabel="RL step", ylabel=reward)
        axes[1].set(title=f"Held-out {val} (greedy; step 0 is before RL)", xlabel="RL step", ylabel=val)
        for ax in axes:
            ax.set_ylim(-0.02, 1.02)
            ax.xaxis.get_major_locator().set_params(integer=True)
            ax.grid(alpha=0.3)
        fig.legend(loc="outside right center", fontsize="small")
        files[out_dir / f"curves-{model}-{dataset}.png"] = png_bytes(fig)
    return files
