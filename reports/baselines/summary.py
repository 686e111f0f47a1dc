"""The page's first lines: which algorithm learns best here and which differences its seeds resolve,
how fast the engine is against its peers on each GPU model, whether EasyR1's hardware table holds
(``reports/hardware.py``'s verdicts), the dependency matrix's state (``reports/dependencies.py``),
and what the page was made from."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from statistics import mean, median, stdev

import pandas as pd

from easyr1.models.architecture import Architecture
from reports.baselines.benchmarks import gpu_kind, peer_ratios
from reports.baselines.cells import configurations
from reports.baselines.formatting import missing, pct
from reports.baselines.rows import Report
from reports.dependencies import read_rows
from reports.hardware import SIZES, cell_verdicts
from reports.hardware_records import load_records

RESOLVED_SE = 2.0  # two seed means differ when further apart than this many standard errors of the difference


def _gains(group: pd.DataFrame) -> list[float]:
    ok = group[(group["status"] == "ok") & group["val_before"].notna() & group["val_after"].notna()]
    return list(ok["val_after"] - ok["val_before"])


def _resolved(a: list[float], b: list[float]) -> bool:
    """Whether two configurations' mean gains differ by more than RESOLVED_SE standard errors."""
    if len(a) < 2 or len(b) < 2:
        return False
    error = math.sqrt(stdev(a) ** 2 / len(a) + stdev(b) ** 2 / len(b))
    return abs(mean(a) - mean(b)) > RESOLVED_SE * error


def algorithm_ranking(cells: pd.DataFrame) -> str:
    """The algorithms of the model and data set with the most configurations, ranked by mean held-out
    gain, and which of them the seeds tell apart from the best."""
    configs = [(key, _gains(group)) for key, group in configurations(cells)]
    configs = [(key, gains) for key, gains in configs if gains]
    if not configs:
        return "No CPU cell finished yet."
    counts = Counter((key[0], key[2], key[4]) for key, _ in configs)
    (model, dataset, bits), _ = counts.most_common(1)[0]
    ranked = sorted(
        ((key[3], gains) for key, gains in configs if (key[0], key[2], key[4]) == (model, dataset, bits)),
        key=lambda item: -mean(item[1]),
    )
    seeds = min(len(g) for _, g in ranked)
    spelled = ", ".join(
        f"{name} {mean(g):+.3f}" + (f" ± {stdev(g):.3f}" if len(g) > 1 else "") for name, g in ranked
    )
    best, best_gains = ranked[0]
    level = [name for name, g in ranked[1:] if not _resolved(best_gains, g)]
    below = [name for name, g in ranked[1:] if _resolved(best_gains, g)]
    resolve = (
        f"with {seeds} seeds, {', '.join(below)} {'is' if len(below) == 1 else 'are'} resolved below {best}"
        if below
        else f"with {seeds} seeds no difference from {best} is resolved"
    )
    level_text = f"; {', '.join(level)} cannot be told from it" if level and below else ""
    return (
        f"**Which algorithm learns best here** ({model} on {dataset}, {bits}; held-out accuracy gained, "
        f"mean ± std over seeds): {spelled}. {resolve[0].upper()}{resolve[1:]} (their means more than "
        f"{RESOLVED_SE:g} standard errors apart){level_text}."
    )


def _peer(group: pd.DataFrame, records: pd.DataFrame, peer: str) -> str:
    beside = group[group["peer"] == peer]
    ratios = peer_ratios(beside.iloc[0], records) if len(beside) else []
    if not ratios:
        return ""
    return f"{median(ratios):.2f}x {peer} ({len(ratios)} invocation{'s' if len(ratios) > 1 else ''})"


