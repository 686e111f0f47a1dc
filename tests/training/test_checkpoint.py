"""Checkpoints on 2 CPU ranks (gloo): exact round trip, resharding to 1 rank, skipping broken
checkpoints, pruning, and merging to Hugging Face format (text, VLM, LoRA) checked against the
logits of the FSDP model that was saved.

One launch of 2 ranks runs every distributed scenario and records what it saw; the tests check it.
"""

from __future__ import annotations

import copy
import json
import os
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.checkpoint import FileSystemReader

from easyr1.checkpoint import (
    BEST_METRIC,
    LATEST,
    MARKER,
    STAGING,
    CheckpointError,
    best_checkpoint,
    find_last_checkpoint,
    load_checkpoint,
    prune_checkpoints,
    save_checkpoint,
    step_dir,
)
from easyr1.distributed.ports import free_port
from easyr1.export import merge_checkpoint
from tests.trainer_utils import end_rank, run_train, start_rank, tiny_config

WORLD = 2
TEXT_IDS = torch.arange(3, 3 + 2 * 12).reshape(2, 12) * 7 % 300  # the same batch on every rank


def _parts(model: nn.Module) -> dict[str, Any]:
    """An actor's model, AdamW and LR schedule, as save_checkpoint and load_checkpoint take them."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (step + 1))
    return {
        "models": {"actor": model},
        "optimizers": {"actor": optimizer},
        "schedulers": {"actor": scheduler},
    }


def _train_step(parts: dict[str, Any], **inputs: torch.Tensor) -> None:
    model, optimizer = parts["models"]["actor"], parts["optimizers"]["actor"]
    model.train()
    inputs = inputs or {"input_ids": TEXT_IDS, "labels": TEXT_IDS}
    output = model(**inputs)
    (output.loss if hasattr(output, "loss") else output.sum()).backward()
    optimizer.step()
    parts["schedulers"]["actor"].step()
    optimizer.zero_grad(set_to_none=True)


@torch.no_grad()
def _logits(model: nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    model.eval()
    return model(**inputs, use_cache=False).logits.float()


def _same(a: Any, b: Any, atol: float = 0.0) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k], atol) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y, atol) for x, y in zip(a, b, strict=True))
    if isinstance(a, torch.Tensor):
        if a.shape != b.shape:
            return False
        return torch.equal(a, b) if atol == 0 else torch.allclose(a, b, atol=atol, rtol=0)
    return a == b


# ------------------------------------------------------------------ the distributed part (2 ranks)


def _fsdp(model: nn.Module) -> nn.Module:
    from easyr1.workers.config import FSDPConfig
    from easyr1.workers.fsdp import parallelize

    cfg = FSDPConfig(torch_dtype="fp32", mp_param_dtype="fp32")
    return parallelize(model, cfg, trainable=True, device=torch.device("cpu"))


def _text_model(path: str) -> nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def _full(parts: dict[str, Any], with_optimizer: bool = True) -> dict[str, Any]:
    """Unsharded model (and optimizer) state on every rank, comparable across world sizes."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    model, optimizer = parts["models"]["actor"], parts["optimizers"]["actor"]
    options = StateDictOptions(full_state_dict=True)
    out = {"model": {k: v.clone() for k, v in get_model_state_dict(model, options=options).items()}}
    if with_optimizer:  # deep copy: AdamW's "step" tensors are the live ones
        out["optimizer"] = copy.deepcopy(get_optimizer_state_dict(model, optimizer, options=options))
    return out


def _draws() -> list[float]:
    return [random.random(), float(np.random.rand()), float(torch.rand(()))]


def _text_scenario(paths: dict[str, str], rank: int, results: dict[str, Any]) -> None:
    """Save steps 1-3; resume step 2 into fresh objects: same state, same RNG, same next step."""
    root, source = Path(paths["text_root"]), paths["qwen2"]
    parts = _parts(_fsdp(_text_model(source)))
    _train_step(parts)
    save_checkpoint(root, 1, **parts, trainer_state={"metrics": {"val/overall": 0.1}}, hf_source=source)
    _train_step(parts)
    state = {"sampler": {"epoch": 0, "batch": 2}, "kl_coef": 0.002, "metrics": {"val/overall": 0.7}}
    save_checkpoint(root, 2, **parts, trainer_state=state, hf_source=source)
    after_save = _draws()
    schedule = parts["schedulers"]["actor"].state_dict()
    saved = _full(parts)
    logits = _logits(parts["models"]["actor"], {"input_ids": TEXT_IDS})
    _train_step(parts)
    continued = _full(parts, with_optimizer=False)
    save_checkpoint(root, 3, **parts, trainer_state={"metrics": {"val/overall": 0.3}}, hf_source=source)

    fresh = _parts(_fsdp(_text_model(source)))
    results["trainer_state"] = load_checkpoint(step_dir(root, 2), **fresh)
    results["rng_restored"] = _draws() == after_save
    loaded = _full(fresh)
    results["params_equal"] = _same(loaded["model"], saved["model"])
    results["optimizer_equal"] = _same(loaded["optimizer"], saved["optimizer"])
    results["scheduler_equal"] = fresh["schedulers"]["actor"].state_dict() == schedule
    _train_step(fresh)
    results["next_step_equal"] = _same(_full(fresh, with_optimizer=False)["model"], continued["model"])
    if rank == 0:
        torch.save({"saved": saved, "continued": continued}, Path(paths["out"]) / "text_reference.pt")
        torch.save(logits, Path(paths["out"]) / "text_logits.pt")


