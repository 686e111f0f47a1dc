"""Simulated ranks (``easyr1/distributed/simulated.py``): rank 0 of an N-rank job alone, against torch's
fake process group, allocates what rank 0 of the real job allocates.

The real job is 2 CPU ranks over gloo; the simulated rank 0 of 2 must hold parameters, gradients
and optimizer state of the same local shapes, dtypes and bytes, tensor by tensor. Rank 0 of 8 is
checked against FSDP2's rule (each parameter's first dimension in N chunks, rank 0 the first)
without 8 real ranks. And ``easyr1 bench --simulated-ranks 4`` trains 2 steps on a CPU end to end.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from easyr1.config import PPOConfig
from easyr1.distributed.ports import free_port
from easyr1.distributed.simulated import SIMULATED_RANKS_ENV, init_fake_group
from easyr1.models.loading import load_model
from easyr1.workers.build import sharded_model
from easyr1.workers.config import FSDPConfig, ModelConfig, OptimConfig
from easyr1.workers.optim import build_optimizer
from tests.trainer_utils import end_rank, start_rank

REPO = Path(__file__).resolve().parents[2]
IDS = torch.arange(3, 3 + 2 * 10).reshape(2, 10) * 7 % 300
# What each scenario builds: (architecture, LoRA rank); AMP as the memory table's cells run it
# (fp32 parameters and optimizer state, bf16 compute, fp32 gradient reduction).
KINDS = {"qwen2": ("qwen2", 0), "lora": ("qwen2", 4), "qwen2_5_vl": ("qwen2_5_vl", 0)}
AMP = FSDPConfig(mp_param_dtype="bf16")


def _spec(t: torch.Tensor) -> list[Any]:
    local = t.to_local() if hasattr(t, "to_local") else t
    return [list(local.shape), str(local.dtype), local.numel() * local.element_size()]


def _allocations(path: str, lora: int) -> dict[str, Any]:
    """This rank's parameters, gradients and AdamW state after one step, tensor by tensor, as the
    trainer builds the actor (``workers.build.sharded_model``) and its optimizer."""
    model_cfg = ModelConfig(model_path=path, enable_gradient_checkpointing=False)
    model_cfg.lora.rank = lora
    torch.manual_seed(0)
    model = sharded_model(PPOConfig(), path, AMP, model_cfg, device=torch.device("cpu"))
    trained = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    optimizer = build_optimizer([p for _, p in trained], OptimConfig())
    model.train()  # as the actor updates it (a VL model's vision tower then gets its gradient too)
    loss = model(input_ids=IDS, use_cache=False).logits.float().logsumexp(-1).mean()
    loss.backward()
    optimizer.step()
    return {
        "loss": loss.item(),
        "params": {name: _spec(p) for name, p in model.named_parameters()},
        "grads": {name: _spec(p.grad) for name, p in trained},
        "state": {name: {k: _spec(v) for k, v in optimizer.state[p].items()} for name, p in trained},
        "finite": all(bool(p.to_local().isfinite().all()) for _, p in trained),
        "model": model,
    }


def _real_rank(rank: int, port: int, paths: dict[str, str]) -> None:
    torch.set_num_threads(1)
    start_rank(rank, port, 2)
    try:
        results = {}
        for kind, (arch, lora) in KINDS.items():
            found = _allocations(paths[arch], lora)
            del found["model"]
            results[kind] = found
    finally:
        dist.destroy_process_group()
    (Path(paths["out"]) / f"real_rank{rank}.json").write_text(json.dumps(results))
    end_rank()


def _simulated_rank(world: int, paths: dict[str, str]) -> None:
    """Rank 0 of ``world``, alone: what it allocates, its buffers against a real load's, and what an
    all-gather hands it for the other ranks' parts."""
    torch.set_num_threads(1)
    os.environ[SIMULATED_RANKS_ENV] = str(world)
    init_fake_group(world)
    results = {}
    for kind, (arch, lora) in KINDS.items():
        found = _allocations(paths[arch], lora)
        model = found.pop("model")
        loaded = dict(load_model(paths[arch]).named_buffers())
        found["buffers_as_loaded"] = all(
            torch.equal(buffer, loaded[name.removeprefix("base_model.model.")].to(buffer.dtype))
            for name, buffer in model.named_buffers()
        )
        block = next(m for m in model.modules() if type(m).__name__.endswith("DecoderLayer"))
        block.unshard()
        gathered = block.mlp.down_proj.weight  # (hidden, intermediate): rank 0's rows first
        own = math.ceil(gathered.shape[0] / world)
        found["others_zero"] = bool((gathered[own:] == 0).all())
        found["own_drawn"] = bool((gathered[:own] != 0).any())
        block.reshard()
        results[kind] = found
    dist.destroy_process_group()
    (Path(paths["out"]) / f"simulated{world}.json").write_text(json.dumps(results))
    end_rank()


