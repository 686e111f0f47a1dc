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
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from snakemake.deployment import singularity

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
    origin = subprocess.run([sys.executable, "-c", find], capture_output=True, text=True, check=True).stdout.strip()
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
        return path.is_relative_to(workdir) or any(path != other and path.is_relative_to(other) for other in found)

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
        container.image, script, bind=[Path(b) for b in container.binds], args=container.args, shell_executable="sh"
    )
    return shlex.split(wrapped)


def run(
    args: list[str], log: str, threads: int, container: Container | Virtualenv | None = None,
    launch: tuple[str, ...] = (),
    variables: Mapping[str, str] | None = None,
) -> int:
    """Run ``easyr1 ARGS`` on ``threads`` cores, natively or in ``container``, through ``launch``
    (``srun ...``: one process a rank) where given, with ``variables`` added to its environment,
    output appended to ``log``; return its exit status.

    The engine lives exactly as long as this job (``job_child``), and stops its ranks when it stops:
    an orphaned engine would go on writing into the cell.
    """
    env = {**os.environ, **(variables or {}), "OMP_NUM_THREADS": str(threads)}  # jobs sharing a machine must not oversubscribe it
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
    signal to the job (Ctrl-C, a scheduler's SIGTERM) is passed on and waited for, and if the job
    dies without a word the kernel stops the child (Linux). ``popen``: Popen's arguments (pipes
    give the output back, as ``capture_output`` would)."""
    with subprocess.Popen(argv, preexec_fn=_stop_with_job(), **popen) as child:
        previous = _pass_signals_to(child)
        try:
            out, err = child.communicate()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
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


def _pass_signals_to(engine: subprocess.Popen) -> dict[int, Any]:
    """Forward SIGTERM and SIGINT to ``engine`` (which stops its ranks and exits); the previous
    handlers, to restore. Signal handlers exist only in the main thread; elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.signal(sig, lambda signum, _frame: engine.send_signal(signum)) for sig in (signal.SIGTERM, signal.SIGINT)}


def describe(container: Container | Virtualenv | None = None) -> dict[str, str]:
    """The engine's identity in its environment, as it reports it (``easyr1 version``): its source
    fingerprint (a cell reruns when it changes), git revision, Python and package versions."""
    result = subprocess.run(command(["version"], 1, container), capture_output=True, text=True)
    if result.returncode != 0:
        where = (
            f"virtualenv {container.path}" if isinstance(container, Virtualenv)
            else f"image {container.image}" if container else "the native environment"
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
