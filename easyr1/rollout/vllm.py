"""Rollout with vLLM (0.24) in SPMD mode: every training rank runs one in-process vLLM engine.

Facts of vLLM 0.24 this module relies on (read in its source):

- ``distributed_executor_backend="external_launcher"`` (``v1/executor/uniproc_executor.py``)
  reuses the torch.distributed world the launcher made; ``distributed/parallel_state.py`` lays
  the world out as ``(-1, dp, pp, pcp, tp)``, so with only tensor parallelism its TP groups are
  runs of ``tp`` consecutive ranks. The ranks of a TP group run one model together and must
  submit identical requests in the same order: each rank gathers its group's prompts (and
  seeds), all generate the same batch, and each keeps its own share.
- ``logprobs_mode="processed_logprobs"`` (``config/model.py``, ``v1/sample/sampler.py``): the
  log-probs come after logit processors, temperature and top-k/top-p, that is of the
  distribution actually sampled from. With ``top_p=1`` and ``top_k<=0`` they are
  ``log_softmax(logits / temperature)``, what the actor recomputes (vLLM's default,
  ``raw_logprobs``, has no temperature). Under top-p/top-k truncation they are log-probs of the
  renormalised truncated distribution, unlike the HF backend's.
- Prompts given as token ids are expanded by vLLM itself (``multimodal/processing/processor.py``:
  token prompts get ``is_update_applied=False``, so the Qwen-VL replacement of *each* image
  placeholder token by ``grid_t*grid_h*grid_w/merge_size**2`` copies is applied). The dataset's
  ``input_ids`` are already expanded, so each image's run of placeholders is collapsed back to
  one token, and the images go as ``multi_modal_data={"image": [PIL images]}`` (the dataset
  item's ``images``, already resized to ``data.min/max_pixels``). vLLM's expanded prompt is
  checked against our ``input_ids``, so a processor mismatch fails loudly.
- Videos go the same way, as ``multi_modal_data={"video": [(frames, metadata)]}``: the dataset's
  sampled and resized ``[T, H, W, 3]`` uint8 frames with the metadata the Qwen-VL processors read
  (``fps``, ``frames_indices``: Qwen2.5-VL's ``second_per_grid_ts`` and Qwen3-VL's timestamps), and
  ``mm_processor_kwargs={"do_sample_frames": False}`` so that vLLM's processor keeps exactly those
  frames. vLLM's Qwen2-VL/Qwen2.5-VL data parser (``Qwen2VLMultiModalDataParser``, no
  ``video_needs_metadata``) drops the metadata of a ``(frames, metadata)`` tuple
  (``multimodal/parse.py``, ``_parse_video_data``), and transformers then assumes 24 fps
  (``VideoMetadata.sampled_fps``): ``second_per_grid_ts`` 2/24 instead of 2/2, so every temporal patch
  after the first gets a wrong M-RoPE time position. For those model types the metadata also goes
  as ``mm_processor_kwargs["video_metadata"]``, which vLLM hands to the HF processor call as is
  (Qwen3-VL's parser keeps it and passes it itself, so it must not get it twice). Qwen3-VL expands
  a video into timestamp text and one vision run per frame pair, which cannot be collapsed token by
  token, so a prompt with videos goes as the tokenizer's ids of the
  unexpanded prompt text (the dataset item's ``prompt``). ``limit_mm_per_prompt`` allows
  ``worker.rollout.limit_videos`` videos (0, the default, is sized from the data as in EasyR1: for
  data without videos they stay off, and vLLM does not profile them at start-up with the folder's
  own video processor, which an image-only folder lacks).
- Sleep mode: ``sleep(level=2)`` discards weights and KV cache (buffers are saved to the CPU and
  restored at wake-up, ``v1/worker/gpu_worker.py``); level 1 would copy the weights to the CPU
  (2.3 s for 1.5B on the H200), wasted work since ``prepare`` overwrites them every step.
  Sleeping also clears the prefix cache (``v1/engine/core.py``), which stale weights would poison;
  an engine that stays awake (``free_cache_engine=False``) clears it after each hand-over.
- The in-process model: ``llm.llm_engine.model_executor.driver_worker.worker.model_runner.model``
  (``v1/engine/llm_engine.py``: ``model_executor`` when not multiprocess;
  ``UniProcExecutor.driver_worker`` is a ``WorkerWrapperBase`` whose ``worker`` holds the
  ``model_runner``); a CUDA-graph wrapper around it forwards ``load_weights``.
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from easyr1.config import ConfigError
from easyr1.rollout.base import Rollout, SamplingParams
from easyr1.rollout.config import RolloutConfig
from easyr1.rollout.hf import forbidden_token_ids
from easyr1.workers.fsdp import DTYPES
from easyr1.workers.sync import DEFAULT_BUCKET_BYTES, weight_buckets

VLLM_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
GIB = 2**30
# vLLM's environment as this rollout runs it, unless the user's environment says otherwise: the
# FlashInfer sampler off (every GPU record was made with torch's sampler, as the host notes advise),
# and on one GPU the V2 model runner: on H200s (2026-12-04, two pairs of runs back to back on one
# machine) it decoded the anchor in 1.50-2.01 s a step against 2.14-2.76 s with vLLM's own runner,
# whose host-side work per decoding step outran the GPU's; it is correct with images. At tensor-parallel
# size 2 (two H200s, 2026-12-04) it was correct on the anchor (the same log-prob mismatch) and 5% faster
# in one pair of runs, and has not run with images: vLLM's default stays there. Usage statistics off: vLLM would
# otherwise post them to its server from a thread every 10 minutes, and GPU clusters are offline.
VLLM_ENV = {"VLLM_USE_FLASHINFER_SAMPLER": "0", "VLLM_NO_USAGE_STATS": "1"}
VLLM_ENV_ONE_GPU = {"VLLM_USE_V2_MODEL_RUNNER": "1"}


def set_vllm_env(tensor_parallel_size: int) -> dict[str, str]:
    """Set ``VLLM_ENV`` (and ``VLLM_ENV_ONE_GPU`` for ``tensor_parallel_size`` 1) where the
    environment has no value yet; the ``VLLM_*`` variables as they now are."""
    for key, value in {**VLLM_ENV, **(VLLM_ENV_ONE_GPU if tensor_parallel_size == 1 else {})}.items():
        os.environ.setdefault(key, value)
    return {k: v for k, v in os.environ.items() if k.startswith("VLLM_")}


def check_tensor_parallel(tp: int, world: int) -> None:
    if tp < 1 or world % tp:
        raise ConfigError(
            f"worker.rollout.tensor_parallel_size={tp} must be at least 1 and divide the {world} ranks"
        )


def tp_groups(world: int, tp: int) -> list[list[int]]:
    """vLLM's TP groups under external_launcher: runs of ``tp`` consecutive ranks."""
    check_tensor_parallel(tp, world)
    return [list(range(start, start + tp)) for start in range(0, world, tp)]


