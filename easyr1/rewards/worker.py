"""Score in a child process, so that a reward function that never returns ends the run with an error.

Why a process and not a thread: a thread cannot be stopped, a pure-C call that holds the GIL
starves a watchdog thread, and EasyR1 reward files commonly rely on math_verify / mathruler,
whose own timeouts use ``signal.alarm`` and only work in a main thread. So each rank keeps one
persistent worker (a fresh interpreter; the reward function runs in its main thread, and module
state lives on between calls as it did in-process) and times every call of the user's function
from the outside: a call that exceeds ``worker.reward.timeout`` gets the worker killed (SIGKILL
stops any code) and a ``RewardFunctionError`` that names the function, the timeout and the
input. After any failure the next call starts a new worker. ``worker.reward.num_cpus`` is the
worker's thread count: its ``OMP_NUM_THREADS``, which OpenMP, BLAS and torch follow, as Ray sets it
for EasyR1's reward actor of that many CPUs (and not the rank's setting, which torchrun makes 1).

The cost is negligible next to scoring: per batch, two pickled messages, plus one per input for
a sequential function. Measured on 128 inputs (2 shared CPU cores): about 0.4 ms more per batch
call and 3 ms more per sequential batch, against 350-530 ms for the built-in ``math`` reward,
which scored the same in-process and in the worker; starting a worker takes about 0.1 s, once
per rank (math_verify's imports then come with its first call, as in-process).

The worker never outlives its rank: it asks the kernel for SIGKILL when the rank dies (Linux),
and leaves its loop when the rank closes the connection. It is a plain subprocess, not a
``multiprocessing`` child, so the rank's exit does not wait for it, and the reward function may
start processes of its own (or fork). None of them outlives the worker either: the worker leads a
process group of its own, which they join, and whenever it is stopped (the run's end, a timeout, a
failed call, its own crash) the rank kills the whole group and the worker's descendants (one that
left the group for a session of its own included). Only a process that both left the group and lost
its parent escapes, as a daemon does on purpose. (Making the worker the subreaper of such orphans
would keep them, but then their exits would pile up as zombies the worker cannot tell from the
reward's own children, which it must not reap.)
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import subprocess
import sys
import traceback
import weakref
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import psutil

from easyr1.distributed.lifetime import die_with_parent
from easyr1.rewards.loader import RewardFunction, RewardFunctionError, load_reward_function, preview

_START_S = 60.0  # an interpreter and the reward's libraries (math_verify pulls in sympy); plus the timeout


class RewardWorker:
    """The reward function ``spec`` (see ``load_reward_function``) run in a worker process, at most
    ``timeout`` seconds per call of the user's function, on ``num_cpus`` threads; called like a
    ``RewardFunction``."""

    def __init__(self, spec: str, kwargs: dict[str, Any] | None, timeout: float, num_cpus: int = 1) -> None:
        self.spec, self.kwargs, self.timeout, self.num_cpus = spec, dict(kwargs or {}), timeout, num_cpus
        self.name = spec  # the loaded function's full name once the worker has it
        self._process: subprocess.Popen | None = None
        self._conn: Connection | None = None
        self._stop: weakref.finalize | None = None
        self._start()

    def __call__(self, inputs: list[dict[str, Any]]) -> list[dict[str, float]]:
        inputs = list(inputs)
        if not inputs:
            return []
        if self._process is None:  # stopped after a failure
            self._start()
        try:
            return self._exchange(inputs)
        except BaseException:
            self.close()  # a worker left mid-call (an interrupt) would answer the next call out of turn
            raise

    def close(self) -> None:
        """Stop the worker now (it also stops when this object is collected, and at exit)."""
        if self._stop is not None:
            self._stop()
        self._process = self._conn = self._stop = None

    def _start(self) -> None:
        ours, theirs = multiprocessing.Pipe()
        command = [
            sys.executable,
            "-u",
            "-m",
            "easyr1.rewards.worker",
            str(theirs.fileno()),
            str(os.getpid()),
        ]
        env = {**os.environ, "OMP_NUM_THREADS": str(max(1, self.num_cpus))}  # Ray's rule: 0 CPUs, 1 thread
        # A session (so a process group) of its own, led by the worker: what the reward starts is in it,
        # and goes with it (_kill). The terminal's Ctrl-C reaches the rank, which ends the worker.
        self._process = subprocess.Popen(command, pass_fds=[theirs.fileno()], env=env, start_new_session=True)
        theirs.close()
        self._conn = ours
        self._stop = weakref.finalize(self, _kill, self._process, ours)
        self._send((self.spec, self.kwargs))
        wait = _START_S + self.timeout  # the reward file's top level is the user's code too
        kind, value = self._receive(wait, lambda: f"did not load in its worker process within {wait:g} s")
        if kind == "error":
            self.close()
            raise value
        self.name = value

    def _exchange(self, inputs: list[dict[str, Any]]) -> list[dict[str, float]]:
        self._send(inputs)
        index: int | None = None  # the call in progress: an input's index, or None for the whole batch
        while True:
            kind, value = self._receive(self.timeout, lambda index=index: self._timed_out(inputs, index))
            if kind == "call":
                index = value
            elif kind == "done":
                return value
            else:
                raise value

    def _send(self, message: Any) -> None:
        try:
            self._conn.send(message)
        except OSError as exc:  # a broken pipe: the worker is gone
            raise self._failed("lost its worker process", exit_code=True) from exc

    def _receive(self, timeout: float, late: Callable[[], str]) -> tuple[str, Any]:
        """The worker's next message; when none comes within ``timeout``, an error and the worker killed."""
        if not self._conn.poll(timeout):
            raise self._failed(late())
        try:
            return self._conn.recv()
        except EOFError:
            raise self._failed(
                "lost its worker process", exit_code=True, why="; its output above may say why"
            ) from None

    def _failed(self, what: str, *, exit_code: bool = False, why: str = "") -> RewardFunctionError:
        """The error to raise, the worker stopped first (and reaped only then: see _kill), and with
        ``exit_code`` the code it exited with."""
        process = self._process
        self.close()
        if exit_code:
            what = f"{what} (exit code {process.returncode}){why}"
        return RewardFunctionError(f"reward function {self.name} {what}")

    def _timed_out(self, inputs: list[dict[str, Any]], index: int | None) -> str:
        if index is None:
            where = f"a batch of {len(inputs)} inputs, scored in one call (the first: {preview(inputs[0])})"
        else:
            where = f"input {index} of {len(inputs)} ({preview(inputs[index])})"
        return (
            f"did not return within {self.timeout:g} s on {where}; its worker process was killed. "
            "Raise worker.reward.timeout if it needs longer."
        )


