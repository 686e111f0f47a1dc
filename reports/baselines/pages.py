"""The baselines page and its history page: every table and figure, written only when all are made."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pandas as pd

from reports.baselines.benchmarks import (
    PUBLISHED_WORKLOAD,
    bench_figures,
    bench_label,
    benchmark_table,
    default_settings,
    performance_table,
    profile_tables,
    published_table,
    reproduce_table,
    scaling_table,
    step_spread,
)
from reports.baselines.cells import algorithm_table, configurations, curves, gpu_cell_table, on_gpus
from reports.baselines.formatting import markdown_table, missing, num
from reports.baselines.regressions import (
    CPU_STEP_MEASURED,
    CPU_STEP_SPREAD,
    REGRESSION,
    SEED_MEAN_SE,
    engine_label,
    invocations,
    peer_ratio_spread,
    with_regressions,
)
from reports.baselines.rows import STOPPED, Report, load
from reports.baselines.summary import summary


def failures(cells: pd.DataFrame) -> str:
    failed = cells[cells["status"] != "ok"]
    if failed.empty:
        return "None."
    blocks = []
    for _, r in failed.iterrows():
        tail = "" if missing(r.get("error_tail")) else str(r["error_tail"])
        label = str(r["status"]).upper()  # FAILED, or STOPPED by a signal (it resumes at the next run)
        blocks.append(f"<details><summary>{r['cell']}: {label}</summary>\n\n```\n{tail}\n```\n</details>")
    return "\n\n".join(blocks)


def _environment(row: pd.Series) -> str:
    """Where a row ran: native, or apptainer with its image and, where known, the image's digest or
    definition hash (shortened to 12 digits)."""
    if missing(row.get("image")):
        return "" if missing(row.get("environment")) else str(row["environment"])
    identity = "" if missing(row.get("image_id")) else str(row["image_id"])
    identity = re.sub(r"(sha256:[0-9a-f]{12})[0-9a-f]+", r"\1", identity)
    return f"{row['environment']}: {row['image']}" + (f" ({identity})" if identity else "")


def provenance(df: pd.DataFrame, report: Report) -> str:
    df = df.assign(engine_rev=[engine_label(r, report) for _, r in df.iterrows()])
    df = df.assign(environment=[_environment(r) for _, r in df.iterrows()])
    keys = ["source", "engine_rev", "hardware", "host", "environment", "versions"]
    groups = df.astype(object).where(df.notna(), "").groupby(keys, sort=False)
    rows = [[*key, f"{g['date'].min()} .. {g['date'].max()}", len(g)] for key, g in groups]
    table = markdown_table(
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
            figures = f"held-out {num(r['val_before'], '.3f')} -> {num(r['val_after'], '.3f')}, " + num(
                r["time_per_step"], ".2f", " s/step"
            )
            command = f"`snakemake runs/{r['cell']}/status.json` at {str(r['git'])[:7]}"
        else:
            what = bench_label(r)
            ratio = "" if missing(r["peer_ratio"]) else f", {r['peer_ratio']:.2f}x {r['peer']}"
            figures = f"{step_spread(r)} s/step, {num(r['throughput'], ',.0f')} tokens/s/GPU{ratio}"
            command = f"`{r['reproduce']}`"
        rows.append(
            [
                what,
                str(r["date"])[:16],
                r["status"],
                figures,
                engine_label(r, report),
                command,
                r["source"],
                newer["source"],
            ]
        )
    return markdown_table(
        ["Record", "Date (UTC)", "Status", "Figures", "Engine", "Command", "Source", "Superseded by"], rows
    )


def _images(files: dict[Path, bytes], page: Path) -> str:
    return "\n\n".join(f"![{f.stem}]({os.path.relpath(f, page.parent)})" for f in files)


def _n(count: int, noun: str) -> str:
    """``1 cell``, ``2 cells``."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _counts(df: pd.DataFrame) -> str:
    here = df[df["in_matrix"] & df["current"]]
    ok = int((here["status"] == "ok").sum())
    stopped = int((here["status"] == STOPPED).sum())
    configs = len(configurations(here)) if len(here) else 0
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
    every_bench = df[df["type"] == "bench"]
    groups = default_settings(bench)
    shown = bench.index.isin([i for g in groups for i in g.index])
    page_path, figure_dir = Path(page), Path(figures)
    curve_files, bench_files = curves(cells, points, figure_dir), bench_figures(groups, figure_dir)
    history_link = os.path.relpath(history, page_path.parent)
    ratio_spread, repeats = peer_ratio_spread(every_bench)
    text = f"""# Baselines

{summary(cells, groups, df, report)}

Generated by the harness (`make baselines`) from the matrix `{report.matrix}` and the committed
records it lists; do not edit by hand. {_counts(df)} Each kind of measurement (a cell, or a
benchmark workload with its backend, GPUs and settings) shows its latest record here; benchmark
records at other settings, and every older record, are on [the other page]({history_link}), each
with its command.

"Regression" compares a row with the previous record of its kind, and flags only a change larger
than the same measurement varies between runs of one engine:
- **Held-out accuracy** (a seed's, against the previous record of the same cell and config hash on
  the same CPU model): {REGRESSION:.0%} lower. Across CPU models a configuration's seed mean is
  compared, flagged when {REGRESSION:.0%} lower and lower by more than {SEED_MEAN_SE:g} standard
  errors of the difference.
- **Speed on CPUs**: the calibrated CPU step, a rank's CPU seconds a step over those of a fixed
  piece of work it times around each step (`perf/calibration_cpu_s`, easyr1/telemetry.py), compared
  as the mean over a configuration's seeds of each seed's change against its previous record (same
  config, same CPU model), flagged when more than {CPU_STEP_SPREAD["seeds"]:.0%} higher
  ({CPU_STEP_SPREAD["one seed"]:.0%} for one seed): the spread of that figure between runs of one
  engine ({CPU_STEP_MEASURED}). The seconds a step took are shown, never compared: they follow the host's
  load. CPU seconds leave out the time a rank waited idle, which shows in s/step alone.
- **Speed on GPUs**: the ratio to the peer (TRL, TRL+vLLM) timed in the same invocation, the
  medians over a revision's invocations against the previous revision's, flagged when lower by more
  than {ratio_spread:.0%}, the largest distance of an invocation's ratio from its revision's median
  among the {repeats} repeated invocations recorded. Step times are not compared across hosts.

"Engine" is the git revision a row ran with, marked "changed since" when the engine's code
differs from today's (fingerprint `{report.engine}`).

## Algorithm baselines (the CPU matrix)

Held-out accuracy is the reward's accuracy on the test split with greedy decoding, before RL
(step 0) and after the last step, mean ± standard deviation over seeds; s/step and tokens/s are
medians over cells of each cell's median over its steps (the first left out), and the calibrated CPU
step the median over cells of each cell's (the speed that compares across runs); peak CPU memory is a rank's resident peak. Reproduce a row with `make baselines`, or one cell with
`.venv/bin/snakemake runs/CELL/status.json --profile configs/profiles/local --configfile {report.matrix}` (the target first: `--configfile` takes every word after it).

{algorithm_table(cells, report, df[df["type"] == "cell"])}

{_images(curve_files, page_path)}

## Performance (GPU benchmark records)

`easyr1 bench` on a named workload (see `bench/README.md`) at default settings, one row per
workload, rollout and GPUs (the newest record; [the other page]({history_link}) has every other
setting). "vs TRL" and "vs TRL+vLLM": TRL's GRPOTrainer on the same workload in the same
invocation, the ratio of the two step times (each the median of the timed steps, the first left
out), as the median over the invocations at the row's revision (a speed claim holds once it holds
in three). s/step is the newest invocation's, min-max across its steps in brackets. Peak device is
what the GPU held, the rollout engine's pool included, in GiB.

{performance_table(groups, every_bench, report)}

{_images(bench_files, page_path)}

How to reproduce each row (on the GPU host: `bash bench/h200.sh NAME ARGS`, see `bench/README.md`):

{reproduce_table(bench[shown])}

### Against EasyR1's published rows

EasyR1's own performance table (its `assets/baselines.md` at v0.3.2: Qwen2.5-VL-7B-Instruct trained on
Geometry3k on eight H100s of 80 GB, vLLM at TP 2, its example config) beside the newest record here of
each of its configurations: `{PUBLISHED_WORKLOAD}` on eight GPUs with the same bits and micro-batches and
nothing else changed (`bench/README.md`, "EasyR1 at its own scale"). Ours runs a random-init model
whose responses are all 2048 tokens, EasyR1's real ones vary in length: compare tokens/s per GPU and
MFU, not seconds a step. EasyR1's memory is as its table gives it (GB).

{published_table(bench)}

## GPU cells (the harness on GPUs)

Cells of a GPU matrix that the harness ran end to end (Snakemake, `easyr1 train`, nvidia-smi
read every 0.5 s, the last checkpoint merged with `easyr1 merge --verify`, which loads it back
with `from_pretrained` and checks every tensor). s/step, tokens/s and MFU are medians over the
steps, the first left out; memory in GiB, the peak over the run. Random-init models learn
nothing, so their accuracy is not shown.

{gpu_cell_table(gpu_cells, report)}

## Failed and stopped cells

{failures(all_cells)}

## Provenance

{provenance(current, report)}
"""
    old = df[~df["current"]]
    others = bench[~shown]
    history_text = f"""# Baselines: other settings and superseded records

Generated with [the baselines page]({os.path.relpath(page, Path(history).parent)}): the current
benchmark records at settings other than the defaults that page shows, how the work scales over
GPUs, where a step's time goes, and every record older than its kind's latest, each with how to
reproduce it.

## Benchmark records at other settings

The latest record of each other setting. A row is its kind's newest invocation; "Invocations at
this revision" lists every invocation of the kind at the row's revision, oldest first, with its ratio
to the peer. Phases are medians of the timed steps; "GPU busy in gen" is the share of generation's
time the GPU ran kernels (NVML's performance monitoring, on Hopper and later; records from revision
7149c10 on), the rest being time it waited on the rollout engine's host loop. Peak allocated is
torch's allocator peak; peak device is what the GPU held (the rollout engine's pool included): the
device's reading, or torch's reserved peak plus the memory outside torch where that is lower
(records before 2026-12-04's fix overstated the reading when the allocator's cache was warm).
Memory in GiB. "n/a (see note)": under vLLM's sleep mode torch's counter also counts vLLM's pool
while it is released, so it exceeded what the device held and measures nothing resident.

{benchmark_table(others, report) if len(others) else "None."}

How to reproduce each row (on the GPU host: `bash bench/h200.sh NAME ARGS`, see `bench/README.md`):

{reproduce_table(others) if len(others) else "None."}

## Scaling over GPUs

Each multi-GPU row's tokens/s per GPU against a one-GPU record of the same work (workload, rollout,
precision, GPU, LoRA and settings, the parallel layout apart: tensor-parallel size, Ulysses), current or
superseded: one with the same model runner and vLLM sleep setting first, then the one nearest in time,
which is the same machine's where the scaling run recorded one beside it (hosts have measured up to 20%
apart on the same configuration; times in UTC). The efficiency is the ratio, 1.0 when every GPU is as fast
as one alone. The text and image workloads keep their prompts per step on more GPUs (each GPU trains
on a share); the memory workloads and `long_16k` take one prompt a GPU.

{scaling_table(bench, every_bench)}

## Where a step's time goes (profiled records)

The newest profiled record of each workload. The step after the timed ones ran under
torch.profiler (`easyr1 bench --profile`): per phase its
wall time, which the profiler lengthens (most where the host is busiest: vLLM's decoding loop), the
time of the work itself (on GPUs the kernels, each counted once) and what took the most. Newer
records add one more step with the profiler off and the main thread's Python stack sampled every
5 ms: where each phase's host time went. `bench/README.md` says what each field is. Profiles
recorded before 2026-12-04's fix also count the optimizer's named range (`Optimizer.step#...`)
beside its kernels, outside the phases.

{profile_tables(bench, report)}

## Superseded records

Records of each kind older than its latest, newest first, each with the command that made it (a
cell's: its Snakemake target, with the profile and matrix the page names, at the engine revision
given).

{history_table(old, current, report) if len(old) else "None."}
"""
    figure_dir.mkdir(parents=True, exist_ok=True)  # a folder of figures, empty where there are none
    _write({page_path: text, Path(history): history_text, **curve_files, **bench_files})
    Path(log).write_text("".join(f"{f}\n" for f in [page_path, Path(history), *curve_files, *bench_files]))