def new_tp_group(world: int, tp: int, rank: int) -> dist.ProcessGroup | None:
    """This rank's TP group as a gloo group (for Python objects), None for tp=1; collective over all ranks."""
    if tp == 1:
        return None
    mine = None
    for ranks in tp_groups(world, tp):
        group = dist.new_group(ranks, backend="gloo")  # every rank creates every group, in order
        if rank in ranks:
            mine = group
    return mine


def gather_in_group(obj: Any, group: dist.ProcessGroup | None) -> list[Any]:
    """``obj`` of every rank of ``group``, in rank order; ``[obj]`` without a group."""
    if group is None:
        return [obj]
    out: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


def collapse_image_tokens(input_ids: torch.Tensor, image_token_id: int, n_images: int) -> list[int]:
    """Expanded prompt ids -> one placeholder per image, the form vLLM expands itself."""
    ids = input_ids.tolist()
    out = [t for i, t in enumerate(ids) if t != image_token_id or i == 0 or ids[i - 1] != image_token_id]
    runs = sum(t == image_token_id for t in out)
    if runs != n_images:
        raise ValueError(f"prompt has {runs} runs of image tokens for {n_images} images")
    return out


# Model types whose vLLM data parser drops a video's metadata (see the module docstring).
METADATA_AS_KWARG = ("qwen2_vl", "qwen2_5_vl")


