"""How the harness runs the engine: the one place that decides a command's environment.

Every rule reaches the engine through ``run`` here, and only through its command line. Today
the one environment is ``native``: the interpreter Snakemake runs in, which has ``easyr1``
installed. A per-combination virtualenv or an Apptainer image becomes another branch of
``command``, and nothing else changes: the engine reports its own identity and versions
(``describe``), whichever environment it runs in.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys


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


def describe(environment: str) -> dict[str, str]:
    """The engine's identity in ``environment``, as it reports it (``easyr1 version``): its source
    fingerprint (a cell reruns when it changes), git revision, Python and package versions."""
    result = subprocess.run([*command(environment), "version"], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"easyr1 version failed in environment {environment!r}: {result.stderr.strip()}")
    return json.loads(result.stdout)
