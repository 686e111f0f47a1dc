"""What a checkpoint folder (or the disk it is on) can do to a run, mostly in one process: no code runs from
its files, pruning deletes only what the engine wrote, a linked step folder is refused, and a full
disk is named as such with the last good checkpoint kept."""

from __future__ import annotations

import errno
import pickle
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from easyr1.checkpoint import (
    CheckpointError,
    find_last_checkpoint,
    load_checkpoint,
    prune_checkpoints,
    save_checkpoint,
    step_dir,
)
from easyr1.cli import main

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def _parts() -> dict[str, Any]:
    """A linear actor with AdamW and an LR schedule, one step trained, as save_checkpoint takes them."""
    model = nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (step + 1))
    model(torch.ones(2, 4)).sum().backward()
    optimizer.step()
    scheduler.step()
    return {
        "models": {"actor": model},
        "optimizers": {"actor": optimizer},
        "schedulers": {"actor": scheduler},
    }


_OPEN = f"{open.__module__}.{open.__qualname__}"  # how a pickle names the builtin open (io.open)


class _Payload:
    """Unpickling it opens (creates) ``flag``: code that a pickle in a checkpoint could run."""

    def __init__(self, flag: Path):
        self.flag = flag

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.flag), "w"))


# ------------------------------------------------------------------ no code from a checkpoint's files


def test_pickled_code_in_dcp_metadata_does_not_run(
    tmp_path: Path, tiny_model, capfd: pytest.CaptureFixture[str]
) -> None:
    """A component's .metadata replaced by a pickle that runs code: the scan for the last checkpoint
    skips it naming the file, resuming from it and merging it are refused, and the code never runs."""
    root, source, flag = tmp_path / "run", tiny_model("qwen2"), tmp_path / "code_ran"
    parts = _parts()
    save_checkpoint(root, 1, **parts, trainer_state={}, hf_source=source)
    path = save_checkpoint(root, 2, **parts, trainer_state={}, hf_source=source)
    metadata = path / "actor" / ".metadata"
    metadata.write_bytes(pickle.dumps(_Payload(flag)))

    assert find_last_checkpoint(root) == step_dir(root, 1)
    refused = f"{metadata} refers to {_OPEN}, which DCP metadata never holds: not loaded"
    assert f"skipping {path}: {refused}" in capfd.readouterr().err
    with pytest.raises(CheckpointError, match=re.escape(f"cannot resume from {path}: {refused}")):
        load_checkpoint(path, **_parts())
    assert main(["merge", "--local_dir", str(path / "actor")]) == 1
    assert f"easyr1 merge: {path / 'actor'}: {refused}" in capfd.readouterr().err
    assert not flag.exists()


def test_pickled_code_in_a_shard_does_not_run(tmp_path: Path, tiny_model) -> None:
    """A value that is not a tensor (here the LR schedule's position) pickled as code into a shard, with
    the marker's checksums matching: resuming refuses it, naming the value, and the code never runs."""
    parts, flag = _parts(), tmp_path / "code_ran"
    scheduler = parts["schedulers"]["actor"]
    state = scheduler.state_dict()
    scheduler.state_dict = lambda: {**state, "last_epoch": _Payload(flag)}
    path = save_checkpoint(tmp_path / "run", 1, **parts, trainer_state={}, hf_source=tiny_model("qwen2"))
    flag.unlink(missing_ok=True)  # DCP's save copies the state, which runs the payload here, not on load
    with pytest.raises(
        CheckpointError,
        match=rf"scheduler\.last_epoch was refused by a weights-only load \(it refers to {re.escape(_OPEN)}\)",
    ):
        load_checkpoint(path, **_parts())
    assert not flag.exists()


# ------------------------------------------------------------------ pruning deletes only what the engine wrote