def _kill(process: subprocess.Popen, conn: Connection) -> None:
    """Stop the worker and everything the reward function started: the worker's descendants (those
    that left its process group included, while it is there to hold them) and its whole group (those
    orphaned already). The group is killed before the worker is reaped, so its id is still the
    group's and cannot be another process's."""
    conn.close()
    descendants: list[psutil.Process] = []
    with contextlib.suppress(psutil.Error):
        worker = psutil.Process(process.pid)
        worker.suspend()  # it forks no more while its family is listed
        descendants = worker.children(recursive=True)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    for child in descendants:
        with contextlib.suppress(psutil.Error):
            child.kill()
    process.kill()
    process.wait()


# ------------------------------------------------------------------------------ the worker side


def _reported(exc: Exception, name: str) -> RewardFunctionError:
    """A picklable error for the rank; the user's traceback, when the error comes from user code, goes
    along as a note (an exception's cause does not survive pickling)."""
    user_error = exc.__cause__ if isinstance(exc, RewardFunctionError) else exc
    if not isinstance(exc, RewardFunctionError):
        exc = RewardFunctionError(f"reward function {name} raised {type(exc).__name__}: {exc}")
    if user_error is not None:
        exc.add_note("in the reward worker:\n" + "".join(traceback.format_exception(user_error)).rstrip())
    return exc


def _scores(reward: RewardFunction, inputs: list[dict[str, Any]], conn: Connection) -> tuple[str, Any]:
    try:
        return "done", reward(inputs, started=lambda index: conn.send(("call", index)))
    except Exception as exc:
        return "error", _reported(exc, reward.name)


def serve(fd: int, parent: int) -> None:
    """The worker's loop: load the reward function, then score each batch the rank sends."""
    die_with_parent(parent, signal.SIGKILL)  # a hung call never outlives its rank
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the rank, which ends the worker
    conn = Connection(fd)
    # A copy the reward forks has no part in the exchange, and must not hold the rank's end open: the
    # rank would then see a worker that crashed as one that hangs.
    os.register_at_fork(after_in_child=conn.close)
    spec, kwargs = conn.recv()
    try:
        reward = load_reward_function(spec, kwargs)
    except Exception as exc:
        conn.send(("error", _reported(exc, spec)))
        return
    conn.send(("ready", reward.name))
    while True:
        try:
            inputs = conn.recv()
        except (EOFError, ConnectionError):  # the rank is done, or was stopped (its end of the pipe reset)
            return
        conn.send(_scores(reward, inputs, conn))


if __name__ == "__main__":
    serve(int(sys.argv[1]), int(sys.argv[2]))