@pytest.fixture(scope="module")
def runs(
    tmp_path_factory: pytest.TempPathFactory, tiny_model: Callable[[str], Path]
) -> dict[str, dict[str, Any]]:
    out = tmp_path_factory.mktemp("simulated_ranks")
    paths = {arch: str(tiny_model(arch)) for arch, _ in KINDS.values()}
    paths["out"] = str(out)
    context = mp.get_context("forkserver")
    context.set_forkserver_preload(["torch", "transformers", "peft", "easyr1.trainer"])
    mp.start_processes(_real_rank, args=(free_port(), paths), nprocs=2, join=True, start_method="forkserver")
    for world in (2, 8):
        process = context.Process(target=_simulated_rank, args=(world, paths))
        process.start()
        process.join()
        assert process.exitcode == 0, f"simulated rank 0 of {world} failed"
    files = {"real": "real_rank0.json", "simulated2": "simulated2.json", "simulated8": "simulated8.json"}
    return {name: json.loads((out / file).read_text()) for name, file in files.items()}


@pytest.mark.parametrize("kind", KINDS)
def test_rank_0_of_2_allocates_as_rank_0_of_a_real_2_rank_run(
    runs: dict[str, dict[str, Any]], kind: str
) -> None:
    real, simulated = runs["real"][kind], runs["simulated2"][kind]
    assert real["params"] and real["grads"] and real["state"]
    assert simulated["params"] == real["params"]
    assert simulated["grads"] == real["grads"]
    assert simulated["state"] == real["state"]
    if kind == "lora":  # only the adapters train, and only they have gradients and optimizer state
        assert all("lora_" in name for name in real["grads"])


@pytest.mark.parametrize("kind", KINDS)
def test_rank_0_of_8_holds_the_first_eighth_of_each_first_dimension(
    runs: dict[str, dict[str, Any]], kind: str, tiny_model: Callable[[str], Path]
) -> None:
    arch, lora = KINDS[kind]
    simulated = runs["simulated8"][kind]
    full = {name: list(p.shape) for name, p in load_model(tiny_model(arch), weights=False).named_parameters()}
    for name, (shape, _, _nbytes) in simulated["params"].items():
        base = full.get(name.replace("base_model.model.", "").replace(".base_layer", ""))
        if base is None:  # a LoRA adapter: its shape is not the model's
            assert "lora_" in name
            continue
        assert shape == [min(math.ceil(base[0] / 8), base[0]), *base[1:]], name
    for name, spec in simulated["grads"].items():
        assert spec == simulated["params"][name], name  # gradient shards as the parameters'
        assert (
            simulated["state"][name]["exp_avg"] == spec and simulated["state"][name]["exp_avg_sq"] == spec
        ), name


@pytest.mark.parametrize("kind", KINDS)
def test_a_simulated_rank_has_real_buffers_zeroed_peers_and_finite_values(
    runs: dict[str, dict[str, Any]], kind: str
) -> None:
    for world in (2, 8):
        found = runs[f"simulated{world}"][kind]
        assert found["buffers_as_loaded"]  # rotary frequencies as from_pretrained computes them
        assert found["others_zero"] and found["own_drawn"]
        assert found["finite"] and math.isfinite(found["loss"])


