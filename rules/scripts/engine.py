"""How the harness runs the engine: the one place that decides a command's environment.

Every rule reaches the engine through ``run`` here, and only through its command line, in one of
three environments:

- ``native``: the interpreter Snakemake runs in, which has ``easyr1`` installed;
- a dependency combination (``Virtualenv``): an isolated virtualenv built from pinned versions
  (``rules/scripts/deps.py``), its interpreter run with the checkout's engine first on ``PYTHONPATH``;
- ``apptainer``: an image, through Snakemake's own ``container:`` mechanism. The rule names the
  image; Snakemake checks for the binary, pulls a ``docker://`` image into its cache and hands
  the job the local copy and the profile's ``apptainer-args``; the command is wrapped exactly as
  Snakemake's ``shell()`` wraps one (``apptainer exec --home $PWD ARGS IMAGE sh -c ...``).

In an image or a combination's virtualenv the engine is the same source as natively (the folder
the native command imports it from, bound into the container and put first on ``PYTHONPATH``): the
image or virtualenv supplies the stack
(Python, torch, vLLM, ...), so a cell's engine fingerprint means the same in every environment
and only its versions differ. The engine reports its own identity and versions (``describe``),
inside the environment it runs in.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from snakemake.deployment import singularity

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)  # Ctrl-C; a scheduler's, supervisor's or timeout's stop
BINARIES = ("apptainer", "singularity")  # what Snakemake's container mechanism runs, in its order
# Host variables a container still needs under --cleanenv: the GPUs the scheduler gave the job,
# and where and whether to reach the Hugging Face hub.
FORWARDED = ("CUDA_VISIBLE_DEVICES", "HF_HOME", "HF_HUB_OFFLINE")
DEFINITION = "/.singularity.d/Singularity"  # where Apptainer keeps the definition an image was built from
# A task's SLURM variables (its rank: SLURM_PROCID, SLURM_NODEID, ...; the job's allocation) handed
# to the container it starts, through which --cleanenv passes none: Apptainer sets NAME inside from
# APPTAINERENV_NAME outside. Run by a shell of each task, after srun has set them.
TASK_VARIABLES = (
    'for name in $(env | sed -n "s/^\\(SLURM_[A-Za-z0-9_]*\\)=.*/\\1/p"); do '
    'export "APPTAINERENV_$name=$(printenv "$name")"; done; exec "$@"'
)


@dataclass(frozen=True)
class Container:
    """An Apptainer image as Snakemake hands it to a job, and what the command needs from the host."""

    image: str  # the local image (Snakemake's pulled copy of a docker:// one)
    args: str  # the profile's apptainer-args, e.g. "--nv --cleanenv"
    binds: tuple[str, ...]  # host paths outside the working directory (Apptainer's home) it reads or writes
    revision: str  # the engine's git revision as the host sees it (an image need not have git)


@dataclass(frozen=True)
class Virtualenv:
    """A dependency combination's isolated environment: its own interpreter and packages, no easyr1
    installed; the checkout's engine comes first on PYTHONPATH, as in an image."""

    path: Path  # the virtualenv's root (bin/python in it)


@cache
def engine_root() -> Path:
    """The folder holding the ``easyr1`` package that the native command imports (a checkout, or
    one put first on PYTHONPATH), found as that command's interpreter finds it (no engine code runs)."""
    find = "import importlib.util as u; s = u.find_spec('easyr1'); print(s.origin if s else '')"
    origin = subprocess.run(
        [sys.executable, "-c", find], capture_output=True, text=True, check=True
    ).stdout.strip()
    if not origin:
        raise RuntimeError("the harness needs the easyr1 package importable (make setup installs it)")
    return Path(origin).resolve().parents[1]


def apptainer_binary() -> str | None:
    """The binary Snakemake would run for a ``container:`` job, None when neither is on PATH."""
    return next((name for name in BINARIES if shutil.which(name)), None)


def binds(values: Iterable[Any], workdir: Path) -> tuple[str, ...]:
    """What a command must see besides the working directory: the engine's source, the host paths
    among ``values`` (config values or arguments: ``path``, ``path@split``, ``file.py:function``)
    that exist outside ``workdir``, and the Hugging Face cache when ``HF_HOME`` names one."""
    found = {engine_root()}
    if os.environ.get("HF_HOME"):
        values = [*values, os.environ["HF_HOME"]]
    for value in values:
        if not isinstance(value, str) or not value.startswith("/"):
            continue
        for candidate in (value, value.split("@")[0], value.rsplit(":", 1)[0]):
            path = Path(os.path.normpath(candidate))  # as named: a link is bound where the run looks for it
            if path.exists():
                found.add(path)
                break
    workdir = workdir.resolve()

    def covered(path: Path) -> bool:  # by the home (the working directory) or by another bind
        return path.is_relative_to(workdir) or any(
            path != other and path.is_relative_to(other) for other in found
        )

    return tuple(sorted(str(path) for path in found if not covered(path)))


