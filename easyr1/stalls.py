"""A run that stops making progress says where it stopped.

A rank that hangs (a collective waiting on a rank that is gone, a compile worker that never answers,
a rollout engine's threads waiting on each other) prints nothing and holds its GPUs until the job's
time runs out. faulthandler's timer runs in a C thread that needs no GIL, so it fires even when the
main thread holds the GIL in a call that never returns: it writes every Python thread's stack to
stderr ("Timeout (H:MM:SS)!", then each thread, most recent call first) once the period passes
without progress, and again each further period. The run itself goes on: a slow step is not a hung
one, and only its owner can tell them apart.

A rank that dies of a fatal signal instead (a segmentation fault in native code, an abort from NCCL or
CUDA) writes every thread's stack the same way before it goes ("Fatal Python error: ..."), where
otherwise the launcher would report only its exit signal.

With several ranks each line of a report starts with the rank (``[rank 3] ``): faulthandler writes to
a pipe whose reader, a small process of its own, adds the label. A thread could not: it would need
the GIL that a stalled main thread may hold.
"""

from __future__ import annotations

import faulthandler
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO

_period = 0.0  # seconds; 0 outside a stall_reports block, where progress() does nothing
_report: IO | None = None  # where reports go within the block

# The labeller: each line read from stdin to stderr behind argv[1], as it comes.
_LABELLER = """
import os, signal, sys
for sig in (signal.SIGINT, signal.SIGHUP):  # a terminal's signals are the rank's to handle; EOF ends this
    signal.signal(sig, signal.SIG_IGN)
label, rest = sys.argv[1].encode(), b""
while chunk := os.read(0, 65536):
    *lines, rest = (rest + chunk).split(b"\\n")
    os.write(2, b"".join(label + line + b"\\n" for line in lines))
if rest:
    os.write(2, label + rest + b"\\n")
"""


@contextmanager
def _labelled(label: str) -> Iterator[IO]:
    """stderr, or with ``label`` a pipe to the labeller; closed and drained at the block's end."""
    if not label:
        yield sys.__stderr__
        return
    labeller = subprocess.Popen(
        [sys.executable, "-c", _LABELLER, label], stdin=subprocess.PIPE, stderr=sys.__stderr__
    )
    try:
        yield labeller.stdin
    finally:
        labeller.stdin.close()
        try:  # a process forked meanwhile that still holds the pipe keeps it open: no waiting on it
            labeller.wait(timeout=2)
        except subprocess.TimeoutExpired:
            pass


@contextmanager
def stall_reports(seconds: float, label: str = "") -> Iterator[None]:
    """Report stalls of ``seconds`` (0: none) within the block, which owns faulthandler's one timer,
    and fatal signals whatever ``seconds``; ``label`` starts each line of a report."""
    global _period, _report
    if sys.__stderr__ is None:  # no stderr (pythonw): nowhere to write
        yield
        return
    on_fatal = not faulthandler.is_enabled()
    with _labelled(label) as _report:
        _period = seconds
        if on_fatal:
            faulthandler.enable(file=_report, all_threads=True)
        progress()
        try:
            yield
        finally:
            _period = 0.0
            faulthandler.cancel_dump_traceback_later()
            if on_fatal:
                faulthandler.disable()


def progress() -> None:
    """Restart the timer: the run has moved on."""
    if _period > 0:
        faulthandler.dump_traceback_later(_period, repeat=True, file=_report)
