"""One cell's jobs: train it in ``runs/{cell}/`` and merge its checkpoint, recording how each went.

A failure is recorded, not raised: the job succeeds with ``status: failed`` (or ``stopped``, with
the signal, when Ctrl-C or a scheduler's SIGTERM ended the run), the exit status and the tail of
the log, so the report shows the cell as FAILED or STOPPED while the other cells go on; either
resumes from its last complete checkpoint at the next run.

``runs/{cell}/`` holds:
- ``cell.yaml``: the engine config the harness resolved (the run reads it); ``cell.json``: the
  cell's axes, environment (its image or dependency combination), config hash and resources;
- ``train.log``: the engine's output; ``gpu_memory.csv``: nvidia-smi readings (GPU machines);
- ``status.json``: ok, failed or stopped (and the signal), exit status, wall time, error tail,
  hardware, provenance (the engine, the versions it reported in the cell's environment, the
  image's identity) (and ``result.json``, the same, which survives Snakemake deleting the output
  of an interrupted job);
- from the engine: ``config.yaml`` (fully resolved), ``metrics.jsonl``, ``generations.jsonl``,
  and ``global_step_N/`` checkpoints when the cell saves them; ``merge.json`` after a merge.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from easyr1.provenance import cpu_model
from rules.scripts import engine

REPO = Path(__file__).resolve().parents[2]
TAIL_LINES = 40
TAIL_LINE_CHARS = 300  # a line longer than this (a dumped config, a progress bar) is cut in the tail
# Signals that stop a run on purpose (Ctrl-C, a scheduler's or supervisor's stop, a closed shell): the
# cell is "stopped", not "failed". SIGKILL is not one: the kernel's out-of-memory killer sends it too.
STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
RESULT = "result.json"  # the last attempt's outcome, kept where Snakemake does not delete it
REDO = "delete it, and the next run redoes the job that wrote it"  # the fix for a damaged job output


class DamagedFile(ValueError):
    """A file of a cell's run that cannot be read back (cut by a crash or a full disk, or edited by
    hand). Its message names the file, what is wrong with it and what to delete: Snakemake shows
    only the message, and a bare JSONDecodeError names no file."""


def retrain(run_dir: Path) -> str:
    """What to do about a damaged file that only a new run of the cell writes again."""
    return f"delete the folder {run_dir} to train the cell again"


def read_json(path: Path, fix: str, keys: Iterable[str] = ()) -> dict[str, Any]:
    """The JSON object in ``path``; DamagedFile, saying ``fix``, when it is missing, cut, not an
    object or without one of ``keys`` (valid JSON edited by hand, or written by an older harness)."""
    try:
        value = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:  # missing, JSONDecodeError, or bytes that are not UTF-8
        raise DamagedFile(f"{path} cannot be read ({exc}); {fix}") from exc
    if not isinstance(value, dict):
        raise DamagedFile(f"{path} cannot be read (not a JSON object); {fix}")
    missing = [key for key in keys if key not in value]
    if missing:
        raise DamagedFile(f"{path} cannot be read (no key {', '.join(map(repr, missing))}); {fix}")
    return value


def read_status(path: str | Path, keys: Iterable[str] = ("status",)) -> dict[str, Any] | None:
    """A job's outcome (status.json, result.json, merge.json); None before the job ran."""
    path = Path(path)
    return read_json(path, REDO, keys) if path.is_file() else None


def write_atomic(path: str | Path, text: str) -> None:
    """Write ``path`` whole or not at all (a temporary file beside it, then a rename): a job killed
    while writing leaves the previous file or none, never a cut one that stops the next run."""
    path = Path(path)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with temporary.open("w") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def tail(log: str | Path, lines: int = TAIL_LINES, width: int = TAIL_LINE_CHARS) -> str:
    """The last ``lines`` lines of ``log``, each cut to ``width`` characters: the tail goes into
    status.json, results.csv and the page, so it stays a few KB however long the log's lines are."""
    path = Path(log)
    if not path.is_file():
        return ""
    last = path.read_text(errors="replace").splitlines()[-lines:]
    return "\n".join(line if len(line) <= width else line[: width - 4] + " ..." for line in last)