def test_bench_trains_2_steps_as_rank_0_of_4_on_a_cpu(tmp_path: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    out = tmp_path / "summary.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "easyr1.cli",
            "bench",
            "--workload",
            "smoke_memory",
            "--steps",
            "2",
            "--simulated-ranks",
            "4",
            "--root",
            str(tmp_path),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads(out.read_text())
    assert summary["simulated_ranks"] == 4 and summary["gpus"] == 4 and summary["steps"] == 2
    assert summary["rollouts_per_step"] == 8  # the 4-rank job's batch, of which rank 0 trained a quarter
    assert all(
        math.isfinite(step["actor/pg_loss"]) and math.isfinite(step["actor/kl_loss"])
        for step in summary["per_step"]
    )
    # The model folder has no weights: the simulated rank drew its own.
    model = tmp_path / "smoke_memory" / "model-config"
    assert (model / "config.json").is_file() and not list(model.glob("*.safetensors"))


@pytest.mark.parametrize(
    "args, message",
    [
        (["--simulated-ranks", "4", "--backend", "vllm"], "the Hugging Face rollout only"),
        (["--simulated-ranks", "4", "--gpus", "2"], "--gpus 2 with it is not 1"),
        (["--simulated-ranks", "1"], "simulates rank 0 of 2 or more ranks"),
    ],
)
def test_bench_refuses_what_simulated_ranks_cannot_run(args: list[str], message: str, tmp_path: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [sys.executable, "-m", "easyr1.cli", "bench", "--workload", "smoke", "--root", str(tmp_path), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode != 0 and message in result.stderr


def _measure(args: list[str], env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess:
    from easyr1.config import override_value
    from easyr1.workloads import workload_config

    settings = {
        **workload_config("smoke_memory", "hf", 4),
        "data.train_files": str(tmp_path / "train.jsonl"),
        "worker.actor.model.model_path": str(tmp_path / "model"),
    }
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "easyr1.cli",
            "memory",
            "--measure",
            *args,
            *(f"{k}={override_value(v)}" for k, v in settings.items()),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO), **env},
        timeout=900,
    )


def test_memory_measure_needs_a_gpu(tmp_path: Path) -> None:
    result = _measure(["--gpus", "4"], {}, tmp_path)
    assert result.returncode != 0 and "there is no CUDA GPU here" in result.stderr


def test_memory_measure_runs_rank_0_of_the_job_through_every_phase_on_a_cpu_when_told(
    tmp_path: Path, tiny_model: Callable[[str], Path]
) -> None:
    from easyr1.bench import _text_prompts
    from easyr1.models.loading import load_tokenizer

    (tmp_path / "model").symlink_to(tiny_model("qwen2"))
    rows = _text_prompts(load_tokenizer(tmp_path / "model"), 16, 64)
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = _measure(
        ["--gpus", "4", "--root", str(tmp_path / "measure")], {"EASYR1_MEASURE_ON_CPU": "1"}, tmp_path
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "rank 0 of 4 for 2 steps as simulated ranks" in result.stdout
    assert "update_actor" in result.stdout and "a CPU has no GPU memory to measure" in result.stdout
    steps = [json.loads(line) for line in (tmp_path / "measure/run/metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2] and all(math.isfinite(s["actor/kl_loss"]) for s in steps)


@pytest.mark.parametrize(
    "summary, verdict",
    [
        (
            {
                "memory_phases": {
                    "gen": {"allocated": 20.0},
                    "ref_log_prob": {"allocated": 25.0},
                    "update_actor": {"allocated": 38.0},
                },
                "oom": None,
                "gpu_other_memory_gib": 0.6,
            },
            "fits 8 x 40.0 GiB: 39.4 GiB needed per GPU",
        ),
        (
            {
                "memory_phases": {"gen": {"allocated": 20.0}, "update_actor": {"allocated": 39.0}},
                "oom": None,
                "gpu_other_memory_gib": 0.6,
            },
            "does not fit 8 x 40.0 GiB: 40.4 GiB needed per GPU",
        ),
        (
            {
                "memory_phases": {"gen": {"allocated": 20.0}},
                "oom": {"phase": "update_actor", "max_allocated_gib": 39.2},
                "gpu_other_memory_gib": 0.6,
            },
            "does not fit 8 x 40.0 GiB: out of memory in update_actor (39.2 GiB allocated",
        ),
    ],
    ids=["fits", "over", "oom"],
)
def test_memory_measure_verdict_adds_what_lies_outside_pytorch_and_nccl(
    summary: dict[str, Any], verdict: str
) -> None:
    from easyr1.config import load_config, override_value
    from easyr1.memory import estimate
    from easyr1.memory_measure import report
    from easyr1.models.architecture import Architecture
    from easyr1.workloads import workload_config

    settings = {
        **workload_config("easyr1_7b", "hf", 8),
        "data.train_files": "x",
        "worker.actor.model.model_path": "x",
    }
    config = load_config([f"{k}={override_value(v)}" for k, v in settings.items()])
    predicted = estimate(config, Architecture.load("qwen2:7b"), gpus=8, gpu_memory_gib=40.0)
    text = report(predicted, summary, 8, 40.0, on_cpu=False)
    assert verdict in text
    assert text.splitlines()[0].split() == ["phase", "predicted", "GiB", "measured", "GiB"]
    if summary["oom"] is None:
        assert "20.00" in text  # the rollout's measured peak beside its prediction
