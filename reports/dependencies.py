"""assets/dependencies.md: the dependency matrix's page, made from baselines/deps.csv (the CPU
combinations, rules/deps.smk), the versions the GPU benchmark records carry (baselines/gpu/),
pyproject.toml's ranges and gpu extra, and today's engine fingerprint (a record made at another
engine is marked so).

The page reads only those, so it regenerates byte for byte from them; a test checks that the
committed page is current, and that pyproject.toml's ranges are the ones the record proves
(``range_disagreements``).
"""

from __future__ import annotations

import csv
import json
from collections import defaultdict
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

# The packages the matrix varies, as columns (the CSV has more: see rules/scripts/deps.py).
VARIED = ("torch", "transformers", "peft", "datasets", "math-verify")
EASYR1_STACK = "easyr1-stack"  # the combination of EasyR1's own requirements (transformers 4.x)
# Newer vLLM releases and what they pin, resolved from PyPI's metadata (uv pip compile, 2026-12-07).
NEWER_VLLM = (
    "vLLM 0.25 and 0.26 still pin torch 2.11; 0.27 to 0.32 pin torch 2.13 and 0.33 pins 2.14 "
    "(each with its own torchvision); 0.34 needs flashinfer-python 0.7.3, which PyPI does not serve. "
    "A vLLM newer than 0.26 therefore means a new torch on the GPU hosts (offline: its CUDA wheels "
    "carried there, several GB) and every GPU record measured again; 0.25 and 0.26 need only their "
    "own wheels. None is measured here: vLLM needs a GPU, and this matrix runs on CPU"
)


def read_rows(results: str | Path) -> list[dict[str, str]]:
    with open(results, newline="") as f:
        return list(csv.DictReader(f))


def proven_ranges(rows: list[dict[str, str]]) -> dict[str, tuple[str, str]]:
    """Per package, the oldest and newest installed release among the fixed combinations that
    passed (public versions: torch's 2.13.0+cpu is 2.13.0). ``latest`` probes the next releases
    without moving a bound: the upper bounds are the pinned set's, which a plain install gets and
    the CPU baselines reproduce with; moving them is a change of the pinned set."""
    passed = [row for row in rows if row["status"] == "ok" and "==latest" not in row["pins"]]
    ranges = {}
    for package in VARIED:
        versions = sorted({Version(row[package]).public for row in passed if row[package]}, key=Version)
        if versions:
            ranges[package] = (versions[0], versions[-1])
    return ranges


def project_ranges(pyproject: str | Path) -> dict[str, SpecifierSet]:
    """pyproject.toml's ranges of the varied packages (dependencies and the lora extra)."""
    project = tomllib.loads(Path(pyproject).read_text())["project"]
    requirements = [
        Requirement(s) for s in project["dependencies"] + project["optional-dependencies"]["lora"]
    ]
    return {r.name: r.specifier for r in requirements if r.name in VARIED}


def _versions(row: dict[str, str]) -> dict[str, str]:
    """A combination's versions of the varied packages: installed, else requested ("" for latest)."""
    requested = dict(pin.split("==") for pin in row["pins"].split())
    return {p: row[p] or ("" if requested.get(p) in (None, "latest") else requested[p]) for p in VARIED}


def range_disagreements(rows: list[dict[str, str]], ranges: dict[str, SpecifierSet]) -> list[str]:
    """Where ``ranges`` (pyproject.toml's) are not the record's proven ones: a range other than
    ``>=oldest,<=newest`` of the passing combinations, and a failed combination whose every
    version lies inside the ranges (they would claim what failed)."""
    problems = []
    for package, (oldest, newest) in proven_ranges(rows).items():
        expected = SpecifierSet(f">={oldest},<={newest}")
        if ranges.get(package) != expected:
            problems.append(
                f"{package}: pyproject.toml says {ranges.get(package)!s}, the record proves {expected!s}"
            )
    for row in rows:
        versions = _versions(row)
        inside = all(
            v and p in ranges and ranges[p].contains(v, prereleases=True) for p, v in versions.items()
        )
        if row["status"] != "ok" and inside:
            problems.append(f"{row['combination']} failed ({row['status']}) inside pyproject.toml's ranges")
    return problems


def gpu_stacks(records: list[str | Path], repo: Path) -> list[dict[str, str]]:
    """One row per (torch, transformers, vLLM, Python) the GPU records ran with: which workloads
    on which rollout backend, how many records, first and last date."""
    stacks: dict[tuple[str, str, str, str], dict] = defaultdict(
        lambda: {"runs": set(), "files": [], "dates": []}
    )
    for path in records:
        record = json.loads(Path(path).read_text())
        key = (
            record.get("torch", ""),
            record.get("transformers", ""),
            record.get("vllm") or "",
            record.get("python", ""),
        )
        stack = stacks[key]
        stack["runs"].add(f"{record['workload']} ({record['backend']})")
        stack["files"].append(Path(path).resolve().relative_to(repo.resolve()).as_posix())
        stack["dates"].append(record.get("date", "")[:10])
    return [
        {
            "torch": key[0],
            "transformers": key[1],
            "vllm": key[2] or "—",
            "python": key[3],
            "runs": ", ".join(sorted(stack["runs"])),
            "records": str(len(stack["files"])),
            "dates": f"{min(stack['dates'])} – {max(stack['dates'])}",
        }
        for key, stack in sorted(stacks.items())
    ]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _first_test(failure: str) -> str:
    """The first failure's test (or what failed), without its message: the table's short form."""
    return failure.split(": ", 1)[0] if failure.startswith("tests/") else failure.splitlines()[0][:80]


