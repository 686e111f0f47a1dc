"""GPU check of the offload's host buffers: torch's pinned allocator against registered plain memory.

Sixteen 7B MLP weights (3,584 x 18,944 fp32, 272 MB each) in host memory three ways: the offload's
``host_buffer`` (plain memory registered with CUDA), ``pin_memory=True`` (torch's pinned allocator,
which rounds each block up to a power of two) and pageable memory; for each, the resident memory it
added and the bandwidth of copies to and from the GPU.
Usage: python bench/host_buffers.py OUT.json
"""

import gc
import json
import sys
import time

import torch

from easyr1.provenance import describe
from easyr1.workers.offload import host_buffer

SHAPE, COUNT = torch.Size((3584, 18944)), 16


def rss_gib() -> float:
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 2**20
    raise RuntimeError("no VmRSS in /proc/self/status")


def allocate(kind: str) -> list[torch.Tensor]:
    if kind == "registered":
        return [host_buffer(SHAPE, torch.float32, True) for _ in range(COUNT)]
    return [torch.empty(SHAPE, pin_memory=kind == "pin_memory") for _ in range(COUNT)]


def measure(kind: str, source: torch.Tensor) -> dict[str, float | bool]:
    before = rss_gib()
    buffers = allocate(kind)
    for b in buffers:
        b.zero_()  # touch every page
    added = rss_gib() - before
    start = time.perf_counter()
    for b in buffers:
        b.copy_(source, non_blocking=True)
    torch.cuda.synchronize()
    to_host = time.perf_counter() - start
    start = time.perf_counter()
    back = [b.to(source.device, non_blocking=True) for b in buffers]
    torch.cuda.synchronize()
    to_device = time.perf_counter() - start
    gb = COUNT * source.numel() * source.element_size() / 1e9
    return {
        "resident_gib": round(added, 2),
        "tensors_gib": round(gb * 1e9 / 2**30, 2),
        "is_pinned": buffers[0].is_pinned(),
        "to_host_gb_per_s": round(gb / to_host, 1),
        "to_device_gb_per_s": round(gb / to_device, 1),
        "round_trip_exact": all(torch.equal(x, source) for x in back),
    }


def main() -> None:
    source = torch.randn(SHAPE, device="cuda")
    results = {}
    for kind in ("registered", "pin_memory", "pageable"):
        results[kind] = measure(kind, source)
        gc.collect()
    record = {"check": "host_buffers", "gpu": torch.cuda.get_device_name(), **describe(), "results": results}
    print(json.dumps(results, indent=1))
    with open(sys.argv[1], "w") as f:
        json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
