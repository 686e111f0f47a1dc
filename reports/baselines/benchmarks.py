"""The GPU benchmark records: tables (performance, scaling, EasyR1's published rows, reproduction,
profiles) and figures."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from statistics import median
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd

from reports.baselines.formatting import (
    integer,
    lora_label,
    markdown_table,
    missing,
    num,
    pct,
    png_bytes,
    setting,
)
from reports.baselines.regressions import engine_label
from reports.baselines.rows import Report, other_settings, spelled


def step_spread(row: pd.Series) -> str:
    spread = "" if missing(row["step_min"]) else f" ({row['step_min']:.2f}-{row['step_max']:.2f})"
    return num(row["time_per_step"], ".2f") + spread


def _phases(row: pd.Series) -> str:
    if missing(row["gen_s"]):
        return "-"
    return " / ".join(num(row[c], ".2f") for c in ("gen_s", "update_s", "ref_s"))


def _gen_busy(row: pd.Series) -> str:
    """The share of generation's time the GPU ran kernels: the rest it waited on the host's loop."""
    if missing(row["gen_busy_s"]) or missing(row["gen_s"]) or not row["gen_s"]:
        return "-"
    return pct(row["gen_busy_s"] / row["gen_s"])


def _allocated(row: pd.Series) -> str:
    """Torch's peak, unless it exceeds what the device held: then it counted vLLM's pool while
    sleep mode had released it, and is not a measure of anything resident."""
    return (
        "n/a (see note)"
        if row["allocated_counts_pool"] is True
        else num(row["peak_gpu_memory_gb"], ".1f", " GiB")
    )


def benchmark_table(bench: pd.DataFrame, report: Report) -> str:
    header = [
        "Workload",
        "Model",
        "Bits",
        "GPU",
        "GPUs",
        "Rollout",
        "TP",
        "free_cache_engine",
        "Model runner",
        "LoRA",
        "Other settings",
        "s/step, median (min-max)",
        "Invocations at this revision",
        "Tokens/s/GPU",
        "vs TRL (same run)",
        "gen / update / ref (s)",
        "GPU busy in gen",
        "Actor MFU",
        "Peak allocated (torch)",
        "Peak device (incl. rollout pool)",
        "Engine",
        "Regression",
    ]
    rows = [
        [
            r["workload"],
            r["model"],
            r["bits"],
            r["hardware"],
            integer(r["devices"]),
            r["rollout"],
            integer(r["tp"]),
            setting(r["free_cache_engine"]),
            setting(r["model_runner"]),
            integer(r["lora"]) if r["lora"] else "-",
            setting(r["other"]),
            step_spread(r),
            r["invocations"],
            num(r["throughput"], ",.0f"),
            "-"
            if missing(r["peer_ratio"])
            else f"{r['peer_ratio']:.2f}x ({r['peer']} {r['peer_step_s']:.2f} s)",
            _phases(r),
            _gen_busy(r),
            pct(r["mfu_actor"]),
            _allocated(r),
            num(r["peak_gpu_device_gb"], ".1f", " GiB"),
            engine_label(r, report),
            r["regression"],
        ]
        for _, r in bench.iterrows()
    ]
    return markdown_table(header, rows)


# Overrides that lay the same work out differently over the GPUs: a run that sets one is compared
# with the one-GPU run of the same work (the tensor-parallel size is a column of its own).
LAYOUT_KEYS = ("worker.actor.ulysses_size",)


def _work(other: Any) -> str:
    """A row's other settings without the layout ones: the work, however it is spread."""
    return spelled({k: v for k, v in other_settings(other).items() if k not in LAYOUT_KEYS})


def _one_gpu_reference(row: pd.Series, records: pd.DataFrame) -> pd.Series | None:
    """The one-GPU record a multi-GPU row is measured against, current or superseded: the same
    workload, rollout, precision, GPU, LoRA and work; of several, one with the same model runner and
    ``free_cache_engine`` first, then the one nearest in time (the same machine's, where the scaling
    run recorded one beside it: hosts differ more than repeats on one)."""
    same = records[
        (records["devices"] == 1)
        & (records["workload"] == row["workload"])
        & (records["rollout"] == row["rollout"])
        & (records["bits"] == row["bits"])
        & (records["hardware"] == row["hardware"])
        & (records["lora"] == row["lora"])
        & (records["other"].map(_work) == _work(row["other"]))
    ]
    if same.empty:
        return None
    apart = (pd.to_datetime(same["date"], utc=True) - pd.to_datetime(row["date"], utc=True)).abs()
    rank = same.assign(
        _runner=same["model_runner"] != row["model_runner"],
        _awake=same["free_cache_engine"] != row["free_cache_engine"],
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
        reference = (
            "none with the same work"
            if ref is None
            else (
                f"{bench_label(ref)}: {num(ref['throughput'], ',.0f')} tokens/s ({str(ref['date'])[:16]}, {_file(ref)})"
            )
        )
        efficiency = "-" if ref is None else f"{r['throughput'] / ref['throughput']:.2f}"
        rows.append(
            [
                bench_label(r),
                integer(r["devices"]),
                step_spread(r),
                num(r["throughput"], ",.0f"),
                reference,
                efficiency,
                f"{str(r['date'])[:16]}, {_file(r)}",
            ]
        )
    if not rows:
        return "No multi-GPU record yet."
    header = [
        "Run",
        "GPUs",
        "s/step, median (min-max)",
        "Tokens/s/GPU",
        "One-GPU reference",
        "Efficiency",
        "Record",
    ]
    return markdown_table(header, rows)


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
    "worker.actor.micro_batch_size_per_device_for_update",
    "worker.actor.micro_batch_size_per_device_for_experience",
)


