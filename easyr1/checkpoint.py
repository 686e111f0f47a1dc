"""Sharded checkpoints that survive crashes and resume exactly (their export to Hugging Face format:
``easyr1.export``).

Layout (EasyR1's), under ``trainer.save_checkpoint_path``::

    global_step_N/
      actor/                DCP shards of {"model", "optimizer", "scheduler"} (only "model": save_model_only)
        huggingface/        config, generation config, tokenizer and processor files (no weights)
        adapter_config.json only for a peft (LoRA) actor
      critic/               likewise, when there is a critic
      trainer_state.json    step, data-loader position, KL coefficient, metrics, ... (the caller's dict)
      rng_rank{r}.pt        python, numpy, torch CPU (and CUDA) generator states of rank r, as plain
                            tensors and numbers (loaded with ``weights_only=True``: no code runs)
      checkpoint_complete.json  the completion marker, written last, with a CRC-32 of each file resuming reads
    latest_checkpointed_iteration.txt

Every rank writes into ``global_step_N.tmp``; rank 0 writes the marker last and only then renames
the folder, so a ``global_step_N`` folder is complete or absent. A staging folder holds the engine's
staging file (``STAGING``) while it is one: pruning deletes checkpoints and such folders only, never
a user's ``global_step_N.old`` backup, and never through a symbolic link; a ``global_step_N`` that is
a link is refused on resume (pruning or saving its step again would reach outside the run folder).
A folder that still lacks its marker, whose shards do not match their metadata, or whose files do
not match their checksums (corrupted in place, same size) is reported and skipped on resume. A save
that fails (a full disk is named as such) fails on every rank alike and removes what it wrote.
DCP stores tensors by name and global shape, so a checkpoint written by W ranks loads on any
other number of ranks (the shards are resharded on load); its files are read through
``easyr1.safe_dcp``, so that none can run code.

Longer than 600 lines, on purpose: save, the checks that resuming and merging run, load and prune
all lean on the same conventions (staging folders and their file, the marker and its checksums,
failures every rank sees alike), which a split would scatter over modules that import each other's
private names.
"""

from __future__ import annotations

import errno
import json
import os
import pickle
import random
import re
import shutil
import socket
import sys
import time
import traceback
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.tensor import DTensor
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from easyr1.files import WEIGHT_SUFFIXES, is_weight_file
from easyr1.safe_dcp import RefusedPickle, SafeReader, WeightsOnlyPlanner, read_metadata, refusal

MARKER = "checkpoint_complete.json"
TRAINER_STATE = "trainer_state.json"
LATEST = "latest_checkpointed_iteration.txt"
# In the folders a save stages in (global_step_N.tmp, and .old while a step is saved again), never in a
# checkpoint: what proves that the engine made them, so that pruning deletes no one else's folder.
STAGING = "easyr1_staging.json"
HF_DIR = "huggingface"
ADAPTER_CONFIG = "adapter_config.json"
_STEP_DIR = re.compile(r"^global_step_(\d+)$")
# Written from the model itself; everything else in a model folder (tokenizer, processor) is copied.
MODEL_FILES = ("config.json", "generation_config.json")
_CHUNK = 1 << 23  # checksums stream files in 8 MiB reads


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete or does not fit the model; the message names the folder."""


# ------------------------------------------------------------------------------ ranks


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _world() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _from_rank0(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank, so that all ranks act on the same list."""
    if not dist.is_initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _merged_over_ranks(part: dict[str, Any]) -> dict[str, Any]:
    """The union of every rank's ``part``, on every rank."""
    if not dist.is_initialized():
        return part
    parts: list[dict[str, Any]] = [{} for _ in range(_world())]
    dist.all_gather_object(parts, part)
    return {key: value for each in parts for key, value in each.items()}