def outcome(code: int, received: int | None) -> tuple[str, str | None]:
    """(status, signal name) of a run that exited ``code`` in a job that got the stop signal
    ``received`` (None: none). Stopped: the job was signalled, or the run ended by one of ``STOPS``
    (killed by it: a negative code; or exited 128 + its number, as the engine and shells do)."""
    if code == 0:
        return "ok", None
    number = received or (-code if code < 0 else code - 128 if 128 < code <= 128 + 64 else None)
    try:
        sig = signal.Signals(number) if number else None
    except ValueError:  # 128 + a number that is no signal: an exit status like any other
        sig = None
    return ("stopped" if sig in STOPS else "failed"), (sig.name if sig else None)


def _visible_gpus() -> list[str]:
    if shutil.which("nvidia-smi") is None:
        return []
    args = ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]
    if os.environ.get("CUDA_VISIBLE_DEVICES"):
        args += ["-i", os.environ["CUDA_VISIBLE_DEVICES"]]
    result = subprocess.run(args, capture_output=True, text=True)
    return (
        [line.strip() for line in result.stdout.splitlines() if line.strip()]
        if result.returncode == 0
        else []
    )


def hardware() -> dict[str, Any]:
    """What this job ran on (under SLURM: the compute node, as the job saw it)."""
    return {
        "host": socket.gethostname(),
        "cpu": cpu_model(),
        "cpus": len(os.sched_getaffinity(0)),
        "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1024**3, 1),
        "gpus": _visible_gpus(),
    }


@contextmanager
def gpu_memory_readings(path: Path) -> Iterator[None]:
    """Sample the visible GPUs' used memory every half second into ``path`` (CSV: index, MiB)."""
    if not _visible_gpus():
        yield
        return
    args = ["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits", "-lms", "500"]
    if os.environ.get("CUDA_VISIBLE_DEVICES"):
        args += ["-i", os.environ["CUDA_VISIBLE_DEVICES"]]
    with path.open("a") as out:  # a resumed attempt adds to the readings of the earlier ones
        sampler = subprocess.Popen(args, stdout=out, stderr=subprocess.DEVNULL)
        try:
            yield
        finally:
            sampler.terminate()
            sampler.wait()


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _checkpoints(run_dir: Path) -> list[Path]:
    """The engine's complete checkpoints in ``run_dir`` (its completion marker is written last)."""
    return sorted(run_dir.glob("global_step_*/checkpoint_complete.json"), key=_step)  # step 10 after 5


def _previous_attempt(run_dir: Path, identity: dict[str, str]) -> dict[str, Any] | None:
    """What an earlier attempt of this same cell (same config, same engine) left in ``run_dir``:
    its result, or ``{"status": "interrupted"}`` when it stopped before writing one. None when the
    folder holds nothing of this cell."""
    cell_file = run_dir / "cell.json"
    if not cell_file.is_file():
        return None
    ran = read_json(cell_file, retrain(run_dir))
    if {key: ran.get(key) for key in identity} != identity:
        return None
    return read_status(run_dir / RESULT) or {"status": "interrupted"}


def _ran_in(
    cell: dict[str, Any],
    engine_identity: dict[str, str],
    container: engine.Container | engine.Virtualenv | None,
    log: str,
    unusable: str = "",
) -> dict[str, Any]:
    """The versions the engine reports in the cell's environment, and the image's identity where it
    has one (an image or virtualenv the engine cannot start in reports none: the run's own failure
    says why). A combination's virtualenv is identified by its versions and its key (in cell.json)."""
    if container is None:
        return {"versions": _versions(engine_identity), "image_id": ""}
    identity = {}
    if not unusable:
        try:
            identity = engine.describe(container)
        except RuntimeError as error:
            with open(log, "a") as out:
                out.write(f"# {error}\n")
    image_id = engine.image_id(cell["image"], container) if isinstance(container, engine.Container) else ""
    return {"versions": _versions(identity), "image_id": image_id}


