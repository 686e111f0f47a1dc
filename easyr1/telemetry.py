"""Step metrics: phase timings, peak memory per phase, throughput, MFU, and where they go.

Names follow EasyR1: ``timing_s/{phase}``, ``perf/time_per_step``, ``perf/throughput``
(tokens per second per device), ``perf/mfu_actor``, ``perf/max_memory_allocated_gb``,
``perf/max_memory_reserved_gb``, ``perf/cpu_memory_used_gb``; and ``perf/max_memory_device_gb``,
``perf/gc_s``, ``perf/gc_full``, the step's contention readings (``Contention``) and, on GPUs
with NVML's performance monitoring, ``perf/gpu_busy_s/{phase}`` (``GpuBusy``).

torch's allocated/reserved counters keep counting vLLM's memory pool while vLLM sleeps (its
pages are unmapped, the tensors stay), so with the vLLM backend they overstate training phases
by vLLM's whole share. ``perf/max_memory_device_gb`` is what the GPU really held: the device's
used memory when a phase starts (all processes, as nvidia-smi shows it) plus what torch's
allocator took from the device during the phase (its peak reserved memory above its level at the
start; an allocation that reuses a cached block takes nothing new), or the device's used memory at
the phase's end if that is higher (vLLM waking up maps its memory outside torch's counters).
"""

from __future__ import annotations

import gc
import logging
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any, NamedTuple

import psutil
import torch
import torch.distributed as dist

GIB = 1024**3

# A smaller GPU simulated on a larger one: the GiB this process may use in all (the memory-table
# benchmarks run the table's 12, 24 and 40 GB cells on one H200 this way).
GPU_MEMORY_ENV = "EASYR1_GPU_MEMORY_GIB"


def gpu_memory_gib(device: torch.device) -> float:
    """The GiB this process may use on ``device``: ``$EASYR1_GPU_MEMORY_GIB`` where set, else the whole device."""
    value = os.environ.get(GPU_MEMORY_ENV)
    return float(value) if value else torch.cuda.get_device_properties(device).total_memory / GIB


def smallest_gpu_memory_gib(device: torch.device) -> float:
    """``gpu_memory_gib`` of the smallest GPU among the ranks, so that every rank plans alike on
    mixed GPUs (a collective: every rank calls it)."""
    gib = torch.tensor(gpu_memory_gib(device), device=device)
    if dist.is_initialized():
        dist.all_reduce(gib, op=dist.ReduceOp.MIN)
    return gib.item()


def cap_gpu_memory(device: torch.device) -> float | None:
    """Hold this process to ``$EASYR1_GPU_MEMORY_GIB`` of the device; the CUDA context's GiB, or None.

    PyTorch's allocator is capped at the size less what the device holds once this process's CUDA
    context exists, which is the context itself when the process has the device to itself (the
    benchmarks run one at a time). Memory allocated outside PyTorch later (NCCL's buffers) is not
    capped: telemetry reports it as ``perf/gpu_other_memory_gb`` so that it can be added back.
    """
    value = os.environ.get(GPU_MEMORY_ENV)
    if not value or device.type != "cuda":
        return None
    try:
        cap = float(value) * GIB
    except ValueError:
        raise ValueError(f"{GPU_MEMORY_ENV}={value!r}: expected a number of GiB") from None
    torch.zeros(1, device=device)  # creates the context
    free, total = torch.cuda.mem_get_info(device)
    context = total - free
    if not context < cap <= total:
        raise ValueError(
            f"{GPU_MEMORY_ENV}={value}: must lie between the CUDA context's {context / GIB:.2f} GiB "
            f"and the device's {total / GIB:.1f} GiB"
        )
    torch.cuda.set_per_process_memory_fraction((cap - context) / total, device)
    return context / GIB


# Dense bf16 peak of the accelerator, for MFU (vendor datasheet figures).
PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10": 125e12}


def peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, flops in PEAK_BF16_FLOPS.items():
        if key in name:
            return flops
    return None


_LEFT_OUT: set[str] = set()  # readings on_every_rank has warned about, once each