def _lora_scenario(paths: dict[str, str], rank: int) -> None:
    from peft import LoraConfig, get_peft_model

    source = paths["qwen2"]
    torch.manual_seed(0)  # init_lora_weights=False draws both LoRA matrices: the adapter is not a no-op
    config = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False)
    parts = _parts(_fsdp(get_peft_model(_text_model(source), config)))
    _train_step(parts)
    save_checkpoint(paths["lora_root"], 1, **parts, trainer_state={}, hf_source=source)
    logits = _logits(parts["models"]["actor"], {"input_ids": TEXT_IDS})
    if rank == 0:
        torch.save(logits, Path(paths["out"]) / "lora_logits.pt")


def _vlm_scenario(paths: dict[str, str], rank: int) -> None:
    from transformers import AutoModelForImageTextToText

    source = paths["qwen2_5_vl"]
    model = AutoModelForImageTextToText.from_pretrained(source, dtype=torch.float32)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():  # move every weight (vision tower included) away from the source folder's
        for p in model.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=generator))
    parts = _parts(_fsdp(model))
    save_checkpoint(paths["vlm_root"], 1, **parts, trainer_state={}, hf_source=source, model_only=True)
    logits = _logits(parts["models"]["actor"], torch.load(Path(paths["out"]) / "vlm_inputs.pt"))
    if rank == 0:
        torch.save(logits, Path(paths["out"]) / "vlm_logits.pt")


