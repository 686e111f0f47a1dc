"""The profile summary (`easyr1.profiling.summarize`) from fabricated profiler events: on a GPU each
kernel counts once, in the phase it ran in, although the op that launched it carries the same time
as its own device time; on a CPU the ops' own CPU time counts. Fabricated because no GPU is here;
the real profiler's CPU path runs end to end in tests/training/test_bench.py (`--profile`). The host
sampler runs for real, on a main thread (its SIGALRM timer samples that thread only): pytest's, or
where a test weighs shares of time, that of a forked process holding no other thread."""

from __future__ import annotations

import gc
import json
import multiprocessing
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.autograd import DeviceType

from easyr1.profiling import HOST_INTERVAL_S, NAME_CHARS, TOP_FUNCTIONS, HostSampler, host_sampled, summarize
from easyr1.telemetry import OPEN_PHASES, StepTelemetry


@dataclass
class Range:
    start: int  # microseconds
    end: int


@dataclass
class Event:
    name: str
    start: int
    end: int
    device_type: DeviceType = DeviceType.CPU
    self_device_time_total: float = 0.0
    self_cpu_time_total: float = 0.0
    is_user_annotation: bool = False

    @property
    def time_range(self) -> Range:
        return Range(self.start, self.end)


def test_kernels_count_once_in_the_phase_they_ran_in() -> None:
    long_name = "void flash::kernel<" + "x" * 500 + ">"
    events = [
        Event("phase/gen", 0, 1_000_000),
        Event("phase/update_actor", 1_000_000, 3_000_000),
        # The op launching a GEMM carries the kernel's time as its own device time: not counted again.
        Event("aten::mm", 1_100_000, 1_100_050, self_device_time_total=400_000, self_cpu_time_total=50),
        Event("nvjet_gemm", 1_100_100, 1_500_100, DeviceType.CUDA, self_device_time_total=400_000),
        Event("nvjet_gemm", 1_600_000, 1_800_000, DeviceType.CUDA, self_device_time_total=200_000),
        Event(long_name, 200_000, 500_000, DeviceType.CUDA, self_device_time_total=300_000),
        Event("Memcpy HtoD", 3_500_000, 3_600_000, DeviceType.CUDA, self_device_time_total=100_000),
        # A named range (the optimizer's record_function) shows on the GPU's timeline over its kernels.
        Event(
            "Optimizer.step#AdamW.step",
            3_500_000,
            3_600_000,
            DeviceType.CUDA,
            self_device_time_total=100_000,
            is_user_annotation=True,
        ),
    ]
    summary = summarize(events, on_device=True)
    assert summary["time"] == "device (kernels)"
    update, gen = summary["phases"]["update_actor"], summary["phases"]["gen"]
    assert update["wall_s"] == 2.0 and update["ops_s"] == pytest.approx(0.6)
    assert update["top"] == [
        {"op": "nvjet_gemm", "s": pytest.approx(0.6), "calls": 2, "share": pytest.approx(1.0)}
    ]
    assert gen["ops_s"] == pytest.approx(0.3) and len(gen["top"][0]["op"]) == NAME_CHARS
    assert summary["phases"]["outside phases"]["ops_s"] == pytest.approx(0.1)


def test_on_a_cpu_the_ops_own_cpu_time_counts() -> None:
    events = [
        Event("phase/ref_log_prob", 0, 1_000_000),
        Event("aten::mm", 100, 700_100, self_cpu_time_total=700_000),
        Event("aten::add", 800_000, 900_000, self_cpu_time_total=100_000),
    ]
    phase = summarize(events, on_device=False)["phases"]["ref_log_prob"]
    assert phase["ops_s"] == pytest.approx(0.8) and [op["op"] for op in phase["top"]] == [
        "aten::mm",
        "aten::add",
    ]


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _in_a_process_of_one_thread(sampled: Callable[[Path], Any], out: Path) -> Any:
    """Runs ``sampled`` in a forked process, which holds only this thread: a thread busy in Python,
    such as one an earlier test left running, biases the timer's samples (easyr1.profiling says how).
    The parent's objects are frozen out of the child's collections, which would otherwise copy the
    parent's heap page by page in the middle of the sampled time. Its telemetry runs no calibration:
    torch's CPU kernels hang in a process forked from one that has used their thread pool."""
    with ProcessPoolExecutor(
        1, mp_context=multiprocessing.get_context("fork"), initializer=gc.freeze
    ) as pool:
        return pool.submit(sampled, out).result()