def vllm_prompt(
    item: dict[str, Any],
    image_token_id: int | None,
    tokenizer: Any = None,
    limit_videos: int = 0,
    model_type: str | None = None,
) -> dict[str, Any]:
    """A dataset item as a vLLM prompt: token ids, plus the images and videos when it has any
    (``tokenizer``, ``limit_videos`` and ``model_type`` matter only for videos: see the module docstring)."""
    images = list(item.get("images") or [])
    videos = list(item.get("videos") or [])
    if not images and not videos:
        return {"prompt_token_ids": item["input_ids"].tolist()}
    if not videos:
        if image_token_id is None:
            raise ValueError("a prompt has images but the model config has no image_token_id")
        ids = collapse_image_tokens(item["input_ids"], image_token_id, len(images))
        return {"prompt_token_ids": ids, "multi_modal_data": {"image": images}}
    if len(videos) > limit_videos:
        raise ConfigError(
            f"worker.rollout.limit_videos={limit_videos}: a prompt has {len(videos)} video(s); "
            f"raise worker.rollout.limit_videos to at least the most videos one prompt holds"
        )
    metadata = [dict(v.metadata().items()) for v in videos]
    data: dict[str, Any] = {"video": [(v.frames, m) for v, m in zip(videos, metadata, strict=True)]}
    if images:
        data["image"] = images
    kwargs: dict[str, Any] = {"do_sample_frames": False}
    if model_type in METADATA_AS_KWARG:
        kwargs["video_metadata"] = metadata
    return {
        "prompt_token_ids": tokenizer(item["prompt"], add_special_tokens=False)["input_ids"],
        "multi_modal_data": data,
        "mm_processor_kwargs": kwargs,
    }


def assemble(
    prompts: Sequence[dict[str, Any]],
    samples: Sequence[Sequence[tuple[list[int], list[float] | None]]],
    params: SamplingParams,
    eos_ids: Sequence[int],
) -> Rollout:
    """Per prompt, its ``n`` (token ids, log-probs or None) -> a ``Rollout`` in prompt order."""
    eos = set(eos_ids)
    rollout = Rollout([], [], [], [], [] if params.logprobs else None)
    for index, (prompt, per_prompt) in enumerate(zip(prompts, samples, strict=True)):
        for token_ids, logprobs in per_prompt:
            rollout.prompt_index.append(index)
            rollout.prompt_ids.append(prompt["input_ids"])
            rollout.response_ids.append(torch.tensor(token_ids, dtype=torch.long))
            rollout.finished.append(not params.ignore_eos and bool(token_ids) and token_ids[-1] in eos)
            if rollout.logprobs is not None:
                rollout.logprobs.append(torch.tensor(logprobs, dtype=torch.float32))
    return rollout


def _samples(output: Any, expected_prompt: list[int]) -> list[tuple[list[int], list[float] | None]]:
    """A vLLM ``RequestOutput`` -> its samples (token ids, log-probs where asked for) in index order,
    after checking vLLM's prompt is ours."""
    if list(output.prompt_token_ids) != expected_prompt:
        raise RuntimeError(
            "vLLM expanded a prompt differently from the dataset's processor (image token counts differ); "
            "check that the model folder's preprocessor config matches the processor the dataset used"
        )
    out = []
    for completion in sorted(output.outputs, key=lambda c: c.index):
        tokens = list(completion.token_ids)
        logprobs = completion.logprobs
        out.append(
            (
                tokens,
                None if logprobs is None else [logprobs[t][token].logprob for t, token in enumerate(tokens)],
            )
        )
    return out