def _report(path: Path, why: str) -> None:
    if _rank() == 0:
        print(f"[checkpoint] skipping {path}: {why}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------ files


def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"global_step_{step}"


def _mark_staging(folder: Path, step: int) -> None:
    (folder / STAGING).write_text(
        json.dumps({"step": step, "pid": os.getpid(), "host": socket.gethostname()})
    )


def _is_staging(folder: Path) -> bool:
    """A folder a save of this engine staged in: a folder (not a link) holding the staging file."""
    return folder.is_dir() and not folder.is_symlink() and (folder / STAGING).is_file()


def _remove(folder: Path, why: str) -> None:
    """Delete a folder the engine wrote (never a link: the caller checked), and say so."""
    shutil.rmtree(folder)
    _note(f"removed {folder} ({why})")


def _local_model_dir(source: str | Path) -> Path:
    """A model folder on disk; a hub id resolves to its cached snapshot (config and tokenizer files only)."""
    if Path(source).is_dir():
        return Path(source)
    from huggingface_hub import snapshot_download

    patterns = ["*" + s for s in WEIGHT_SUFFIXES] + ["*.index.json"]
    return Path(snapshot_download(str(source), ignore_patterns=patterns))


def copy_model_files(source: Path, dest: Path, *, skip: tuple[str, ...] = ()) -> None:
    """Copy a model folder's small files (tokenizer, processor, configs), never its weights."""
    dest.mkdir(parents=True, exist_ok=True)
    for file in sorted(source.iterdir()):
        if file.is_file() and not is_weight_file(file.name) and file.name not in skip:
            shutil.copy2(file, dest / file.name)


def _write_hf_files(
    model: nn.Module, dest: Path, hf_source: str | Path, tokenizer_source: str | Path | None
) -> None:
    """Everything ``merge`` needs besides the weights: the live model's config (it describes the saved
    tensors), the source's generation config and tokenizer/processor files, and a LoRA adapter config."""
    copy_model_files(_local_model_dir(hf_source), dest / HF_DIR)
    if tokenizer_source is not None:
        copy_model_files(_local_model_dir(tokenizer_source), dest / HF_DIR, skip=MODEL_FILES)
    config = getattr(model, "config", None)
    if hasattr(config, "save_pretrained"):
        config.save_pretrained(dest / HF_DIR)
    peft_config = getattr(model, "peft_config", None)
    if peft_config:
        peft_config[model.active_adapter].save_pretrained(dest)  # writes dest/adapter_config.json


# ------------------------------------------------------------------------------ RNG


def _rng_state() -> dict[str, Any]:
    """Every generator's state as tensors, numbers and strings only: what ``torch.load(...,
    weights_only=True)`` reads back, so loading a checkpoint never unpickles arbitrary objects (code)."""
    name, keys, position, has_gauss, cached_gauss = np.random.get_state()
    return {
        "python": random.getstate(),  # (version, tuple of 625 ints, gauss or None)
        "numpy": [name, torch.from_numpy(keys.astype(np.int64)), position, has_gauss, cached_gauss],
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
    }


def _set_rng_state(state: dict[str, Any]) -> None:
    version, words, gauss = state["python"]
    random.setstate((version, tuple(words), gauss))
    name, keys, position, has_gauss, cached_gauss = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), position, has_gauss, cached_gauss))
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _read_rng_state(file: Path) -> dict[str, Any] | None:
    """The generator states in ``file``, or None (with a note) when it holds anything but tensors and
    numbers: a checkpoint from before this format, or a file made to run code when unpickled."""
    try:
        return torch.load(file, weights_only=True)
    except pickle.UnpicklingError as exc:
        print(
            f"[checkpoint] random generators not restored: {file} was refused by a weights-only load "
            f"({refusal(exc)}); the run continues, not bit-identically",
            file=sys.stderr,
            flush=True,
        )
        return None


# ------------------------------------------------------------------------------ checksums
# CRC-32 (zlib's, in the standard library) because the threat is accidental damage (a bad disk, a
# copy that went wrong), which it detects like any hash, and it streams several times faster
# than a cryptographic hash: checkpoints of large models are read in full at every save and resume.
# It is no defence against deliberate tampering; loading is made safe by easyr1.safe_dcp (allow-listed
# metadata, weights-only values) and weights-only RNG files.