def _easyr1_section(rows: list[dict[str, str]], ranges: dict[str, tuple[str, str]]) -> list[str]:
    """What an EasyR1 user needs, from the row of EasyR1's own stack (none when the matrix has none)."""
    row = next((r for r in rows if r["combination"] == EASYR1_STACK), None)
    if row is None:
        return []
    versions = ", ".join(f"{p} {v}" for p, v in _versions(row).items() if v)
    lines = ["", "## EasyR1's stack", ""]
    if row["status"] == "ok":
        return lines + [
            f"EasyR1's own stack ({versions}) passes the suite: the engine runs in an EasyR1 environment."
        ]
    low = ranges.get("transformers", ("?", "?"))[0]
    failure = row["install_error"] or row["first_failure"] or row["status"]
    return lines + [
        f"EasyR1's own stack ({versions}; EasyR1 pins transformers<5) does not run this engine: "
        f"{_cell(failure.splitlines()[-1] if row['install_error'] else failure)[:300]}. The engine is "
        "written against transformers 5 (its PIL Qwen-VL image processors and their modules, the rope "
        "indices' `mm_token_type_ids`) and huggingface_hub 1.x (`is_offline_mode`), which transformers "
        f"4.x excludes (it needs huggingface_hub<1); {low} is the oldest transformers that passes. "
        "Bridging 4.57 would mean a second code path through the model layer, not a renamed import, so "
        "it is not supported. An EasyR1 user keeps EasyR1's environment for EasyR1 and installs this "
        "engine into a new one: `pip install easyr1[lora]` (the pinned set above) on CPU or for HF "
        "rollouts, or the `gpu` extra (vLLM 0.24.0 with transformers 5.17.0, on torch 2.11) on the GPU "
        "hosts; the engine there takes EasyR1's config schema and reward-function files.",
    ]


