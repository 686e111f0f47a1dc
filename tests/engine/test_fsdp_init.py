"""How models are built and sharded, by EasyR1's ``fsdp.*`` and ``model.*`` keys: rank-0 init
(only rank 0 reads the weights), ``fsdp_size`` (HSDP), ``mp_buffer_dtype`` and
``freeze_vision_tower``.

One launch of 2 CPU ranks (gloo) runs the distributed scenarios and records what it saw; the
tests check the records.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import yaml

from easyr1.config import ConfigError, PPOConfig, load_config
from easyr1.config_checks import check_config
from easyr1.distributed.ports import free_port
from easyr1.models.structure import vision_tower
from easyr1.trainer import Dist, Trainer
from easyr1.workers.build import sharded_model
from easyr1.workers.config import FSDPConfig, ModelConfig
from easyr1.workers.fsdp import parallelize
from easyr1.workers.logprobs import install_scoring_head
from tests.trainer_utils import end_rank, start_rank, tiny_config

WORLD = 2
IDS = torch.arange(3, 3 + 2 * 10).reshape(2, 10) * 7 % 300
FP32 = {"torch_dtype": "fp32", "mp_param_dtype": "fp32"}
# What each scenario builds: (architecture, LoRA rank, value head).
KINDS = {
    "tied": ("qwen2", 0, False),
    "untied": ("llama", 0, False),
    "lora": ("qwen2", 4, False),
    "qwen2_5_vl": ("qwen2_5_vl", 0, False),
    "qwen3_vl": ("qwen3_vl", 0, False),
    "critic": ("qwen2", 0, True),
}


def _build(path: str, fsdp: FSDPConfig, *, lora: int = 0, value_head: bool = False) -> torch.nn.Module:
    """The trainer's own loading and sharding (``workers.build.sharded_model``), seeded alike on
    every rank, so LoRA adapters and value heads start the same with rank-0 init on or off."""
    model_cfg = ModelConfig(model_path=path, enable_gradient_checkpointing=False)
    model_cfg.lora.rank = lora
    torch.manual_seed(0)
    return sharded_model(
        PPOConfig(), path, fsdp, model_cfg, device=torch.device("cpu"), value_head=value_head
    )


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Full parameters and buffers, and the model's log-probs (values for a critic) on ``IDS``."""
    state = {f"param/{k}": v.full_tensor() for k, v in model.named_parameters()}
    state.update({f"buffer/{k}": v.clone() for k, v in model.named_buffers()})
    with torch.no_grad():
        logits = model(input_ids=IDS, use_cache=False).logits
    state["logp"] = logits if logits.shape[-1] == 1 else torch.log_softmax(logits.float(), -1)
    return state


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


def _count_weight_reads() -> list[str]:
    """A spy on ``from_pretrained``, the only place the engine reads weight files."""
    from transformers import PreTrainedModel

    reads: list[str] = []
    original = PreTrainedModel.from_pretrained.__func__

    def spy(cls: type, *args: Any, **kwargs: Any) -> Any:
        reads.append(cls.__name__)
        return original(cls, *args, **kwargs)

    PreTrainedModel.from_pretrained = classmethod(spy)
    return reads


def _rank0_init_scenario(rank: int, paths: dict[str, str], results: dict[str, Any]) -> None:
    reads = _count_weight_reads()
    for kind, (arch, lora, value_head) in KINDS.items():
        built = {}
        for rank0 in (False, True):
            del reads[:]
            model = _build(
                paths[arch], FSDPConfig(**FP32, enable_rank0_init=rank0), lora=lora, value_head=value_head
            )
            built[rank0] = _state(model)
            results[f"{kind}/reads_rank0_init_{rank0}"] = len(reads)
        results[f"{kind}/equal"] = _same(built[False], built[True])
        results[f"{kind}/lora_params"] = sum("lora_" in k for k in built[True])


def _update(
    rank: int, path: str, fsdp: FSDPConfig
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], int]:
    """(parameters before, after one AdamW step on this rank's own batch, mesh dimensions)."""
    model = _build(path, fsdp)
    before = {k: v.full_tensor().clone() for k, v in model.named_parameters()}  # a 1-rank shard is no copy
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    ids = IDS + 11 * rank  # different data on each rank: the gradients must be averaged
    model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    after = {k: v.full_tensor() for k, v in model.named_parameters()}
    return before, after, next(model.parameters()).device_mesh.ndim


