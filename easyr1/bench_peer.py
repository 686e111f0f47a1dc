"""The TRL peer of ``easyr1 bench`` (``--trl``, ``--trl-vllm``): which workloads and generation modes
it runs, why it cannot run beside a given run (said before our run), running ``bench/trl_peer.py``
after ours, and its step times beside ours in one record. ``step_stats`` is the one rule both runs'
step times go through, so that their ratio (``speedup_vs_trl``) is fair.
"""

from __future__ import annotations

import importlib.util
import json
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from easyr1.data.synthetic import VIDEO_TASKS
from easyr1.workloads import WORKLOADS


def step_stats(times: list[float]) -> dict[str, float | None]:
    """Median, min and max of step times over the steps after the first, which pays for warm-up
    (a single step counts as is). One rule for our run and the peer's, so their ratio is fair."""
    timed = times[1:] or times
    if not timed:
        return {"median": None, "min": None, "max": None}
    return {"median": statistics.median(timed), "min": min(timed), "max": max(timed)}


PEER = Path(__file__).resolve().parents[1] / "bench" / "trl_peer.py"
# The TRL peer's workloads: text prompts of one length (its token count per step assumes it) or prompts
# with one image each (TRL 1.16's GRPOTrainer takes images, not videos), on the benchmark's own settings
# (the memory workloads' EasyR1 settings have no TRL equivalent).
PEER_WORKLOADS = sorted(
    name
    for name, work in WORKLOADS.items()
    if work.task not in VIDEO_TASKS and work.min_prompt_tokens is None and not work.engine
)
# The peer's generation: Hugging Face generate (``--trl``) or vLLM colocated (``--trl-vllm``), the
# flag that picks it, and the packages it needs beyond ours.
PEER_MODES: dict[str, dict[str, Any]] = {
    "hf": {"flag": "--trl", "packages": ("trl",), "install": "pip install -e '.[peer]'"},
    "vllm": {"flag": "--trl-vllm", "packages": ("trl", "vllm"), "install": "pip install -e '.[gpu,peer]'"},
}


def peer_out(root: Path, mode: str) -> Path:
    """Where the peer of ``mode`` writes its JSON (the HF peer's name as before)."""
    return root / ("trl.json" if mode == "hf" else f"trl_{mode}.json")


def peer_record_path(out: Path, modes: list[str], mode: str) -> Path:
    """Where the record of our run beside the peer of ``mode`` goes: ``out`` for the first peer
    asked for, ``OUT-trl-vllm.json`` (the peer's flag) beside it for a second."""
    return (
        out
        if mode == modes[0]
        else out.with_name(f"{out.stem}-{PEER_MODES[mode]['flag'].lstrip('-')}{out.suffix}")
    )


# Overrides that change what a step holds or how often it updates: the TRL peer runs the workload's
# own shape, so a ratio against it would set two different steps side by side.
PEER_SHAPE_KEYS = (
    "data.rollout_batch_size",
    "worker.rollout.n",
    "data.max_prompt_length",
    "data.max_response_length",
    "worker.actor.global_batch_size",
)


def peer_refusal(mode: str, workload: str, overrides: Sequence[str] = ()) -> str | None:
    """Why the peer of ``mode`` cannot run ``workload`` beside our run with ``overrides`` here (None:
    it can), said before our run."""
    flag, packages, install = (
        PEER_MODES[mode]["flag"],
        PEER_MODES[mode]["packages"],
        PEER_MODES[mode]["install"],
    )
    if workload not in PEER_WORKLOADS:
        return (
            f"{flag}: the TRL peer runs the text workloads of one prompt length and the image workloads on the "
            f"benchmark's own settings ({', '.join(PEER_WORKLOADS)}), not {workload} (TRL's GRPOTrainer takes no videos)"
        )
    reshaped = [key for key in (o.partition("=")[0] for o in overrides) if key in PEER_SHAPE_KEYS]
    if reshaped:
        return (
            f"{flag}: {', '.join(reshaped)} would change our step and not the TRL peer's, which runs {workload}'s own "
            "shape: drop the override or the peer"
        )
    if not PEER.exists():
        return f"{flag} needs {PEER}: run from a checkout of the repository"
    missing = [package for package in packages if importlib.util.find_spec(package) is None]
    if missing:
        return f"{flag} needs {' and '.join(missing)}, which cannot be imported here: {install}"
    if mode == "vllm" and not torch.cuda.is_available():
        return f"{flag} needs a CUDA GPU: TRL's colocated vLLM shares it with the training"
    return None


def run_trl(
    name: str,
    steps: int,
    model: str,
    prompts: str,
    out: Path,
    mode: str = "hf",
    overrides: list[str] | tuple[str, ...] = (),
) -> dict[str, Any]:
    """TRL's GRPOTrainer (``bench/trl_peer.py``) on the model folder and prompts we trained; its JSON.
    ``mode``: its generation (``PEER_MODES``); ``overrides``: our run's ``KEY=VALUE`` arguments,
    whose vLLM settings the vLLM peer follows."""
    cmd = [
        sys.executable,
        str(PEER),
        "--workload",
        name,
        "--model",
        model,
        "--prompts",
        prompts,
        "--steps",
        str(steps),
        "--out",
        str(out),
        "--mode",
        mode,
        *overrides,
    ]
    print("TRL peer:", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    return json.loads(out.read_text())


def with_trl(summary: dict[str, Any], trl: dict[str, Any]) -> dict[str, Any]:
    """The peer's step times beside ours, by the same rule; ``speedup_vs_trl`` is TRL's median
    step time over ours. ``trl`` is the peer's whole result: its ``mode`` says which peer it was
    (records from before the vLLM peer have none: they are the HF peer's)."""
    step = step_stats(trl["step_times"])
    speedup = step["median"] / summary["step_s"] if step["median"] and summary["step_s"] else None
    return {
        **summary,
        "trl_step_s": step["median"],
        "trl_step_s_min": step["min"],
        "trl_step_s_max": step["max"],
        "trl_tokens_per_s": trl["tokens_per_step"] / step["median"] if step["median"] else None,
        "speedup_vs_trl": speedup,
        "trl": trl,
    }


def run_peers(
    peers: list[str],
    summary: dict[str, Any],
    *,
    workload: str,
    steps: int,
    model: str,
    prompts: str,
    root: Path,
    out: Path,
    overrides: list[str],
) -> None:
    """After our run (``summary``, written to ``out``): each peer of ``peers`` on the same model folder
    and prompts, its record (``with_trl``) written to ``peer_record_path``."""
    for mode in peers:
        # The HF peer is called as it always was; the vLLM peer also follows our vLLM overrides.
        peer_kwargs = {"mode": mode, "overrides": overrides} if mode != "hf" else {}
        trl = run_trl(workload, steps, model, prompts, peer_out(root, mode), **peer_kwargs)
        record = with_trl(summary, trl)
        peer_record_path(out, peers, mode).write_text(json.dumps(record, indent=2) + "\n")
        print(
            json.dumps(
                {"trl_mode": mode, **{k: record[k] for k in ("step_s", "trl_step_s", "speedup_vs_trl")}}
            )
        )
