"""Which engine produced a number: a fingerprint of the package's files, its git revision, versions.

The fingerprint hashes the package's own source, so it names the engine exactly even in a copy
without ``.git`` (a GPU host, a container) and whatever the working tree's state; the harness
reruns a cell whose engine fingerprint changed, and the baselines page flags rows whose engine
is not the current one. ``easyr1 version`` prints all of it as JSON without importing torch.
"""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

PACKAGE = Path(__file__).resolve().parent
PACKAGES = ("torch", "transformers", "vllm", "peft")


def fingerprint(root: Path = PACKAGE) -> str:
    """SHA-256 (12 hex digits) over the relative path and content of every file of the package."""
    digest = hashlib.sha256()
    files = sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    for path in files:
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:12]


def git_revision() -> str:
    """The package's repository HEAD (``-dirty`` with local changes), or EASYR1_GIT_REVISION where the
    copy has no usable ``.git`` (set it from the machine that sent the tree)."""
    if os.environ.get("EASYR1_GIT_REVISION"):
        return os.environ["EASYR1_GIT_REVISION"]

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], capture_output=True, text=True, check=True, cwd=PACKAGE
        ).stdout.strip()

    try:
        dirty = git("status", "--porcelain", "--untracked-files=no")
        return git("rev-parse", "--short=12", "HEAD") + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def cpu_model() -> str:
    """The host CPU's model name (``platform.processor()`` is empty on most Linux hosts): the host's
    speed moves host-bound numbers, so records name it."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


SYSFS = Path("/sys")


def numa_nodes(sysfs: Path = SYSFS) -> int | None:
    """How many NUMA nodes the host has (Linux's count; None elsewhere). On a host of several, a
    process's memory and threads can lie on the node away from its GPU: records say so, to tell it
    apart when host-bound numbers differ between runs."""
    return len(list((sysfs / "devices/system/node").glob("node[0-9]*"))) or None


def pci_numa_node(bus_id: str, sysfs: Path = SYSFS) -> int | None:
    """The NUMA node of a PCI device (``0000:18:00.0``, or NVML's ``00000000:18:00.0``); None where
    the host does not say (Linux writes -1)."""
    domain, rest = bus_id.lower().split(":", 1)
    try:
        node = int((sysfs / "bus/pci/devices" / f"{domain[-4:]}:{rest}" / "numa_node").read_text())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def describe() -> dict[str, Any]:
    """The engine's identity and the versions it runs with (installed distributions only)."""
    out: dict[str, Any] = {
        "fingerprint": fingerprint(),
        "git": git_revision(),
        "python": platform.python_version(),
    }
    for name in ("easyr1", *PACKAGES):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out