def _fsdp_size_scenario(rank: int, paths: dict[str, str], results: dict[str, Any]) -> None:
    """fsdp_size=1: 2 replicas of 1 shard each (HSDP); -1: one group of both ranks (FSDP)."""
    sharded = _update(rank, paths["qwen2"], FSDPConfig(**FP32, fsdp_size=-1))
    replicated = _update(rank, paths["qwen2"], FSDPConfig(**FP32, fsdp_size=1))
    results["fsdp_size/mesh_ndim"] = [sharded[2], replicated[2]]
    results["fsdp_size/same_start"] = _same(sharded[0], replicated[0])
    results["fsdp_size/moved"] = not _same(sharded[0], sharded[1])
    results["fsdp_size/max_diff"] = max(
        float((sharded[1][k] - replicated[1][k]).abs().max()) for k in sharded[1]
    )


def _worker(rank: int, port: int, paths: dict[str, str]) -> None:
    torch.set_num_threads(1)
    start_rank(rank, port, WORLD)
    results: dict[str, Any] = {}
    try:
        _rank0_init_scenario(rank, paths, results)
        _fsdp_size_scenario(rank, paths, results)
    finally:
        dist.destroy_process_group()
    (Path(paths["out"]) / f"results_rank{rank}.json").write_text(json.dumps(results))
    end_rank()


@pytest.fixture(scope="module")
def records(
    tmp_path_factory: pytest.TempPathFactory, tiny_model: Callable[[str], Path]
) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("fsdp_init")
    paths = {arch: str(tiny_model(arch)) for arch, _, _ in KINDS.values()}
    paths["out"] = str(out)
    # Forked from a forkserver that imported the heavy modules once (see tests/training/test_checkpoint.py).
    mp.get_context("forkserver").set_forkserver_preload(["torch", "transformers", "peft", "easyr1.trainer"])
    mp.start_processes(_worker, args=(free_port(), paths), nprocs=WORLD, join=True, start_method="forkserver")
    return [json.loads((out / f"results_rank{rank}.json").read_text()) for rank in range(WORLD)]


# ----------------------------------------------------------------------------- rank-0 init


@pytest.mark.parametrize("kind", list(KINDS))
def test_rank0_init_builds_the_same_model_bit_for_bit(records: list[dict[str, Any]], kind: str) -> None:
    """Parameters (full tensors), buffers (rotary ``inv_freq`` is in no state dict) and log-probs
    are identical with rank-0 init on and off: tied and untied heads, LoRA, both Qwen-VL
    generations, a critic's value head."""
    for rank, record in enumerate(records):
        assert record[f"{kind}/equal"] is True, f"rank {rank}"
    assert (records[0][f"{kind}/lora_params"] > 0) == (kind == "lora")


@pytest.mark.parametrize("kind", list(KINDS))
def test_rank0_init_reads_the_weights_on_rank0_alone(records: list[dict[str, Any]], kind: str) -> None:
    """With rank-0 init rank 1 never reads a weight file (so never holds a full copy: it builds
    on the meta device and receives its shards); without it every rank reads them."""
    assert [record[f"{kind}/reads_rank0_init_True"] for record in records] == [1, 0]
    assert [record[f"{kind}/reads_rank0_init_False"] for record in records] == [1, 1]


# ----------------------------------------------------------------------------- fsdp_size


def test_fsdp_size_one_replicates_and_trains_like_full_sharding(records: list[dict[str, Any]]) -> None:
    """HSDP with shards of one rank (pure replication, a 2-D mesh) starts from the same weights and
    takes the same step as sharding over both ranks, up to fp32 rounding of the reduction order."""
    for record in records:
        assert record["fsdp_size/mesh_ndim"] == [1, 2]
        assert record["fsdp_size/same_start"] is True and record["fsdp_size/moved"] is True
        assert record["fsdp_size/max_diff"] < 1e-6


@pytest.mark.parametrize("size", [0, -2, 3, 4])
def test_fsdp_size_must_divide_the_world(size: int) -> None:
    config = PPOConfig()
    config.data.rollout_batch_size = config.worker.actor.global_batch_size = 2
    for size_ok in (-1, 1, 2):
        config.worker.ref.fsdp.fsdp_size = size_ok
        check_config(config, 2)
    config.worker.ref.fsdp.fsdp_size = size
    with pytest.raises(
        ConfigError, match=rf"worker\.ref\.fsdp\.fsdp_size={size} must be -1 .* divide the 2 ranks"
    ):
        check_config(config, 2)


# ----------------------------------------------------------------------------- mp_buffer_dtype


