"""A SIGINT or SIGTERM sent to the process that runs a job, and to it alone (``kill PID``, ``timeout``,
a supervisor; not a terminal's Ctrl-C, which reaches the whole process group), reaches the job's
child (``engine.job_child``: the engine and its ranks, an install, a test suite), which stops within
seconds, and Snakemake exits. The local profile runs each job in a thread of Snakemake's own process;
without it (and under SLURM) a job has a Snakemake process of its own, which is the one signalled.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.harness.test_harness import REPO

CHILD_LIFE_S = 30  # the child's own end: the old harness let Snakemake wait this long
STOP_S = 10  # what a stop may take on a loaded machine (about 1.5 s here: Snakemake winds down)

# The child says it is ready (its handlers are in place) by naming the process that runs its job,
# records every signal it gets, and stops a second after the first (time for a duplicate to come).
CHILD = f"""
import os, signal, sys, time
from pathlib import Path

got = []

def record(signum, _frame):
    got.append(signum)
    Path(sys.argv[1]).write_text(" ".join(map(str, got)))

for sig in (signal.SIGINT, signal.SIGTERM):
    signal.signal(sig, record)
Path(sys.argv[2]).write_text(str(os.getppid()))
end = time.monotonic() + {CHILD_LIFE_S}
while time.monotonic() < end and not got:
    time.sleep(0.05)
time.sleep(1)
"""

SNAKEFILE = """
import sys
from pathlib import Path

sys.path.insert(0, {repo!r})
from rules.scripts import engine

rule job:
    output: "done"
    run:
        engine.job_child([sys.executable, "-c", {child!r}, "received", "job.pid"])
        Path(output[0]).touch()
"""


def _sigint_as_in_a_terminal() -> None:
    """A shell starts a background job (``make test &``, CI's own runner at times) with SIGINT
    ignored, which its children inherit: Snakemake would rightly ignore it too."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(work: Path, threads: bool) -> subprocess.Popen:
    """Snakemake on a one-job workflow in ``work``, in a session of its own: nothing but the test
    signals it. ``threads``: the local profile (the job in a thread of this process); otherwise a
    process per job."""
    snakefile = work / "Snakefile"
    snakefile.write_text(SNAKEFILE.format(repo=str(REPO), child=CHILD))
    how = ["--profile", str(REPO / "configs" / "profiles" / "local")] if threads else ["--cores", "1"]
    return subprocess.Popen(
        [sys.executable, "-m", "snakemake", "-s", str(snakefile), "-d", str(work), *how],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=_sigint_as_in_a_terminal,
    )


def job_process(work: Path, snakemake: subprocess.Popen) -> int:
    """The process that runs the job, once its child is ready."""
    ready = work / "job.pid"
    deadline = time.monotonic() + 60  # Snakemake's imports: seconds on a loaded CI machine
    while not (ready.is_file() and ready.read_text()):
        if snakemake.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"the job's child never started:\n{stop(snakemake)}")
        time.sleep(0.1)
    return int(ready.read_text())


def stop(snakemake: subprocess.Popen) -> str:
    """Snakemake's output, after ending what is left of its session (all of it, where a child
    outlived the signal)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(snakemake.pid, signal.SIGKILL)
    return snakemake.communicate()[0]


@pytest.mark.parametrize(
    "threads, sig",
    [(True, signal.SIGINT), (True, signal.SIGTERM), (False, signal.SIGINT), (False, signal.SIGTERM)],
    ids=["threads-sigint", "threads-sigterm", "processes-sigint", "processes-sigterm"],
)
def test_a_signal_to_the_jobs_process_alone_stops_its_child(threads, sig, tmp_path):
    """The child gets the very signal, and Snakemake exits within seconds, not at the child's end."""
    snakemake = start(tmp_path, threads)
    job = job_process(tmp_path, snakemake)
    assert (job == snakemake.pid) == threads
    os.kill(job, sig)
    try:
        snakemake.wait(timeout=STOP_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"Snakemake still ran {STOP_S} s after {sig.name} to {job}:\n{stop(snakemake)}")
    output = stop(snakemake)
    received = tmp_path / "received"
    assert received.is_file(), f"the child never got {sig.name}:\n{output}"
    assert received.read_text().split() == [str(int(sig))], output  # the very signal, once
    assert snakemake.returncode != 0, output


def test_ctrl_c_in_a_terminal_reaches_the_child_once(tmp_path):
    """A terminal sends SIGINT to its whole process group: the child, in a group of its own, gets it
    from Snakemake alone, not a second time from the terminal (a second SIGINT aborts a test suite's
    teardown, and the engine's launcher passes each one to its ranks)."""
    snakemake = start(tmp_path, threads=True)
    job_process(tmp_path, snakemake)
    os.killpg(snakemake.pid, signal.SIGINT)
    try:
        snakemake.wait(timeout=STOP_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"Snakemake still ran {STOP_S} s after Ctrl-C:\n{stop(snakemake)}")
    output = stop(snakemake)
    assert (tmp_path / "received").read_text().split() == [str(int(signal.SIGINT))], output


LATE_CHILD = """
import os, signal, threading
from rules.scripts import engine

signal.signal(signal.SIGTERM, lambda *_: None)  # stands in for Snakemake's handler
os.kill(os.getpid(), signal.SIGTERM)  # before the job starts its child
codes = []
job = threading.Thread(target=lambda: codes.append(engine.job_child(["sleep", "30"]).returncode))
job.start()
job.join()
print(codes[0])
"""


def test_a_child_started_after_the_signal_gets_it():
    """A job between two children when the signal comes (an install's steps, the engine after a
    prepare) does not start one that would run to its end."""
    job = subprocess.run(
        [sys.executable, "-c", LATE_CHILD], cwd=REPO, capture_output=True, text=True, timeout=STOP_S
    )
    assert job.stdout.strip() == str(-signal.SIGTERM), job.stderr