def _crashed_save(
    root: Path, step: int, parts: dict[str, Any], source: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A save that stops as DCP writes (a Ctrl-C, here raised where it would arrive): it leaves its
    staging folder global_step_N.tmp, as a killed run does."""
    from torch.distributed.checkpoint import filesystem

    def interrupted(self: Any, plan: Any, planner: Any) -> Any:
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(filesystem.FileSystemWriter, "write_data", interrupted)
        with pytest.raises(KeyboardInterrupt):
            save_checkpoint(root, step, **parts, trainer_state={}, hf_source=source)


def test_pruning_deletes_only_what_the_engine_wrote(
    tmp_path: Path, tiny_model, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user's global_step_1.old (a renamed backup) and global_step_9.tmp, and a link with a staging
    name, are kept and said once; the engine's old checkpoints and its crashed save's staging folder
    are removed, each path named. A save that would have to replace a user's folder is refused."""
    root, source, parts = tmp_path / "run", tiny_model("qwen2"), _parts()
    backup, user_tmp, elsewhere = (
        root / "global_step_1.old",
        root / "global_step_9.tmp",
        tmp_path / "elsewhere",
    )
    for folder in (backup, user_tmp, elsewhere):
        folder.mkdir(parents=True)
        (folder / "notes.txt").write_text("mine")
    (root / "global_step_2.old").symlink_to(elsewhere)
    for step in range(1, 5):
        save_checkpoint(root, step, **parts, trainer_state={}, hf_source=source)
    _crashed_save(root, 5, parts, source, monkeypatch)
    capfd.readouterr()

    removed = prune_checkpoints(root, 2)
    assert [p.name for p in removed] == ["global_step_1", "global_step_2", "global_step_5.tmp"]
    for folder in (backup, user_tmp, elsewhere):
        assert (folder / "notes.txt").read_text() == "mine"
    assert (root / "global_step_2.old").is_symlink()
    assert sorted(p.name for p in root.glob("global_step_*")) == [
        "global_step_1.old",
        "global_step_2.old",
        "global_step_3",
        "global_step_4",
        "global_step_9.tmp",
    ]
    err = capfd.readouterr().err
    for step in (1, 2):
        assert (
            f"[checkpoint] removed {step_dir(root, step)} (older than the newest 2 (trainer.save_limit)"
            in err
        )
    assert f"[checkpoint] removed {root / 'global_step_5.tmp'} (an unfinished save)" in err
    assert f"[checkpoint] pruning keeps {backup}: not written by this engine" in err
    assert f"[checkpoint] pruning keeps {root / 'global_step_2.old'}: a symbolic link (to {elsewhere})" in err
    prune_checkpoints(root, 2)
    assert "pruning keeps" not in capfd.readouterr().err  # said once

    with pytest.raises(
        CheckpointError,
        match=f"cannot save step 9: {user_tmp} is in the way and was not written by this engine",
    ):
        save_checkpoint(root, 9, **parts, trainer_state={}, hf_source=source)
    save_checkpoint(root, 1, **parts, trainer_state={}, hf_source=source)
    with pytest.raises(CheckpointError, match=f"cannot save step 1: {backup} is in the way"):
        save_checkpoint(
            root, 1, **parts, trainer_state={}, hf_source=source
        )  # would replace global_step_1 via .old
    assert (backup / "notes.txt").read_text() == "mine" and (user_tmp / "notes.txt").read_text() == "mine"


# ------------------------------------------------------------------ a step folder that is a symbolic link


def test_a_linked_step_folder_is_refused_naming_it(
    tmp_path: Path, tiny_model, capfd: pytest.CaptureFixture[str]
) -> None:
    """global_step_3 linked to another run's checkpoint: the scan refuses it (before any model would
    load), naming the link and its target; pruning keeps it and what it points to; a save of its step
    refuses to replace it. No raw OSError anywhere."""
    root, other, source, parts = tmp_path / "run", tmp_path / "other", tiny_model("qwen2"), _parts()
    save_checkpoint(root, 1, **parts, trainer_state={}, hf_source=source)
    target = save_checkpoint(other, 2, **parts, trainer_state={}, hf_source=source)
    link = root / "global_step_3"
    link.symlink_to(target)
    with pytest.raises(
        CheckpointError, match=f"holds checkpoint folders that are symbolic links.*\n  {link} -> {target}\n"
    ):
        find_last_checkpoint(root)
    assert (
        load_checkpoint(link, **_parts())["step"] == 2
    )  # resuming from it on purpose: trainer.load_checkpoint_path
    save_checkpoint(root, 4, **parts, trainer_state={}, hf_source=source)
    assert prune_checkpoints(root, 1) == [step_dir(root, 1)]
    assert link.is_symlink() and (target / "checkpoint_complete.json").is_file()
    assert f"pruning keeps {link}: a symbolic link (to {target})" in capfd.readouterr().err
    with pytest.raises(
        CheckpointError, match=f"cannot save step 3: {link} is a symbolic link \\(to {target}\\)"
    ):
        save_checkpoint(root, 3, **parts, trainer_state={}, hf_source=source)
    assert (target / "checkpoint_complete.json").is_file()


# ------------------------------------------------------------------ a full disk


@pytest.fixture()
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A folder on a tmpfs of 8 MiB: a disk that really fills. Mounting one needs root; where the tests
    do not run as root a full disk cannot be made, and the test that needs one is skipped (the next
    one simulates the failure everywhere)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(disk)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"a full disk cannot be made here (mounting a small tmpfs: {done.stderr.strip()})")
    try:
        yield disk
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def _tiny_actor(source: Path) -> dict[str, Any]:
    """The tiny qwen2 model (about 0.5 MiB of fp32 weights) with AdamW, one step trained."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    ids = torch.arange(3, 15).reshape(1, 12)
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    return {
        "models": {"actor": model},
        "optimizers": {"actor": optimizer},
        "schedulers": {"actor": scheduler},
    }


def _leave_free(disk: Path, free: int) -> None:
    """Fill ``disk`` until ``free`` bytes are left."""
    (disk / "filler").unlink(missing_ok=True)
    (disk / "filler").write_bytes(b"\0" * (shutil.disk_usage(disk).free - free))


def test_a_full_disk_is_named_on_every_save_path(small_disk: Path, tiny_model) -> None:
    """A disk without room for the shards, then one with room for the shards but not for the RNG and
    model files, then a merge: each says "no space left on <path>" with what the save needed, removes
    what it wrote, and the checkpoint saved before stays complete and resumable."""
    from easyr1.checkpoint import checkpoint_problem
    from easyr1.export import merge_checkpoint

    root, source = small_disk / "run", tiny_model("qwen2")
    parts = _tiny_actor(source)
    first = save_checkpoint(root, 1, **parts, trainer_state={}, hf_source=source)
    page = 4096
    shards = sum(-(-f.stat().st_size // page) * page for f in (first / "actor").iterdir() if f.is_file())
    for step, free, where in ((2, shards // 2, "/actor"), (3, shards + 2 * page, "")):
        _leave_free(small_disk, free)
        with pytest.raises(CheckpointError) as failure:
            save_checkpoint(root, step, **parts, trainer_state={}, hf_source=source)
        tmp = root / f"global_step_{step}.tmp"
        assert re.fullmatch(
            rf"cannot save step {step}: no space left on {re.escape(str(tmp))}{where}: the checkpoint needs about "
            r"1\.\d MiB, and \d+\.\d [KM]iB were free when its save started; the checkpoints saved before are kept",
            str(failure.value),
        ), str(failure.value)
        assert not tmp.exists()
        assert find_last_checkpoint(root) == first and checkpoint_problem(first) is None

    _leave_free(small_disk, 64 * 1024)
    merged = small_disk / "merged"
    with pytest.raises(
        CheckpointError,
        match=(
            rf"^cannot write {merged}: no space left on {merged}: the merged model needs about \d+\.\d KiB, "
            r"and 64\.0 KiB were free when the merge started; nothing merged$"
        ),
    ):
        merge_checkpoint(first / "actor", merged)
    assert not merged.exists() and checkpoint_problem(first) is None


def test_a_save_cut_short_by_a_full_disk_says_so(
    tmp_path: Path, tiny_model, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch's zip writer reports a write that a full disk cut short only as "unexpected pos": with less
    room on the file system than the save needs, it is named a full disk. Simulated (the failing write
    and the room left are patched in), so that it runs where no small disk can be mounted."""
    from collections import namedtuple

    from torch.distributed.checkpoint import filesystem

    root, source, parts = tmp_path / "run", tiny_model("qwen2"), _parts()
    first = save_checkpoint(root, 1, **parts, trainer_state={}, hf_source=source)

    def cut_short(self: Any, plan: Any, planner: Any) -> Any:
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(filesystem.FileSystemWriter, "write_data", cut_short)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(1 << 20, (1 << 20) - 300, 300))
    tmp = root / "global_step_2.tmp"
    with pytest.raises(
        CheckpointError,
        match=(
            rf"^cannot save step 2: no space left on {tmp / 'actor'}: the checkpoint needs about \d+\.\d KiB, and "
            r"300 bytes were free when its save started; the checkpoints saved before are kept$"
        ),
    ):
        save_checkpoint(root, 2, **parts, trainer_state={}, hf_source=source)
    assert not tmp.exists() and find_last_checkpoint(root) == first