def test_mp_buffer_dtype_casts_floating_buffers(tiny_model: Callable[[str], Path], one_rank: None) -> None:
    """Under AMP the floating buffers (rotary ``inv_freq``) take ``mp_buffer_dtype``, as EasyR1's FSDP
    ``MixedPrecision(buffer_dtype=...)`` keeps them; the model computes with them."""
    from easyr1.models.loading import load_model

    outputs = {}
    for dtype, expected in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        model = load_model(tiny_model("qwen2"))
        install_scoring_head(model)
        model = parallelize(
            model, FSDPConfig(mp_buffer_dtype=dtype), trainable=True, device=torch.device("cpu")
        )
        floating = [b for b in model.buffers() if b.is_floating_point()]
        assert floating and all(b.dtype == expected for b in floating)
        assert next(model.parameters()).dtype == torch.float32  # fp32 master weights under AMP
        with torch.no_grad():
            outputs[dtype] = model(input_ids=IDS, use_cache=False).logits
    assert not torch.equal(outputs["fp32"], outputs["bf16"])


# ----------------------------------------------------------------------------- freeze_vision_tower

REWARD = '''
def compute_score(reward_inputs):
    """Scores that differ within a group, so advantages (and gradients) are not zero."""
    return [{"overall": float(len(r["response"]) % 3)} for r in reward_inputs]
'''


@pytest.mark.parametrize("freeze", [True, False])
def test_frozen_vision_tower_is_not_updated_by_a_step_on_images(
    tiny_model: Callable[[str], Path], tmp_path: Path, one_rank: None, freeze: bool
) -> None:
    """One training step on image prompts (one rank, in this process): with
    ``model.freeze_vision_tower`` the tower's weights stay bit for bit, the language model's move;
    without it the tower moves too (weight decay off: only gradients move weights)."""
    from easyr1.data.synthetic import write_task

    write_task("count_shapes", tmp_path / "data", n_train=8, n_test=2, seed=0)
    (tmp_path / "reward.py").write_text(REWARD)
    config = tiny_config(tiny_model("qwen2_5_vl"), tmp_path / "data", tmp_path / "run")
    config["trainer"]["val_freq"] = -1
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    overrides = [
        f"config={path}",
        f"worker.reward.reward_function={tmp_path / 'reward.py'}:compute_score",
        "algorithm.disable_kl=true",
        "worker.actor.optim.weight_decay=0.0",
        f"worker.actor.model.freeze_vision_tower={str(freeze).lower()}",
    ]
    trainer = Trainer(load_config(overrides), Dist(0, 1, 0, torch.device("cpu")))
    try:

        def weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
            return {k: v.full_tensor().clone() for k, v in module.named_parameters()}

        tower = vision_tower(trainer.actor_model)
        before_tower, before_all = weights(tower), weights(trainer.actor_model)
        trainer.step(1, trainer.sampler.endless())
        after_tower, after_all = weights(tower), weights(trainer.actor_model)
    finally:
        trainer.close()
    tower_moved = [k for k in before_tower if not torch.equal(before_tower[k], after_tower[k])]
    text_moved = [
        k for k in before_all if ".visual." not in k and not torch.equal(before_all[k], after_all[k])
    ]
    assert text_moved
    if freeze:
        assert not tower_moved and all(not p.requires_grad for p in tower.parameters())
    else:
        assert len(tower_moved) == len(before_tower)


# ----------------------------------------------------------------------------- outputs


def test_training_forwards_return_no_views_for_fsdp_to_warn_of(
    tiny_model: Callable[[str], Path], one_rank: None
) -> None:
    """FSDP2 warns of each view among a wrapped model's outputs. A VL model's training forward on
    an image (its output carried the tower's per-image features, split views) and a critic's (its
    value head's ``[B, T, 1]`` logits, a view of the matmul) return none now, and their logits
    still carry gradients to the weights."""
    from PIL import Image

    from easyr1.models.loading import load_model, load_processor, load_value_model

    path = tiny_model("qwen2_5_vl")
    processor = load_processor(path)
    text = processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "count"}]}], tokenize=False
    )
    images = processor(text=[text], images=[Image.new("RGB", (56, 84), (200, 30, 30))], return_tensors="pt")
    vl = load_model(path)
    install_scoring_head(vl)
    critic = load_value_model(tiny_model("qwen2"))
    calls = {
        "vl": (parallelize(vl, FSDPConfig(**FP32), trainable=True, device=torch.device("cpu")), dict(images)),
        "critic": (
            parallelize(critic, FSDPConfig(**FP32), trainable=True, device=torch.device("cpu")),
            {"input_ids": IDS},
        ),
    }
    for name, (model, inputs) in calls.items():
        model.train()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model(**inputs, use_cache=False).logits.float().square().mean().backward()
        views = [str(w.message) for w in caught if "returned a view tensor" in str(w.message)]
        assert not views, f"{name}: {views}"
        assert all(p.grad is not None for p in model.parameters() if p.requires_grad), name