def _crc32(file: Path) -> str | None:
    """The file's CRC-32 as 8 hex digits, read in chunks; None if it cannot be read."""
    crc = 0
    try:
        with file.open("rb") as stream:
            while chunk := stream.read(_CHUNK):
                crc = zlib.crc32(chunk, crc)
    except OSError:
        return None
    return f"{crc:08x}"


def _checksums(folder: Path, names: list[str]) -> dict[str, str | None]:
    """CRC-32 of each of ``names`` (paths relative to ``folder``), on every rank. Each rank reads its
    own share of the files, so a checkpoint is read once in all, in parallel. Collective when a
    process group exists: every rank calls it with the same ``names``."""
    return _merged_over_ranks({name: _crc32(folder / name) for name in names[_rank() :: _world()]})


def _resume_files(folder: Path) -> list[str]:
    """The files of a checkpoint that resuming reads, relative to it, sorted, as rank 0 sees them: all
    but the components' ``huggingface/`` folders, into which ``merge`` writes its output, and the
    staging file, removed before the folder becomes a checkpoint."""
    found = None
    if _rank() == 0:
        names = (p.relative_to(folder).parts for p in folder.rglob("*") if p.is_file())
        found = sorted("/".join(parts) for parts in names if parts[1:2] != (HF_DIR,) and parts != (STAGING,))
    return _from_rank0(found)


def _checksum_problem(path: Path, recorded: dict[str, str]) -> str | None:
    """The first file of ``path`` that is unreadable or no longer matches its recorded CRC-32."""
    current = _checksums(path, sorted(recorded))
    for name, crc in sorted(recorded.items()):
        if current[name] is None:
            return f"{name} is missing or unreadable"
        if current[name] != crc:
            return f"{name} does not match its checksum (crc32 {crc} when saved, {current[name]} now): it changed after the save"
    return None


# ------------------------------------------------------------------------------ errors of torch.distributed.checkpoint


def _failure_summary(exc: BaseException) -> str:
    """One line per distinct failure: DCP wraps each rank's exception, with its whole traceback, in a
    ``CheckpointException`` (a ``BaseException``, so ``except Exception`` misses it)."""
    if isinstance(exc, CheckpointException):
        errors = [error for error, _ in exc.failures.values()]
    else:
        errors = [exc]
    lines = ("".join(traceback.format_exception_only(type(e), e)).strip() for e in errors)
    return "; ".join(dict.fromkeys(lines))


def _interrupted(exc: BaseException) -> bool:
    """A KeyboardInterrupt that DCP caught on this rank and wrapped with the ranks' other failures."""
    return isinstance(exc, CheckpointException) and any(
        isinstance(error, KeyboardInterrupt) for error, _ in exc.failures.values()
    )


def _some(keys: list[str], limit: int = 3) -> str:
    more = f" and {len(keys) - limit} more" if len(keys) > limit else ""
    return ", ".join(keys[:limit]) + more


def _model_mismatch(component: Path, model_state: dict[str, Any]) -> list[str]:
    """How the saved model tensors differ from the model's (names, shapes), in a few lines: a checkpoint
    of another architecture, size or LoRA setting."""
    saved = {
        key[len("model.") :]: list(meta.size)
        for key, meta in _read_metadata(component).state_dict_metadata.items()
        if key.startswith("model.") and isinstance(meta, TensorStorageMetadata)
    }
    wanted = {key: list(value.shape) for key, value in model_state.items() if isinstance(value, torch.Tensor)}
    missing, unexpected = sorted(wanted.keys() - saved.keys()), sorted(saved.keys() - wanted.keys())
    reshaped = sorted(key for key in wanted.keys() & saved.keys() if wanted[key] != saved[key])
    lines = []
    if missing:
        lines.append(f"{len(missing)} tensors of the model are not in the checkpoint: {_some(missing)}")
    if unexpected:
        lines.append(f"{len(unexpected)} tensors of the checkpoint are not in the model: {_some(unexpected)}")
    if reshaped:
        shapes = [f"{key} (saved {saved[key]}, model {wanted[key]})" for key in reshaped]
        lines.append(f"{len(reshaped)} tensors differ in shape: {_some(shapes)}")
    return lines


# ------------------------------------------------------------------------------ save


