"""Training steps under torch.profiler (``trainer.profile_steps``): where a step's time goes, phase
by phase and op by op, as a summary small enough to keep in a benchmark record.

Each rank writes ``profile/step{N}-rank{R}.json`` in the run folder. Its phases are the step's
``timing_s/*`` phases (the telemetry opens a ``phase/{name}`` range for each); an op belongs to the
phase its call began in, whichever thread ran it (the backward pass runs on autograd's). For each
phase: its wall time, the time the ops' own work took, and the ops that took the most. On GPUs that
work is the device's: the kernels (and copies) themselves, each counted once, by kernel name, in the
phase it ran in (a phase's range closes only after its kernels finished, ``StepTelemetry.phase``);
an op's device time would count its kernels a second time. ``ops_s`` against ``wall_s`` then says
how busy the GPU was. Elsewhere it is the ops' own CPU time. No trace is kept: a whole RL step's
trace runs to hundreds of megabytes.
"""

from __future__ import annotations

import bisect
import json
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

PHASE = "phase/"  # the prefix of the telemetry's ranges (StepTelemetry.phase)
TOP_OPS = 15
NAME_CHARS = 160  # a templated kernel's name runs to kilobytes


def _short(name: str) -> str:
    return name if len(name) <= NAME_CHARS else name[: NAME_CHARS - 3] + "..."


@contextmanager
def profiled(enabled: bool, device: torch.device, out: Path) -> Iterator[None]:
    """Profile the body when ``enabled`` and write its summary to ``out``."""
    if not enabled:
        yield
        return
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        yield
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summarize(prof.events(), on_device=device.type == "cuda"), indent=2) + "\n")


def summarize(events: Iterable[Any], *, on_device: bool) -> dict[str, Any]:
    """Per phase: wall seconds, the ops' own seconds, and the ``TOP_OPS`` ops with the most."""
    events = list(events)
    ranges = sorted(
        (e.time_range.start, e.time_range.end, e.name[len(PHASE):]) for e in events if e.name.startswith(PHASE)
    )
    starts = [start for start, _, _ in ranges]
    wall: dict[str, float] = defaultdict(float)
    for start, end, name in ranges:
        wall[name] += (end - start) / 1e6
    ops: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0]))
    for event in events:
        if event.name.startswith(PHASE):
            continue
        if on_device and event.device_type == DeviceType.CPU:
            continue  # its device time is its kernels', counted as they are
        own = event.self_device_time_total if on_device else event.self_cpu_time_total
        if own <= 0:
            continue
        at = bisect.bisect_right(starts, event.time_range.start) - 1
        phase = ranges[at][2] if at >= 0 and event.time_range.start <= ranges[at][1] else "outside phases"
        entry = ops[phase][_short(event.name)]
        entry[0] += own / 1e6
        entry[1] += 1
    phases = {}
    for phase in sorted(set(wall) | set(ops), key=lambda p: -wall.get(p, 0.0)):
        busy = sum(seconds for seconds, _ in ops[phase].values())
        top = sorted(ops[phase].items(), key=lambda item: -item[1][0])[:TOP_OPS]
        phases[phase] = {
            "wall_s": wall.get(phase),
            "ops_s": busy,
            "top": [{"op": name, "s": seconds, "calls": int(calls), "share": seconds / busy if busy else 0.0}
                    for name, (seconds, calls) in top],
        }
    return {"time": "device (kernels)" if on_device else "cpu", "phases": phases}