def _reshard_scenario(paths: dict[str, str], results: dict[str, Any]) -> None:
    """Rank 0 alone, as a 1-rank world, resumes the 2-rank checkpoint."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    reference = torch.load(Path(paths["out"]) / "text_reference.pt")
    parts = _parts(_fsdp(_text_model(paths["qwen2"])))
    load_checkpoint(step_dir(paths["text_root"], 2), **parts)
    loaded = _full(parts)
    results["reshard_params_equal"] = _same(loaded["model"], reference["saved"]["model"])
    results["reshard_optimizer_equal"] = _same(loaded["optimizer"], reference["saved"]["optimizer"])
    _train_step(parts)  # one rank sums the same gradient in another order: close, not equal
    after = _full(parts, with_optimizer=False)["model"]
    results["reshard_next_step_close"] = _same(after, reference["continued"]["model"], atol=1e-5)
    dist.destroy_process_group()


def _worker(rank: int, port: int, paths: dict[str, str]) -> None:
    torch.set_num_threads(1)
    start_rank(rank, port, WORLD)
    results: dict[str, Any] = {}
    try:
        _text_scenario(paths, rank, results)
        _lora_scenario(paths, rank)
        _vlm_scenario(paths, rank)
    finally:
        dist.destroy_process_group()
    if rank == 0:
        _reshard_scenario(paths, results)
    (Path(paths["out"]) / f"results_rank{rank}.json").write_text(json.dumps(results))
    end_rank()


def _vlm_inputs(path: Path) -> dict[str, torch.Tensor]:
    from PIL import Image

    from easyr1.models.loading import load_processor

    processor = load_processor(path)
    content = [{"type": "image"}, {"type": "text", "text": "How many shapes are there?"}]
    messages = [{"role": "user", "content": content}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    pixels = (torch.arange(56 * 56 * 3) * 37 % 251).to(torch.uint8).reshape(56, 56, 3).numpy()
    inputs = dict(processor(text=[text], images=[Image.fromarray(pixels)], return_tensors="pt"))
    image_id = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    inputs["mm_token_type_ids"] = (inputs["input_ids"] == image_id).long()
    return inputs


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, tiny_model) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("ckpt")
    paths = {
        "qwen2": str(tiny_model("qwen2")),
        "qwen2_5_vl": str(tiny_model("qwen2_5_vl")),
        "text_root": str(base / "text"),
        "lora_root": str(base / "lora"),
        "vlm_root": str(base / "vlm"),
        "out": str(base / "out"),
    }
    Path(paths["out"]).mkdir()
    inputs = _vlm_inputs(Path(paths["qwen2_5_vl"]))
    torch.save(inputs, Path(paths["out"]) / "vlm_inputs.pt")
    # Ranks forked from a forkserver that has imported the heavy modules once (unless an earlier test
    # started it): not from this process, whose threads (gloo's of earlier tests, pytest's) would
    # leave locks held in the children, which then wait forever.
    mp.get_context("forkserver").set_forkserver_preload(
        ["torch", "transformers", "peft", "easyr1.checkpoint", "easyr1.export"]
    )
    mp.start_processes(_worker, args=(free_port(), paths), nprocs=WORLD, join=True, start_method="forkserver")
    results = [json.loads((Path(paths["out"]) / f"results_rank{r}.json").read_text()) for r in range(WORLD)]
    return {"paths": {k: Path(v) for k, v in paths.items()}, "results": results, "vlm_inputs": inputs}


# ------------------------------------------------------------------ tests: 2 ranks


def test_round_trip_is_exact_on_two_ranks(run: dict[str, Any]) -> None:
    for rank, results in enumerate(run["results"]):
        for key in ("params_equal", "optimizer_equal", "scheduler_equal", "rng_restored", "next_step_equal"):
            assert results[key] is True, f"rank {rank}: {key}"
        assert results["trainer_state"] == {
            "step": 2,
            "sampler": {"epoch": 0, "batch": 2},
            "kl_coef": 0.002,
            "metrics": {"val/overall": 0.7},
        }


def test_resume_on_one_rank_reshards(run: dict[str, Any]) -> None:
    results = run["results"][0]
    assert results["reshard_params_equal"] is True
    assert results["reshard_optimizer_equal"] is True
    assert results["reshard_next_step_close"] is True


def test_layout(run: dict[str, Any]) -> None:
    root = run["paths"]["text_root"]
    step = step_dir(root, 2)
    names = {p.name for p in step.iterdir()}
    assert {"actor", "trainer_state.json", MARKER, "rng_rank0.pt", "rng_rank1.pt"} <= names
    actor = step / "actor"
    assert (actor / ".metadata").is_file()
    assert sorted(p.name for p in actor.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    hf = {p.name for p in (actor / "huggingface").iterdir()}
    assert {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"} <= hf
    assert not any(name.endswith(".safetensors") for name in hf)
    marker = json.loads((step / MARKER).read_text())
    assert marker["world_size"] == 2 and marker["components"] == ["actor"] and marker["model_only"] is False
    every_file = {p.relative_to(step).as_posix() for p in step.rglob("*") if p.is_file()}
    # shards, .metadata, RNG files, trainer state; not the files that merge overwrites
    assert set(marker["crc32"]) == every_file - {MARKER} - {f"actor/huggingface/{name}" for name in hf}
    assert (root / LATEST).read_text() == "3"
    assert not list(root.glob("*.tmp"))
    assert find_last_checkpoint(root) == step_dir(root, 3)


@pytest.mark.parametrize(
    "damage", ["shard_deleted", "shard_truncated", "shard_corrupted", "marker_removed", "metadata_removed"]
)
def test_damaged_checkpoint_is_reported_and_skipped(
    damage: str, run: dict[str, Any], tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "text"
    shutil.copytree(run["paths"]["text_root"], root)
    newest = step_dir(root, 3)
    shard = newest / "actor" / "__1_0.distcp"
    if damage == "shard_deleted":
        shard.unlink()
    elif damage == "shard_truncated":
        shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    elif damage == "shard_corrupted":  # one byte flipped in place: the size still matches the metadata
        with shard.open("r+b") as f:
            f.seek(shard.stat().st_size // 2)
            byte = f.read(1)[0]
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte ^ 0xFF]))
    elif damage == "marker_removed":
        (newest / MARKER).unlink()
    else:
        (newest / "actor" / ".metadata").unlink()
    (root / "global_step_4.tmp").mkdir()  # a save that never finished, with the engine's staging file
    (root / "global_step_4.tmp" / STAGING).write_text("{}")
    assert find_last_checkpoint(root) == step_dir(root, 2)
    err = capfd.readouterr().err
    assert f"skipping {newest}" in err and "global_step_4.tmp" in err
    why = {
        "shard_deleted": "missing",
        "shard_truncated": "truncated",
        "shard_corrupted": "__1_0.distcp does not match",
        "marker_removed": "marker",
        "metadata_removed": ".metadata",
    }[damage]
    assert why in err.split(f"skipping {newest}")[1].splitlines()[0]
    with pytest.raises(CheckpointError, match="global_step_3"):
        load_checkpoint(newest, models={}, optimizers={}, schedulers={})


def test_no_checkpoint_at_all(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    assert find_last_checkpoint(tmp_path / "nothing") is None
    assert find_last_checkpoint(tmp_path) is None
    (tmp_path / "global_step_4.tmp").mkdir()  # a save that never finished is no checkpoint: start over
    (tmp_path / "global_step_4.tmp" / STAGING).write_text("{}")
    assert find_last_checkpoint(tmp_path) is None
    assert "global_step_4.tmp" in capfd.readouterr().err
    # A folder of EasyR1's own checkpoints (FSDP1's per-rank files) is named as that, not as a cut-off
    # save; being the only one, it stops the run rather than being overwritten by a fresh start.
    (tmp_path / "global_step_5" / "actor").mkdir(parents=True)
    (tmp_path / "global_step_5" / "actor" / "model_world_size_2_rank_0.pt").write_bytes(b"")
    with pytest.raises(CheckpointError, match="global_step_5: a checkpoint of EasyR1 itself"):
        find_last_checkpoint(tmp_path)


def test_checkpoints_that_are_all_unusable_stop_the_run_instead_of_being_overwritten(
    run: dict[str, Any], tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Every checkpoint damaged (a shared file system that hiccuped, a requeue): starting from step 0
    would overwrite days of training, so the run stops and lists each with its reason, naming the
    file (marker or trainer state) that does not parse."""
    root = tmp_path / "text"
    shutil.copytree(run["paths"]["text_root"], root)
    (step_dir(root, 3) / MARKER).write_text('{"step" 3}')
    (step_dir(root, 2) / "trainer_state.json").write_text('{"step" 2}')
    (step_dir(root, 1) / MARKER).unlink()
    (root / "global_step_4.tmp").mkdir()
    with pytest.raises(CheckpointError) as failure:
        find_last_checkpoint(root)
    message = str(failure.value)
    assert message.startswith(f"{root} holds checkpoints but none can be resumed from:")
    assert f"global_step_3: unreadable {MARKER} (Expecting ':' delimiter" in message
    assert "global_step_2: unreadable trainer_state.json (Expecting ':' delimiter" in message
    assert "global_step_1: no completion marker" in message
    assert "global_step_4" not in message
    assert (
        "Delete them, or set trainer.find_last_checkpoint=false (or another trainer.save_checkpoint_path)"
        in message
    )
    assert sorted(p.name for p in root.glob("global_step_*")) == [
        "global_step_1",
        "global_step_2",
        "global_step_3",
        "global_step_4.tmp",
    ]
    # One usable checkpoint is enough: the damaged ones are skipped, each said once.
    shutil.rmtree(step_dir(root, 2))
    shutil.copytree(step_dir(run["paths"]["text_root"], 2), step_dir(root, 2))
    capfd.readouterr()
    assert find_last_checkpoint(root) == step_dir(root, 2)
    assert capfd.readouterr().err.count(f"skipping {step_dir(root, 3)}: unreadable {MARKER}") == 1


