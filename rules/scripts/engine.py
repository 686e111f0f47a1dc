"""How the harness runs the engine: the one place that decides a command's environment.

Every rule reaches the engine through ``run`` here, and only through its command line. Today
the one environment is ``native``: the interpreter Snakemake runs in, which has ``easyr1``
installed. A per-combination virtualenv or an Apptainer image becomes another branch of
``command``, and nothing else changes: the engine reports its own identity and versions
(``describe``), whichever environment it runs in.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
from typing import Any, Callable


def command(environment: str) -> list[str]:
    """The argv prefix that runs ``easyr1`` in ``environment``."""
    if environment == "native":
        return [sys.executable, "-m", "easyr1.cli"]
    raise ValueError(f"environment {environment!r} is not available yet; use native")


def run(args: list[str], log: str, environment: str, threads: int) -> int:
    """Run ``easyr1 ARGS`` on ``threads`` cores, output appended to ``log``; return its exit status.

    The engine lives exactly as long as this job: a signal to the job (Ctrl-C, a scheduler's
    SIGTERM) is passed on and waited for, and if the job dies without a word the kernel stops the
    engine (Linux), which stops its ranks. An orphaned engine would go on writing into the cell.
    """
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}  # jobs sharing a machine must not oversubscribe it
    with open(log, "a") as out:
        out.write("$ easyr1 " + " ".join(args) + "\n")
        out.flush()
        engine = subprocess.Popen(
            [*command(environment), *args], stdout=out, stderr=subprocess.STDOUT, env=env, preexec_fn=_stop_with_job()
        )
        previous = _pass_signals_to(engine)
        try:
            return engine.wait()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def _stop_with_job() -> Callable[[], None] | None:
    """Between fork and exec in the engine's process: SIGTERM it when this job's process dies."""
    if not sys.platform.startswith("linux"):
        return None
    job, prctl = os.getpid(), ctypes.CDLL(None, use_errno=True).prctl

    def request() -> None:
        prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if os.getppid() != job:  # the job died before the request took effect
            os._exit(1)

    return request


def _pass_signals_to(engine: subprocess.Popen) -> dict[int, Any]:
    """Forward SIGTERM and SIGINT to ``engine`` (which stops its ranks and exits); the previous
    handlers, to restore. Signal handlers exist only in the main thread; elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.signal(sig, lambda signum, _frame: engine.send_signal(signum)) for sig in (signal.SIGTERM, signal.SIGINT)}


def describe(environment: str) -> dict[str, str]:
    """The engine's identity in ``environment``, as it reports it (``easyr1 version``): its source
    fingerprint (a cell reruns when it changes), git revision, Python and package versions."""
    result = subprocess.run([*command(environment), "version"], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"easyr1 version failed in environment {environment!r}: {result.stderr.strip()}")
    return json.loads(result.stdout)
