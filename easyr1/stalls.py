"""A run that stops making progress says where it stopped.

A rank that hangs (a collective waiting on a rank that is gone, a compile worker that never answers,
a rollout engine's threads waiting on each other) prints nothing and holds its GPUs until the job's
time runs out. faulthandler's timer runs in a C thread that needs no GIL, so it fires even when the
main thread holds the GIL in a call that never returns: it writes every Python thread's stack to
stderr ("Timeout (H:MM:SS)!", then each thread, most recent call first) once the period passes
without the timer being restarted, and again each further period. The run itself goes on: a slow
step is not a hung one, and only its owner can tell them apart.
"""

from __future__ import annotations

import faulthandler
import sys


def report_stalls(seconds: float) -> None:
    """(Re)start the timer: call it wherever the run has made progress. 0 turns it off."""
    stderr = sys.__stderr__
    if seconds <= 0 or stderr is None:  # no stderr to write to (pythonw); nothing to report into
        stop_stall_reports()
        return
    faulthandler.dump_traceback_later(seconds, repeat=True, file=stderr)


def stop_stall_reports() -> None:
    faulthandler.cancel_dump_traceback_later()