# ------------------------------------------------------------------ tests: one process, prune, best

single_process = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def _linear() -> dict[str, Any]:
    return _parts(nn.Linear(4, 3))


@single_process
def test_single_process_round_trip_and_resave(tmp_path: Path, tiny_model) -> None:
    source = tiny_model("qwen2")
    parts = _linear()
    _train_step(parts, input=torch.ones(2, 4))
    save_checkpoint(tmp_path, 1, **parts, trainer_state={"x": 1}, hf_source=source)
    _train_step(parts, input=torch.ones(2, 4))
    path = save_checkpoint(tmp_path, 1, **parts, trainer_state={"x": 2}, hf_source=source)  # replaces step 1
    fresh = _linear()
    assert load_checkpoint(path, **fresh) == {"step": 1, "x": 2}
    assert torch.equal(fresh["models"]["actor"].weight, parts["models"]["actor"].weight)
    optimizer, fresh_optimizer = parts["optimizers"]["actor"], fresh["optimizers"]["actor"]
    assert _same(optimizer.state_dict()["state"], fresh_optimizer.state_dict()["state"])
    assert fresh["schedulers"]["actor"].last_epoch == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step_1", LATEST]
    with pytest.raises(CheckpointError, match="JSON"):
        save_checkpoint(tmp_path, 2, **parts, trainer_state={"bad": object()}, hf_source=source)