def test_a_run_on_a_linked_step_folder_stops_naming_it(tiny_model, arithmetic: Path, tmp_path: Path) -> None:
    """``easyr1 train`` in a run folder whose global_step_2 links elsewhere: every rank stops, before any
    model loads, with the link and its target named; no OSError, no traceback."""
    from tests.trainer_utils import run_train, tiny_config

    run_dir, elsewhere = tmp_path / "run", tmp_path / "elsewhere" / "global_step_2"
    run_dir.mkdir()
    elsewhere.mkdir(parents=True)
    (run_dir / "global_step_2").symlink_to(elsewhere)
    done = run_train(tiny_config(tiny_model("qwen2"), arithmetic, run_dir), tmp_path, timeout=300)
    assert done.returncode != 0
    assert f"\n  {run_dir / 'global_step_2'} -> {elsewhere}\n" in done.stderr, done.stderr[-3000:]
    assert (
        "Traceback" not in done.stderr
        and "OSError" not in done.stderr
        and "Loading weights" not in done.stderr
    )
    assert elsewhere.is_dir()


def _full_on_rank1(rank: int, port: int, root: str, source: str, out: str) -> None:
    """One rank of two: saves step 1, then step 2 with rank 1's RNG file meeting a full disk (ENOSPC,
    patched into torch.save: two ranks here share one disk, which cannot fill for one alone); writes
    what its save of step 2 ended with."""
    import torch.distributed as dist

    from tests.trainer_utils import end_rank, start_rank

    torch.set_num_threads(1)
    start_rank(rank, port, 2)
    parts = _parts()
    save_checkpoint(root, 1, **parts, trainer_state={}, hf_source=source)
    if rank == 1:
        save = torch.save

        def full(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
            if str(f).endswith("rng_rank1.pt"):
                raise OSError(errno.ENOSPC, "No space left on device", str(f))
            save(obj, f, *args, **kwargs)

        torch.save = full
    try:
        save_checkpoint(root, 2, **parts, trainer_state={}, hf_source=source)
        ended = "saved"
    except CheckpointError as exc:
        ended = str(exc)
    Path(out, f"rank{rank}.txt").write_text(ended)
    dist.destroy_process_group()
    end_rank()


def test_a_full_disk_on_one_rank_stops_every_rank_alike(tmp_path: Path, tiny_model) -> None:
    """Rank 1 cannot write its RNG file: both ranks stop with the same message (rank 0 does not wait
    for rank 1 forever, nor go on), the failed save is removed and step 1 stays the last checkpoint."""
    import torch.multiprocessing as mp

    from easyr1.distributed.ports import free_port

    root, out = tmp_path / "run", tmp_path / "out"
    out.mkdir()
    mp.get_context("forkserver").set_forkserver_preload(["torch", "easyr1.checkpoint"])
    ranks = mp.start_processes(
        _full_on_rank1,
        args=(free_port(), str(root), str(tiny_model("qwen2")), str(out)),
        nprocs=2,
        join=False,
        start_method="forkserver",
    )
    for _ in range(60):  # a hang guard, not a timing: each round waits until the ranks end or 10 s pass
        if ranks.join(timeout=10):
            break
    else:
        for process in ranks.processes:
            process.kill()
        pytest.fail("the ranks did not end: one waits for the other")
    ended = [(out / f"rank{rank}.txt").read_text() for rank in range(2)]
    assert ended[0] == ended[1], ended
    assert ended[0].startswith(
        f"cannot save step 2: no space left on {root / 'global_step_2.tmp'}: the checkpoint needs about "
    )
    assert not (root / "global_step_2.tmp").exists() and find_last_checkpoint(root) == step_dir(root, 1)
