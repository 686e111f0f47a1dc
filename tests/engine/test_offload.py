"""Offloading parameters and optimizer state to host memory between phases (``worker.*.offload``).

On a CPU the compute device is host memory, so every move is a no-op there; what a CPU can check
is that the state survives the round trip bit for bit, that the trainer loads and offloads at the
phases EasyR1 does, that a run's numbers do not change, and that host memory stays bounded. With a
GPU the same tests move the tensors for real (the device is CUDA when there is one).
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import yaml
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard

from easyr1.algorithms.config import AlgorithmConfig
from easyr1.config import load_config
from easyr1.distributed.ports import free_port
from easyr1.experience import Experience
from easyr1.models.loading import load_model as load_hf_model
from easyr1.rollout.hf import HFRollout
from easyr1.trainer import Dist, Trainer
from easyr1.workers import offload
from easyr1.workers.actor import Actor
from easyr1.workers.config import ActorConfig, FSDPConfig, OffloadConfig
from easyr1.workers.fsdp import parallelize
from easyr1.workers.logprobs import install_scoring_head
from easyr1.workers.offload import Offloader
from tests.trainer_utils import tiny_config

DEVICE = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


@pytest.fixture()
def group() -> Iterator[None]:
    """A one-rank process group for FSDP2 on ``DEVICE`` (NCCL for CUDA tensors)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("cpu:gloo,cuda:nccl" if DEVICE.type == "cuda" else "gloo", rank=0, world_size=1)
    yield
    dist.destroy_process_group()
    gc.collect()  # see conftest.one_rank


# ----------------------------------------------------------------------------- the moves


def _actor(path: Path) -> tuple[torch.nn.Module, Actor]:
    torch.manual_seed(0)
    model = load_hf_model(path)
    install_scoring_head(model)
    config = ActorConfig(
        global_batch_size=4,
        micro_batch_size_per_device_for_update=2,
        fsdp=FSDPConfig(torch_dtype="fp32", mp_param_dtype="fp32"),
    )
    model = parallelize(model, config.fsdp, trainable=True, device=DEVICE)
    actor = Actor(
        model,
        config,
        AlgorithmConfig(disable_kl=True),
        samples_per_prompt=1,
        max_response_length=6,
        temperature=1.0,
        pad_id=0,
        total_steps=4,
        device=DEVICE,
    )
    return model, actor


def _experience(seed: int) -> Experience:
    generator = torch.Generator().manual_seed(seed)
    lengths = [3, 6, 2, 5]
    mask = torch.zeros(len(lengths), max(lengths))
    for row, n in enumerate(lengths):
        mask[row, :n] = 1
    return Experience(
        prompt_ids=[torch.randint(1, 200, (4,), generator=generator) for _ in lengths],
        response_ids=[torch.randint(1, 200, (n,), generator=generator) for n in lengths],
        multi_modal_inputs=[{} for _ in lengths],
        group=torch.zeros(len(lengths), dtype=torch.long),
        response_mask=mask,
        advantages=torch.linspace(-1, 1, len(lengths))[:, None] * mask,
    )