@single_process
def test_ctrl_c_during_a_save_stops_the_run_and_keeps_the_last_checkpoint(
    tmp_path: Path, tiny_model, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ctrl-C as DCP starts writing (the moment chosen by wrapping its writer) arrives as the
    KeyboardInterrupt any other Ctrl-C is, not as a failed save; the folder it was writing is
    unfinished and the step before it stays the last checkpoint. The interrupt is raised where
    Python's SIGINT handler would raise it, in the main thread at that point: a real signal to this
    process would also reach the harness's signal watcher (rules/scripts/engine.py), which the tests
    share, and stop every job child a later test starts."""
    from torch.distributed.checkpoint import filesystem

    source = tiny_model("qwen2")
    parts = _linear()
    save_checkpoint(tmp_path, 1, **parts, trainer_state={}, hf_source=source)

    def interrupted(self: Any, plan: Any, planner: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(filesystem.FileSystemWriter, "write_data", interrupted)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path, 2, **parts, trainer_state={}, hf_source=source)
    assert find_last_checkpoint(tmp_path) == step_dir(tmp_path, 1)


@single_process
def test_model_only_checkpoint_resumes_with_fresh_optimizer(
    tmp_path: Path, tiny_model, capfd: pytest.CaptureFixture[str]
) -> None:
    parts = _linear()
    _train_step(parts, input=torch.ones(2, 4))
    source = tiny_model("qwen2")
    path = save_checkpoint(tmp_path, 5, **parts, trainer_state={}, hf_source=source, model_only=True)
    saved = FileSystemReader(str(path / "actor")).read_metadata().state_dict_metadata
    assert {key.split(".")[0] for key in saved} == {"model"}
    fresh = _linear()
    load_checkpoint(path, **fresh)
    assert torch.equal(fresh["models"]["actor"].weight, parts["models"]["actor"].weight)
    assert not fresh["optimizers"]["actor"].state and fresh["schedulers"]["actor"].last_epoch == 0
    assert "model only" in capfd.readouterr().err


@single_process
def test_prune_keeps_newest_and_best(tmp_path: Path, tiny_model) -> None:
    source = tiny_model("qwen2")
    parts = _linear()
    for step, score in {1: 0.2, 2: 0.9, 3: 0.1, 4: 0.3, 5: 0.4, 6: None}.items():
        # Steps 1-3 as checkpoints written before the best metric took EasyR1's name.
        name = "val/overall" if step <= 3 else BEST_METRIC
        metrics = {} if score is None else {name: score, "val/loss": -score}
        save_checkpoint(tmp_path, step, **parts, trainer_state={"metrics": metrics}, hf_source=source)
    (tmp_path / "global_step_7.tmp").mkdir()  # left by a crash, with the engine's staging file
    (tmp_path / "global_step_7.tmp" / STAGING).write_text("{}")
    best = best_checkpoint(tmp_path, BEST_METRIC)
    assert best == step_dir(tmp_path, 2)
    assert best_checkpoint(tmp_path, "val/loss", higher_is_better=False) == best
    assert best_checkpoint(tmp_path, "val/missing") is None
    (step_dir(tmp_path, 3) / "trainer_state.json").write_text("{")  # damaged: skipped, as resuming skips it
    assert best_checkpoint(tmp_path, BEST_METRIC) == best
    assert prune_checkpoints(tmp_path, -1) == []  # save_limit=-1 keeps everything
    removed = prune_checkpoints(tmp_path, 2, keep=best)
    removed_names = sorted(p.name for p in removed)
    assert removed_names == ["global_step_1", "global_step_3", "global_step_4", "global_step_7.tmp"]
    left = sorted(p.name for p in tmp_path.glob("global_step_*"))
    assert left == ["global_step_2", "global_step_5", "global_step_6"]
    prune_checkpoints(tmp_path, 1)
    assert [p.name for p in tmp_path.glob("global_step_*")] == ["global_step_6"]


# ------------------------------------------------------------------ tests: merge


def _merged_logits(folder: Path, inputs: dict[str, torch.Tensor], vision: bool = False) -> torch.Tensor:
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    auto = AutoModelForImageTextToText if vision else AutoModelForCausalLM
    return _logits(auto.from_pretrained(folder, dtype=torch.float32), inputs)


def test_merge_text_via_cli_matches_fsdp_logits(run: dict[str, Any]) -> None:
    from safetensors import safe_open

    from easyr1.cli import main

    actor = step_dir(run["paths"]["text_root"], 2) / "actor"
    assert main(["merge", "--local_dir", str(actor), "--verify"]) == 0
    out = actor / "huggingface"
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    expected = torch.load(run["paths"]["out"] / "text_logits.pt")
    torch.testing.assert_close(_merged_logits(out, {"input_ids": TEXT_IDS}), expected, atol=1e-5, rtol=0)
    with safe_open(out / "model.safetensors", "pt") as f:  # tied embeddings: one tensor on disk
        assert "lm_head.weight" not in set(f.keys())
    source = json.loads((run["paths"]["qwen2"] / "generation_config.json").read_text())
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == source["eos_token_id"]


def test_merge_vlm_matches_fsdp_logits(run: dict[str, Any], tmp_path: Path) -> None:
    from easyr1.models.loading import load_processor

    out = merge_checkpoint(step_dir(run["paths"]["vlm_root"], 1) / "actor", tmp_path / "merged", verify=True)
    expected = torch.load(run["paths"]["out"] / "vlm_logits.pt")
    merged = _merged_logits(out, run["vlm_inputs"], vision=True)
    torch.testing.assert_close(merged, expected, atol=1e-5, rtol=0)
    assert load_processor(out).image_processor is not None


def test_merge_lora_into_base_and_as_adapter(run: dict[str, Any], tmp_path: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    actor = step_dir(run["paths"]["lora_root"], 1) / "actor"
    expected = torch.load(run["paths"]["out"] / "lora_logits.pt")
    merged = merge_checkpoint(actor, tmp_path / "merged")
    torch.testing.assert_close(_merged_logits(merged, {"input_ids": TEXT_IDS}), expected, atol=1e-4, rtol=0)

    adapter = merge_checkpoint(actor, tmp_path / "adapter", lora_adapter=True)
    assert (adapter / "adapter_model.safetensors").is_file() and not (adapter / "model.safetensors").exists()
    adapter_config = json.loads((adapter / "adapter_config.json").read_text())
    assert adapter_config["base_model_name_or_path"] == str(run["paths"]["qwen2"])
    base = AutoModelForCausalLM.from_pretrained(run["paths"]["qwen2"], dtype=torch.float32)
    with_adapter = _logits(PeftModel.from_pretrained(base, adapter), {"input_ids": TEXT_IDS})
    torch.testing.assert_close(with_adapter, expected, atol=1e-5, rtol=0)


def test_verify_fails_for_a_folder_that_does_not_reload_as_merged(
    run: dict[str, Any], tmp_path: Path
) -> None:
    """The check the harness runs after every merge: a changed tensor or a dropped one is named."""
    from safetensors.torch import load_file, save_file

    from easyr1.export import verify_merged

    out = merge_checkpoint(step_dir(run["paths"]["text_root"], 1) / "actor", tmp_path / "merged")
    saved = load_file(out / "model.safetensors")
    expected = {**saved, "lm_head.weight": saved["model.embed_tokens.weight"]}  # tied: one tensor on disk
    verify_merged(out, expected)
    key = "model.layers.0.mlp.down_proj.weight"
    save_file({**saved, key: saved[key] + 1e-3}, out / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=f"other values than were saved, e.g. \\['{key}'\\]"):
        verify_merged(out, expected)
    save_file(
        {k: v for k, v in saved.items() if k != key}, out / "model.safetensors", metadata={"format": "pt"}
    )
    with pytest.raises(CheckpointError):
        verify_merged(out, expected)
    with pytest.raises(CheckpointError, match="not a LoRA adapter"):
        merge_checkpoint(
            step_dir(run["paths"]["lora_root"], 1) / "actor", tmp_path / "a", lora_adapter=True, verify=True
        )


def test_merge_errors_are_clear(run: dict[str, Any], tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="global_step_N/actor"):
        merge_checkpoint(step_dir(run["paths"]["text_root"], 2))
    with pytest.raises(CheckpointError, match="no LoRA"):
        merge_checkpoint(step_dir(run["paths"]["text_root"], 1) / "actor", tmp_path, lora_adapter=True)
    # EasyR1's own checkpoints (FSDP1's per-rank files) are named as such, with the tool that reads them.
    easyr1_actor = tmp_path / "global_step_5" / "actor"
    easyr1_actor.mkdir(parents=True)
    (easyr1_actor / "model_world_size_2_rank_0.pt").write_bytes(b"")
    with pytest.raises(
        CheckpointError, match="checkpoint of EasyR1 itself .* EasyR1's scripts/model_merger.py"
    ):
        merge_checkpoint(easyr1_actor)


def test_merge_refuses_an_unfinished_or_damaged_checkpoint(run: dict[str, Any], tmp_path: Path) -> None:
    """What resuming refuses, merging refuses too, before writing anything: a save that did not
    finish, a shard cut short, a byte changed since the save (which would merge as garbage)."""
    import shutil

    def damaged(name: str, damage: Callable[[Path], None]) -> Path:
        copy = tmp_path / name / "global_step_1"
        shutil.copytree(step_dir(run["paths"]["text_root"], 1), copy)
        damage(copy)
        return copy / "actor"

    def flip_a_byte(folder: Path) -> None:
        shard = next((folder / "actor").glob("*.distcp"))
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0xFF
        shard.write_bytes(data)

    def truncate(folder: Path) -> None:
        shard = next((folder / "actor").glob("*.distcp"))
        shard.write_bytes(shard.read_bytes()[:100])

    for name, damage, message in [
        (
            "unfinished",
            lambda folder: (folder / "checkpoint_complete.json").unlink(),
            "the save did not finish",
        ),
        ("flipped", flip_a_byte, "does not match its checksum"),
        ("truncated", truncate, "is truncated"),
    ]:
        actor = damaged(name, damage)
        with pytest.raises(CheckpointError, match=f"{message}.*; nothing merged"):
            merge_checkpoint(actor, tmp_path / name / "merged")
        assert not (tmp_path / name / "merged").exists()


def test_merge_of_a_folder_that_does_not_exist_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from easyr1.cli import main

    missing = tmp_path / "does" / "not" / "exist"
    with pytest.raises(CheckpointError, match=f"^{missing}: no such folder"):
        merge_checkpoint(missing)
    assert main(["merge", "--local_dir", str(missing)]) == 1
    assert capsys.readouterr().err.startswith(f"easyr1 merge: {missing}: no such folder")


def _checkpoint_copy(run: dict[str, Any], tmp_path: Path) -> Path:
    root = tmp_path / "run"
    shutil.copytree(step_dir(run["paths"]["text_root"], 1), step_dir(root, 1))
    return root


def test_a_merge_that_cannot_write_leaves_no_partial_folder(
    run: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A full disk or an unwritable output: one line naming the folder and the reason, and no
    folder with config.json but no weights (which would look like a model); the default output, the
    checkpoint's own huggingface/ folder, stays as it was and the checkpoint still resumes."""
    import transformers.modeling_utils
    from safetensors import SafetensorError

    from easyr1.checkpoint import checkpoint_problem
    from easyr1.cli import main

    root = _checkpoint_copy(run, tmp_path)
    actor = step_dir(root, 1) / "actor"
    (tmp_path / "file.txt").write_text("")
    under_a_file = tmp_path / "file.txt" / "merged"
    assert main(["merge", "--local_dir", str(actor), "--output", str(under_a_file)]) == 1
    assert (
        capsys.readouterr().err
        == f"easyr1 merge: cannot write {under_a_file}: Not a directory; nothing merged\n"
    )
    # The weights are written, then cannot be moved into place: the output is a file.
    with pytest.raises(
        CheckpointError, match=f"cannot write {tmp_path / 'file.txt'}: Not a directory; nothing merged"
    ):
        merge_checkpoint(actor, tmp_path / "file.txt")
    assert (tmp_path / "file.txt").read_text() == "" and sorted(p.name for p in tmp_path.iterdir()) == [
        "file.txt",
        "run",
    ]

    def disk_full(tensors: Any, filename: str, metadata: Any = None) -> None:
        Path(filename).write_bytes(b"\0" * 100)  # as far as it got
        raise SafetensorError(
            f'Error while serializing: I/O error: No space left on device (os error 28) at path "{filename}"'
        )

    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", disk_full)
    hf = actor / "huggingface"
    before = {p.name: p.read_bytes() for p in hf.iterdir()}
    for output, shown in [(tmp_path / "merged", tmp_path / "merged"), (None, hf)]:
        with pytest.raises(
            CheckpointError,
            match=(
                f"^cannot write {shown}: no space left on {shown}: the merged model needs about .+, and .+ were free "
                "when the merge started; nothing merged$"
            ),
        ):
            merge_checkpoint(actor, output)
    assert not (tmp_path / "merged").exists()
    assert {p.name: p.read_bytes() for p in hf.iterdir()} == before
    assert sorted(p.name for p in actor.iterdir() if p.name.startswith(".")) == [
        ".metadata"
    ]  # no staging folder left
    assert checkpoint_problem(step_dir(root, 1)) is None


def test_a_merge_into_the_checkpoint_keeps_it_resumable_and_its_weights_readable_by_all(
    run: dict[str, Any], tmp_path: Path
) -> None:
    """The default output is the checkpoint's huggingface/ folder, which holds the config and tokenizer
    files merging reads: merging there (twice) keeps them and the checkpoint. The weights get the mode
    any new file gets (0666 less the umask), not safetensors' 0600: on a shared cluster others read them."""
    from easyr1.checkpoint import checkpoint_problem

    root = _checkpoint_copy(run, tmp_path)
    actor = step_dir(root, 1) / "actor"
    tokenizer = (actor / "huggingface" / "tokenizer.json").read_bytes()
    umask = os.umask(0o027)
    try:
        for _ in range(2):
            out = merge_checkpoint(actor, verify=True)
            assert out == actor / "huggingface" and (out / "tokenizer.json").read_bytes() == tokenizer
            assert (out / "model.safetensors").stat().st_mode & 0o777 == 0o640
        other = merge_checkpoint(actor, tmp_path / "merged")
        assert (other / "model.safetensors").stat().st_mode & 0o777 == 0o640
        assert (other / "config.json").stat().st_mode & 0o777 == 0o640
    finally:
        os.umask(umask)
    assert find_last_checkpoint(root) == step_dir(root, 1) and checkpoint_problem(step_dir(root, 1)) is None
    assert not [p for p in actor.iterdir() if p.name.endswith(".merging")]


# ------------------------------------------------------------------ tests: what a checkpoint folder can do to a run


def test_an_unwritable_run_folder_is_one_error_before_any_model(
    tiny_model, arithmetic: Path, tmp_path: Path
) -> None:
    """trainer.save_checkpoint_path that cannot be created (here under a regular file; a read-only
    file system is the same): every rank stops with the key, the path and the OS's reason, no
    traceback, before loading a model."""
    (tmp_path / "file.txt").write_text("")
    run_dir = tmp_path / "file.txt" / "run"
    done = run_train(tiny_config(tiny_model("qwen2"), arithmetic, run_dir), tmp_path, timeout=300)
    assert done.returncode != 0
    assert f"trainer.save_checkpoint_path={run_dir}: cannot create it: Not a directory" in done.stderr, (
        done.stderr[-3000:]
    )
    assert "Traceback" not in done.stderr, done.stderr[-3000:]


def test_a_run_whose_checkpoints_are_all_unusable_stops_and_keeps_them(
    tiny_model, arithmetic: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    easyr1_actor = run_dir / "global_step_5" / "actor"
    easyr1_actor.mkdir(parents=True)
    (easyr1_actor / "model_world_size_2_rank_0.pt").write_bytes(b"weights")
    done = run_train(tiny_config(tiny_model("qwen2"), arithmetic, run_dir), tmp_path, timeout=300)
    assert done.returncode != 0
    assert "none can be resumed from:\n  global_step_5: a checkpoint of EasyR1 itself" in done.stderr, (
        done.stderr[-3000:]
    )
    assert "trainer.find_last_checkpoint=false" in done.stderr and "Traceback" not in done.stderr
    assert (easyr1_actor / "model_world_size_2_rank_0.pt").read_bytes() == b"weights"
    assert not (run_dir / "metrics.jsonl").exists() and not (run_dir / "config.yaml").exists()


class _Payload:
    """Unpickling it opens (creates) ``flag``: code that a pickled RNG file could run."""

    def __init__(self, flag: Path):
        self.flag = flag

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.flag), "w"))


