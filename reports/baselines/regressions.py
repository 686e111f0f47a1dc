"""Engine revisions (is a row's engine today's?) and regressions (is a row worse than the previous
record of its kind?)."""

from __future__ import annotations

import math
import subprocess
from functools import cache
from pathlib import Path
from statistics import median

import pandas as pd

from reports.baselines.formatting import missing, num
from reports.baselines.rows import Report

REGRESSION = 0.05  # a metric this much worse (relative) than the previous record is flagged


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
    if not missing(row.get("engine")):
        return "current" if row["engine"] == report.engine else "changed since"
    return _engine_at(report.repo, str(row.get("git", "")))


def engine_label(row: pd.Series, report: Report) -> str:
    revision = (
        "?"
        if missing(row.get("git"))
        else str(row["git"])[:7] + ("-dirty" if "dirty" in str(row["git"]) else "")
    )
    state = engine_state(row, report)
    return revision if state == "current" else f"{revision} ({state})"


# Speed on CPUs compares as the "calibrated CPU step" (``calibrated_cpu_step``): a rank's CPU seconds a
# step over the CPU seconds of a fixed piece of work its rank timed around each step (easyr1/telemetry.py),
# summed over the steps after the first. The seconds a step took follow a shared host's load; CPU seconds
# do not count the time other processes held the cores, and the calibration takes out what changes
# what a CPU second does (the core's frequency, what shares its caches). Neither counts the time a rank
# waited idle: a slower collective shows in s/step alone. Measured on this project's 2-core machine,
# 2026-12-07 (baselines/cpu-speed-spread/2026-12-07.csv): two 6-step cells of the regression test's
# matrix (tests/harness/test_regression_flags.py), 16 runs each, 8 of them beside a process burning a
# core, the host otherwise shared with other work (load 4 to 7). The largest change of the figure
# between two runs of one cell was 27% (the seconds a step's 2.4x); of the mean over the two cells, 20%.
# A configuration's speed is flagged beyond the one or the other, as it has one seed or more.
CPU_STEP_SPREAD = {"one seed": 0.27, "seeds": 0.20}
CPU_STEP_MEASURED = (
    "16 runs of two cells on a shared 2-core host, 8 of them beside a process burning a core: the largest "
    "change between two runs, 27% for one cell and 20% for the mean of the two, where their s/step "
    "changed by up to 2.4x; baselines/cpu-speed-spread/"
)
# (column, label, higher is better). A seed's held-out accuracy is compared on the same hardware
# only: a tiny model's RL run follows the CPU's floating-point paths, and on another CPU model the
# same code lands each seed elsewhere (2026-12-03: two Xeon models, one seed 22% apart, every text
# cell's seed mean within 1.5 pooled standard deviations); across hardware the page's mean ± std over
# seeds is what compares (``seed_mean_shift``). A cell's speed compares over its configuration's seeds
# (``speed_shift``).
CELL_METRICS = [("val_after", "held-out acc.", True)]
# A benchmark's speed is its ratio to the peer timed in the same invocation (TRL, TRL+vLLM): absolute
# step times differ between hosts of one GPU model by more than most changes of the engine.
BENCH_METRICS = [("peer_ratio", "vs peer", True)]


def peer_ratio_spread(bench: pd.DataFrame) -> tuple[float, int]:
    """The run-to-run spread of the ratio to the peer, measured from the records: over every kind
    with several invocations at one revision (repeats of the same code), the largest relative
    distance of an invocation's ratio from the median of its revision's; and how many invocations
    that is from. REGRESSION where no kind was repeated."""
    spread, count = REGRESSION, 0
    for _, group in bench.groupby(["kind", "git"], sort=False):
        ratios = [v for v in group["peer_ratio"] if not missing(v)]
        if len(ratios) < 2:
            continue
        middle = median(ratios)
        spread = max(spread, *(abs(r - middle) / middle for r in ratios))
        count += len(ratios)
    return spread, count


def regressions(current: pd.Series, previous: pd.Series | None, thresholds: dict[str, float]) -> str:
    """The current record's headline metrics against the previous record of its kind, each flagged
    when worse by more than its threshold (relative)."""
    if previous is None:
        return "-"
    if current["type"] == "cell" and current.get("config_hash") != previous.get("config_hash"):
        return "-"  # another config (a new setting, not a regression): nothing to compare with
    flags = []
    for column, label, higher in CELL_METRICS if current["type"] == "cell" else BENCH_METRICS:
        if current["type"] == "cell" and current.get("hardware") != previous.get("hardware"):
            continue  # another CPU model: the seeds compare as a sample (seed_mean_shift)
        now, before = current.get(column), previous.get(column)
        if missing(now) or missing(before) or before == 0:
            continue
        change = (now - before) / abs(before)
        if (-change if higher else change) > thresholds[column]:
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
        cells["kind"].isin(now["kind"])
        & cells["config_hash"].isin(now["config_hash"])
        & (cells["hardware"] != now["hardware"].iloc[0])
        & (cells["date"] < now["date"].min())
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