def _micro_batches(other: Any) -> tuple[tuple[int, int], str]:
    """A row's update and experience micro-batches (the workload's 1 and 2 unless set) and its other
    settings besides them."""
    settings = other_settings(other)
    update, experience = (
        int(settings.pop(key, default)) for key, default in zip(MICRO_BATCH_KEYS, (1, 2), strict=True)
    )
    return (update, experience), spelled(settings)


def published_table(bench: pd.DataFrame) -> str:
    """Each of EasyR1's published rows beside the current record of its configuration here: the same
    bits and micro-batches on eight GPUs with vLLM at TP 2, full fine-tuning, nothing else changed."""
    ours = (
        bench[
            (bench["workload"] == PUBLISHED_WORKLOAD)
            & (bench["devices"] == PUBLISHED_GPUS)
            & (bench["rollout"] == "vllm")
            & (bench["tp"] == 2)
            & (bench["lora"] == 0)
        ]
        if not bench.empty
        else bench
    )
    rows = []
    for bits, micro, tokens, step, mfu, memory in EASYR1_PUBLISHED:
        same = [
            r for _, r in ours.iterrows() if r["bits"] == bits and _micro_batches(r["other"]) == (micro, "")
        ]
        easyr1 = [bits, f"{micro[0]} / {micro[1]}", f"{tokens:,}", f"{step} s", pct(mfu), f"{memory} GB"]
        if not same:
            rows.append([*easyr1, "not run yet", "-", "-", "-", "-", "-"])
            continue
        r = max(same, key=lambda row: row["date"])
        rows.append(
            [
                *easyr1,
                r["hardware"],
                num(r["throughput"], ",.0f"),
                step_spread(r),
                pct(r["mfu_actor"]),
                num(r["peak_gpu_device_gb"], ".1f", " GiB"),
                f"{str(r['date'])[:10]}, {_file(r)}",
            ]
        )
    header = [
        "Bits",
        "Micro-batches (update / experience)",
        "EasyR1: tokens/s/GPU",
        "EasyR1: s/step",
        "EasyR1: actor MFU",
        "EasyR1: peak GPU memory",
        "Ours: GPU",
        "Ours: tokens/s/GPU",
        "Ours: s/step, median (min-max)",
        "Ours: actor MFU",
        "Ours: peak device",
        "Record",
    ]
    return markdown_table(header, rows)


def reproduce_table(bench: pd.DataFrame) -> str:
    rows = [
        [
            f"{r['workload']}, {r['rollout']}, {gpus_label(r)}"
            + (f", beside {r['peer']}" if r["peer"] else ""),
            f"`{r['reproduce']}`",
            r["source"],
        ]
        for _, r in bench.iterrows()
    ]
    return markdown_table(["Row", "Command", "Record"], rows)


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
        if (record.get("profile") or record.get("host_profile")) and r["date"] >= newest.get(
            r["workload"], ("",)
        )[0]:
            newest[r["workload"]] = (r["date"], r, path, record)
    blocks = []
    for _, r, path, record in newest.values():
        profile, host = record.get("profile"), record.get("host_profile")
        blocks.append(f"**{bench_label(r)}** (`{path.relative_to(report.repo)}`, {str(r['date'])[:10]})")
        if profile:
            rows = [
                [
                    phase,
                    num(p["wall_s"], ".2f"),
                    num(p["ops_s"], ".2f"),
                    pct(p["ops_s"] / p["wall_s"]) if p.get("wall_s") else "-",
                    _named_shares(p["top"], "op"),
                ]
                for phase, p in profile["phases"].items()
            ]
            blocks.append(
                markdown_table(
                    [
                        f"phase (step {profile['step']}, profiled)",
                        "wall (s)",
                        f"{profile['time']} (s)",
                        "busy",
                        "costliest (share)",
                    ],
                    rows,
                )
            )
        if host:
            rows = [
                [phase, num(p["s"], ".2f"), _named_shares(p["self"], "function")]
                for phase, p in host["phases"].items()
            ]
            blocks.append(
                markdown_table(
                    [f"phase (step {host['step']}, host sampled)", "sampled (s)", "Python time in (share)"],
                    rows,
                )
            )
    return "\n\n".join(blocks) or "No latest record profiled a step."