def engine_kwargs(
    cfg: RolloutConfig,
    *,
    model_path: str,
    tokenizer_path: str,
    max_model_len: int,
    trust_remote_code: bool,
    multimodal: bool = False,
) -> dict[str, Any]:
    """Arguments of ``vllm.LLM`` for one SPMD engine per rank (sleep mode unless it stays awake)."""
    if cfg.free_cache_engine == "auto":
        raise ValueError(
            "free_cache_engine='auto' must be settled first (easyr1.rollout.backend.settle_free_cache_engine)"
        )
    if not cfg.enable_chunked_prefill and cfg.max_num_batched_tokens < max_model_len:
        # vLLM refuses it too, but as a validation error of its scheduler that names neither key.
        raise ConfigError(
            f"worker.rollout.max_num_batched_tokens={cfg.max_num_batched_tokens} is below the context of "
            f"{max_model_len} tokens (prompt plus response, or worker.rollout.max_model_len): without "
            "chunked prefill one batch must hold a whole sequence; raise it or set "
            "worker.rollout.enable_chunked_prefill=true"
        )
    kwargs: dict[str, Any] = {
        "model": model_path,
        "tokenizer": tokenizer_path,
        "trust_remote_code": trust_remote_code,
        "distributed_executor_backend": "external_launcher",
        "tensor_parallel_size": cfg.tensor_parallel_size,
        "dtype": VLLM_DTYPES[cfg.dtype],
        "gpu_memory_utilization": cfg.gpu_memory_utilization,
        "enforce_eager": cfg.enforce_eager,
        "enable_chunked_prefill": cfg.enable_chunked_prefill,
        "max_num_batched_tokens": cfg.max_num_batched_tokens,
        "max_num_seqs": cfg.max_num_seqs,
        "max_model_len": max_model_len,
        "enable_sleep_mode": cfg.free_cache_engine,
        "seed": cfg.seed,
        "logprobs_mode": "processed_logprobs",
        "disable_log_stats": cfg.disable_log_stats,
    }
    if (
        not cfg.enforce_eager
    ):  # inductor compilation did not finish in 400 s on the H200; CUDA graphs alone did
        kwargs["compilation_config"] = {"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"}
    if multimodal:  # 0 videos also stops vLLM profiling them (see the module docstring)
        kwargs["limit_mm_per_prompt"] = {"image": cfg.limit_images or 4, "video": cfg.limit_videos}
    if cfg.limit_videos > 1:
        # The video metadata goes per request (mm_processor_kwargs); after a partial hit of vLLM's
        # processor cache the HF processor would see fewer videos than metadata entries, and fail.
        kwargs["mm_processor_cache_gb"] = 0
    return kwargs


