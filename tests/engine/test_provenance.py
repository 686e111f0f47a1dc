"""The engine's identity: the fingerprint follows the package's files and nothing else, and
``easyr1 version`` reports it (the harness's rerun trigger and every record's engine field)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from easyr1.provenance import PACKAGE, cpu_model, fingerprint, numa_nodes, pci_numa_node


def test_fingerprint_changes_with_a_file_and_ignores_bytecode(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "a.py").write_text("x = 1\n")
    (package / "sub" / "b.py").write_text("y = 2\n")
    before = fingerprint(package)
    (package / "__pycache__").mkdir()
    (package / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\0\1")
    assert fingerprint(package) == before
    (package / "sub" / "b.py").write_text("y = 3\n")
    assert fingerprint(package) != before
    (package / "sub" / "b.py").write_text("y = 2\n")
    (package / "sub" / "b.py").rename(package / "b.py")  # same content, another path
    assert fingerprint(package) != before


def test_version_reports_the_fingerprint_and_versions() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "easyr1.cli", "version"], capture_output=True, text=True, check=True
    )
    identity = json.loads(out.stdout)
    assert identity["fingerprint"] == fingerprint(PACKAGE) and len(identity["fingerprint"]) == 12
    assert identity["torch"].startswith("2.") and identity["easyr1"] and identity["git"]


def test_the_cpu_is_named_by_its_model_where_the_host_says_it() -> None:
    """Linux's /proc/cpuinfo names the model ("Intel(R) Xeon(R) ..."); platform.processor() is
    empty there, and the architecture alone ("x86_64") cannot tell two machines apart."""
    info = Path("/proc/cpuinfo")
    names = (
        [
            line.split(":", 1)[1].strip()
            for line in info.read_text().splitlines()
            if line.startswith("model name")
        ]
        if info.is_file()
        else []
    )
    if not names:
        pytest.skip("this host's /proc/cpuinfo names no model")
    assert cpu_model() == names[0] and cpu_model()


def test_numa_nodes_and_a_pci_devices_node_from_sysfs(tmp_path: Path) -> None:
    """The host's NUMA nodes and the node a GPU hangs off, as Linux's sysfs gives them (a tree of
    its files here: this machine has one node and no GPU); NVML writes the domain in 8 digits."""
    for node in ("node0", "node1"):
        (tmp_path / "devices/system/node" / node).mkdir(parents=True)
    (tmp_path / "devices/system/node/possible").write_text("0-1\n")
    assert numa_nodes(tmp_path) == 2
    assert numa_nodes(tmp_path / "elsewhere") is None
    device = tmp_path / "bus/pci/devices/0000:9a:00.0"
    device.mkdir(parents=True)
    (device / "numa_node").write_text("1\n")
    assert pci_numa_node("00000000:9A:00.0", tmp_path) == pci_numa_node("0000:9a:00.0", tmp_path) == 1
    (device / "numa_node").write_text("-1\n")  # a host that does not say
    assert pci_numa_node("0000:9a:00.0", tmp_path) is None
    assert pci_numa_node("0000:01:00.0", tmp_path) is None
    assert numa_nodes() == (len(list(Path("/sys/devices/system/node").glob("node[0-9]*"))) or None)
