"""What a checkpoint folder (or the disk it is on) can do to a run, in one process: no code runs from
its files, pruning deletes only what the engine wrote, a linked step folder is refused, and a full
disk is named as such with the last good checkpoint kept."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from easyr1.checkpoint import CheckpointError, find_last_checkpoint, load_checkpoint, save_checkpoint, step_dir
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
    return {"models": {"actor": model}, "optimizers": {"actor": optimizer}, "schedulers": {"actor": scheduler}}


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
    refused = f"{metadata} refers to io.open, which DCP metadata never holds: not loaded"
    assert f"skipping {path}: {refused}" in capfd.readouterr().err
    with pytest.raises(CheckpointError, match=f"^cannot resume from {path}: {refused}"):
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
    with pytest.raises(CheckpointError, match=r"scheduler\.last_epoch was refused by a weights-only load \(it refers to io\.open\)"):
        load_checkpoint(path, **_parts())
    assert not flag.exists()