def _component_state(
    model: nn.Module, optimizer: Optimizer | None, scheduler: LRScheduler | None
) -> dict[str, Any]:
    """Sharded (DTensor) state dicts keyed by parameter name; the LR schedule rides along as small objects."""
    if optimizer is None:
        return {"model": get_model_state_dict(model)}
    model_state, optim_state = get_state_dict(model, optimizer)
    state: dict[str, Any] = {"model": model_state, "optimizer": optim_state}
    if scheduler is not None:
        state["scheduler"] = scheduler.state_dict()
    return state


def _foreign_in_the_way(final: Path, tmp: Path, old: Path) -> str | None:
    """Why a save of ``final`` would have to replace or write through something the engine did not
    make: a link, or a staging name (``.tmp``, ``.old``) without the engine's staging file."""
    if final.is_symlink():
        return f"{final} is a symbolic link (to {os.readlink(final)}), which the engine neither writes through nor removes; move it away"
    for folder in (tmp, old) if final.exists() else (tmp,):
        if (folder.exists() or folder.is_symlink()) and not _is_staging(folder):
            return f"{folder} is in the way and was not written by this engine (no {STAGING} in it); move it away"
    return None


def save_checkpoint(
    root: str | Path,
    step: int,
    *,
    models: Mapping[str, nn.Module],
    optimizers: Mapping[str, Optimizer],
    schedulers: Mapping[str, LRScheduler],
    trainer_state: dict[str, Any],
    hf_source: str | Path,
    tokenizer_source: str | Path | None = None,
    model_only: bool = False,
) -> Path:
    """Write ``root/global_step_{step}`` atomically; every rank calls this. Returns the folder.

    ``models`` maps a component name ("actor", "critic") to its (FSDP-sharded) module; the optimizer
    and scheduler of the same name are saved with it unless ``model_only``. ``hf_source`` is the
    model folder (or hub id) the run started from; ``tokenizer_source`` a separate tokenizer folder.
    """
    try:
        state_text = json.dumps({"step": step, **trainer_state}, indent=2, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"trainer_state for step {step} is not JSON-serializable: {exc}") from exc
    rng = _rng_state()  # before anything below could draw from a generator
    final = step_dir(root, step)
    tmp, old = final.with_name(final.name + ".tmp"), final.with_name(final.name + ".old")
    problem = _from_rank0(_foreign_in_the_way(final, tmp, old) if _rank() == 0 else None)
    if problem is not None:
        raise CheckpointError(f"cannot save step {step}: {problem}")
    states = {
        name: _component_state(
            model, None if model_only else optimizers.get(name), None if model_only else schedulers.get(name)
        )
        for name, model in models.items()
    }
    # What the save writes on all ranks (rank 0 also copies the model's small files into each
    # component) and the room there was: what a full disk's message says.
    written = _tensor_bytes([states, rng])
    if _rank() == 0:
        written += len(state_text) + len(models) * _model_files_bytes(hf_source, tokenizer_source)
    needed = sum(_merged_over_ranks({_rank(): written}).values())
    space = _Space(step, tmp, needed=needed, free=free_bytes(Path(root)))

    def stage() -> None:
        if tmp.exists():
            _remove(tmp, "an unfinished save of the same step")
        tmp.mkdir(parents=True)
        try:
            _mark_staging(tmp, step)
        except OSError:
            shutil.rmtree(tmp)  # just made: no staging folder is left without the file that proves it ours
            raise

    space.written_by_all(stage if _rank() == 0 else None, tmp)  # every rank waits for the folder
    for name, state in states.items():
        try:
            dcp.save(state, checkpoint_id=tmp / name)
        except (Exception, CheckpointException) as exc:
            if _interrupted(
                exc
            ):  # Ctrl-C during the save stops the run as anywhere else: the last checkpoint stands
                raise KeyboardInterrupt from None
            space.fail(space.failure(exc, tmp / name))  # DCP failed on every rank alike

    def write_files() -> None:
        torch.save(rng, tmp / f"rng_rank{_rank()}.pt")
        if _rank() == 0:
            for name, model in models.items():
                _write_hf_files(model, tmp / name, hf_source, tokenizer_source)
            (tmp / TRAINER_STATE).write_text(state_text)

    space.written_by_all(write_files, tmp)  # every rank's shards and RNG file are on disk
    crc32 = _checksums(tmp, _resume_files(tmp))

    def finish() -> None:
        marker = {
            "step": step,
            "world_size": _world(),
            "components": sorted(models),
            "model_only": model_only,
            "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "torch": torch.__version__,
            "crc32": dict(sorted(crc32.items())),
        }
        (tmp / MARKER).write_text(json.dumps(marker, indent=2))
        (tmp / STAGING).unlink()  # a checkpoint holds none: a copy of it is the user's, not the engine's
        if final.exists():  # the same step saved again (e.g. after resuming from an earlier step)
            if old.exists():
                _remove(old, "left by an earlier save of the same step")
            _mark_staging(final, step)
            os.rename(final, old)
            os.rename(tmp, final)
            _remove(old, f"step {step} saved again: its earlier save")
        else:
            os.rename(tmp, final)
        latest = Path(root) / LATEST
        latest.with_name(LATEST + ".tmp").write_text(str(step))
        os.replace(latest.with_name(LATEST + ".tmp"), latest)

    space.written_by_all(finish if _rank() == 0 else None, tmp)
    return final


