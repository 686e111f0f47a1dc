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
the main thread's Python stack every ``HOST_INTERVAL_S`` of wall time, profiler off, and writes
``profile/step{N}-rank{R}-host.json``: per phase, the functions the main thread's time was spent in
(``self``) and under (``within``, from the frame that opened the phase down), as shares of the
phase's sampled time, and the other threads' leaf functions: how much of generation is vLLM's
scheduler, its model runner, its sampler, waiting for the GPU. The samples come from a SIGALRM
timer, not from a second thread: a thread reads the main thread's stack only when that thread lets
go of the GIL, which it does mostly in the calls that release it, so a thread sampler files a
loop's Python time under its GIL-releasing calls (on vLLM's decoding it put 47% of generation in
two small host-to-device copies that py-spy, sampling from outside the process, finds at 8%;
``baselines/gpu/perf/README.md``). The timer's signal is handled at the main thread's next
bytecode, in the frame that was running (or that made the C call running, once it returns), so
each sample's time goes where it was spent, to the Python frame.
That holds while no other thread is busy running Python: beside one, CPython may defer the signal
until the main thread takes the GIL back after a releasing call, and the samples lean towards those
calls again (a loop that spent 22% of its time in Python got 5% of the samples beside a thread
spinning in Python); the ``other_threads`` entry shows whether one was busy.
"""

from __future__ import annotations

import bisect
import json
import os
import signal
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from easyr1.telemetry import OPEN_PHASES

PHASE = "phase/"  # the prefix of the telemetry's ranges (StepTelemetry.phase)
TOP_OPS = 15
HOST_INTERVAL_S = 0.005  # 200 samples a second: ~400 in a 2 s phase, at ~1% of a core
TOP_FUNCTIONS = 40  # "within" starts with the phase's common callers (the trainer's step, vLLM's generate), then what is under them
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
        (e.time_range.start, e.time_range.end, e.name[len(PHASE) :])
        for e in events
        if e.name.startswith(PHASE)
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
            "top": [
                {"op": name, "s": seconds, "calls": int(calls), "share": seconds / busy if busy else 0.0}
                for name, (seconds, calls) in top
            ],
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
    """Samples the main thread's Python stack every ``interval`` seconds of wall time (a SIGALRM
    timer; the module docstring says why not a thread), filed under the telemetry phase open at that
    moment (``OPEN_PHASES``; "outside phases" between them). Each sample stands for the time since
    the one before: signals that arrive during a long C call are handled once, after it. The
    process's other Python threads (the data loader's, vLLM's) are sampled at the same moments, by
    name, their leaf functions only. System calls the signal interrupts are restarted (SA_RESTART)."""

    def __init__(self, interval: float = HOST_INTERVAL_S):
        self.interval = interval
        self.seconds: Counter[str] = Counter()
        self.leaf: dict[str, Counter[str]] = defaultdict(Counter)
        self.within: dict[str, Counter[str]] = defaultdict(Counter)
        self.others: dict[str, dict[str, Counter[str]]] = defaultdict(lambda: defaultdict(Counter))
        self._labels: dict[int, str] = {}  # thread id -> its name, numbered where names repeat
        self._last = 0.0
        self._previous: Any = None

    def __enter__(self) -> HostSampler:
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError(
                "trainer.host_profile_steps: the host sampler's SIGALRM timer samples the main thread; run the step there"
            )
        if signal.getitimer(signal.ITIMER_REAL) != (0.0, 0.0):
            raise RuntimeError(
                "trainer.host_profile_steps: a SIGALRM timer is already armed in this process (signal.setitimer)"
            )
        self._previous = signal.signal(signal.SIGALRM, self._sample)
        signal.siginterrupt(signal.SIGALRM, False)
        self._last = time.perf_counter()
        signal.setitimer(signal.ITIMER_REAL, self.interval, self.interval)
        return self

    def __exit__(self, *exc: object) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0.0)
        # None: the handler before was set outside Python, which Python cannot put back; the default then.
        signal.signal(signal.SIGALRM, signal.SIG_DFL if self._previous is None else self._previous)

    def _sample(self, signum: int, frame: Any) -> None:
        stack = []
        while frame is not None:
            if frame.f_code is HostSampler._sample.__code__:
                return  # the timer fired again during a sample (a loaded host): the next one covers the time
            stack.append(_where(frame.f_code))
            frame = frame.f_back
        if not stack:
            return
        now = time.perf_counter()
        span, self._last = now - self._last, now
        phase, above = OPEN_PHASES[-1] if OPEN_PHASES else ("outside phases", 0)
        main = threading.get_ident()
        for ident, leaf in sys._current_frames().items():
            if ident != main:
                self.others[self._label(ident)][phase][_where(leaf.f_code)] += span
        self.seconds[phase] += span
        self.leaf[phase][stack[0]] += span
        # From the frame that opened the phase (the trainer's step) down: the frames above it, which
        # every sample holds (the launcher's, Ray's worker loop, pytest's), would fill the list's
        # TOP_FUNCTIONS places before the phase's own. Innermost first: ties keep that order.
        for name in dict.fromkeys(stack[: max(len(stack) - above, 1)]):
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
            return [
                {"function": _short(name), "share": t / total}
                for name, t in counts.most_common(TOP_FUNCTIONS)
            ]

        return {
            "time": "host (the main thread's Python stacks, sampled by a wall-clock timer)",
            "interval_s": self.interval,
            "phases": {
                phase: {"s": t, "self": top(self.leaf[phase], t), "within": top(self.within[phase], t)}
                for phase, t in self.seconds.most_common()
            },
            "other_threads": {
                name: {
                    phase: top(leaf, self.seconds[phase] or sum(leaf.values()))[:OTHER_THREAD_FUNCTIONS]
                    for phase, leaf in per_phase.items()
                }
                for name, per_phase in sorted(self.others.items())
            },
        }


@contextmanager
def host_sampled(enabled: bool, out: Path) -> Iterator[None]:
    """Sample the main thread's Python stacks through the body when ``enabled``; write the summary to ``out``."""
    if not enabled:
        yield
        return
    with HostSampler() as sampler:
        yield
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(sampler.summary(), indent=2) + "\n")