def command(args: list[str], threads: int, container: Container | Virtualenv | None = None) -> list[str]:
    """The argv that runs ``easyr1 ARGS`` on ``threads`` cores, natively, in ``container`` or in a
    combination's virtualenv."""
    if container is None:
        return [sys.executable, "-m", "easyr1.cli", *args]
    if isinstance(container, Virtualenv):
        python = str(container.path / "bin" / "python")
        return ["env", f"PYTHONPATH={engine_root()}", python, "-m", "easyr1.cli", *args]
    variables = {
        "OMP_NUM_THREADS": str(threads),
        "PYTHONPATH": str(engine_root()),
        "EASYR1_GIT_REVISION": container.revision,
        **{name: os.environ[name] for name in FORWARDED if name in os.environ},
    }
    inner = ["exec", "env", *(f"{k}={v}" for k, v in variables.items()), "python3", "-m", "easyr1.cli", *args]
    return _in_container(shlex.join(inner), container)


def _in_container(script: str, container: Container) -> list[str]:
    """``sh -c SCRIPT`` in the image, as Snakemake's ``shell()`` wraps a command of a ``container:`` rule."""
    singularity.Singularity().check()  # which binary (and that its version is one Snakemake runs)
    wrapped = singularity.shellcmd(
        container.image,
        script,
        bind=[Path(b) for b in container.binds],
        args=container.args,
        shell_executable="sh",
    )
    return shlex.split(wrapped)


def run(
    args: list[str],
    log: str,
    threads: int,
    container: Container | Virtualenv | None = None,
    launch: tuple[str, ...] = (),
    variables: Mapping[str, str] | None = None,
) -> int:
    """Run ``easyr1 ARGS`` on ``threads`` cores, natively or in ``container``, through ``launch``
    (``srun ...``: one process a rank) where given, with ``variables`` added to its environment,
    output appended to ``log``; return its exit status.

    The engine lives exactly as long as this job (``job_child``), and stops its ranks when it stops:
    an orphaned engine would go on writing into the cell.
    """
    env = {
        **os.environ,
        **(variables or {}),
        "OMP_NUM_THREADS": str(threads),
    }  # jobs sharing a machine must not oversubscribe it
    inner = command(args, threads, container)
    if isinstance(container, Container) and launch:  # srun tasks: their ranks
        inner = with_task_variables(inner)
    argv = [*launch, *inner]
    with open(log, "a") as out:
        out.write("$ easyr1 " + " ".join(args) + "\n")
        if container is not None or launch:
            out.write("$ " + shlex.join(argv) + "\n")
        out.flush()
        return job_child(argv, stdout=out, stderr=subprocess.STDOUT, env=env).returncode


def job_child(argv: list[str], **popen: Any) -> subprocess.CompletedProcess:
    """``subprocess.run`` for a job's long-running child (the engine, an install, a test suite): a
    SIGINT or SIGTERM to the job's process is passed on and waited for (``_watch_signals``), and if
    the job dies without a word the kernel stops the child (Linux). The child has a session (a process
    group) of its own, so a terminal's Ctrl-C (sent to Snakemake's group) reaches it once, passed on, not a
    second time directly; the engine passes it to its ranks (srun to its tasks, Apptainer to the
    container's process). Where nothing passes signals on, it stays in the job's group.
    ``popen``: Popen's arguments (pipes give the output back, as ``capture_output`` would)."""
    with (
        subprocess.Popen(argv, preexec_fn=_stop_with_job(), start_new_session=_WATCHING, **popen) as child,
        _signals_reach(child),
    ):
        out, err = child.communicate()
    return subprocess.CompletedProcess(argv, child.returncode, out, err)


def with_task_variables(argv: list[str]) -> list[str]:
    """``argv`` (an ``apptainer exec``) started by a shell that hands it its task's SLURM variables."""
    return ["sh", "-c", TASK_VARIABLES, "sh", *argv]


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