# ------------------------------------------------------------------------------ a full disk


def _tensor_bytes(obj: Any) -> int:
    """Bytes of the tensors in a nested state (this rank's shard of a sharded one)."""
    if isinstance(obj, DTensor):
        obj = obj.to_local()
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, Mapping):
        return sum(_tensor_bytes(value) for value in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(value) for value in obj)
    return 0


def _model_files_bytes(*sources: str | Path | None) -> int:
    """Bytes of the files ``_write_hf_files`` copies into each component (configs, tokenizer)."""
    folders = [_local_model_dir(source) for source in sources if source is not None]
    return sum(
        f.stat().st_size
        for folder in folders
        for f in folder.iterdir()
        if f.is_file() and not is_weight_file(f.name)
    )


def free_bytes(path: Path) -> int | None:
    """Free bytes on the file system of ``path`` (or of its nearest existing parent)."""
    for folder in (path, *path.absolute().parents):
        if folder.exists():
            try:
                return shutil.disk_usage(folder).free
            except OSError:
                return None
    return None


def size_text(n: int | None) -> str:
    if n is None:
        return "an unknown amount"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def no_space(exc: BaseException, where: Path, needed: int) -> bool:
    """Whether ``exc`` comes from a full disk (or a full quota): an ENOSPC or EDQUOT among its errors,
    or a write that stopped short (torch's zip writer then says only "unexpected pos") where the file
    system has less room left than the write needed."""
    errors = [error for error, _ in exc.failures.values()] if isinstance(exc, CheckpointException) else [exc]
    chained = [e for error in errors for e in (error, error.__cause__, error.__context__) if e is not None]
    if any(
        isinstance(e, OSError)
        and e.errno in (errno.ENOSPC, errno.EDQUOT)
        or "No space left on device" in str(e)
        for e in chained
    ):
        return True
    free = free_bytes(where)
    return free is not None and free < needed


class _Space:
    """One save's bookkeeping for failed writes: what it needs and had, and the collective stop."""

    def __init__(self, step: int, tmp: Path, *, needed: int, free: int | None):
        self.step, self.tmp, self.needed, self.free = step, tmp, needed, free

    def failure(self, exc: BaseException, where: Path) -> str:
        if no_space(exc, where, self.needed):
            return (
                f"no space left on {where}: the checkpoint needs about {size_text(self.needed)}, and "
                f"{size_text(self.free)} were free when its save started"
            )
        return f"cannot write {where}: {_failure_summary(exc)}"

    def fail(self, why: str) -> None:
        """Every rank stops with ``why``; rank 0 first removes the staging folder, freeing its space.
        The checkpoints saved before are not touched. Collective."""
        _barrier()  # no rank writes into the staging folder any more
        if _rank() == 0 and _is_staging(self.tmp):
            _remove(self.tmp, "the failed save")
        raise CheckpointError(f"cannot save step {self.step}: {why}; the checkpoints saved before are kept")

    def written_by_all(self, write: Callable[[], None] | None, where: Path) -> None:
        """Run this rank's ``write`` (None: nothing to write); when it fails on any rank, every rank
        stops with the first rank's reason. Collective: a barrier."""
        why = None
        try:
            if write is not None:
                write()
        except (OSError, RuntimeError) as exc:  # torch.save's zip writer raises RuntimeError
            why = self.failure(exc, where)
        failures = _merged_over_ranks({_rank(): why})
        first = next((failures[rank] for rank in sorted(failures) if failures[rank] is not None), None)
        if first is not None:
            self.fail(first)