def _phase_of_spin_and_sleep(out: Path) -> tuple[bool, dict[str, float]]:
    """Whether the phase closed, and the wall seconds its spin and the whole phase took, measured
    around the same code the sampler saw (a loaded host stretches the sleep, and so the phase)."""
    tele = StepTelemetry(torch.device("cpu"), calibrate=False)
    waiting = threading.Event()
    helpers = [threading.Thread(target=waiting.wait, name="output-thread") for _ in range(2)]
    with host_sampled(True, out):
        for helper in helpers:
            helper.start()
        begin = time.perf_counter()
        with tele.phase("gen"):
            _spin(0.3)
            spun = time.perf_counter()
            time.sleep(0.1)
        wall = {"spin": spun - begin, "phase": time.perf_counter() - begin}
        _spin(0.1)
        waiting.set()
    for helper in helpers:
        helper.join()
    return not OPEN_PHASES, wall  # the phase closed


def test_the_host_sampler_files_python_time_under_the_phase_it_ran_in(tmp_path: Path) -> None:
    """The real sampler: a phase that spins in one function and sleeps in another, with time outside
    any phase; shares are of each phase's samples, within each phase's callers."""
    out = tmp_path / "host.json"
    closed, wall = _in_a_process_of_one_thread(_phase_of_spin_and_sleep, out)
    assert closed
    summary = json.loads(out.read_text())
    # The other threads, each on its own (two of one name are numbered): where they waited, per phase,
    # as a share of the phase's time.
    for name in ("output-thread", "output-thread #2"):
        (wait,) = [
            f for f in summary["other_threads"][name]["gen"] if f["function"].endswith(":Condition.wait")
        ]
        assert wait["share"] == pytest.approx(1.0, abs=0.1)
    assert summary["interval_s"] == HOST_INTERVAL_S
    gen = summary["phases"]["gen"]
    # Against the wall time of the same block, not a figure of this host: each sample stands for the
    # time since the one before, so the phase's sum is its wall time to within a few intervals.
    assert gen["s"] == pytest.approx(wall["phase"], rel=0.25), wall
    functions = {entry["function"]: entry["share"] for entry in gen["self"]}
    spin = "tests/engine/test_profiling.py:_spin"
    assert functions[spin] == pytest.approx(wall["spin"] / wall["phase"], abs=0.15), (gen["self"], wall)
    within = {entry["function"]: entry["share"] for entry in gen["within"]}
    assert (
        within["tests/engine/test_profiling.py:_phase_of_spin_and_sleep"] == 1.0
    )  # the frame that opened the phase
    assert within[spin] == pytest.approx(
        functions[spin], abs=0.05
    )  # and what it called: a collection's callbacks
    outside = summary["phases"]["outside phases"]
    assert outside["s"] < gen["s"] and outside["self"][0]["function"] == spin


def test_within_lists_the_phase_from_the_frame_that_opened_it_down(tmp_path: Path) -> None:
    """Every sample holds the frames above the one that opened the phase (pytest's here, the
    launcher's and Ray's worker loop in a run): they are left out, so the cut at TOP_FUNCTIONS keeps
    the phase's own callers."""
    depth = TOP_FUNCTIONS // 2
    namespace: dict[str, Any] = {"_spin": _spin}
    exec("def caller_0():\n    _spin(0.1)\n", namespace)  # distinct names, as a real call chain has
    for level in range(1, depth):
        exec(f"def caller_{level}():\n    caller_{level - 1}()\n", namespace)
    out = tmp_path / "host.json"
    with host_sampled(True, out), StepTelemetry(torch.device("cpu"), calibrate=False).phase("gen"):
        namespace[f"caller_{depth - 1}"]()
    within = [entry["function"] for entry in json.loads(out.read_text())["phases"]["gen"]["within"]]
    opener = "tests/engine/test_profiling.py:test_within_lists_the_phase_from_the_frame_that_opened_it_down"
    chain = [opener, "tests/engine/test_profiling.py:_spin"] + [
        f"<string>:caller_{level}" for level in range(depth)
    ]
    assert set(chain) <= set(within), within
    assert not [name for name in within if name.startswith(("_pytest/", "pluggy/"))], within