@single_process
def test_pickled_code_in_an_rng_file_does_not_run(
    tmp_path: Path, tiny_model, capfd: pytest.CaptureFixture[str]
) -> None:
    parts = _linear()
    _train_step(parts, input=torch.ones(2, 4))
    path = save_checkpoint(tmp_path / "run", 1, **parts, trainer_state={}, hf_source=tiny_model("qwen2"))
    flag = tmp_path / "code_ran"
    torch.save(_Payload(flag), path / "rng_rank0.pt")
    marker = json.loads((path / MARKER).read_text())
    del marker["crc32"]  # as a marker written before checksums: it still loads
    (path / MARKER).write_text(json.dumps(marker))
    fresh = _linear()
    load_checkpoint(path, **fresh)
    assert not flag.exists()
    assert torch.equal(fresh["models"]["actor"].weight, parts["models"]["actor"].weight)
    assert f"{path / 'rng_rank0.pt'} was refused by a weights-only load" in capfd.readouterr().err


def test_another_architecture_or_size_is_named_not_a_dcp_traceback(
    tmp_path: Path, tiny_model, one_rank
) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    source = tiny_model("qwen2")
    path = save_checkpoint(
        tmp_path, 1, **_parts(_fsdp(_text_model(str(source)))), trainer_state={}, hf_source=source
    )
    other = _parts(_fsdp(_text_model(str(tiny_model("qwen3")))))
    with pytest.raises(CheckpointError) as failure:
        load_checkpoint(path, **other)
    message = str(failure.value)
    assert message.startswith(f"cannot load {path / 'actor'}: it was saved from another model")
    assert "not in the checkpoint: " in message and "q_norm" in message  # qwen3 has q_norm, qwen2 has not
    assert "not in the model: " in message and "q_proj.bias" in message  # qwen2 has q/k/v biases
    assert len(message.splitlines()) <= 4 and "Traceback" not in message

    config = AutoConfig.from_pretrained(source)
    config.intermediate_size *= 2
    wider = _parts(_fsdp(AutoModelForCausalLM.from_config(config)))
    with pytest.raises(
        CheckpointError,
        match=r"tensors differ in shape: model\.layers\.0\.mlp\.down_proj\.weight \(saved \[64, 128\], model \[64, 256\]\)",
    ):
        load_checkpoint(path, **wider)