class VLLMRollout:
    """vLLM engine given the actor's weights before each rollout; it sleeps between rollouts
    unless ``free_cache_engine`` is off."""

    def __init__(
        self,
        cfg: RolloutConfig,
        actor: nn.Module,
        *,
        model_path: str,
        tokenizer_path: str,
        max_model_len: int,
        trust_remote_code: bool,
        eos_ids: Sequence[int],
        rank: int,
        world: int,
        local_rank: int,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    ) -> None:
        check_tensor_parallel(cfg.tensor_parallel_size, world)
        # external_launcher reads the launcher's variables; a single process started by hand has none.
        for key, value in (("RANK", rank), ("LOCAL_RANK", local_rank), ("WORLD_SIZE", world)):
            os.environ.setdefault(key, str(value))
        set_vllm_env(cfg.tensor_parallel_size)
        from vllm import LLM

        self.actor, self.cfg, self.eos_ids, self.bucket_bytes = actor, cfg, list(eos_ids), bucket_bytes
        self.dtype = DTYPES[cfg.dtype]
        self.group = new_tp_group(world, cfg.tensor_parallel_size, rank)
        self.group_rank = rank % cfg.tensor_parallel_size
        config = actor.config
        self.image_token_id = getattr(config, "image_token_id", None)
        self.model_type = getattr(config, "model_type", None)
        self.logit_bias = {token: float("-inf") for token in forbidden_token_ids(config)} or None
        self.llm = LLM(
            **engine_kwargs(
                cfg,
                model_path=model_path,
                tokenizer_path=tokenizer_path,
                max_model_len=max_model_len,
                trust_remote_code=trust_remote_code,
                multimodal=self.image_token_id is not None,
            )
        )
        self.tokenizer = self.llm.get_tokenizer()
        self.release()  # training runs first; prepare() gives the engine the actor's weights

    @property
    def _model(self) -> nn.Module:
        return self.llm.llm_engine.model_executor.driver_worker.worker.model_runner.model

    def prepare(self, step: int) -> dict[str, float]:
        """Wake the weights, load the actor's bucket by bucket, then wake the KV cache (an engine
        that stays awake instead drops its prefix cache, computed with the old weights).

        The peak is taken before the KV cache comes back, so it measures the hand-over itself
        (vLLM's weights plus one bucket); it resets CUDA's peak statistics, so call it at the
        start of a telemetry phase.
        """
        torch.cuda.synchronize()
        start = time.perf_counter()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        if self.cfg.free_cache_engine:
            torch.cuda.empty_cache()  # training's cached blocks would otherwise keep vLLM's memory from it
            self.llm.wake_up(tags=["weights"])
        model = self._model
        for bucket in weight_buckets(self.actor, self.dtype, self.bucket_bytes):
            model.load_weights(bucket)
            del bucket  # or two buckets are alive while the next one is gathered
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        if self.cfg.free_cache_engine:
            self.llm.wake_up(tags=["kv_cache"])
        elif not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM could not reset its prefix cache after the weight hand-over")
        torch.cuda.synchronize()
        return {
            "rollout/handover_s": time.perf_counter() - start,
            "rollout/handover_peak_memory_gib": peak / GIB,
            "rollout/awake": float(
                not self.cfg.free_cache_engine
            ),  # 1: kept through training (records say which)
        }

    def _sampling(self, params: SamplingParams) -> Any:
        from vllm import SamplingParams as VLLMSamplingParams

        return VLLMSamplingParams(
            n=params.n,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k if params.top_k > 0 else 0,
            max_tokens=params.max_tokens,
            ignore_eos=params.ignore_eos,
            stop_token_ids=None if params.ignore_eos else self.eos_ids,
            logprobs=0 if params.logprobs else None,  # the sampled token's log-prob only
            flat_logprobs=True,  # one list per sample, not a dict per token
            logit_bias=self.logit_bias,
            detokenize=False,  # rewards decode the ids themselves
        )

    def generate(self, prompts: Sequence[dict[str, Any]], params: SamplingParams, seed: int) -> Rollout:
        requests = [
            vllm_prompt(p, self.image_token_id, self.tokenizer, self.cfg.limit_videos, self.model_type)
            for p in prompts
        ]
        shared = gather_in_group((requests, seed), self.group)
        requests = [r for reqs, _ in shared for r in reqs]
        start = sum(len(reqs) for reqs, _ in shared[: self.group_rank])
        # vLLM samples from the default CUDA generator unless a request has its own seed, and then
        # it draws row by row (64 small kernels per decoding step for the anchor). So no request
        # seeds: the group's first seed seeds the generator, the same on every rank of the group
        # (TP ranks must draw the same tokens), inside fork_rng so training's RNG is untouched.
        # The garbage collector skips the objects training made (gc.freeze) while vLLM decodes.
        with torch.random.fork_rng(devices=[torch.cuda.current_device()]):
            torch.cuda.manual_seed(shared[0][1])
            gc.freeze()
            try:
                outputs = self.llm.generate(
                    requests, self._sampling(params), use_tqdm=not self.cfg.disable_tqdm
                )
            finally:
                gc.unfreeze()
        own = outputs[start : start + len(prompts)]
        samples = [_samples(out, p["input_ids"].tolist()) for out, p in zip(own, prompts, strict=True)]
        return assemble(prompts, samples, params, self.eos_ids)

    def release(self) -> None:
        if self.cfg.free_cache_engine:
            self.llm.sleep(level=2)