def gpu_headline(groups: list[pd.DataFrame], records: pd.DataFrame) -> list[str]:
    """Per GPU model, the anchor and VL anchor step on one GPU with vLLM at default settings: seconds,
    ratio to each peer (median over the invocations at the revision), MFU."""
    lines = []
    one = [g for g in groups if g["devices"].iloc[0] == 1 and g["rollout"].iloc[0] == "vllm"]
    for kind in sorted({gpu_kind(g["hardware"].iloc[0]) for g in one}):
        parts = []
        for workload, name in (("anchor", "anchor step"), ("anchor_vl", "VL anchor step")):
            group = next(
                (
                    g
                    for g in one
                    if g["workload"].iloc[0] == workload and gpu_kind(g["hardware"].iloc[0]) == kind
                ),
                None,
            )
            if group is None:
                continue
            r = group.iloc[0]
            peers = [p for p in (_peer(group, records, "TRL"), _peer(group, records, "TRL+vLLM")) if p]
            mfu = "" if missing(r["mfu_actor"]) else f", actor MFU {pct(r['mfu_actor'])}"
            parts.append(
                f"{name} {r['time_per_step']:.2f} s"
                + (f", {' and '.join(peers)}" if peers else ", no peer run")
                + mfu
            )
        if parts:
            lines.append(f"**{kind}** (one GPU, vLLM): " + "; ".join(parts) + ".")
    return lines


def hardware_verdicts(memory_records: list[str]) -> str:
    """EasyR1's hardware table against the estimator and the measurements: counts of each verdict."""
    if not memory_records:
        return "EasyR1's hardware table: no memory record yet."
    verdicts = cell_verdicts(
        load_records(memory_records), {s: Architecture.load(f"qwen2:{s}") for s in SIZES}
    )
    counts = Counter(v["verdict"].split(":")[0] for v in verdicts)
    measured = [v for v in verdicts if v["measured"]]
    fits = sum(v["measured"].startswith("fits") for v in measured)
    return (
        f"**EasyR1's hardware table** ([hardware.md](hardware.md)): of its {len(verdicts)} cells, "
        f"{counts['matches']} match the estimator's GPU count, {counts['pessimistic']} need fewer GPUs than it says "
        f"and {counts['optimistic']} more; {len(measured)} measured on capped GPUs, {fits} of them fit."
    )


def dependency_status(deps: str) -> str:
    """The dependency matrix's combinations: how many passed, which did not, when it ran."""
    if not deps or not Path(deps).is_file():
        return "**Dependency matrix**: not run yet (`make deps`)."
    rows = read_rows(deps)
    failed = [r["combination"] for r in rows if r["status"] != "ok"]
    dates = sorted({r["date"][:10] for r in rows if r.get("date")})
    return (
        f"**Dependency matrix** ([dependencies.md](dependencies.md)): {len(rows) - len(failed)} of "
        f"{len(rows)} combinations pass the regression suite"
        + (f" ({', '.join(failed)} do not)" if failed else "")
        + (f", run {dates[-1]}." if dates else ".")
    )


def made(df: pd.DataFrame, report: Report) -> str:
    """When and at which engine: the newest record's date (the page regenerates byte for byte from its
    records, so no clock is read) and the engine's fingerprint and revision of this run's cells."""
    newest = max((str(d) for d in df["date"] if not missing(d)), default="?")
    revisions = sorted({str(g)[:7] for g in df.loc[~df["committed"], "git"] if not missing(g)})
    return (
        f"Made from the records up to {newest[:16].replace('T', ' ')} UTC, at engine `{report.engine}`"
        + (f" (revision {', '.join(revisions)})" if revisions else "")
        + "."
    )


def summary(cells: pd.DataFrame, groups: list[pd.DataFrame], df: pd.DataFrame, report: Report) -> str:
    """The handful of lines at the top of the page."""
    lines = [
        algorithm_ranking(cells),
        *gpu_headline(groups, df[df["type"] == "bench"]),
        hardware_verdicts(list(report.memory_records)),
        dependency_status(report.deps),
        made(df, report),
    ]
    return "\n".join(f"- {line}" for line in lines)
