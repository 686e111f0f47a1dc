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
"""

from __future__ import annotations

import faulthandler
import sys
from contextlib import contextmanager
from typing import Iterator

_period = 0.0  # seconds; 0 outside a stall_reports block, where progress() does nothing


@contextmanager
def stall_reports(seconds: float) -> Iterator[None]:
    """Report stalls of ``seconds`` (0: none) within the block, which owns faulthandler's one timer,
    and fatal signals whatever ``seconds``."""
    global _period
    _period = seconds if sys.__stderr__ is not None else 0.0  # no stderr (pythonw): nowhere to write
    on_fatal = sys.__stderr__ is not None and not faulthandler.is_enabled()
    if on_fatal:
        faulthandler.enable(file=sys.__stderr__, all_threads=True)
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
        faulthandler.dump_traceback_later(_period, repeat=True, file=sys.__stderr__)