def speed_shift(group: pd.DataFrame, cells: pd.DataFrame) -> str | None:
    """A flag when the calibrated CPU step of ``group`` (a configuration's current cells on a CPU) rose
    against each cell's previous record of the same config on the same CPU model, in ``cells`` (every
    cell record), as the mean over the seeds of each seed's change, by more than CPU_STEP_SPREAD; None
    when it did not or nothing compares."""
    changes, dates = [], []
    for _, now in group.dropna(subset=["calibrated_cpu_step"]).iterrows():
        if not str(now["hardware"]).startswith("CPU"):
            continue  # a GPU cell's host seconds are not its speed
        earlier = cells[
            (cells["kind"] == now["kind"])
            & (cells["config_hash"] == now["config_hash"])
            & (cells["hardware"] == now["hardware"])
            & (cells["date"] < now["date"])
        ].dropna(subset=["calibrated_cpu_step"])
        if len(earlier):
            before = earlier.sort_values("date", kind="stable").iloc[-1]
            changes.append(now["calibrated_cpu_step"] / before["calibrated_cpu_step"] - 1)
            dates.append(str(before["date"])[:10])
    if not changes:
        return None
    change = sum(changes) / len(changes)
    if change <= CPU_STEP_SPREAD["one seed" if len(changes) == 1 else "seeds"]:
        return None
    seeds = f"{len(changes)} seed{'s' if len(changes) > 1 else ''}"
    return f"calibrated CPU step {change:+.1%} vs {max(dates)} (mean over {seeds})"


def _revision_medians(group: pd.DataFrame) -> pd.Series:
    """A revision's repeat invocations of one benchmark kind as one measurement: the newest record
    with each headline metric the median over the invocations."""
    row = group.iloc[0].copy()
    for column, *_ in BENCH_METRICS:
        values = [v for v in group[column] if not missing(v)]
        row[column] = median(values) if values else None
    return row


def thresholds(df: pd.DataFrame) -> dict[str, float]:
    """How much worse each headline metric of a row must be to be flagged: a seed's accuracy by
    REGRESSION, a benchmark's ratio to its peer by that ratio's spread in the records."""
    return {"val_after": REGRESSION, "peer_ratio": peer_ratio_spread(df[df["type"] == "bench"])[0]}


def with_regressions(df: pd.DataFrame) -> pd.DataFrame:
    """Each row's regression flags. A benchmark is run several times at one revision (a claim holds
    once it holds in three invocations): those repeats measure the host's noise, not a change, so a
    benchmark row compares its revision's invocations (their medians) with the previous revision's."""
    df = df.copy()
    limits = thresholds(df)
    df["regression"] = ""
    for _, group in df.groupby("kind", sort=False):
        group = group.sort_values("date", ascending=False, kind="stable")
        if group["type"].iloc[0] == "bench":
            revisions = [rev for _, rev in group.groupby("git", sort=False)]  # newest revision first
            for i, rev in enumerate(revisions):
                previous = _revision_medians(revisions[i + 1]) if i + 1 < len(revisions) else None
                flags = regressions(_revision_medians(rev), previous, limits)
                df.loc[rev.index, "regression"] = flags
            continue
        for i, index in enumerate(group.index):
            previous = group.iloc[i + 1] if i + 1 < len(group) else None
            df.loc[index, "regression"] = regressions(df.loc[index], previous, limits)
    return df


def invocations(df: pd.DataFrame) -> pd.Series:
    """For each benchmark row, the step and peer ratio of every invocation of its kind at its
    revision, oldest first ("2.83 / 2.86 / 3.19 s; 4.20x / 4.92x / 4.02x"); "1" for a single one."""
    out = pd.Series("", index=df.index, dtype=object)
    for _, group in df[df["type"] == "bench"].groupby(["kind", "git"], sort=False):
        group = group.sort_values("date", kind="stable")
        text = "1"
        if len(group) > 1:
            steps = " / ".join(num(v, ".2f") for v in group["time_per_step"])
            ratios = [f"{v:.2f}x" for v in group["peer_ratio"] if not missing(v)]
            text = f"{len(group)}: {steps} s" + (f"; {' / '.join(ratios)}" if ratios else "")
        out[group.index] = text
    return out
