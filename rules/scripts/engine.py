"""How the harness runs the engine: the one place that decides a command's environment.

Every rule reaches the engine through ``run`` here, and only through its command line. Today
the one environment is ``native``: the interpreter Snakemake runs in, which has ``easyr1``
installed. A per-combination virtualenv or an Apptainer image becomes another branch of
``command`` (and of ``versions``), and nothing else changes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata

PACKAGES = ("easyr1", "torch", "transformers", "vllm", "peft")


def command(environment: str) -> list[str]:
    """The argv prefix that runs ``easyr1`` in ``environment``."""
    if environment == "native":
        return [sys.executable, "-m", "easyr1.cli"]
    raise ValueError(f"environment {environment!r} is not available yet; use native")


def run(args: list[str], log: str, environment: str, threads: int) -> int:
    """Run ``easyr1 ARGS`` on ``threads`` cores, output appended to ``log``; return its exit status."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}  # jobs sharing a machine must not oversubscribe it
    with open(log, "a") as out:
        out.write("$ easyr1 " + " ".join(args) + "\n")
        out.flush()
        return subprocess.run(
            [*command(environment), *args], stdout=out, stderr=subprocess.STDOUT, env=env
        ).returncode


def versions(environment: str) -> dict[str, str]:
    """Python and package versions the engine runs with (native: this interpreter's)."""
    if environment != "native":
        raise ValueError(f"environment {environment!r} is not available yet; use native")
    out = {"python": sys.version.split()[0]}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out