def _release() -> None:
    time.sleep(0.0002)  # lets go of the GIL, as a host-to-device copy or a CUDA wait does


def _loop_of_python_and_releasing_calls(out: Path) -> tuple[dict[str, float], bool]:
    spent = {"spin": 0.0, "release": 0.0}
    before = signal.getsignal(signal.SIGALRM)
    with host_sampled(True, out), StepTelemetry(torch.device("cpu"), calibrate=False).phase("gen"):
        end = time.perf_counter() + 1.0
        while (now := time.perf_counter()) < end:
            _spin(0.002)
            mid = time.perf_counter()
            _release()
            spent["spin"] += mid - now
            spent["release"] += time.perf_counter() - mid
    return spent, signal.getsignal(signal.SIGALRM) == before and signal.getitimer(signal.ITIMER_REAL) == (
        0.0,
        0.0,
    )


def test_time_goes_where_it_was_spent_not_to_the_calls_that_release_the_gil(tmp_path: Path) -> None:
    """A loop of pure Python with a short GIL-releasing call in each turn, as vLLM's host loop is. A
    sampling thread could read the main thread's stack only during the releasing calls and filed
    nearly all of the loop under them; the timer's samples match the time each function really took,
    to within 0.15 (on a loaded 2-core host they lean 4-10 points towards the releasing call, whose
    return waits for a core)."""
    out = tmp_path / "host.json"
    spent, restored = _in_a_process_of_one_thread(_loop_of_python_and_releasing_calls, out)
    assert restored  # the handler before, and no timer left armed
    total = sum(spent.values())
    shares = {
        entry["function"]: entry["share"] for entry in json.loads(out.read_text())["phases"]["gen"]["self"]
    }
    assert shares["tests/engine/test_profiling.py:_spin"] == pytest.approx(spent["spin"] / total, abs=0.15), (
        spent,
        shares,
    )
    assert shares.get("tests/engine/test_profiling.py:_release", 0.0) == pytest.approx(
        spent["release"] / total, abs=0.15
    ), (spent, shares)


def test_a_sample_is_not_taken_inside_another(tmp_path: Path) -> None:
    """The timer fires again while its handler still walks the stacks (a loaded host; forced here
    with an interval shorter than a sample takes): the handler's own frames are never sampled."""
    sampler = HostSampler(interval=0.00005)
    tele = StepTelemetry(torch.device("cpu"), calibrate=False)
    begin = time.perf_counter()
    with sampler:
        entered = time.perf_counter()
        with tele.phase("gen"):
            _spin(0.2)
        phase = time.perf_counter() - entered
    whole = time.perf_counter() - begin
    sampled = set(sampler.within["gen"]) | set(sampler.leaf["gen"])
    assert not {name for name in sampled if name.startswith("easyr1/profiling.py:")}, sampled
    # Each sample stands for the time since the one before, and none is counted twice: the samples
    # add up to no more than the sampler's wall time, and the phase's to about the phase's (both
    # measured around the same block, so a slower host moves both sides alike).
    assert sum(sampler.seconds.values()) <= whole
    assert sampler.seconds["gen"] == pytest.approx(phase, rel=0.25), (dict(sampler.seconds), phase)


def test_the_sampler_refuses_a_thread_other_than_the_main_one(tmp_path: Path) -> None:
    errors: list[BaseException] = []

    def sampled() -> None:
        try:
            with host_sampled(True, tmp_path / "host.json"):
                pass
        except RuntimeError as error:
            errors.append(error)

    thread = threading.Thread(target=sampled)
    thread.start()
    thread.join()
    assert errors and "main thread" in str(errors[0])


def test_no_sampler_runs_unless_asked(tmp_path: Path) -> None:
    with host_sampled(False, tmp_path / "host.json"):
        assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert not (tmp_path / "host.json").exists()