def page(
    rows: list[dict[str, str]], gpu: list[dict[str, str]], engine_now: str, gpu_extra: dict[str, str]
) -> str:
    """The Markdown page; ``engine_now``: today's engine fingerprint (a row made at another one is
    marked), ``gpu_extra``: pyproject.toml's gpu extra ({package: version}), the stack of now."""
    first = next((row for row in rows if row["install"] == "ok"), rows[0])
    engines = sorted({row["engine"] for row in rows})
    older = [row for row in rows if row["engine"] != engine_now]
    seconds = {key: sum(float(row[key]) for row in rows if row[key]) for key in ("install_s", "suite_s")}
    lines = [
        "# Dependency matrix",
        "",
        "Generated by `make deps` (rules/deps.smk, reports/dependencies.py) from `baselines/deps.csv`,",
        "the versions in `baselines/gpu/*.json` and pyproject.toml; do not edit.",
        "",
        f"Made {first['date']} on {first['host']}, at engine `{', '.join(engines)}` (revision "
        f"{', '.join(sorted({row['git'] for row in rows}))}).",
        "",
    ]
    if older:
        lines += [
            f"**Made at an older engine**: the engine is now `{engine_now}`, and "
            f"{'every combination' if len(older) == len(rows) else ', '.join(r['combination'] for r in older)} "
            "ran at an engine that has changed since. `make deps` records the matrix again.",
            "",
        ]
    lines += [
        "## CPU combinations",
        "",
        f"Each combination is installed into its own virtualenv (Python {first['python'] or '?'}) from "
        "pyproject.toml's requirements with the combination's pins as constraints (a pin lifts its "
        "package's range, so versions outside it are tried), then runs the regression suite: the test "
        "files of `configs/deps/cpu.yaml` and a short fp32 GRPO run on a tiny model. torch is the local "
        "CPU build (2.13.0+cpu) unless a combination pins it; the other releases are PyPI's Linux wheels, "
        "CUDA builds, run on CPU (the CPU builds of download.pytorch.org are not reachable here). "
        "`latest` pins the newest release of each varied package, resolved when the matrix runs; its row "
        "shows what it got. Drift is the largest difference from the reference combination: the "
        "log-probs of a fixed batch, and the policy and KL losses of every step of the GRPO run.",
        "",
        f"Time: {(seconds['install_s'] + seconds['suite_s']) / 60:.0f} min of jobs on this host: the "
        f"installs {seconds['install_s'] / 60:.1f} min (beside the first suite; from uv's cache, or a "
        f"cached virtualenv, seconds), the suites {seconds['suite_s'] / 60:.0f} min, one at a time. CI "
        "(.ci/deps.sh) runs only the pinned and oldest combinations: a few minutes once their "
        "virtualenvs are cached.",
        "",
        "| combination | " + " | ".join(VARIED) + " | install ok | tests passed/failed | first failure | "
        "metric drift (log-probs / losses) | time | status |",
        "| --- | " + " | ".join("---" for _ in VARIED) + " | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        name = f"**{row['combination']}** (reference)" if row["reference"] == "True" else row["combination"]
        requested = dict(pin.split("==") for pin in row["pins"].split())
        versions = [row[p] or f"({requested.get(p, '?')})" for p in VARIED]
        install = "yes" if row["install"] == "ok" else "**install failed**"
        tests = f"{row['tests_passed']} / {row['tests_failed']}" if row["install"] == "ok" else "—"
        first_failure = row["first_failure"] if row["install"] == "ok" else row["install_error"]
        drift = (
            f"{row['logprob_drift'] or '—'} / {row['loss_drift'] or '—'}" if row["install"] == "ok" else "—"
        )
        total = sum(float(row[k]) for k in ("install_s", "suite_s") if row[k])
        status = "ok" if row["status"] == "ok" else f"**{row['status']}**"
        if row["engine"] != engine_now and len(older) < len(rows):  # else the heading says it of all
            status += f" (engine {row['engine']}, changed since)"
        lines.append(
            f"| {name} | {' | '.join(versions)} | {install} | {tests} | "
            f"{_cell(_first_test(first_failure)) if first_failure else '—'} | {drift} | {total:.0f} s | "
            f"{_cell(status)} |"
        )
    failed = [row for row in rows if row["status"] != "ok"]
    if failed:
        lines += ["", "### Failures", ""]
        for row in failed:
            detail = row["install_error"] or row["first_failure"] or row["status"]
            lines += [
                f"- **{row['combination']}** ({row['pins']}): {row['status']}",
                "",
                "  ```",
                *(f"  {line}" for line in detail.splitlines()),
                "  ```",
                "",
            ]
        lines.pop()
    ranges = proven_ranges(rows)
    lines += [
        "",
        "Versions shown are the installed ones; a version in parentheses was requested and never installed.",
        *_easyr1_section(rows, ranges),
        "",
        "## Proven ranges",
        "",
        "The oldest and newest release of each package among the fixed combinations that passed; "
        "pyproject.toml's ranges are these (a test checks it, and that no failed combination lies "
        "inside them). `latest` probes the next releases without moving a bound: the upper bounds "
        "are the pinned set's, which a plain install gets and the CPU baselines reproduce with.",
        "",
        "| package | oldest | newest |",
        "| --- | --- | --- |",
        *(f"| {package} | {low} | {high} |" for package, (low, high) in ranges.items()),
        "",
        "## GPU stacks",
        "",
        f"Now: the `gpu` extra pins vLLM {gpu_extra.get('vllm', '?')} with transformers "
        f"{gpu_extra.get('transformers', '?')}, on the GPU hosts' torch "
        f"{next((s['torch'] for s in gpu if (s['transformers'], s['vllm']) == (gpu_extra.get('transformers'), gpu_extra.get('vllm'))), '?')} "
        "(the row marked now). The versions `easyr1 bench` recorded with each GPU run "
        "(`baselines/gpu/*.json`): which pairs of transformers and vLLM ran the `anchor` (text) and "
        "`anchor_vl` (vision-language) workloads.",
        "",
        "| torch | transformers | vLLM | Python | workloads run (rollout backend) | records | dates |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        *(
            f"| {s['torch']} | {s['transformers']} | {s['vllm']}"
            f"{' (now)' if (s['transformers'], s['vllm']) == (gpu_extra.get('transformers'), gpu_extra.get('vllm')) else ''}"
            f" | {s['python']} | {s['runs']} | {s['records']} | {s['dates']} |"
            for s in gpu
        ),
        "",
        f"Newer vLLM: {NEWER_VLLM}.",
        "",
    ]
    return "\n".join(lines)


def gpu_extra(pyproject: str | Path) -> dict[str, str]:
    """pyproject.toml's gpu extra as {package: version} (its pins)."""
    project = tomllib.loads(Path(pyproject).read_text())["project"]
    return {
        Requirement(s).name: str(Requirement(s).specifier).removeprefix("==")
        for s in project["optional-dependencies"]["gpu"]
    }


def write_page(
    results: str | Path, gpu_records: list[str | Path], repo: Path, engine_now: str, out: str | Path
) -> None:
    rows = read_rows(results)
    if not rows:
        raise ValueError(f"{results}: no combinations")
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    stacks = gpu_stacks(gpu_records, repo)
    Path(out).write_text(page(rows, stacks, engine_now, gpu_extra(repo / "pyproject.toml")))


if __name__ == "__main__":
    # Only the page, from the committed record (e.g. after a new GPU record): no combination reruns.
    import yaml

    from rules.scripts import engine

    REPO = Path(__file__).resolve().parents[1]
    patterns = yaml.safe_load((REPO / "configs/deps/cpu.yaml").read_text())["gpu_records"]
    records = sorted({f for pattern in patterns for f in REPO.glob(pattern)})
    now = engine.describe()["fingerprint"]
    write_page(REPO / "baselines/deps.csv", records, REPO, now, REPO / "assets/dependencies.md")