def _tensors(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """Every tensor offloading moves (local shards; optimizer state), by name."""
    local = lambda t: t.to_local() if hasattr(t, "to_local") else t  # noqa: E731
    out = {f"param/{n}": local(p) for n, p in model.named_parameters()}
    out.update({f"grad/{n}": local(p.grad) for n, p in model.named_parameters() if p.grad is not None})
    out.update({f"buffer/{n}": b for n, b in model.named_buffers()})
    names = {id(p): n for n, p in model.named_parameters()}
    for param, state in optimizer.state.items():
        out.update(
            {
                f"state/{names[id(param)]}/{k}": local(v)
                for k, v in state.items()
                if torch.is_tensor(v) and v.dim()
            }
        )
    return out


def test_round_trip_is_exact_and_training_continues_unchanged(
    tiny_model: Callable[[str], Path], group: None
) -> None:
    """Two identical actors train on the same batches; one goes to host memory and back between
    every phase. Everything moved must land on the host, come back bit for bit, stay the objects
    the optimizer holds, and leave the updates exactly as without offloading."""
    model, actor = _actor(tiny_model("qwen2"))
    twin_model, twin = _actor(tiny_model("qwen2"))
    host_state: offload.HostBuffers = {}  # reused across the two round trips, as the Offloader does
    first_buffers: dict = {}
    for step in (1, 2):
        for _, a in ((model, actor), (twin_model, twin)):
            a.update(_experience(step), step=step)
        # Gradients as well: a backward pass whose gradients are still there when offloading.
        loss = model(input_ids=torch.arange(1, 9, device=DEVICE)[None], use_cache=False).logits.float().mean()
        loss.backward()
        before = {k: v.detach().clone() for k, v in _tensors(model, actor.optimizer).items()}
        params = list(model.parameters())
        offload.offload_model(model, host_state)
        offload.offload_optimizer(actor.optimizer, host_state)
        assert all(t.device.type == "cpu" for t in _tensors(model, actor.optimizer).values())
        held = {key: buffer.data_ptr() for key, buffer in host_state.items()}
        local = lambda t: t.to_local() if hasattr(t, "to_local") else t  # noqa: E731
        assert held and all(  # the parameters and optimizer state sit in the host buffers, allocated once
            any(
                local(s).data_ptr() == host_state[(id(p), k)].data_ptr()
                for k, s in state.items()
                if torch.is_tensor(s) and s.dim()
            )
            for p, state in actor.optimizer.state.items()
        )
        assert all(local(p).data_ptr() == host_state[(id(p), "param")].data_ptr() for p in model.parameters())
        assert step == 1 or held == first_buffers
        first_buffers = held
        offload.load_model(model, DEVICE)
        offload.load_optimizer(actor.optimizer, DEVICE)
        after = _tensors(model, actor.optimizer)
        assert after.keys() == before.keys() and any(k.startswith("grad/") for k in after)
        for key, value in after.items():
            assert value.device == before[key].device and torch.equal(value, before[key]), key
        assert all(p is q for p, q in zip(model.parameters(), params, strict=True))
        assert all(
            p is q
            for p, q in zip(
                actor.optimizer.param_groups[0]["params"], [p for p in params if p.requires_grad], strict=True
            )
        )
        actor.optimizer.zero_grad(set_to_none=True)
    ours = {k: v.full_tensor() for k, v in model.state_dict().items()}
    theirs = {k: v.full_tensor() for k, v in twin_model.state_dict().items()}
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_a_shard_of_a_device_mesh_stays_in_its_host_buffer(group: None) -> None:
    """On a GPU the mesh is CUDA's and the buffer is host memory: the offloaded DTensor must keep
    the buffer as its local shard (``DTensor.from_local`` would copy it straight back to the mesh's
    device, freeing nothing: measured on the H200 on 2026-12-02). CPU machines have no CUDA, so a
    mesh on the "meta" device stands in for it: any move to the mesh's device would show there."""
    mesh = DeviceMesh("meta", [0])
    spec = DTensor.from_local(torch.empty(4, 3, device="meta"), mesh, [Shard(0)], run_check=False)._spec
    shard = DTensor(torch.arange(12.0).view(4, 3), spec, requires_grad=False)  # what a device shard reads as
    buffers: offload.HostBuffers = {}
    for _ in range(2):  # the first offload allocates the buffer, the second reuses it
        host = offload._into_buffer(shard, buffers, (0, "param"), pinned=False)
        assert isinstance(host, DTensor) and host.device_mesh is mesh and host.placements == (Shard(0),)
        assert host.to_local().data_ptr() == buffers[(0, "param")].data_ptr()
        assert torch.equal(host.to_local(), torch.arange(12.0).view(4, 3)) and host.shape == (4, 3)
        offload._check_on_host("parameter", [host])
    on_device = DTensor(torch.empty(4, 3, device="meta"), spec, requires_grad=False)
    with pytest.raises(RuntimeError, match=r"offload left a parameter of shape \(4, 3\) on meta"):
        offload._check_on_host("parameter", [host, on_device])


class FakeCudart:
    """CUDA's runtime where there is none (a mock: this machine has no GPU): records which host
    ranges are registered, as the driver would page-lock them."""

    class cudaError:  # noqa: N801 (torch's name)
        success = 0

    def __init__(self) -> None:
        self.registered: dict[int, int] = {}

    def cudaHostRegister(self, pointer: int, nbytes: int, flags: int) -> int:  # noqa: N802
        assert pointer not in self.registered and flags == 0
        self.registered[pointer] = nbytes
        return self.cudaError.success

    def cudaHostUnregister(self, pointer: int) -> int:  # noqa: N802
        del self.registered[pointer]
        return self.cudaError.success

    def cudaGetErrorString(self, error: int) -> str:  # noqa: N802
        return str(error)


def test_pinned_host_buffers_are_registered_at_their_exact_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 7B model's MLP weight (3,584 x 18,944 in fp32: 272 MB) took 512 MiB from torch's pinned
    allocator, which rounds up to a power of two; the buffer is plain memory registered at its own
    size instead, and unregistered when it is freed."""
    cudart = FakeCudart()
    monkeypatch.setattr(torch.cuda, "cudart", lambda: cudart)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    buffers: offload.HostBuffers = {}
    weight = torch.randn(3, 5)
    host = offload._into_buffer(weight, buffers, (0, "param"), pinned=True)
    pointer = buffers[(0, "param")].data_ptr()
    assert cudart.registered == {pointer: 3 * 5 * 4} and torch.equal(host, weight)
    assert offload._into_buffer(weight * 2, buffers, (0, "param"), pinned=True).data_ptr() == pointer
    assert len(cudart.registered) == 1  # the next offloads copy into the same registered range
    del host, buffers
    gc.collect()
    assert cudart.registered == {}


@pytest.mark.skipif(
    DEVICE.type == "cuda", reason="mocks CUDA's runtime; the GPU test below runs the real one"
)
def test_a_frozen_models_host_shards_are_registered_in_place(
    tiny_model: Callable[[str], Path], group: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reference's shards in host memory (FSDP2's CPU offload) are page-locked where they are, each
    storage once at its exact size (FSDP2's pin_memory would round each up to a power of two), and
    unregistered with the model."""
    cudart = FakeCudart()
    monkeypatch.setattr(torch.cuda, "cudart", lambda: cudart)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    model = parallelize(load_hf_model(tiny_model("qwen2")), FSDPConfig(), trainable=False, device=DEVICE)
    offload.register_host_shards(model)
    storages = {
        p.to_local().untyped_storage().data_ptr(): p.to_local().untyped_storage().nbytes()
        for p in model.parameters()
    }
    assert cudart.registered == storages and len(storages) == len(list(model.parameters()))
    del model
    gc.collect()
    assert cudart.registered == {}


@pytest.mark.skipif(DEVICE.type != "cuda", reason="needs a GPU (run on the H200)")
def test_the_reference_offloaded_by_fsdp_is_page_locked_and_computes_the_same(
    tiny_model: Callable[[str], Path], group: None
) -> None:
    path = tiny_model("qwen2")
    ids = torch.arange(1, 9, device=DEVICE)[None]
    on_device = parallelize(load_hf_model(path), FSDPConfig(), trainable=False, device=DEVICE)
    offloaded = parallelize(
        load_hf_model(path), FSDPConfig(), trainable=False, device=DEVICE, offload_params=True
    )
    assert all(p.to_local().device.type == "cpu" and p.to_local().is_pinned() for p in offloaded.parameters())
    with torch.no_grad():
        assert torch.equal(offloaded(input_ids=ids).logits, on_device(input_ids=ids).logits)


# ----------------------------------------------------------------------------- the trainer


def _trainer(model: Path, data: Path, run_dir: Path, *overrides: str) -> Trainer:
    """A one-rank trainer in this process: actor, reference model and critic (gae)."""
    config = tiny_config(model, data, run_dir)
    config["trainer"]["val_freq"] = -1
    path = run_dir.parent / f"{run_dir.name}.yaml"
    path.write_text(yaml.safe_dump(config))
    ppo = [
        "algorithm.adv_estimator=gae",
        "algorithm.use_kl_loss=false",
        "algorithm.kl_penalty=kl",
        "worker.critic.global_batch_size=2",
        "worker.critic.micro_batch_size_per_device_for_update=2",
        "worker.critic.model.enable_gradient_checkpointing=false",
        "worker.critic.fsdp.torch_dtype=fp32",
        "worker.critic.fsdp.mp_param_dtype=fp32",
        "worker.actor.use_torch_compile=false",  # on a GPU: no compile time for two steps
    ]
    torch.manual_seed(0)  # the critic's value head starts random
    return Trainer(load_config([f"config={path}", *ppo, *overrides]), Dist(0, 1, 0, DEVICE))


OFFLOAD_ALL = (
    "worker.actor.offload.offload_params=true",
    "worker.actor.offload.offload_optimizer=true",
    "worker.critic.offload.offload_params=true",
    "worker.critic.offload.offload_optimizer=true",
)


class OwnWeights:
    """A rollout engine that, like vLLM, holds a copy of the weights after ``prepare``: the HF engine
    behind a class the trainer does not take for the actor itself."""

    def __init__(self, engine: HFRollout) -> None:
        self.engine = engine

    def prepare(self, step: int) -> dict[str, float]:
        return self.engine.prepare(step)

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        return self.engine.generate(*args, **kwargs)

    def release(self) -> None:
        self.engine.release()


@pytest.mark.parametrize("engine", ["hf", "own_weights"])
def test_each_phase_has_on_the_device_exactly_what_it_uses(
    tiny_model: Callable[[str], Path],
    arithmetic: Path,
    tmp_path: Path,
    group: None,
    monkeypatch: pytest.MonkeyPatch,
    engine: str,
) -> None:
    """The moves are replaced by records (from before the trainer starts, so that nothing really
    moves), and each phase checks what is on the device when it runs: the actor's parameters for
    the hand-over (and for generation when the rollout engine is the actor itself), the model of
    each pass, the optimizer state for its model's update only, and nothing between phases. The
    reference model is FSDP's to offload (``CPUOffloadPolicy``)."""
    offloaded: set[int] = set()  # ids of the models and optimizers on the host
    moves: list[tuple[str, int]] = []

    def move(verb: str) -> Callable[..., None]:
        def record(thing: Any, where: torch.device | dict | None = None) -> None:
            assert (
                where is None or where == DEVICE or isinstance(where, dict)
            )  # a load's device; an offload's host buffers
            moves.append((verb, id(thing)))
            (offloaded.discard if verb == "load" else offloaded.add)(id(thing))

        return record

    for verb, functions in (
        ("load", ("load_model", "load_optimizer")),
        ("offload", ("offload_model", "offload_optimizer")),
    ):
        for function in functions:
            monkeypatch.setattr(offload, function, move(verb))
    trainer = _trainer(tiny_model("qwen2"), arithmetic, tmp_path / "run", *OFFLOAD_ALL)
    try:
        names = {
            id(trainer.actor.model): "actor",
            id(trainer.critic.model): "critic",
            id(trainer.actor.optimizer): "actor optimizer",
            id(trainer.critic.optimizer): "critic optimizer",
        }
        assert offloaded == set(names)  # at the trainer's start
        seen: list[tuple[str, set[str]]] = []

        def on_device() -> set[str]:
            return {name for key, name in names.items() if key not in offloaded}

        def watch(obj: Any, method: str, label: str) -> None:
            original = getattr(obj, method)

            def watched(*args: Any, **kwargs: Any) -> Any:
                seen.append((label, on_device()))
                return original(*args, **kwargs)

            monkeypatch.setattr(obj, method, watched)

        if engine == "own_weights":
            trainer.rollout = OwnWeights(trainer.rollout)
        for obj, method, label in (
            (trainer.rollout, "prepare", "hand-over"),
            (trainer.rollout, "generate", "generate"),
            (trainer.actor, "log_probs", "old log-probs"),
            (trainer.actor, "update", "actor update"),
            (trainer.critic, "values", "values"),
            (trainer.critic, "update", "critic update"),
        ):
            watch(obj, method, label)
        batches = trainer.sampler.endless()
        for step in (1, 2):
            trainer.step(step, batches)
            seen.append(("after the step", on_device()))
    finally:
        trainer.close()
    generating = {"actor"} if engine == "hf" else set()
    expected = {
        "hand-over": {"actor"},
        "generate": generating,
        "old log-probs": {"actor"},
        "values": {"critic"},
        "critic update": {"critic", "critic optimizer"},
        "actor update": {"actor", "actor optimizer"},
        "after the step": set(),
    }
    assert {label for label, _ in seen} == set(expected), seen
    for label, state in seen:
        assert state == expected[label], (label, state)
    optimizer = id(trainer.actor.optimizer)
    assert (
        moves.count(("load", optimizer)) == 2 and moves.count(("offload", optimizer)) == 3
    )  # 2 steps, and the start


def _numbers(metrics: dict[str, float]) -> dict[str, float]:
    """The metrics that do not measure time or memory."""
    return {k: v for k, v in metrics.items() if not k.startswith(("perf/", "timing_s/"))}


def test_offloading_changes_no_number_of_a_run(
    tiny_model: Callable[[str], Path], arithmetic: Path, tmp_path: Path, group: None
) -> None:
    """Two steps of PPO (actor, critic, reference) with every offload key on and off: the same metrics
    and the same weights, bit for bit."""
    results = []
    for label, overrides in (
        ("off", ()),
        (
            "on",
            (
                *OFFLOAD_ALL,
                "worker.ref.offload.offload_params=true",
                "worker.ref.fsdp.enable_cpu_offload=true",
            ),
        ),
    ):
        trainer = _trainer(tiny_model("qwen2"), arithmetic, tmp_path / label, *overrides)
        try:
            batches = trainer.sampler.endless()
            metrics = [_numbers(trainer.step(step, batches)) for step in (1, 2)]
            with trainer._on_device("actor", "critic"):
                weights = {k: v.full_tensor().cpu() for k, v in trainer.actor_model.state_dict().items()}
        finally:
            trainer.close()
        results.append((metrics, weights))
    (metrics_off, weights_off), (metrics_on, weights_on) = results
    assert metrics_on == metrics_off and "critic/vf_loss" in metrics_on[0]
    assert all(torch.equal(weights_on[k], weights_off[k]) for k in weights_off)


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


RSS_BOUND_MB = 8.0


def test_host_memory_stays_bounded_over_steps(tiny_model: Callable[[str], Path], group: None) -> None:
    """20 steps (a log-prob pass, an update) with parameters and optimizer state offloaded between
    phases: after 10 steps of warm-up (allocator pools, caches), the process's resident memory stays
    within ``RSS_BOUND_MB`` of step 10's. On a GPU a host copy leaked at each offload would add the
    model's size (parameters and both Adam moments) at every step."""
    model, actor = _actor(tiny_model("qwen2"))
    offloader = Offloader(
        model, actor.optimizer, OffloadConfig(offload_params=True, offload_optimizer=True), DEVICE
    )
    offloader.offload(optimizer=True)
    size_mb = 3 * sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
    rss = []
    for step in range(1, 21):
        exp = _experience(step)
        with offloader.on_device():
            exp.old_logp = actor.log_probs(exp)
        with offloader.on_device(optimizer=True):
            actor.update(exp, step=step)
        rss.append(_rss_mb())
    growth = [value - rss[9] for value in rss[10:]]
    assert max(growth) < RSS_BOUND_MB, [round(value, 1) for value in rss]
    assert 10 * size_mb > RSS_BOUND_MB  # so a copy leaked per step would show
