"""The profile summary (`easyr1.profiling.summarize`) from fabricated profiler events: on a GPU each
kernel counts once, in the phase it ran in, although the op that launched it carries the same time
as its own device time; on a CPU the ops' own CPU time counts. Fabricated because no GPU is here;
the real profiler's CPU path runs end to end in tests/test_bench.py (`--profile`). The host
sampler runs for real, on pytest's main thread (its SIGALRM timer samples that thread only)."""

from __future__ import annotations

import json
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.autograd import DeviceType

from easyr1.profiling import HOST_INTERVAL_S, NAME_CHARS, TOP_FUNCTIONS, host_sampled, summarize
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
        Event("Optimizer.step#AdamW.step", 3_500_000, 3_600_000, DeviceType.CUDA, self_device_time_total=100_000,
              is_user_annotation=True),
    ]
    summary = summarize(events, on_device=True)
    assert summary["time"] == "device (kernels)"
    update, gen = summary["phases"]["update_actor"], summary["phases"]["gen"]
    assert update["wall_s"] == 2.0 and update["ops_s"] == pytest.approx(0.6)
    assert update["top"] == [{"op": "nvjet_gemm", "s": pytest.approx(0.6), "calls": 2, "share": pytest.approx(1.0)}]
    assert gen["ops_s"] == pytest.approx(0.3) and len(gen["top"][0]["op"]) == NAME_CHARS
    assert summary["phases"]["outside phases"]["ops_s"] == pytest.approx(0.1)


def test_on_a_cpu_the_ops_own_cpu_time_counts() -> None:
    events = [
        Event("phase/ref_log_prob", 0, 1_000_000),
        Event("aten::mm", 100, 700_100, self_cpu_time_total=700_000),
        Event("aten::add", 800_000, 900_000, self_cpu_time_total=100_000),
    ]
    phase = summarize(events, on_device=False)["phases"]["ref_log_prob"]
    assert phase["ops_s"] == pytest.approx(0.8) and [op["op"] for op in phase["top"]] == ["aten::mm", "aten::add"]


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_the_host_sampler_files_python_time_under_the_phase_it_ran_in(tmp_path: Path) -> None:
    """The real sampler on this thread: a phase that spins in one function and sleeps in another,
    with time outside any phase; shares are of each phase's samples, within each phase's callers."""
    tele = StepTelemetry(torch.device("cpu"))
    out = tmp_path / "host.json"
    waiting = threading.Event()
    helpers = [threading.Thread(target=waiting.wait, name="output-thread") for _ in range(2)]
    with host_sampled(True, out):
        for helper in helpers:
            helper.start()
        with tele.phase("gen"):
            _spin(0.3)
            time.sleep(0.1)
        _spin(0.1)
        waiting.set()
    for helper in helpers:
        helper.join()
    summary = json.loads(out.read_text())
    # The other threads, each on its own (two of one name are numbered): where they waited, per phase,
    # as a share of the phase's time.
    for name in ("output-thread", "output-thread #2"):
        (wait,) = [f for f in summary["other_threads"][name]["gen"] if f["function"].endswith(":Condition.wait")]
        assert wait["share"] == pytest.approx(1.0, abs=0.1)
    assert summary["interval_s"] == HOST_INTERVAL_S
    gen = summary["phases"]["gen"]
    assert gen["s"] == pytest.approx(0.4, rel=0.25)
    functions = {entry["function"]: entry["share"] for entry in gen["self"]}
    spin = "tests/test_profiling.py:_spin"
    assert functions[spin] == pytest.approx(0.75, abs=0.15), gen["self"]
    within = {entry["function"]: entry["share"] for entry in gen["within"]}
    caller = "tests/test_profiling.py:test_the_host_sampler_files_python_time_under_the_phase_it_ran_in"
    assert within[caller] == 1.0 and within[spin] == pytest.approx(functions[spin])
    outside = summary["phases"]["outside phases"]
    assert outside["s"] < gen["s"] and outside["self"][0]["function"] == spin
    assert not OPEN_PHASES  # the phase closed


def test_the_innermost_of_the_callers_every_sample_shares_are_listed(tmp_path: Path) -> None:
    """Every sample of a phase holds its whole chain of callers, so they tie at the phase's full share;
    a chain deeper than TOP_FUNCTIONS keeps its innermost callers (the phase's own entry point, such as
    the rollout's generate), whatever the order the interpreter hashes their names in, above pytest's
    own frames."""
    depth = TOP_FUNCTIONS + 10
    namespace: dict[str, Any] = {"_spin": _spin}
    exec("def caller_0():\n    _spin(0.1)\n", namespace)  # distinct names, as a real call chain has
    for level in range(1, depth):
        exec(f"def caller_{level}():\n    caller_{level - 1}()\n", namespace)
    out = tmp_path / "host.json"
    with host_sampled(True, out), StepTelemetry(torch.device("cpu")).phase("gen"):
        namespace[f"caller_{depth - 1}"]()
    within = [entry["function"] for entry in json.loads(out.read_text())["phases"]["gen"]["within"]]
    assert len(within) == TOP_FUNCTIONS
    innermost = ["tests/test_profiling.py:_spin"] + [f"<string>:caller_{level}" for level in range(TOP_FUNCTIONS - 10)]
    assert set(innermost) <= set(within), within


def _release() -> None:
    time.sleep(0.0002)  # lets go of the GIL, as a host-to-device copy or a CUDA wait does


def test_time_goes_where_it_was_spent_not_to_the_calls_that_release_the_gil(tmp_path: Path) -> None:
    """A loop of pure Python with a short GIL-releasing call in each turn, as vLLM's host loop is. A
    sampling thread could read the main thread's stack only during the releasing calls and filed
    nearly all of the loop under them; the timer's samples match the time each function really took."""
    spent = {"spin": 0.0, "release": 0.0}
    out = tmp_path / "host.json"
    before = signal.getsignal(signal.SIGALRM)
    with host_sampled(True, out), StepTelemetry(torch.device("cpu")).phase("gen"):
        end = time.perf_counter() + 1.0
        while (now := time.perf_counter()) < end:
            _spin(0.002)
            mid = time.perf_counter()
            _release()
            spent["spin"] += mid - now
            spent["release"] += time.perf_counter() - mid
    assert signal.getsignal(signal.SIGALRM) == before and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    total = sum(spent.values())
    shares = {entry["function"]: entry["share"] for entry in json.loads(out.read_text())["phases"]["gen"]["self"]}
    assert shares["tests/test_profiling.py:_spin"] == pytest.approx(spent["spin"] / total, abs=0.1), shares
    assert shares.get("tests/test_profiling.py:_release", 0.0) == pytest.approx(spent["release"] / total, abs=0.1), shares


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