def gpu_kind(hardware: Any) -> str:
    """A GPU model as a reader names it: "H100" for "NVIDIA H100 80GB HBM3"."""
    words = str(hardware or "?").removeprefix("NVIDIA ").split()
    return words[0] if words else "?"


def gpus_label(r: pd.Series) -> str:
    """The GPUs a row ran on: ``1 x H200``."""
    return f"{integer(r['devices'])} x {gpu_kind(r['hardware'])}"


def bench_label(r: pd.Series) -> str:
    """What a benchmark row ran, its GPUs named: two settings alike on an H100 and an H200 differ."""
    settings = [gpus_label(r), f"TP {int(r['tp'])}" if not missing(r["tp"]) and r["tp"] > 1 else ""]
    if r["rollout"] == "vllm":
        settings += [
            "awake" if str(r["free_cache_engine"]).lower() == "false" else "sleep",
            f"{r['model_runner']} runner",
        ]
    settings += [lora_label(r["lora"]).strip(), str(r["other"])]
    return " ".join([r["workload"], r["rollout"], ", ".join(s for s in settings if s)]).strip()


# A row's setting, the peer it ran beside apart: records of one setting beside TRL and beside TRL+vLLM
# are kinds of their own, and one row of the current performance table.
SETTING = [
    "workload",
    "rollout",
    "hardware",
    "devices",
    "bits",
    "tp",
    "free_cache_engine",
    "model_runner",
    "lora",
]


def _default_runner(row: pd.Series) -> bool:
    """Whether a vLLM row ran the model runner today's engine picks (V2 with one GPU per engine)."""
    return row["rollout"] != "vllm" or row["model_runner"] == ("V2" if row["tp"] == 1 else "own")


def default_settings(bench: pd.DataFrame) -> list[pd.DataFrame]:
    """The current records at default settings, one group per workload x rollout x GPUs (model and
    count) x precision: no override, no LoRA, real ranks; of several such settings, the one with
    today's model runner, then the newest. A group holds its setting's current records, one per peer."""
    if bench.empty:
        return []
    plain = bench[
        (bench["other"].fillna("") == "")
        & (bench["lora"].fillna(0) == 0)
        & ~bench["simulated_ranks"].fillna(False).astype(bool)
    ]
    keys = pd.Series(
        [" | ".join(str(v) for v in row) for row in plain[SETTING].itertuples(index=False)], index=plain.index
    )
    groups = []
    for _, where in plain.groupby(["workload", "rollout", "hardware", "devices", "bits"], sort=False):
        options = [plain.loc[keys[keys == key].index] for key in dict.fromkeys(keys[where.index])]
        best = max(options, key=lambda rows: (_default_runner(rows.iloc[0]), rows["date"].max()))
        groups.append(best.sort_values("date", ascending=False, kind="stable"))
    order = ["workload", "rollout", "devices", "hardware", "bits"]
    return sorted(groups, key=lambda g: tuple(str(g[c].iloc[0]) for c in order))


def peer_ratios(row: pd.Series, records: pd.DataFrame) -> list[float]:
    """A row's ratio to its peer in every invocation of its kind at its revision, oldest first."""
    same = records[(records["kind"] == row["kind"]) & (records["git"] == row["git"])]
    return [v for v in same.sort_values("date", kind="stable")["peer_ratio"] if not missing(v)]


def versus(group: pd.DataFrame, records: pd.DataFrame, peer: str) -> str:
    """The median ratio to ``peer`` over the invocations at the revision, with their count and range."""
    beside = group[group["peer"] == peer]
    if beside.empty:
        return "-"
    ratios = peer_ratios(beside.iloc[0], records)
    if not ratios:
        return "-"
    if len(ratios) == 1:
        return f"{ratios[0]:.2f}x (1 invocation)"
    return f"{median(ratios):.2f}x ({len(ratios)} invocations, {min(ratios):.2f}-{max(ratios):.2f})"


