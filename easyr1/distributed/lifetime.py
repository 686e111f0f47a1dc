"""No process of a run outlives the one that started it.

A rank whose launcher is gone, or a reward worker whose rank is gone, would go on training,
scoring or writing into the run folder. Linux signals a process when its parent dies if it asks
(``PR_SET_PDEATHSIG``), even when the parent dies by SIGKILL and runs no handler of its own.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1  # linux/prctl.h
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None


def die_with_parent(parent: int, sig: signal.Signals = signal.SIGTERM) -> None:
    """Ask for ``sig`` when ``parent`` (this process's parent, by pid) dies; exit now if it already
    has. Call it first thing in the child, or between fork and exec (``preexec_fn``): the request
    survives exec. Elsewhere than on Linux it does nothing but that check."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, sig)
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)
