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

The profiler records ops, not the Python between them, and slows a host-bound phase several times
over (vLLM's decoding: 8 s under it, 2 s without). ``trainer.host_profile_steps`` instead samples
the process's Python stacks every ``HOST_INTERVAL_S`` from a second thread, profiler off, and
writes ``profile/step{N}-rank{R}-host.json``: per phase, the functions the main thread's time was
spent in (``self``) and under (``within``), as shares of the phase's sampled time, and the other
threads' leaf functions: how much of generation is vLLM's scheduler, its output processing, waiting
for the GPU. A sampler inside the process reads the main thread's stack only once that thread lets
go of the GIL (at a Python call or loop, or in a call that releases it), so the time of a C call that
holds the GIL goes to the frame that runs next: the shares place Python time roughly, by frame.
"""

from __future__ import annotations

import bisect
import json
import os
import sys
import threading
import time
from collections import Counter, defaultdict
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any, Iterable, Iterator

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from easyr1.telemetry import OPEN_PHASES

PHASE = "phase/"  # the prefix of the telemetry's ranges (StepTelemetry.phase)
TOP_OPS = 15
HOST_INTERVAL_S = 0.005  # 200 samples a second: ~400 in a 2 s phase, at ~1% of a core
TOP_FUNCTIONS = 25  # "within" lists the phase's common callers too (the trainer's, vLLM's generate)
OTHER_THREAD_FUNCTIONS = 5
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
        if on_device and (event.device_type == DeviceType.CPU or getattr(event, "is_user_annotation", False)):
            continue  # an op's or a named range's device time is its kernels', counted as they are
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


@cache  # per code object: a sample walks ~40 frames, 200 times a second
def _where(code: Any) -> str:
    """``vllm/v1/core/sched/scheduler.py:Scheduler.schedule``: the file from its package down."""
    path = code.co_filename
    for root in ("site-packages" + os.sep, "dist-packages" + os.sep):
        if root in path:
            path = path.rsplit(root, 1)[1]
            break
    else:
        path = os.path.relpath(path) if path.startswith(os.getcwd()) else os.path.basename(path)
    return f"{path}:{code.co_qualname}"


class HostSampler:
    """Samples one thread's Python stack every ``interval`` seconds, filed under the telemetry phase
    open at that moment (``OPEN_PHASES``; "outside phases" between them). Each sample stands for the
    time since the one before: a thread that holds the GIL is sampled only when it lets go (every
    ``sys.getswitchinterval()``), less often than one that waits, and counting samples would
    undercount its Python against its waits. The process's other Python threads (vLLM's output
    thread under async scheduling, the data loader's) are sampled too, by name, their leaf functions only."""

    def __init__(self, thread_id: int, interval: float = HOST_INTERVAL_S):
        self.thread_id, self.interval = thread_id, interval
        self.seconds: Counter[str] = Counter()
        self.leaf: dict[str, Counter[str]] = defaultdict(Counter)
        self.within: dict[str, Counter[str]] = defaultdict(Counter)
        self.others: dict[str, dict[str, Counter[str]]] = defaultdict(lambda: defaultdict(Counter))
        self._labels: dict[int, str] = {}  # thread id -> its name, numbered where names repeat
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="easyr1-host-sampler", daemon=True)

    def __enter__(self) -> HostSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        last = time.perf_counter()
        while not self._stop.wait(self.interval):
            frames = sys._current_frames()
            now = time.perf_counter()
            span, last = now - last, now
            phase = OPEN_PHASES[-1] if OPEN_PHASES else "outside phases"
            for ident, leaf in frames.items():
                if ident not in (self.thread_id, threading.get_ident()):
                    self.others[self._label(ident)][phase][_where(leaf.f_code)] += span
            frame = frames.get(self.thread_id)
            if frame is None:
                continue
            stack = []
            while frame is not None:
                stack.append(_where(frame.f_code))
                frame = frame.f_back
            self.seconds[phase] += span
            self.leaf[phase][stack[0]] += span
            # Innermost first: the callers every sample shares tie, and the list keeps ties in the order
            # first seen, so the phase's own entry point (the rollout's generate) goes before the
            # trainer's and the interpreter's frames above it, which a cut at TOP_FUNCTIONS drops.
            for name in dict.fromkeys(stack):
                self.within[phase][name] += span

    def _label(self, ident: int) -> str:
        if ident not in self._labels:
            name = next((t.name for t in threading.enumerate() if t.ident == ident), f"thread {ident}")
            taken = sum(label == name or label.startswith(f"{name} #") for label in self._labels.values())
            self._labels[ident] = f"{name} #{taken + 1}" if taken else name
        return self._labels[ident]

    def summary(self) -> dict[str, Any]:
        """Per phase, longest first: its sampled seconds and the functions' shares of them."""

        def top(counts: Counter[str], total: float) -> list[dict[str, Any]]:
            return [{"function": _short(name), "share": t / total} for name, t in counts.most_common(TOP_FUNCTIONS)]

        return {
            "time": "host (sampled Python stacks of the main thread)",
            "interval_s": self.interval,
            "phases": {
                phase: {"s": t, "self": top(self.leaf[phase], t), "within": top(self.within[phase], t)}
                for phase, t in self.seconds.most_common()
            },
            "other_threads": {
                name: {phase: top(leaf, self.seconds[phase] or sum(leaf.values()))[:OTHER_THREAD_FUNCTIONS] for phase, leaf in per_phase.items()}
                for name, per_phase in sorted(self.others.items())
            },
        }


@contextmanager
def host_sampled(enabled: bool, out: Path) -> Iterator[None]:
    """Sample this thread's Python stacks through the body when ``enabled``; write the summary to ``out``."""
    if not enabled:
        yield
        return
    with HostSampler(threading.get_ident()) as sampler:
        yield
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(sampler.summary(), indent=2) + "\n")
