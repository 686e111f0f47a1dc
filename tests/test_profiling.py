"""The profile summary (`easyr1.profiling.summarize`) from fabricated profiler events: on a GPU each
kernel counts once, in the phase it ran in, although the op that launched it carries the same time
as its own device time; on a CPU the ops' own CPU time counts. Fabricated because no GPU is here;
the real profiler's CPU path runs end to end in tests/test_bench.py (`--profile`)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from torch.autograd import DeviceType

from easyr1.profiling import NAME_CHARS, summarize


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