class _JobChildren:
    """The job children alive in this process, and the stop signal it got (None before one): a
    child a job starts after the signal (it was between two children) gets it at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # taken by job threads and the watcher, never in a signal handler
        self._alive: set[subprocess.Popen] = set()
        self._stop: int | None = None

    def add(self, child: subprocess.Popen) -> None:
        with self._lock:
            self._alive.add(child)
            if self._stop is not None:
                child.send_signal(self._stop)

    @property
    def received(self) -> int | None:
        return self._stop

    def discard(self, child: subprocess.Popen) -> None:
        with self._lock:
            self._alive.discard(child)

    def stop(self, signum: int) -> None:
        """Pass ``signum`` to every child alive (``send_signal`` skips one that has ended)."""
        with self._lock:
            self._stop = signum
            for child in self._alive:
                child.send_signal(signum)


_CHILDREN = _JobChildren()


def stop_signal() -> int | None:
    """The stop signal (SIGINT, SIGTERM) this process got and passed to its job children, None before
    one: a child that then exits non-zero was stopped, not failed."""
    return _CHILDREN.received


@contextmanager
def _signals_reach(child: subprocess.Popen) -> Iterator[None]:
    """While ``child`` runs, a SIGINT or SIGTERM to this process is passed to it."""
    _CHILDREN.add(child)
    try:
        with _job_waits():
            yield
    finally:
        _CHILDREN.discard(child)


@contextmanager
def _job_waits() -> Iterator[None]:
    """In the main thread (a job run as a script) the signal would end the job before its child:
    meanwhile it is only noted (the watcher passes it on). In a thread of Snakemake, Snakemake's
    handlers stay: they stop the scheduling, which then waits for the job."""
    if not _WATCHING or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, _noted) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _noted(_signum: int, _frame: object) -> None:
    """A handler that does nothing, where SIG_IGN would not do: the interpreter writes a signal to
    the wakeup fd only when a Python handler is set for it."""


def _watch_signals() -> bool:
    """Pass every SIGINT and SIGTERM this process gets to its job children, from a thread of its
    own; whether it does. Snakemake runs a job in a worker thread (the local profile's
    force-use-threads; a job's own Snakemake process, as under SLURM, runs it in a thread too),
    where no handler can be set, and its main thread's handlers are its own: SIGTERM (set after the
    Snakefile is read) starts no more jobs and waits for the running ones, SIGINT raises
    KeyboardInterrupt and waits for them too. So they stay, and the signal is read from the
    interpreter's wakeup fd, to which it writes the number of every signal that has a Python
    handler, whichever. Only the main thread can set it; one an event loop holds is left to it."""
    if threading.current_thread() is not threading.main_thread():
        return False
    read, write = os.pipe()
    os.set_blocking(write, False)
    held = signal.set_wakeup_fd(write)
    if held != -1:
        signal.set_wakeup_fd(held)
        os.close(read)
        os.close(write)
        return False
    threading.Thread(target=_forward, args=(read,), name="job-children-signals", daemon=True).start()
    os.register_at_fork(after_in_child=_unwatched)
    return True


def _unwatched() -> None:
    """In a forked child (a child's preexec, a multiprocessing worker): its signals are its own,
    not to be written into the pipe it shares with this process."""
    signal.set_wakeup_fd(-1)


def _forward(wakeup: int) -> None:
    """The watcher: each stop signal the interpreter writes to ``wakeup``, to the job children."""
    while numbers := os.read(wakeup, 64):
        for signum in numbers:
            if signum in STOP_SIGNALS:
                _CHILDREN.stop(signum)


_WATCHING = _watch_signals()  # at import: the Snakefile imports this module in the main thread


def describe(container: Container | Virtualenv | None = None) -> dict[str, str]:
    """The engine's identity in its environment, as it reports it (``easyr1 version``): its source
    fingerprint (a cell reruns when it changes), git revision, Python and package versions."""
    result = subprocess.run(command(["version"], 1, container), capture_output=True, text=True)
    if result.returncode != 0:
        where = (
            f"virtualenv {container.path}"
            if isinstance(container, Virtualenv)
            else f"image {container.image}"
            if container
            else "the native environment"
        )
        raise RuntimeError(f"easyr1 version failed in {where}: {result.stderr.strip()}")
    return json.loads(result.stdout)


def image_id(reference: str, container: Container) -> str:
    """What identifies the image's content, where it can be known: the digest a reference pins
    (``docker://NAME@sha256:...``), else the hash of the definition file the image was built from
    (Apptainer keeps it inside); "" when neither is there."""
    pinned = re.search(r"@(sha256:[0-9a-f]{64})$", reference)
    if pinned:
        return pinned.group(1)
    result = subprocess.run(_in_container(f"cat {DEFINITION}", container), capture_output=True)
    if result.returncode != 0 or not result.stdout:
        return ""
    return "definition sha256:" + hashlib.sha256(result.stdout).hexdigest()
