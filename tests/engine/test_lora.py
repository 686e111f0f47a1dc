"""LoRA in the trainer (``worker.actor.model.lora``): only the adapters train, the reference is the
actor with its adapters off (no second model), and the checkpoint merges into a model that
differs from the base by exactly the trained adapters."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from easyr1.config import ConfigError
from easyr1.data.synthetic import write_task
from easyr1.models.loading import load_model
from easyr1.models.lora import apply_lora, reference_mode, target_modules
from easyr1.workers.config import LoraConfig
from tests.trainer_utils import read_metrics, run_train, tiny_config


def test_adapters_alone_train_and_reference_mode_is_the_base(tiny_model: Callable[[str], Path]) -> None:
    path = tiny_model("qwen2")
    base = load_model(path).eval()
    model = apply_lora(load_model(path), LoraConfig(rank=4, alpha=8, target_modules="q_proj, v_proj"))
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert all(".q_proj." in n or ".v_proj." in n for n in trainable)
    for name, param in model.named_parameters():  # a trained adapter, so that "off" differs from "on"
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.5)
    ids = torch.randint(1, 200, (2, 7))
    model.eval()
    with torch.no_grad():
        with reference_mode(model):
            off = model(input_ids=ids).logits
        on = model(input_ids=ids).logits
        want = base(input_ids=ids).logits
    assert torch.allclose(off, want, atol=1e-6)
    assert not torch.allclose(on, want, atol=1e-3)


def test_target_modules_and_bad_names() -> None:
    assert target_modules("all-linear") == "all-linear"
    assert target_modules("q_proj, v_proj") == ["q_proj", "v_proj"]
    with pytest.raises(ConfigError, match="lora.target_modules"):
        target_modules(" , ")


def test_unknown_target_module_names_the_key(tiny_model: Callable[[str], Path]) -> None:
    with pytest.raises(ConfigError, match="worker.actor.model.lora"):
        apply_lora(load_model(tiny_model("qwen2")), LoraConfig(rank=4, target_modules="no_such_proj"))


def test_lora_run_trains_adapters_against_the_base_and_merges(
    tiny_model: Callable[[str], Path], arithmetic: Path, tmp_path: Path
) -> None:
    path = tiny_model("qwen2")
    run_dir = tmp_path / "run"
    config = tiny_config(path, arithmetic, run_dir)
    # A reward that differs between samples from the start (the untrained tiny model scores 0 on
    # arithmetic), so that the first update moves the adapters.
    reward = tmp_path / "length_reward.py"
    reward.write_text(
        'REWARD_TYPE = "sequential"\n\ndef score(x):\n    return {"overall": x["response_length"] / 12.0}\n'
    )
    done = run_train(
        config,
        tmp_path,
        "worker.actor.model.lora.rank=4",
        "worker.actor.model.lora.alpha=8",
        "worker.actor.optim.lr=5.0e-2",
        f"worker.reward.reward_function={reward}:score",
        "trainer.max_steps=2",
        "trainer.save_freq=2",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "reference: the actor with its LoRA adapters off" in done.stdout
    metrics = read_metrics(run_dir)
    # Step 1: the adapters start as a no-op (B = 0), so the policy is its reference; step 2 has moved.
    assert metrics[1]["actor/kl_loss"] == pytest.approx(0.0, abs=1e-7)
    assert metrics[2]["actor/kl_loss"] > 1e-6
    actor = run_dir / "global_step_2" / "actor"
    assert (actor / "adapter_config.json").is_file()
    merged = subprocess.run(
        [
            sys.executable,
            "-m",
            "easyr1.cli",
            "merge",
            "--local_dir",
            str(actor),
            "--output",
            str(tmp_path / "merged"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert merged.returncode == 0, merged.stderr[-3000:]
    after = load_file(str(next((tmp_path / "merged").glob("*.safetensors"))))
    before = load_file(str(next(path.glob("*.safetensors"))))
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    # All-linear adapters on every block's projections; embeddings, norms and the head stay the base's.
    assert changed and all(k.endswith("proj.weight") for k in changed), sorted(changed)[:5]
    assert set(after) == set(before)
    # The run resumes from its LoRA checkpoint.
    resumed = run_train(
        config,
        tmp_path,
        "worker.actor.model.lora.rank=4",
        "worker.actor.model.lora.alpha=8",
        "worker.actor.optim.lr=5.0e-2",
        f"worker.reward.reward_function={reward}:score",
        "trainer.max_steps=3",
    )
    assert resumed.returncode == 0 and "resumed from" in resumed.stdout, resumed.stderr[-3000:]
    assert [m["step"] for m in read_metrics(run_dir)] == [0, 1, 2, 3]


def test_lora_on_a_vision_language_model(tiny_model: Callable[[str], Path], tmp_path: Path) -> None:
    """A LoRA Qwen2.5-VL trains on text and image prompts: the peft wrapper does not hide the
    vision tower (its rollouts go through ``generate``, its FSDP keep-alive still runs)."""
    from easyr1.models.structure import vision_tower

    path = tiny_model("qwen2_5_vl")
    assert vision_tower(apply_lora(load_model(path), LoraConfig(rank=4))) is not None
    data = tmp_path / "mixed"
    write_task("mixed", data, n_train=16, n_test=4, seed=0)
    run_dir = tmp_path / "run"
    config = tiny_config(path, data, run_dir)
    done = run_train(
        config,
        tmp_path,
        "worker.actor.model.lora.rank=4",
        "trainer.max_steps=1",
        "trainer.val_before_train=false",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "actor/kl_loss" in read_metrics(run_dir)[-1]


def test_lora_example_config() -> None:
    from easyr1.config import load_config

    lora = load_config(["config=examples/qwen2_5_7b_math_grpo_lora.yaml"]).worker.actor.model.lora
    assert (lora.rank, lora.alpha, lora.target_modules) == (64, 64, "all-linear")