# ------------------------------------------------------------------------------ check and find


def _read_metadata(component: Path) -> Metadata:
    return read_metadata(component / ".metadata")  # through an allow-list: no code runs


def _shard_problem(component: Path) -> str | None:
    """Every shard file that the metadata names must exist and be long enough (catches truncation)."""
    if not (component / ".metadata").is_file():
        return f"{component.name}/.metadata is missing"
    try:
        metadata = _read_metadata(component)
    except RefusedPickle as exc:
        return str(exc)
    except Exception as exc:  # a truncated pickle raises anything
        return f"{component.name}/.metadata is unreadable ({type(exc).__name__}: {exc})"
    needed: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
    for relative, size in sorted(needed.items()):
        file = component / relative
        if not file.is_file():
            return f"shard {component.name}/{relative} is missing"
        if file.stat().st_size < size:
            return f"shard {component.name}/{relative} is truncated ({file.stat().st_size} of {size} bytes)"
    return None


# The per-rank files of a checkpoint EasyR1 itself wrote (FSDP1's), which this engine does not read.
EASYR1_SHARDS = "model_world_size_*_rank_*.pt"


def checkpoint_problem(path: str | Path) -> str | None:
    """Why ``path`` cannot be resumed from, or None when it is complete and every file matches the
    checksum its marker recorded (markers written before checksums existed have none to compare).
    Collective when a process group exists: every rank calls it."""
    path = Path(path)
    if not (path / MARKER).is_file():
        if next(path.glob(f"*/{EASYR1_SHARDS}"), None) is not None:
            return "a checkpoint of EasyR1 itself (FSDP1's per-rank files), which this engine does not read"
        return f"no completion marker ({MARKER}): the save did not finish"
    try:
        marker = json.loads((path / MARKER).read_text())
    except (OSError, ValueError) as exc:
        return f"unreadable {MARKER} ({exc})"
    try:
        json.loads((path / TRAINER_STATE).read_text())
    except (OSError, ValueError) as exc:
        return f"unreadable {TRAINER_STATE} ({exc})"
    for name in marker["components"]:
        problem = _shard_problem(path / name)
        if problem is not None:
            return problem
    for rank in range(marker["world_size"]):
        if not (path / f"rng_rank{rank}.pt").is_file():
            return f"rng_rank{rank}.pt is missing"
    return _checksum_problem(path, marker.get("crc32", {}))


def _step_dirs(root: Path) -> list[tuple[int, Path]]:
    """The ``global_step_N`` folders of ``root`` by step; symbolic links are none (``_linked_steps``)."""
    if not root.is_dir():
        return []
    found = [
        (int(m.group(1)), p)
        for p in root.iterdir()
        if p.is_dir() and not p.is_symlink() and (m := _STEP_DIR.match(p.name))
    ]
    return sorted(found)


def _linked_steps(root: Path) -> list[Path]:
    return (
        sorted(p for p in root.iterdir() if p.is_symlink() and _STEP_DIR.match(p.name))
        if root.is_dir()
        else []
    )


