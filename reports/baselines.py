"""The baselines page: tables and plots from the collected results, in the shape of EasyR1's
``assets/baselines.md`` (an Algorithm Baselines table and a Performance Baselines table).

Input: ``baselines/results.csv`` (one row per cell of this matrix, written by the collect rule)
and recorded results from runs elsewhere (e.g. on GPUs), merged in and marked with their
source: rows with the same columns, or benchmark records (see ``from_benchmark``). Curves are
read from the cells' ``metrics.jsonl``.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from rules.scripts.collect import read_metrics  # noqa: E402


def _override(record: dict, key: str, default: int) -> int:
    """An integer ``key=value`` the benchmark was run with (its ``overrides``), else ``default``."""
    for item in record.get("overrides") or []:
        name, _, value = item.partition("=")
        if name == key:
            return int(value)
    return default


def from_benchmark(record: dict, name: str) -> dict:
    """A benchmark record (``workload``, ``backend``, ``tokens_per_s``, ``step_s``, ``peak_mem_gib``,
    ...; e.g. the anchor GRPO step of a GPU benchmark) as a performance-only row. Benchmarks run
    bf16 and one GPU unless the record says otherwise (``dtype``, ``gpus``)."""
    size = re.search(r"(\d+(?:\.\d+)?)[bB]\b", record["model"])
    return {
        "cell": name,
        "model": record["model"],
        "size": f"{size.group(1)}B" if size else "",
        "algorithm": f"grpo ({record['workload']} step)",
        "bits": record.get("dtype", "bf16").upper(),
        "status": "ok",
        "steps": record["steps"],
        "hardware": record["gpu"],
        "devices": record.get("gpus", 1),
        "rollout": record["backend"],
        "lora": _override(record, "worker.actor.model.lora.rank", 0),
        "throughput": record["tokens_per_s"],
        "time_per_step": record["step_s"],
        "mfu_actor": record.get("mfu_actor"),
        "peak_gpu_memory_gb": record.get("peak_mem_gib"),
        "git": record.get("git_revision", ""),
        "versions": " ".join(
            f"{k}={record[k]}" for k in ("python", "torch", "transformers", "vllm") if record.get(k)
        ),
        "date": record.get("date", ""),
        "notes": record.get("notes", ""),
    }


def load(results: str, recorded: list[str], repo: Path) -> pd.DataFrame:
    """This matrix's rows, then the recorded ones: ``*.csv`` with results.csv's columns, ``*.json``
    with a row, a list of rows, or a benchmark record."""
    frames = [pd.read_csv(results)]
    for file in recorded:
        path = Path(file)
        if path.suffix == ".csv":
            frame = pd.read_csv(path)
        else:
            data = json.loads(path.read_text())
            if isinstance(data, dict) and "workload" in data:
                data = from_benchmark(data, path.stem)
            frame = pd.DataFrame(data if isinstance(data, list) else [data])
        frame["source"] = f"recorded: {os.path.relpath(path, repo)}"
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or value == ""


def _num(value, fmt: str, unit: str = "") -> str:
    return "-" if _missing(value) else f"{value:{fmt}}{unit}"


def _int(value) -> str:
    return "-" if _missing(value) else str(int(value))


def accuracy(row: pd.Series) -> str:
    if row["status"] != "ok":
        return "FAILED"
    before, after = row["val_before"], row["val_after"]
    if _missing(before) or _missing(after):
        return "-"
    return f"{before:.3f} -> {after:.3f} ({after - before:+.3f})"


def _lora(row: pd.Series) -> str:
    return f" LoRA {int(row['lora'])}" if not _missing(row["lora"]) and int(row["lora"]) > 0 else ""


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def algorithm_table(df: pd.DataFrame) -> str:
    """Cells that were scored on a test split (benchmark records measure speed only)."""
    header = ["Model", "Size", "Dataset", "Algorithm", "Bits", "LR", "KL", "Steps", "Test accuracy", "Source"]
    rows = [
        [
            r["model"],
            r["size"],
            r["dataset"],
            r["algorithm"] + _lora(r),
            r["bits"],
            _num(r["lr"], ".0e"),
            _num(r["kl_coef"], ".0e"),
            _int(r["steps"]),
            accuracy(r),
            r["source"],
        ]
        for _, r in df[df["val_metric"].notna()].iterrows()
    ]
    return _table(header, rows)


def performance_table(df: pd.DataFrame) -> str:
    header = [
        "Model",
        "Size",
        "Algorithm",
        "Bits",
        "Hardware",
        "Devices",
        "Micro-batch (update / exp.)",
        "Rollout (TP)",
        "Peak CPU mem",
        "Peak GPU mem",
        "Tokens/s/device",
        "s/step",
        "Actor MFU",
        "Source",
    ]
    rows = []
    for _, r in df[df["status"] == "ok"].iterrows():
        tp = (
            f" (TP {int(r['rollout_tp'])})"
            if r["rollout"] == "vllm" and not _missing(r["rollout_tp"])
            else ""
        )
        rows.append(
            [
                r["model"],
                r["size"],
                r["algorithm"] + _lora(r),
                r["bits"],
                r["hardware"],
                _int(r["devices"]),
                f"{_int(r['micro_batch_update'])} / {_int(r['micro_batch_experience'])}",
                f"{r['rollout']}{tp}",
                _num(r["peak_cpu_memory_gb"], ".2f", " GB"),
                _num(r["peak_gpu_memory_gb"], ".1f", " GB"),
                _num(r["throughput"], ",.0f"),
                _num(r["time_per_step"], ".2f"),
                "-" if _missing(r["mfu_actor"]) else f"{100 * r['mfu_actor']:.1f}%",
                r["source"],
            ]
        )
    return _table(header, rows)


def _label(r: pd.Series) -> str:
    return f"{r['algorithm']}{_lora(r)} {r['bits']}"


def curves(df: pd.DataFrame, out_dir: Path) -> list[Path]:
    """Per model and data set: training reward and test accuracy against the step, one line per cell."""
    files = []
    here = df[(df["source"] == "this run") & (df["status"] == "ok")]
    for (model, dataset), group in here.groupby(["model", "dataset"], sort=False):
        fig, (train_ax, val_ax) = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
        colors = plt.get_cmap("tab10" if len(group) <= 10 else "tab20")
        for i, (_, r) in enumerate(group.iterrows()):
            metrics = read_metrics(Path(r["run_dir"]) / "metrics.jsonl")
            reward = "reward/accuracy" if any("reward/accuracy" in m for m in metrics) else "reward/overall"
            steps = [m for m in metrics if reward in m]
            train_ax.plot(
                [m["step"] for m in steps], [m[reward] for m in steps], color=colors(i), label=_label(r)
            )
            val = [m for m in metrics if r["val_metric"] in m]
            val_ax.plot([m["step"] for m in val], [m[r["val_metric"]] for m in val], "o-", color=colors(i))
        train_ax.set(
            title=f"{model} on {dataset}: training {reward}", xlabel="step", ylabel=reward, ylim=(-0.02, 1.02)
        )
        val_ax.set(
            title=f"test {r['val_metric']} (step 0: before RL)",
            xlabel="step",
            ylabel=r["val_metric"],
            ylim=(-0.02, 1.02),
        )
        for ax in (train_ax, val_ax):
            ax.xaxis.get_major_locator().set_params(integer=True)
            ax.grid(alpha=0.3)
        fig.legend(loc="outside right center", fontsize="small")
        path = out_dir / f"curves-{model}-{dataset}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        files.append(path)
    return files


def _bar_label(r: pd.Series) -> str:
    where = "" if r["source"] == "this run" else f" [{r['hardware']}, recorded]"
    return f"{r['cell']}{where}"


def _barh(ax, rows: pd.DataFrame, column: str, color: str, fmt: str) -> None:
    rows = rows[rows[column].notna()].iloc[::-1]  # barh draws bottom-up; keep the table's order
    bars = ax.barh([_bar_label(r) for _, r in rows.iterrows()], rows[column], color=color)
    ax.bar_label(bars, fmt=fmt, padding=3)
    ax.margins(x=0.15)


def bars(df: pd.DataFrame, out_dir: Path) -> list[Path]:
    """Throughput, and peak CPU and GPU memory, per cell that finished and measured them."""
    done = df[df["status"] == "ok"]
    panels = [
        (c, t, color)
        for c, t, color in (
            ("peak_cpu_memory_gb", "peak CPU memory (GB, per rank)", "tab:orange"),
            ("peak_gpu_memory_gb", "peak GPU memory allocated (GB)", "tab:green"),
        )
        if done[c].notna().any()
    ]
    height = 1.2 + 0.3 * len(done)
    files = [out_dir / "throughput.png", out_dir / "memory.png"]

    fig, ax = plt.subplots(figsize=(9, height), constrained_layout=True)
    _barh(ax, done, "throughput", "tab:blue", "{:,.0f}")
    ax.set(title="Throughput (median over steps)", xlabel="tokens / s / device")
    fig.savefig(files[0], dpi=100)
    plt.close(fig)

    fig, axes = plt.subplots(len(panels), 1, figsize=(9, height), constrained_layout=True, squeeze=False)
    for ax, (column, title, color) in zip(axes[:, 0], panels):
        _barh(ax, done, column, color, "{:.2f}")
        ax.set(title=title, xlabel="GB")
    fig.savefig(files[1], dpi=100)
    plt.close(fig)
    return files


def failures(df: pd.DataFrame) -> str:
    failed = df[df["status"] != "ok"]
    if failed.empty:
        return "None."
    blocks = []
    for _, r in failed.iterrows():
        tail = "" if _missing(r["error_tail"]) else str(r["error_tail"])
        blocks.append(f"<details><summary>{r['cell']}: FAILED</summary>\n\n```\n{tail}\n```\n</details>")
    return "\n\n".join(blocks)


def provenance(df: pd.DataFrame) -> str:
    df = df.reindex(columns=[*df.columns, "notes"] if "notes" not in df else df.columns).fillna("")
    keys = ["source", "git", "hardware", "host", "environment", "versions"]
    groups = df.groupby(keys, sort=False)
    rows = [[*key, f"{g['date'].min()} .. {g['date'].max()}", len(g)] for key, g in groups]
    table = _table(
        ["Source", "Git revision", "Hardware", "Host", "Environment", "Versions", "Dates (UTC)", "Cells"],
        rows,
    )
    notes = [f"- {r['source']}: {r['notes']}" for _, r in df[df["notes"] != ""].iterrows()]
    return "\n\n".join([table, "\n".join(notes)]) if notes else table


def _images(files: list[Path], page: Path) -> str:
    return "\n\n".join(f"![{f.stem}]({os.path.relpath(f, page.parent)})" for f in files)


def write_report(
    results: str, recorded: list[str], page: str, figures: str, matrix: str, repo: Path, log: str
) -> None:
    df = load(results, recorded, repo)
    page_path, figure_dir = Path(page), Path(figures)
    figure_dir.mkdir(parents=True, exist_ok=True)
    curve_files, bar_files = curves(df, figure_dir), bars(df, figure_dir)
    ok = int((df["status"] == "ok").sum())
    text = f"""# Baselines

Generated by the harness (`make baselines`) from the matrix `{matrix}`, through
`baselines/results.csv`; do not edit by hand. {len(df)} cells: {ok} finished, {len(df) - ok} failed. Rows whose source is "recorded"
come from runs elsewhere (see the provenance table).

## Algorithm Baselines

Test accuracy (the reward's accuracy on the test split, greedy decoding) before RL, at step 0,
and after the last step: `before -> after (+delta)`.

{algorithm_table(df)}

{_images(curve_files, page_path)}

## Performance Baselines

Tokens/s/device, s/step and MFU are medians over the training steps (the first step left out);
peak memories are maxima over the steps (CPU: resident memory of a rank).

{performance_table(df)}

{_images(bar_files, page_path)}

## Failed cells

{failures(df)}

## Provenance

{provenance(df)}
"""
    page_path.parent.mkdir(parents=True, exist_ok=True)
    page_path.write_text(text)
    Path(log).write_text("".join(f"{f}\n" for f in [page_path, *curve_files, *bar_files]))
