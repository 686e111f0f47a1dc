"""One run per run folder: an exclusive lock on ``run.lock`` in it, held for the run's life.

Two runs writing one folder would interleave their ``metrics.jsonl`` and resume from each other's
checkpoints. Rank 0 takes the lock (an ``flock`` on the file, which records its pid, host and
start) as the run begins, before any model loads, whichever way the ranks were started (the local
launcher, torchrun, srun, Ray): only rank 0 exists in every one of them. The kernel releases it when
the process ends, however it ends, so a lock left by a run that died is free: it is taken over, and
said. A run that finds the lock held is refused with the holder's pid and host. A file system
without locks (some Lustre mounts) gets a warning and no lock.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
import time
from pathlib import Path

try:
    import fcntl
except ImportError:  # not a POSIX system: no lock to take
    fcntl = None  # type: ignore[assignment]

LOCK_FILE = "run.lock"
_NO_LOCKS = (errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOLCK)  # a file system that does not lock

log = logging.getLogger(__name__)


class RunFolderBusy(RuntimeError):
    """Another live process holds the run folder's lock."""


def _holder(text: str) -> str:
    try:
        info = json.loads(text)
        return f"pid {info['pid']} on host {info['host']}, started {info['started']}"
    except (ValueError, KeyError, TypeError):
        return "a process that left no readable pid"


class RunLock:
    """The lock of ``folder`` (created if missing), taken now; ``release`` gives it back."""

    def __init__(self, folder: Path) -> None:
        self.path = Path(folder) / LOCK_FILE
        self.fd: int | None = None
        self.created = not self.path.parent.exists()  # removed again at release if the run wrote nothing
        if fcntl is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                held = os.pread(fd, 4096, 0).decode("utf-8", "replace")
                os.close(fd)
                raise RunFolderBusy(
                    f"{self.path.parent}: another run is using this folder ({_holder(held)}; {self.path}); "
                    "wait for it to end or stop it, or give this run another trainer.save_checkpoint_path"
                ) from None
            except OSError as exc:
                os.close(fd)
                if exc.errno not in _NO_LOCKS:
                    raise
                log.warning(
                    "%s: the file system takes no locks (%s): a second run into this folder would not be refused",
                    self.path,
                    exc.strerror,
                )
                return
            # The file may have been removed by its holder between our open and our lock: then the
            # lock is on a name no one else sees, and the next open finds the current file.
            if os.path.exists(self.path) and os.path.samestat(os.fstat(fd), os.stat(self.path)):
                break
            os.close(fd)
        left = os.pread(fd, 4096, 0).decode("utf-8", "replace")
        if left.strip():  # a holder that ended without releasing: killed, or its machine lost
            log.warning("%s: taking over the lock of %s, which is gone", self.path, _holder(left))
        record = json.dumps(
            {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            }
        )
        os.ftruncate(fd, 0)
        os.pwrite(fd, (record + "\n").encode(), 0)
        self.fd = fd

    def release(self) -> None:
        """Remove the lock file and let go of the lock (in that order: no one can take a lock on a
        file that is about to disappear and believe it is the folder's); and the folder, when this
        run created it and left nothing in it (it stopped before it began, on a config error)."""
        if self.fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)
            if self.created and not any(self.path.parent.iterdir()):
                self.path.parent.rmdir()
        finally:
            os.close(self.fd)
            self.fd = None


def hold_run_folder(folder: Path, rank: int, world: int) -> RunLock | None:
    """Rank 0's lock of ``folder`` (None on the other ranks); ``RunFolderBusy`` on every rank when
    another run holds it, so that all stop with the same message."""
    import torch.distributed as dist

    lock, busy = None, None
    if rank == 0:
        try:
            lock = RunLock(folder)
        except RunFolderBusy as exc:
            busy = str(exc)
        except OSError:
            pass  # a folder it cannot create or write in: the trainer says so, naming the key
    if dist.is_initialized() and world > 1:
        box = [busy]
        dist.broadcast_object_list(box, src=0)
        busy = box[0]
    if busy is not None:
        raise RunFolderBusy(busy)
    return lock