def find_last_checkpoint(root: str | Path) -> Path | None:
    """The newest complete ``global_step_N`` under ``root`` (None when there is none at all);
    incomplete or corrupted ones are reported and skipped. When there are some but none is usable,
    a CheckpointError lists them: starting over would overwrite them, and what made them unreadable
    may be passing (a shared file system, a requeue), so the user decides. ``global_step_N.tmp``
    folders (saves that never finished) are no checkpoints. Every rank calls it (see
    ``checkpoint_problem``).

    A ``global_step_N`` that is a symbolic link is refused, not followed: the run would prune it or
    save its step again, deleting or replacing what the link points to, outside the run folder."""
    root = Path(root)
    linked = _linked_steps(root)
    if linked:
        listed = "".join(f"\n  {path} -> {os.readlink(path)}" for path in linked)
        raise CheckpointError(
            f"{root} holds checkpoint folders that are symbolic links, which the engine does not resume "
            f"through (pruning or saving the step again would delete or replace what they point to):{listed}\n"
            "Put the folder itself in the link's place, or remove the link; to resume from it all the "
            "same, pass it as trainer.load_checkpoint_path."
        )
    if root.is_dir():
        for unfinished in sorted(root.glob("global_step_*.tmp")):
            if _is_staging(
                unfinished
            ):  # a folder of that name that the engine did not write is no save of its own
                _report(unfinished, "an unfinished save (never renamed)")
    skipped: list[tuple[Path, str]] = []
    for _, path in reversed(_step_dirs(root)):
        problem = checkpoint_problem(path)
        if problem is None:
            for damaged, why in skipped:
                _report(damaged, why)
            return path
        skipped.append((path, problem))
    if skipped:
        listed = "".join(f"\n  {path.name}: {why}" for path, why in reversed(skipped))
        raise CheckpointError(
            f"{root} holds checkpoints but none can be resumed from:{listed}\n"
            "Starting over would overwrite them. Delete them, or set trainer.find_last_checkpoint=false "
            "(or another trainer.save_checkpoint_path), to start over."
        )
    return None


# ------------------------------------------------------------------------------ load


def _saved_keys(component: Path) -> set[str]:
    """Top-level entries of a component's DCP state ("model", "optimizer", "scheduler")."""
    return {key.split(".", 1)[0] for key in _read_metadata(component).state_dict_metadata}


def load_checkpoint(
    path: str | Path,
    *,
    models: Mapping[str, nn.Module],
    optimizers: Mapping[str, Optimizer],
    schedulers: Mapping[str, LRScheduler],
) -> dict[str, Any]:
    """Load ``path`` (a ``global_step_N`` folder) into the given objects on every rank; returns the
    trainer state. RNG states are restored when the world size is the one that saved them."""
    path = Path(path)
    problem = checkpoint_problem(path)
    if problem is not None:
        raise CheckpointError(f"cannot resume from {path}: {problem}")
    marker = json.loads((path / MARKER).read_text())
    for name, model in models.items():
        component = path / name
        if name not in marker["components"]:
            held = ", ".join(marker["components"])
            raise CheckpointError(f"{path} has no {name!r} component (it holds {held})")
        saved = _saved_keys(component)
        optimizer, scheduler = optimizers.get(name), schedulers.get(name)
        if optimizer is not None and "optimizer" not in saved:
            _note(
                f"{component} holds the model only (save_model_only): the {name} optimizer and LR schedule "
                "start fresh"
            )
            optimizer = scheduler = None
        state = _component_state(model, optimizer, scheduler if "scheduler" in saved else None)
        try:
            dcp.load(state, storage_reader=SafeReader(component), planner=WeightsOnlyPlanner())
        except (Exception, CheckpointException) as exc:
            raise CheckpointError(_load_failure(component, state["model"], exc)) from None
        if optimizer is None:
            set_model_state_dict(model, state["model"])
        else:
            set_state_dict(
                model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"]
            )
        if "scheduler" in state:
            scheduler.load_state_dict(state["scheduler"])
    if marker["world_size"] == _world():
        rng = _read_rng_state(path / f"rng_rank{_rank()}.pt")
        if rng is not None:
            _set_rng_state(rng)
    else:
        _note(
            f"{path} was saved by {marker['world_size']} ranks and is resumed on {_world()}: model and "
            "optimizer are resharded, random generators are not restored (the run continues, not "
            "bit-identically)"
        )
    return json.loads((path / TRAINER_STATE).read_text())