def performance_table(groups: list[pd.DataFrame], records: pd.DataFrame, report: Report) -> str:
    """One row per workload x rollout x GPUs at default settings: the newest record's step, rate,
    MFU and memory; the ratio to each peer as the median over the invocations at its revision."""
    header = [
        "Workload",
        "Rollout",
        "GPUs",
        "Bits",
        "s/step, median (min-max)",
        "Tokens/s/GPU",
        "Actor MFU",
        "vs TRL (same invocation)",
        "vs TRL+vLLM (same invocation)",
        "Peak device",
        "Engine",
        "Regression",
    ]
    rows = []
    for group in groups:
        r = group.iloc[0]
        flags = [f for f in dict.fromkeys(group["regression"]) if f not in ("ok", "-", "")]
        rows.append(
            [
                r["workload"],
                r["rollout"]
                + (
                    ""
                    if r["rollout"] != "vllm"
                    else f" ({'awake' if str(r['free_cache_engine']).lower() == 'false' else 'sleep'})"
                ),
                gpus_label(r),
                r["bits"],
                step_spread(r),
                num(r["throughput"], ",.0f"),
                pct(r["mfu_actor"]),
                versus(group, records, "TRL"),
                versus(group, records, "TRL+vLLM"),
                num(r["peak_gpu_device_gb"], ".1f", " GiB"),
                engine_label(r, report),
                "; ".join(flags) if flags else ("ok" if (group["regression"] == "ok").any() else "-"),
            ]
        )
    return markdown_table(header, rows) if rows else "No benchmark record at default settings yet."


FIGURE_LABEL = 70  # characters a line of a figure's row label


def bench_figures(groups: list[pd.DataFrame], out_dir: Path) -> dict[Path, bytes]:
    """For the current performance table's rows: step time split into its phases, with each peer's
    step in the same invocation, and peak memory by definition. Each row is labelled with its GPUs."""
    if not groups:
        return {}
    bench = pd.DataFrame([g.iloc[0] for g in groups])
    peers = {
        name: pd.Series(
            [next((v for v in g.loc[g["peer"] == name, "peer_step_s"]), None) for g in groups],
            index=bench.index,
            dtype=float,
        )
        for name in ("TRL", "TRL+vLLM")
    }
    labels = pd.Series(
        [textwrap.fill(bench_label(r), FIGURE_LABEL) for _, r in bench.iterrows()], index=bench.index
    )
    lines = labels.str.count("\n") + 1.5
    height = 1.5 + 0.3 * float(lines.sum())
    # One panel a workload, each with its own time axis: a 76 s step would flatten a 3 s one.
    workloads = list(dict.fromkeys(bench["workload"]))
    panels = [float(lines[bench["workload"] == w].sum()) + 1.5 for w in workloads]
    fig, axes = plt.subplots(
        len(workloads),
        1,
        figsize=(10, height + 0.3 * len(workloads)),
        constrained_layout=True,
        squeeze=False,
        gridspec_kw={"height_ratios": panels},
    )
    for ax, workload in zip(axes[:, 0], workloads, strict=True):
        rows = bench[bench["workload"] == workload].iloc[::-1]
        y = list(range(len(rows)))  # positions, not the labels: two rows may still read alike
        left = pd.Series(0.0, index=rows.index)
        for column, name, color in (
            ("gen_s", "generation", "tab:blue"),
            ("update_s", "update", "tab:orange"),
            ("ref_s", "reference log-probs", "tab:green"),
        ):
            values = rows[column].fillna(0.0).astype(float)
            ax.barh(y, values, left=left, color=color, label=name)
            left += values
        other = (rows["time_per_step"].astype(float) - left).clip(lower=0)
        ax.barh(y, other, left=left, color="tab:gray", label="other / not split")
        for (name, steps), marker in zip(peers.items(), ("|", "x"), strict=True):
            ax.scatter(
                steps[rows.index],
                y,
                marker=marker,
                s=200,
                color="black",
                label=f"{name}, same invocation",
                zorder=3,
            )
        ax.set_yticks(y, list(labels[rows.index]))
        ax.set(title=workload, xlabel="seconds")
        ax.grid(axis="x", alpha=0.3)
    handles, names = axes[0, 0].get_legend_handles_labels()  # below the panels: a legend inside hides bars
    fig.legend(handles, names, fontsize="small", loc="outside lower center", ncol=3)
    fig.suptitle("Step time (median over steps)")
    step_time = png_bytes(fig)

    rows = bench.iloc[::-1]
    fig, ax = plt.subplots(figsize=(10, height), constrained_layout=True)
    y = range(len(rows))
    ax.barh(
        [i + 0.2 for i in y],
        rows["peak_gpu_memory_gb"].fillna(0.0),
        height=0.4,
        color="tab:green",
        label="torch peak allocated",
    )
    ax.barh(
        [i - 0.2 for i in y],
        rows["peak_gpu_device_gb"].fillna(0.0),
        height=0.4,
        color="tab:purple",
        label="device peak (rollout pool included)",
    )
    ax.set_yticks(list(y), list(labels[rows.index]))
    ax.set(title="Peak GPU memory per GPU (0: not recorded)", xlabel="GiB")
    ax.legend(fontsize="small", loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    return {out_dir / "gpu-step-time.png": step_time, out_dir / "gpu-memory.png": png_bytes(fig)}