def _versions(identity: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in identity.items() if k not in ("fingerprint", "git")}


def train(
    cell: dict[str, Any],
    engine_identity: dict[str, str],
    attempt: str,
    status_path: str,
    log: str,
    threads: int,
    container: engine.Container | engine.Virtualenv | None,
    unusable: str = "",
) -> None:
    """Run the engine for ``cell`` in the folder of ``status_path``, natively or in ``container`` (an
    image or a combination's virtualenv); write ``status_path``. ``unusable`` says why the cell's
    environment cannot run it ("" when it can: a virtualenv that did not install): the cell then
    fails with that reason, as a cell of several nodes outside an allocation does.

    ``engine_identity`` is what ``easyr1 version`` reported natively: the status records the
    engine's fingerprint and git revision (the same source runs in every environment) beside the
    versions it reported in the cell's environment and, in an image, the image's identity.

    Work is not thrown away. A result of the same config and engine that Snakemake discarded
    (it was interrupted after the cell finished) is kept; a failed or interrupted attempt with a
    complete checkpoint resumes from it (the engine finds it); otherwise the cell starts clean.
    """
    run_dir = Path(status_path).parent
    identity = {"hash": cell["hash"], "engine": engine_identity["fingerprint"]}
    previous = _previous_attempt(run_dir, identity)
    if previous is not None and previous["status"] == "ok":
        write_atomic(status_path, (run_dir / RESULT).read_text())
        print(
            f"{cell['name']}: kept the finished run of this config and engine in {run_dir} "
            f"(delete the folder to train it again)",
            file=sys.stderr,
        )
        return
    checkpoints = _checkpoints(run_dir) if previous is not None else []
    if checkpoints:
        with open(log, "a") as out:
            out.write(
                f"# the {previous['status']} attempt left {checkpoints[-1].parent.name}: resuming from it\n"
            )
    else:
        if run_dir.exists():
            shutil.rmtree(run_dir)  # a rerun starts clean: the engine appends to metrics.jsonl
        run_dir.mkdir(parents=True)
    (run_dir / RESULT).unlink(missing_ok=True)
    (run_dir / "cell.yaml").write_text(yaml.safe_dump(cell["config"], sort_keys=False))
    record = {k: v for k, v in cell.items() if k != "config"}
    write_atomic(run_dir / "cell.json", json.dumps({**record, **identity}, indent=2))
    started, begin = _now(), time.monotonic()
    job = slurm_allocation(os.environ)
    missing = unusable or missing_nodes(cell, job)
    if missing:
        with open(log, "a") as out:
            out.write(missing + "\n")
        code = 2
    else:
        with gpu_memory_readings(run_dir / "gpu_memory.csv"):
            code = engine.run(
                ["train", f"config={run_dir / 'cell.yaml'}"], log, threads, container, rank_launch(cell), job
            )
    state, by_signal = outcome(code, engine.stop_signal())
    status = {
        "status": state,
        "exit_code": code,
        "signal": by_signal,
        "started": started,
        "attempt": attempt,
        "resumed_from": checkpoints[-1].parent.name if checkpoints else None,
        "wall_s": round(time.monotonic() - begin, 1),
        "error_tail": "" if code == 0 else tail(log),
        "hardware": hardware(),
        "engine": engine_identity["fingerprint"],
        "git": engine_identity["git"],
        **_ran_in(cell, engine_identity, container, log, unusable),
    }
    # Written beside the Snakemake output too: Snakemake deletes the output of a job it was
    # interrupted in, even when the job had finished.
    text = json.dumps(status, indent=2)
    write_atomic(run_dir / RESULT, text)
    write_atomic(status_path, text)
    how = f"{state} by {by_signal}" if by_signal else state  # a SIGKILL (out of memory?) is a failure
    more = "; it resumes from its last complete checkpoint at the next run" if state == "stopped" else ""
    print(f"{cell['name']}: {how} after {status['wall_s']} s{more}", file=sys.stderr)