def on_every_rank(readings: dict[str, float]) -> dict[str, float]:
    """The readings that every rank took: one that some ranks cannot take (NVML, or its performance
    monitoring, missing or refused on a node) is left out, so that the reductions over ranks line up
    key by key (a collective: every rank calls it)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return readings
    names: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(names, sorted(readings))
    common = set.intersection(*map(set, names))
    left_out = set.union(*map(set, names)) - common - _LEFT_OUT
    if left_out and dist.get_rank() == 0:
        logging.getLogger(__name__).warning(
            "not every rank took these readings; left out: %s", ", ".join(sorted(left_out))
        )
    _LEFT_OUT.update(left_out)
    return {k: v for k, v in readings.items() if k in common}


def max_over_ranks(values: dict[str, float]) -> dict[str, float]:
    if not dist.is_initialized() or not values:
        return values
    keys = sorted(values)
    t = torch.tensor([values[k] for k in keys], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return dict(zip(keys, t.tolist(), strict=True))


class GCPauses:
    """The time Python's cyclic garbage collector has stopped this process, and its full (oldest
    generation) collections: a full collection walks every object the process holds (millions with
    torch, transformers and vLLM loaded), so it can stall a step for a noticeable part of a second."""

    def __init__(self) -> None:
        self.seconds, self.full = 0.0, 0
        self._began: float | None = None

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        elif self._began is not None:
            self.seconds += time.perf_counter() - self._began
            self.full += info["generation"] == 2
            self._began = None


@cache
def gc_pauses() -> GCPauses:
    """The process's one collector clock, registered with ``gc.callbacks`` the first time it is asked for."""
    pauses = GCPauses()
    gc.callbacks.append(pauses)
    return pauses


class Contention:
    """What else the machine did during a step, for telling a slow step's cause apart: this
    process's CPU seconds (``perf/cpu_process_s``), every other process's on the machine
    (``perf/cpu_others_s``), the CPU time a hypervisor gave other guests (``perf/cpu_steal_s``), and
    on NVIDIA GPUs the device's mean power (``perf/gpu_power_w``) and the time its clocks were held
    down for power or heat (``perf/gpu_throttled_s``), from NVML's counters. Counters read at the
    step's ends, so no thread competes with the step for the GIL."""

    def __init__(self, device: torch.device) -> None:
        self.process = psutil.Process()
        self.nvml = _nvml_handle(device) if device.type == "cuda" else None
        self.begin = self._read()

    def _read(self) -> dict[str, float]:
        machine, own = psutil.cpu_times()._asdict(), self.process.cpu_times()
        # Linux counts guest time inside user time, and steal is not this machine's work.
        busy = sum(
            v for k, v in machine.items() if k not in ("idle", "iowait", "steal", "guest", "guest_nice")
        )
        out = {
            "time": time.perf_counter(),
            "process": own.user + own.system,
            "busy": busy,
            "steal": machine.get("steal", 0.0),
        }
        if self.nvml is not None:
            out.update(_nvml_counters(self.nvml))
        return out

    def finish(self) -> dict[str, float]:
        end = self._read()
        delta = {key: end[key] - self.begin[key] for key in end}
        out = {
            "perf/cpu_process_s": delta["process"],
            # The two readings come from different kernel accounts: a few ms apart at most.
            "perf/cpu_others_s": max(0.0, delta["busy"] - delta["process"]),
            "perf/cpu_steal_s": delta["steal"],
        }
        if "energy_mj" in delta:
            out["perf/gpu_power_w"] = delta["energy_mj"] / 1e3 / delta["time"]
            out["perf/gpu_throttled_s"] = delta["throttled_ns"] / 1e9
        return out


@cache
def _nvml_handle(device: torch.device) -> Any:
    """NVML's handle of ``device`` (found by UUID, whatever ``CUDA_VISIBLE_DEVICES`` renumbered), or
    None where NVML is missing (``nvidia-ml-py`` comes with vLLM) or refuses."""
    try:
        import pynvml

        pynvml.nvmlInit()
        uuid = torch.cuda.get_device_properties(device).uuid
        handle = pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")
        _nvml_counters(handle)  # a device or driver without these counters: no readings at all
        return handle
    except Exception:  # noqa: BLE001 - pynvml raises its own error classes, or ImportError
        return None


def gpu_bus_id(device: torch.device) -> str | None:
    """NVML's PCI bus id of ``device`` (``00000000:18:00.0``), or None without NVML."""
    handle = _nvml_handle(device)
    if handle is None:
        return None
    import pynvml

    bus_id = pynvml.nvmlDeviceGetPciInfo(handle).busId
    return bus_id.decode() if isinstance(bus_id, bytes) else bus_id


def _nvml_counters(handle: Any) -> dict[str, float]:
    import pynvml

    throttled = sum(
        pynvml.nvmlDeviceGetViolationStatus(handle, policy).violationTime
        for policy in (pynvml.NVML_PERF_POLICY_POWER, pynvml.NVML_PERF_POLICY_THERMAL)
    )
    return {
        "energy_mj": float(pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)),
        "throttled_ns": float(throttled),
    }


