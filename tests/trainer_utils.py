"""Helpers for tests that run the real trainer: a small config, a subprocess run of `easyr1 train`,
a free port for a process group, a sharded actor on one rank."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

FORMAT_PROMPT = Path(__file__).resolve().parent.parent / "examples" / "format_prompt" / "math.jinja"


def tiny_config(model: Path, data: Path, run_dir: Path) -> dict[str, Any]:
    """A config for 2 CPU ranks on a tiny model: fp32 so numbers are exact, small batches."""
    return {
        "data": {
            "train_files": f"{data}@train",
            "val_files": f"{data}@test",
            "prompt_key": "problem",
            "answer_key": "answer",
            "max_prompt_length": 256,
            "max_response_length": 12,
            "rollout_batch_size": 4,
            "val_batch_size": 8,
            "min_pixels": None,
            "max_pixels": None,
        },
        "algorithm": {
            "adv_estimator": "grpo",
            "use_kl_loss": True,
            "kl_penalty": "low_var_kl",
            "kl_coef": 0.01,
        },
        "worker": {
            "actor": {
                "global_batch_size": 2,
                "micro_batch_size_per_device_for_update": 2,
                "micro_batch_size_per_device_for_experience": 4,
                "model": {"model_path": str(model), "enable_gradient_checkpointing": False},
                "optim": {"lr": 1.0e-3},
                "fsdp": {"torch_dtype": "fp32", "mp_param_dtype": "fp32"},
            },
            "ref": {"fsdp": {"torch_dtype": "fp32", "mp_param_dtype": "fp32"}},
            "rollout": {"n": 2, "temperature": 1.0, "val_override_config": {"temperature": 0.0, "n": 1}},
            "reward": {"reward_function": "math"},
        },
        "trainer": {
            "max_steps": 2,
            "logger": ["file"],
            "n_gpus_per_node": 2,
            "val_freq": 2,
            "val_generations_to_log": 2,
            "save_checkpoint_path": str(run_dir),
        },
    }


def run_train(
    config: dict[str, Any], workdir: Path, *overrides: str, timeout: int = 600
) -> subprocess.CompletedProcess:
    """``easyr1 train config=... key=value ...`` in a subprocess, as a user runs it."""
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    return subprocess.run(
        [sys.executable, "-m", "easyr1.cli", "train", f"config={path}", *overrides],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def start_rank(rank: int, port: int, world: int) -> None:
    """Join a test's gloo process group of ``world`` ranks on loopback (offline, as every rank runs)."""
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), HF_HUB_OFFLINE="1")
    dist.init_process_group("gloo", rank=rank, world_size=world)


def end_rank() -> None:
    """End a test rank whose results are written, skipping the interpreter's teardown as the
    engine's finished ranks do (``launch.local``): a rare native abort there ("double free or
    corruption") would otherwise fail a test whose work was done."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def sharded_actor(path: Path, config: Any, max_response_length: int) -> tuple[Any, Any]:
    """(model, Actor) for a tiny model at ``path`` on the current (one-rank) process group, fp32,
    seeded, without KL: what the update-equivalence tests compare."""
    import torch

    from easyr1.algorithms.config import AlgorithmConfig
    from easyr1.models.attention import use_packed_attention
    from easyr1.models.loading import load_model
    from easyr1.workers.actor import Actor
    from easyr1.workers.fsdp import parallelize
    from easyr1.workers.logprobs import install_scoring_head

    torch.manual_seed(0)
    model = load_model(path)
    install_scoring_head(model)
    if config.padding_free:
        use_packed_attention(model)
    model = parallelize(model, config.fsdp, trainable=True, device=torch.device("cpu"))
    actor = Actor(
        model,
        config,
        AlgorithmConfig(disable_kl=True),
        samples_per_prompt=1,
        max_response_length=max_response_length,
        temperature=1.0,
        pad_id=0,
        total_steps=1,
        device=torch.device("cpu"),
    )
    return model, actor
