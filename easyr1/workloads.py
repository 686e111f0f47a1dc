"""The named benchmark workloads (``easyr1 bench --workload NAME``): each one's model, shapes and
settings, and its training config as override arguments. Light (no torch): the hardware report
estimates the memory workloads from the same configs the benchmark runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from easyr1.data.synthetic import VIDEO_TASKS


@dataclass(frozen=True)
class Workload:
    arch: str
    size: str
    prompt_tokens: int  # text prompts are padded to exactly this length; VL prompts carry an image or a video
    response_tokens: int
    prompts: int  # per step; with ``per_rank``, per rank
    n: int
    image_size: int = 0  # VL workloads: the side of each image or video frame
    task: str = "count_shapes"  # VL workloads: the synthetic task whose prompts (and media) they use
    # Text prompts' lengths: all ``prompt_tokens``, or spread evenly from this up to it (varied lengths).
    min_prompt_tokens: int | None = None
    # vLLM's share of the GPU. The anchor's KV cache needs 1.4 GiB; 0.12 (17 GiB) holds it with room
    # to spare, and a smaller pool is faster to release at every sleep (0.5 s for 0.25's 32 GiB).
    vllm_memory: float = 0.6
    # Config overrides on top of the benchmark's own (the memory workloads' EasyR1 settings).
    engine: dict[str, Any] = field(default_factory=dict)
    # ``prompts`` on each rank: a run on G GPUs takes G times as many, so that each GPU's share, and
    # so its memory, is that of the one-GPU run (the memory and long-sequence workloads).
    per_rank: bool = False
    # GPUs per vLLM engine (at most the run's): EasyR1's example runs engines of 2; None, one engine
    # over all the GPUs.
    tensor_parallel: int | None = None
    # ``--precision``'s default; None: bf16 on sized models, fp32 on tiny ones.
    precision: str | None = None

    def prompts_on(self, gpus: int) -> int:
        """The prompts of one step on ``gpus`` ranks."""
        return self.prompts * gpus if self.per_rank else self.prompts


# EasyR1's examples/config.yaml as far as memory goes: 2048-token prompts and responses,
# micro-batches of 1 (update) and 2 (experience), the actor's parameters and optimizer offloaded
# between phases, the reference model in host memory (FSDP's CPU offload), gradient checkpointing
# of every block, padding-free, dynamic batching. One prompt x 2 samples a rank instead of 512 x 5: peak memory depends on
# the micro-batches, not on how many there are (the HF rollout's KV cache, which does, stays small).
EASYR1_EXAMPLE = {
    "worker.actor.micro_batch_size_per_device_for_update": 1,
    "worker.actor.micro_batch_size_per_device_for_experience": 2,
    "worker.actor.model.enable_gradient_checkpointing": True,
    "worker.actor.padding_free": True,
    "worker.actor.dynamic_batching": True,
    "worker.actor.offload.offload_params": True,
    "worker.actor.offload.offload_optimizer": True,
    "worker.ref.fsdp.enable_cpu_offload": True,
}


def _easyr1_example(size: str) -> Workload:
    return Workload(
        "qwen2",
        size,
        prompt_tokens=2048,
        response_tokens=2048,
        prompts=1,
        n=2,
        engine=EASYR1_EXAMPLE,
        per_rank=True,
    )


# EasyR1's example at its own scale, as its published rows ran it: 512 prompts x 5 samples a step in
# mini-batches of 128 prompts (four updates a step), AMP, vLLM engines of two GPUs, images resized
# into [262,144, 4,194,304] pixels. A step on eight GPUs takes minutes.
EASYR1_SCALE = {
    **EASYR1_EXAMPLE,
    "worker.actor.global_batch_size": 128,
    "data.min_pixels": 262144,
    "data.max_pixels": 4194304,
}


WORKLOADS = {
    "anchor": Workload(
        "qwen2", "1.5b", prompt_tokens=256, response_tokens=512, prompts=8, n=8, vllm_memory=0.12
    ),
    # The anchor with prompts of 64 to 1024 tokens: sequences of 576 to 1536 tokens, where padding costs.
    "anchor_varied": Workload(
        "qwen2",
        "1.5b",
        prompt_tokens=1024,
        min_prompt_tokens=64,
        response_tokens=512,
        prompts=8,
        n=8,
        vllm_memory=0.12,
    ),
    # Two responses of 16,384 tokens from one prompt a rank: long-sequence memory, and on several
    # GPUs Ulysses sequence parallelism against data parallelism.
    "long_16k": Workload(
        "qwen2",
        "1.5b",
        prompt_tokens=256,
        response_tokens=16384,
        prompts=1,
        n=2,
        vllm_memory=0.3,
        per_rank=True,
    ),
    # vLLM's share: 28 GiB hold the 3B's 7 GiB of weights, its 2.4 GiB of KV cache and the image
    # encoder's profiling with room to spare, and the memory estimate then keeps vLLM awake (0.6, 84
    # GiB, made it sleep, about 1 s a step on the H200 before 2026-12-03).
    "anchor_vl": Workload(
        "qwen2_5_vl",
        "3b",
        prompt_tokens=512,
        response_tokens=512,
        prompts=8,
        n=8,
        image_size=448,
        vllm_memory=0.2,
    ),
    # The VL anchor on video: each prompt one 4-frame 448x448 clip (2 temporal patches, 512 video tokens).
    "anchor_video": Workload(
        "qwen2_5_vl",
        "3b",
        prompt_tokens=768,
        response_tokens=512,
        prompts=8,
        n=8,
        image_size=448,
        task="moving_bar",
    ),
    # The same shapes on a tiny model: checks the benchmark itself on a CPU in seconds.
    "smoke": Workload("qwen2", "tiny", prompt_tokens=64, response_tokens=16, prompts=4, n=2),
    "smoke_vl": Workload(
        "qwen2_5_vl", "tiny", prompt_tokens=128, response_tokens=16, prompts=4, n=2, image_size=56
    ),
    "smoke_video": Workload(
        "qwen2_5_vl",
        "tiny",
        prompt_tokens=128,
        response_tokens=16,
        prompts=4,
        n=2,
        image_size=56,
        task="moving_bar",
    ),
    # EasyR1's hardware table's workload on Qwen2.5 architectures (bench/README.md, "Memory").
    **{f"easyr1_{size}": _easyr1_example(size) for size in ("1.5b", "3b", "7b", "32b", "72b")},
    "smoke_memory": Workload(
        "qwen2",
        "tiny",
        prompt_tokens=64,
        response_tokens=32,
        prompts=1,
        n=2,
        engine=EASYR1_EXAMPLE,
        per_rank=True,
    ),
    # The example's text run on the Qwen2.5-7B architecture: every prompt and response 2048 tokens.
    "easyr1_scale_7b": Workload(
        "qwen2",
        "7b",
        prompt_tokens=2048,
        response_tokens=2048,
        prompts=512,
        n=5,
        engine=EASYR1_SCALE,
        tensor_parallel=2,
        precision="amp",
    ),
    # Its Geometry3k run on the Qwen2.5-VL-7B architecture: a short question about one 512x512 image
    # (262,144 pixels: EasyR1's min_pixels, which any smaller diagram is brought up to), responses of 2048.
    "easyr1_scale_vl_7b": Workload(
        "qwen2_5_vl",
        "7b",
        prompt_tokens=2048,
        response_tokens=2048,
        prompts=512,
        n=5,
        image_size=512,
        engine=EASYR1_SCALE,
        tensor_parallel=2,
        precision="amp",
    ),
}

# What ``--precision`` sets, as EasyR1's table names its rows: BF16 (bf16 weights and optimizer
# state), AMP (fp32 master weights and AdamW, bf16 compute) and LoRA (AMP, rank-64 adapters on
# every linear layer, as EasyR1's LoRA examples); fp32 throughout for the tiny models.
PRECISIONS: dict[str, dict[str, Any]] = {
    "fp32": {
        "worker.actor.fsdp.torch_dtype": "fp32",
        "worker.actor.fsdp.mp_param_dtype": "fp32",
        "worker.actor.optim.strategy": "adamw",
        "worker.ref.fsdp.torch_dtype": "fp32",
    },
    "bf16": {
        "worker.actor.fsdp.torch_dtype": "bf16",
        "worker.actor.fsdp.mp_param_dtype": "bf16",
        "worker.actor.optim.strategy": "adamw_bf16",
        "worker.ref.fsdp.torch_dtype": "bf16",
    },
    "amp": {
        "worker.actor.fsdp.mp_param_dtype": "bf16",
        "worker.actor.optim.strategy": "adamw",
        "worker.ref.fsdp.torch_dtype": "bf16",
    },
}
PRECISIONS["lora"] = {
    **PRECISIONS["amp"],
    "worker.actor.model.lora.rank": 64,
    "worker.actor.model.lora.alpha": 64,
}

KL_COEF = 0.01  # the KL loss's coefficient (TRL's beta in the peer)


def default_precision(name: str) -> str:
    work = WORKLOADS[name]
    return work.precision or ("fp32" if work.size == "tiny" else "bf16")


def workload_config(
    name: str, backend: str = "hf", gpus: int = 1, precision: str | None = None
) -> dict[str, Any]:
    """The training config of workload ``name`` as override arguments, but for its files (model,
    data, run folder); ``easyr1 memory`` estimates the memory workloads from it."""
    work = WORKLOADS[name]
    prompts = work.prompts_on(gpus)
    return {
        "data.val_files": "",
        "data.prompt_key": "problem",
        "data.answer_key": "answer",
        "data.max_prompt_length": work.prompt_tokens,
        "data.max_response_length": work.response_tokens,
        "data.rollout_batch_size": prompts,
        "data.min_pixels": None,
        "data.max_pixels": None,
        "algorithm.use_kl_loss": True,
        "algorithm.kl_coef": KL_COEF,
        "algorithm.kl_penalty": "low_var_kl",
        "worker.actor.global_batch_size": prompts,
        # The scoring head never forms full logits, so a whole rank's share fits one micro-batch.
        "worker.actor.micro_batch_size_per_device_for_update": prompts * work.n // gpus,
        "worker.actor.micro_batch_size_per_device_for_experience": prompts * work.n // gpus,
        **PRECISIONS[precision or default_precision(name)],
        "worker.rollout.name": backend,
        "worker.rollout.gpu_memory_utilization": work.vllm_memory,
        # vLLM's batch must hold a whole sequence (chunked prefill is off, as in EasyR1).
        "worker.rollout.max_num_batched_tokens": max(8192, work.prompt_tokens + work.response_tokens),
        "worker.rollout.tensor_parallel_size": min(work.tensor_parallel or gpus, gpus),
        "worker.rollout.n": work.n,
        "worker.rollout.ignore_eos": True,
        "worker.rollout.limit_videos": 1 if work.task in VIDEO_TASKS else 0,
        "worker.reward.reward_function": "math",
        "trainer.n_gpus_per_node": gpus,
        "trainer.logger": ["console", "file"],
        "trainer.val_before_train": False,
        **work.engine,
    }