class GpuBusy:
    """The seconds a GPU ran work during a stretch of host time: NVML's GPU performance monitoring
    (GPM, Hopper and later) measures the share of the time between two of its samples in which any
    kernel was active. A phase that lasts longer than its kernels, such as a generation that waits
    on its host loop, reads as busy for less than its wall time."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    def start(self) -> tuple[Any, float]:
        import pynvml

        sample = pynvml.nvmlGpmSampleAlloc()
        pynvml.nvmlGpmSampleGet(self.handle, sample)
        return sample, time.perf_counter()

    def stop(self, begun: tuple[Any, float]) -> float:
        import pynvml

        first, began = begun
        last = pynvml.nvmlGpmSampleAlloc()
        pynvml.nvmlGpmSampleGet(self.handle, last)
        elapsed = time.perf_counter() - began
        query = pynvml.c_nvmlGpmMetricsGet_t()
        query.version, query.numMetrics = pynvml.NVML_GPM_METRICS_GET_VERSION, 1
        query.sample1, query.sample2 = first, last
        query.metrics[0].metricId = pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL
        try:
            pynvml.nvmlGpmMetricsGet(query)
        finally:
            pynvml.nvmlGpmSampleFree(first)
            pynvml.nvmlGpmSampleFree(last)
        metric = query.metrics[0]
        if metric.nvmlReturn != 0:  # NVML_SUCCESS; the call succeeds while a metric can fail alone
            raise RuntimeError(
                f"NVML's GPM could not read the GPU's busy time (NVML error {metric.nvmlReturn})"
            )
        return metric.value / 100 * elapsed


@cache
def gpu_busy(device: torch.device) -> GpuBusy | None:
    """``GpuBusy`` for ``device``, or None without NVML or where the GPU or driver has no GPM."""
    handle = _nvml_handle(device)
    if handle is None:
        return None
    try:
        import pynvml

        if not pynvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice:
            return None
        busy = GpuBusy(handle)
        busy.stop(busy.start())  # a driver that lists GPM but refuses its metrics: no readings at all
        return busy
    except Exception:  # noqa: BLE001 - pynvml raises its own error classes, or lacks GPM (old nvidia-ml-py)
        return None


class OpenPhase(NamedTuple):
    name: str
    above: int  # frames above the one that opened it: the trainer's loop, the launcher's, pytest's


# The phases open now, innermost last: what easyr1.profiling's host sampler files each sample under.
OPEN_PHASES: list[OpenPhase] = []


def _depth(frame: Any) -> int:
    depth = 0
    while frame is not None:
        depth, frame = depth + 1, frame.f_back
    return depth


# A fixed piece of CPU work on CPU ranks, its CPU seconds taken just before each step and just after
# it, the mean of the two (``perf/calibration_cpu_s``): what a CPU second of this core does around
# the step. A rank's CPU seconds a step (``perf/cpu_process_s``) over it compare across runs of a
# shared machine (the harness's regression flags, reports/baselines/regressions.py): the seconds a
# step took follow the other processes' load, its CPU seconds the core's frequency and whatever
# shares its caches. Fixed inputs, no random numbers: the training's state is not touched. About
# 10 ms each on an idle core.
CALIBRATION_SHAPE, CALIBRATION_REPEATS = (64, 256), 80


def calibration_cpu_s() -> float:
    """CPU seconds this thread took for the calibration work, now."""
    x = torch.linspace(-1.0, 1.0, CALIBRATION_SHAPE[0] * CALIBRATION_SHAPE[1]).reshape(CALIBRATION_SHAPE)
    w = torch.linspace(1.0, -1.0, CALIBRATION_SHAPE[1] ** 2).reshape(CALIBRATION_SHAPE[1], -1)
    begin = time.thread_time()
    for _ in range(CALIBRATION_REPEATS):
        x = torch.tanh(x @ w / CALIBRATION_SHAPE[1])
    return time.thread_time() - begin


class StepTelemetry:
    """Collects one step's timings and peak memories, phase by phase."""

    def __init__(self, device: torch.device, *, calibrate: bool | None = None):
        """``calibrate``: time the calibration work around the step (``perf/calibration_cpu_s``); by
        default on CPU ranks."""
        self.device = device
        self.metrics: dict[str, float] = {}
        if calibrate is None:
            calibrate = device.type == "cpu"
        self.calibration = calibration_cpu_s() if calibrate else None  # before the step's clocks
        self.start = time.perf_counter()
        self.cpu_peak = 0.0
        self.gc_start = (gc_pauses().seconds, gc_pauses().full)
        self.contention = Contention(device)
        self.gpu_busy = gpu_busy(device) if device.type == "cuda" else None
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            free, total = torch.cuda.mem_get_info(self.device)
            device_base, reserved_base = total - free, torch.cuda.memory_reserved(self.device)
            # The CUDA context, NCCL's buffers and any other process's memory: outside PyTorch's allocator.
            other = (device_base - reserved_base) / GIB
            self.metrics["perf/gpu_other_memory_gb"] = max(
                self.metrics.get("perf/gpu_other_memory_gb", 0.0), other
            )
        busy = self.gpu_busy.start() if self.gpu_busy is not None else None
        begin = time.perf_counter()
        # Frame 0 is this generator's, 1 contextlib's __enter__, 2 the code that opened the phase.
        OPEN_PHASES.append(OpenPhase(name, _depth(sys._getframe(2).f_back)))
        try:
            with torch.profiler.record_function(f"phase/{name}"):  # what easyr1.profiling sorts ops by
                yield
                if cuda:  # inside the range, so that the phase's kernels run within it (easyr1.profiling)
                    torch.cuda.synchronize(self.device)
        except torch.OutOfMemoryError as exc:
            if not hasattr(exc, "easyr1_phase"):
                exc.easyr1_phase = name  # type: ignore[attr-defined]
                exc.add_note(f"easyr1: out of memory in phase {name!r}")
            raise
        finally:
            OPEN_PHASES.pop()
            if cuda:
                torch.cuda.synchronize(self.device)
                if busy is not None:
                    key = f"perf/gpu_busy_s/{name}"
                    self.metrics[key] = self.metrics.get(key, 0.0) + self.gpu_busy.stop(busy)
                for kind, peak in (
                    ("allocated", torch.cuda.max_memory_allocated),
                    ("reserved", torch.cuda.max_memory_reserved),
                ):
                    key = (
                        f"perf/max_memory_{kind}_gb/{name}"  # a phase entered several times: its highest peak
                    )
                    self.metrics[key] = max(self.metrics.get(key, 0.0), peak(self.device) / GIB)
                key = f"perf/max_memory_device_gb/{name}"
                free, _ = torch.cuda.mem_get_info(self.device)
                device_peak = max(
                    device_base + torch.cuda.max_memory_reserved(self.device) - reserved_base, total - free
                )
                self.metrics[key] = max(self.metrics.get(key, 0.0), device_peak / GIB)
            self.metrics[f"timing_s/{name}"] = (
                self.metrics.get(f"timing_s/{name}", 0.0) + time.perf_counter() - begin
            )
            self.cpu_peak = max(self.cpu_peak, psutil.Process().memory_info().rss / GIB)

    def finish(self, *, tokens: int, actor_flops: float) -> dict[str, float]:
        """``tokens``: prompt + response tokens of this rank's samples; ``actor_flops``: this rank's
        actor work (forward/backward passes) in FLOPs."""
        elapsed = time.perf_counter() - self.start
        out = dict(self.metrics)
        out["perf/time_per_step"] = elapsed
        out["perf/throughput"] = tokens / elapsed
        out["perf/cpu_memory_used_gb"] = self.cpu_peak
        out["perf/gc_s"] = gc_pauses().seconds - self.gc_start[0]
        out["perf/gc_full"] = gc_pauses().full - self.gc_start[1]
        out.update(self.contention.finish())
        allocated = [v for k, v in out.items() if k.startswith("perf/max_memory_allocated_gb/")]
        reserved = [v for k, v in out.items() if k.startswith("perf/max_memory_reserved_gb/")]
        if allocated:
            out["perf/max_memory_allocated_gb"] = max(allocated)
            out["perf/max_memory_reserved_gb"] = max(reserved)
            out["perf/max_memory_device_gb"] = max(
                v for k, v in out.items() if k.startswith("perf/max_memory_device_gb/")
            )
        peak = peak_flops(self.device)
        actor_time = sum(v for k, v in out.items() if k in ("timing_s/old_log_prob", "timing_s/update_actor"))
        if peak is not None and actor_time > 0:
            out["perf/mfu_actor"] = actor_flops / (actor_time * peak)
        if self.calibration is not None:  # after every counter above: none counts it
            out["perf/calibration_cpu_s"] = (self.calibration + calibration_cpu_s()) / 2
        return out


def dense_flops_per_token(num_params: int) -> float:
    """Forward FLOPs per token of a dense transformer, 2N (attention's quadratic term is left out)."""
    return 2.0 * num_params