def _load_failure(component: Path, model_state: dict[str, Any], exc: BaseException) -> str:
    """What to tell the user instead of DCP's traceback (one per rank, ~150 lines): the folder, and how
    its model differs from the one being resumed, or else each distinct failure in one line."""
    mismatch = _model_mismatch(component, model_state)
    if mismatch:
        return (
            f"cannot load {component}: it was saved from another model (architecture, size or LoRA "
            "setting) than the one configured:\n  " + "\n  ".join(mismatch)
        )
    return f"cannot load {component}: {_failure_summary(exc)}"


def _note(message: str) -> None:
    if _rank() == 0:
        print(f"[checkpoint] {message}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------ prune


def component_problem(component: Path) -> str | None:
    """Why the component ``global_step_N/NAME`` cannot be merged: its checkpoint's save did not
    finish, or a file of its own is missing, truncated, or no longer what was saved."""
    folder = component.parent
    try:
        marker = json.loads((folder / MARKER).read_text())
    except FileNotFoundError:
        return f"no completion marker ({folder / MARKER}): the save did not finish"
    except (OSError, ValueError) as exc:
        return f"unreadable {folder / MARKER} ({exc})"
    prefix = f"{component.name}/"
    own = {name: crc for name, crc in marker.get("crc32", {}).items() if name.startswith(prefix)}
    return _shard_problem(component) or _checksum_problem(folder, own)


# The validation metric that picks the best checkpoint kept beside the newest ``save_limit``, as
# EasyR1's ``best_val_reward_score``. Checkpoints written before 2026-12-06 hold it as ``val/overall``.
BEST_METRIC = "val/reward_score"
_EARLIER_NAMES = {BEST_METRIC: "val/overall"}


def best_checkpoint(root: str | Path, metric: str, *, higher_is_better: bool = True) -> Path | None:
    """The complete checkpoint whose ``trainer_state["metrics"][metric]`` is best (None if none has it)."""
    scored = []
    for step, path in _step_dirs(Path(root)):
        if not (path / MARKER).is_file():
            continue
        try:
            metrics = json.loads((path / TRAINER_STATE).read_text()).get("metrics", {})
        except (OSError, ValueError) as exc:  # resuming skips it too; it must not stop every later save
            _report(path, f"unreadable {TRAINER_STATE} ({exc}), not a candidate for the best checkpoint")
            continue
        value = metrics.get(metric, metrics.get(_EARLIER_NAMES.get(metric, metric)))
        if isinstance(value, (int, float)):
            scored.append((value if higher_is_better else -value, step, path))
    return max(scored)[2] if scored else None


_kept_said: set[Path] = set()  # the folders pruning keeps that are not its own, said once each


def prune_checkpoints(root: str | Path, save_limit: int, keep: Path | None = None) -> list[Path]:
    """Delete all but the newest ``save_limit`` complete checkpoints and ``keep`` (e.g. the best one),
    plus the engine's staging folders left by saves that did not finish; each removed path is said.
    Deletes only what the engine provably wrote (a checkpoint with its completion marker, a staging
    folder with its staging file), never through a symbolic link. Rank 0 deletes; call it on every
    rank after ``save_checkpoint``."""
    root = Path(root)
    if save_limit <= 0 or _rank() != 0:
        return []
    complete = [path for _, path in _step_dirs(root) if (path / MARKER).is_file()]
    kept = set(complete[-save_limit:]) | ({Path(keep)} if keep is not None else set())
    staged = sorted(root.glob("global_step_*.tmp")) + sorted(root.glob("global_step_*.old"))
    for path in [*_linked_steps(root), *(path for path in staged if not _is_staging(path))]:
        if path not in _kept_said:
            _kept_said.add(path)
            what = (
                f"a symbolic link (to {os.readlink(path)})"
                if path.is_symlink()
                else f"not written by this engine (no {STAGING})"
            )
            _note(f"pruning keeps {path}: {what}")
    removed = []
    for path in complete:
        if path not in kept:
            _remove(path, f"older than the newest {save_limit} (trainer.save_limit) and not the best")
            removed.append(path)
    for path in staged:
        if _is_staging(path):
            _remove(path, "an unfinished save")
            removed.append(path)
    return removed