def slurm_allocation(environ: Mapping[str, str]) -> dict[str, str]:
    """The SLURM job's allocation as the variables the engine reads ({} outside SLURM).

    Snakemake's SLURM job step hands the job every ``SLURM_*`` variable but the job's id (a nested
    ``srun`` would otherwise inherit the batch step's settings), so they are asked of ``scontrol``.
    The CPUs are assumed even over the nodes, as every train job asks for them.
    """
    if "SLURM_JOB_ID" not in environ:
        return {}
    shown = subprocess.run(
        ["scontrol", "show", "job", "-o", environ["SLURM_JOB_ID"]], capture_output=True, text=True, check=True
    ).stdout
    fields = dict(field.split("=", 1) for field in shown.split() if "=" in field)
    nodes = int(fields["NumNodes"])
    return {
        "SLURM_JOB_NUM_NODES": str(nodes),
        "SLURM_JOB_NODELIST": fields["NodeList"],
        "SLURM_JOB_CPUS_PER_NODE": f"{int(fields['NumCPUs']) // nodes}(x{nodes})",
    }


def missing_nodes(cell: dict[str, Any], job: Mapping[str, str]) -> str:
    """Why ``cell`` cannot run in this job ("" when it can): a cell of several nodes needs a SLURM
    allocation (``job``, from ``slurm_allocation``) of that many; a local run has one machine."""
    have = int(job.get("SLURM_JOB_NUM_NODES", "0"))
    if cell["nodes"] == 1 or have >= cell["nodes"]:
        return ""
    where = f"this SLURM job has {have}" if have else "this job runs outside SLURM"
    return (
        f"{cell['name']} runs on {cell['nodes']} nodes and {where}: run it with "
        f"--profile configs/profiles/slurm (or take nodes: out of its grid block)"
    )


def rank_launch(cell: dict[str, Any]) -> tuple[str, ...]:
    """``srun`` for a cell whose ranks are the job's tasks (launcher srun on several nodes), which
    the engine maps onto torch.distributed ranks; () where the engine starts its ranks itself (one
    node) or joins the Ray cluster it starts in the allocation (launcher ray)."""
    if cell["launcher"] != "srun":
        return ()
    res = cell["resources"]
    return (
        "srun",
        "--kill-on-bad-exit=1",
        f"--nodes={cell['nodes']}",
        f"--ntasks={res['tasks']}",
        f"--ntasks-per-node={res['tasks'] // cell['nodes']}",
        f"--cpus-per-task={res['cpus_per_task']}",
    )


def _step(path: Path) -> int:
    match = re.fullmatch(r"global_step_(\d+)", path.parent.name)
    return int(match.group(1)) if match else -1


def merge(
    cell: dict[str, Any],
    status_path: str,
    out: str,
    log: str,
    threads: int,
    container: engine.Container | engine.Virtualenv | None,
) -> None:
    """Merge the cell's last checkpoint into a Hugging Face folder, natively or in ``container``;
    write the outcome to ``out``."""
    run_dir = Path(status_path).parent
    actors = sorted(run_dir.glob("global_step_*/actor"), key=_step)
    trained = read_status(status_path)["status"]
    if trained != "ok":
        result = {"status": "skipped", "reason": f"training {trained}"}
    elif not actors:
        result = {"status": "failed", "reason": f"no global_step_*/actor under {run_dir}"}
    else:
        code = engine.run(["merge", "--local_dir", str(actors[-1]), "--verify"], log, threads, container)
        result = {
            "status": "ok" if code == 0 else "failed",
            "exit_code": code,
            "checkpoint": str(actors[-1]),
            "error_tail": "" if code == 0 else tail(log),
        }
    write_atomic(out, json.dumps({**result, "finished": _now()}, indent=2))
