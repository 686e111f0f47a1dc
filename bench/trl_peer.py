"""TRL's GRPOTrainer on one of ``easyr1.bench``'s text or image workloads: the peer of ``easyr1 bench
--trl`` and ``--trl-vllm``.

It trains the very model folder and prompt file that the benchmark built for its own run (the
same random weights, tokenizer and chat-templated prompts), with TRL's own generation and update,
so that the two step times compare the same work on one machine.

On the image workloads (``smoke_vl``, ``anchor_vl``) the prompts are TRL 1.16's VLM format: a
conversational prompt whose user message has an ``{"type": "image"}`` part where our prompt has its
``<image>``, and the row's images, decoded as our dataset decodes them, in an ``images`` column.
TRL gets our engine's processor (``easyr1.models.loading.load_processor``) as ``processing_class``:
its own ``AutoProcessor`` call wants transformers' torchvision-based video processor, which machines
without torchvision lack; ours works on both, with the folder's image processor and pixel limits,
so the image tokens are the same as ours. TRL loads the model from the folder by its config's
architecture, the image-text class. The prompts' length, image tokens included, is measured with
that processor as TRL tokenizes them (the workload's ``prompt_tokens`` is only a bound for them). The shapes come from
``easyr1.workloads.WORKLOADS``: prompts x n rollouts per optimizer step, one generation for the whole
step, responses of exactly the workload's length, KL to a reference model with our coefficient,
gradient checkpointing, bf16 unless the model is the tiny one.

Two modes of generation (``--mode``):

- ``hf`` (``easyr1 bench --trl``): Hugging Face ``generate``; EOS is masked until the last token
  (``min_new_tokens``), as ``ignore_eos`` does on our side.
- ``vllm`` (``easyr1 bench --trl-vllm``): vLLM in the training process (TRL's
  ``vllm_mode="colocate"``) with our engine's settings, read from what our rollout gives
  ``vllm.LLM`` for the workload (``easyr1.bench.vllm_engine_kwargs``, our ``KEY=VALUE`` overrides
  included): its share of the GPU, sleep mode, context length, and the compilation settings.
  TRL 1.16's GRPOConfig has no field for those, so they are added to the one ``vllm.LLM`` call
  TRL makes (``trl.generation.vllm_generation.LLM``, wrapped while the trainer is built: the
  narrowest point). Responses: ``ignore_eos``, as ours. What still differs is written into the
  result's ``differs``: TRL's importance-sampling correction pass above all (on by default).

Each optimizer step is timed from the end of the step before (the first from the start of
training), so a step's time covers everything TRL does in it. The figures are the median, min
and max over the steps after the first (``easyr1.bench_peer.step_stats``, the rule our summary uses);
every step's time is kept too. ``easyr1 bench --trl`` / ``--trl-vllm`` runs it after its own run;
by hand:

  python bench/trl_peer.py --workload anchor --model runs/bench/anchor/model \\
      --prompts runs/bench/anchor/train.jsonl --steps 5 --out trl.json [--mode vllm [KEY=VALUE ...]]
  python bench/trl_peer.py --workload anchor_vl --model runs/bench/anchor_vl/model \\
      --prompts runs/bench/anchor_vl/data/train.parquet --steps 5 --out trl.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import ProcessorMixin, TrainerCallback

from easyr1.bench import vllm_engine_kwargs
from easyr1.bench_peer import PEER_MODES, PEER_WORKLOADS, step_stats
from easyr1.data.dataset import IMAGE_PLACEHOLDER, load_source
from easyr1.data.images import load_image
from easyr1.models.loading import load_processor
from easyr1.rollout.hf import forbidden_token_ids
from easyr1.rollout.vllm import set_vllm_env
from easyr1.telemetry import gpu_memory_gib
from easyr1.workloads import KL_COEF, WORKLOADS, Workload

IMAGE_SPLIT = re.compile(f"({re.escape(IMAGE_PLACEHOLDER)})")
# Completions per forward/backward pass, as in the TRL runs recorded so far: TRL's loss forms the
# full-vocabulary logits (8 x 768 x 151936 floats per pass on the anchor).
MICRO_BATCH = 8
# Our engine's arguments of ``vllm.LLM`` that TRL 1.16 gives no way to set, added to its call.
COMPILATION_KEYS = ("compilation_config", "enforce_eager")
# Arguments of vllm.LLM not compared between the engines: the same folder, named two ways.
SAME_FOLDER = ("model", "tokenizer")

# What differs from our run whichever way TRL generates.
DIFFERS_SHARED = [
    f"loss: TRL forms the full-vocabulary logits, in micro-batches of {MICRO_BATCH} completions accumulated into one "
    "optimizer step; ours never forms them and takes all of a step's completions in one micro-batch",
    "reward: the peer's is a cheap function of the completion's length (the answers of a random model are noise); "
    "ours is the math reward",
]
# What differs from our run on the image workloads, besides.
DIFFERS_IMAGES = [
    "image preprocessing: TRL runs the processor over every completion's prompt at every step (each prompt and its "
    "image n times); ours once per prompt",
]
DIFFERS = {
    "hf": [
        "generation: Hugging Face generate, all of a step's completions in one batch (min_new_tokens keeps EOS out)"
    ],
    "vllm": [
        "importance-sampling correction (TRL's vllm_importance_sampling_correction, on by default, kept on; its "
        "settings in importance_sampling): an extra no-grad forward pass of the policy over all of a step's "
        "completions before the update, for the old log-probs that it sets against vLLM's sampling log-probs; ours "
        "has no such pass: its one on-policy update takes the old log-probs from the update's own forward",
        "generation batching: TRL submits one vLLM request per completion (each prompt repeated n times, n=1), "
        "ours one request per prompt with n samples",
        "weight hand-over: TRL wakes vLLM's weights and loads the policy's parameters one tensor per load_weights "
        "call; ours loads them in buckets",
    ],
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workload", choices=PEER_WORKLOADS, required=True)
    parser.add_argument("--model", type=Path, required=True, help="model folder the benchmark built")
    parser.add_argument(
        "--prompts",
        type=Path,
        required=True,
        help="its prompt file (data.train_files): a 'problem' column, and 'images' on the image workloads",
    )
    parser.add_argument("--steps", type=int, default=5, help="optimizer steps (the first is not counted)")
    parser.add_argument("--out", type=Path, required=True, help="result JSON")
    parser.add_argument(
        "--mode",
        choices=sorted(PEER_MODES),
        default="hf",
        help="generation: Hugging Face generate or colocated vLLM",
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="our run's config overrides (--mode vllm follows their vLLM settings)",
    )
    return parser.parse_args(argv)


def grpo_settings(
    work: Workload,
    steps: int,
    cuda: bool,
    output_dir: Path,
    engine: dict[str, Any] | None = None,
    forbidden: Sequence[int] = (),
) -> dict[str, Any]:
    """GRPOConfig's arguments for ``work``: one optimizer step per prompts x n rollouts, generated
    with Hugging Face ``generate``, or with ``engine`` (our ``vllm.LLM`` arguments,
    ``easyr1.bench.vllm_engine_kwargs``) by vLLM colocated on our engine's settings.

    ``forbidden``: the tokens never to sample, as our rollouts forbid them (the vision placeholders
    and markers, ``easyr1.rollout.hf.forbidden_token_ids``): a completion holding an image
    placeholder breaks TRL's own forward over it (its image tokens then outnumber the image's
    features). TRL's generate suppresses the image placeholder alone, its vLLM path nothing."""
    rollouts = work.prompts * work.n
    micro = min(MICRO_BATCH, rollouts)
    bf16 = work.size != "tiny"  # as our summary's dtype
    settings = {
        "output_dir": str(output_dir),
        "max_steps": steps,
        "per_device_train_batch_size": micro,
        "gradient_accumulation_steps": rollouts // micro,  # TRL then generates all rollouts at once
        "num_generations": work.n,
        "max_completion_length": work.response_tokens,
        # Never stop early; never sample a vision token.
        "generation_kwargs": {
            "min_new_tokens": work.response_tokens,
            **({"suppress_tokens": list(forbidden)} if forbidden else {}),
        },
        "temperature": 1.0,
        "beta": KL_COEF,
        "gradient_checkpointing": True,
        "bf16": bf16,
        "use_cpu": not cuda,
        "model_init_kwargs": {"dtype": torch.bfloat16 if bf16 else torch.float32},
        "learning_rate": 1e-6,
        "use_vllm": False,
        "seed": 0,
        "logging_steps": 1,
        "report_to": "none",
        "save_strategy": "no",
        "dataloader_num_workers": 0,
    }
    if engine is None:
        return settings
    return {
        **settings,
        "use_vllm": True,
        "vllm_mode": "colocate",
        "vllm_gpu_memory_utilization": engine["gpu_memory_utilization"],
        "vllm_enable_sleep_mode": engine["enable_sleep_mode"],
        "vllm_max_model_length": engine["max_model_len"],
        "vllm_tensor_parallel_size": 1,  # the peer is one process on one GPU
        "vllm_model_impl": "vllm",  # what vLLM's "auto" picks for these architectures
        "vllm_importance_sampling_correction": True,  # TRL's default, said so: it is a pass ours does not make
        # vLLM's SamplingParams: run to max_completion_length whatever is sampled, and leave the text
        # undecoded (TRL reads the token ids only), as ours; the forbidden tokens' logits lowered by
        # 100 (exp(-100): never sampled; ours by infinity, which the peer's JSON could not hold).
        "generation_kwargs": {
            "ignore_eos": True,
            "detokenize": False,
            **({"logit_bias": {t: -100.0 for t in forbidden}} if forbidden else {}),
        },
    }


def llm_settings(engine: dict[str, Any]) -> dict[str, Any]:
    """What the peer adds to TRL's ``vllm.LLM`` call: our engine's compilation settings."""
    return {key: engine[key] for key in COMPILATION_KEYS if key in engine}


@contextlib.contextmanager
def trl_llm_with(extra: dict[str, Any], seen: dict[str, Any]) -> Iterator[None]:
    """While it lasts, TRL's colocated ``vllm.LLM(...)`` call gets ``extra`` too; its arguments,
    ``extra`` included, are put in ``seen``. Fails rather than overrule an argument TRL passes."""
    from trl.generation import vllm_generation

    original = getattr(vllm_generation, "LLM", None)
    if original is None:
        raise ImportError(
            "trl.generation.vllm_generation has no LLM: vllm is not importable, or TRL has moved the call"
        )

    def llm(*args: Any, **kwargs: Any) -> Any:
        clash = sorted(set(extra) & set(kwargs))
        if clash:
            raise RuntimeError(
                f"TRL passes {clash} to vllm.LLM itself now: set them through GRPOConfig instead"
            )
        kwargs.update(extra)
        seen.update(kwargs)
        return original(*args, **kwargs)

    vllm_generation.LLM = llm
    try:
        yield
    finally:
        vllm_generation.LLM = original


def _shown(value: Any) -> str:
    return "unset (vLLM's default)" if value is None else json.dumps(value, sort_keys=True, default=str)


def engine_differences(ours: dict[str, Any], theirs: dict[str, Any]) -> list[str]:
    """The ``vllm.LLM`` arguments on which our engine and TRL's differ (None counts as unset)."""
    keys = sorted((set(ours) | set(theirs)) - set(SAME_FOLDER))
    return [
        f"vllm.LLM {key}: ours {_shown(ours.get(key))}, TRL's {_shown(theirs.get(key))}"
        for key in keys
        if ours.get(key) != theirs.get(key)
    ]


def differences(
    mode: str, ours: dict[str, Any] | None = None, theirs: dict[str, Any] | None = None, images: bool = False
) -> list[str]:
    """What differs between our run and the peer of ``mode`` (for ``vllm``: and the two engines'
    ``vllm.LLM`` arguments, ``ours`` and ``theirs``; ``images``: on an image workload)."""
    engines = engine_differences(ours, theirs) if ours is not None and theirs is not None else []
    return DIFFERS_SHARED + DIFFERS[mode] + (DIFFERS_IMAGES if images else []) + engines


def _json_safe(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def figures(
    work: Workload, times: list[float], lengths: list[float], prompt_tokens: int | None = None
) -> dict[str, Any]:
    """The step-time figures of a run (``lengths``: the completion lengths TRL logged; ``prompt_tokens``:
    the prompts' measured length, where the workload's is only a bound, as with images)."""
    prompt_tokens = prompt_tokens or work.prompt_tokens
    tokens = work.prompts * work.n * (prompt_tokens + work.response_tokens)
    step = step_stats(times)
    return {
        "rollouts_per_step": work.prompts * work.n,
        "n": work.n,
        "prompt_tokens": prompt_tokens,
        "response_tokens": work.response_tokens,
        "completion_tokens_min": min(lengths, default=None),
        "completion_tokens_max": max(lengths, default=None),
        "tokens_per_step": tokens,
        "steps": len(times),
        "step_times": times,
        "step_s": step["median"],
        "step_s_min": step["min"],
        "step_s_max": step["max"],
        "tokens_per_s": tokens / step["median"] if step["median"] else None,
    }


class StepTimer(TrainerCallback):
    """Wall time of each optimizer step, from the end of the previous one (or the start of training)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._last = 0.0

    def _now(self) -> float:
        if torch.cuda.is_available():
            torch.cuda.synchronize()  # the GPU's work belongs to the step that queued it
        return time.perf_counter()

    def on_train_begin(self, *args: Any, **kwargs: Any) -> None:
        self._last = self._now()

    def on_step_end(self, *args: Any, **kwargs: Any) -> None:
        now = self._now()
        self.times.append(now - self._last)
        self._last = now


def message_content(text: str) -> str | list[dict[str, str]]:
    """The user message of ``text``: as is, or parts with an image part at each ``<image>``, as our
    dataset builds it (``{"type": "image"}`` is where TRL puts the row's images)."""
    pieces = IMAGE_SPLIT.split(text)
    if len(pieces) == 1:
        return text
    return [
        {"type": "image"} if piece == IMAGE_PLACEHOLDER else {"type": "text", "text": piece}
        for piece in pieces
        if piece
    ]


def peer_rows(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of our prompt file in TRL's format: a conversational ``prompt``, and the decoded
    ``images`` where a row has any (unresized, as our run's ``data.min_pixels``/``max_pixels`` are unset)."""
    return [
        {
            "prompt": [{"role": "user", "content": message_content(row["problem"])}],
            **({"images": [load_image(item) for item in row["images"]]} if row.get("images") else {}),
        }
        for row in rows
    ]


def measured_prompt_tokens(processor: ProcessorMixin, rows: Iterable[dict[str, Any]]) -> int:
    """The one length of the prompts with images, image tokens included, tokenized as TRL does;
    fails where they differ (the token count per step assumes one length)."""
    from trl.data_utils import prepare_multimodal_messages

    lengths = {
        len(
            processor.apply_chat_template(
                [prepare_multimodal_messages(row["prompt"], images=row["images"])],
                add_generation_prompt=True,
                tokenize=True,
                return_dict=True,
            )["input_ids"][0]
        )
        for row in rows
    }
    if len(lengths) != 1:
        raise ValueError(
            f"the prompts have {len(lengths)} lengths ({sorted(lengths)}): the peer's token count needs one"
        )
    return lengths.pop()


def run(ns: argparse.Namespace) -> dict[str, Any]:
    """Train ``ns.steps`` steps with TRL's GRPOTrainer; the result as written to ``ns.out``."""
    import datasets
    import transformers
    import trl

    work = WORKLOADS[ns.workload]
    cuda = torch.cuda.is_available()
    rows = peer_rows(load_source(str(ns.prompts))[0])
    prompts = datasets.Dataset.from_list(rows)
    # Ours for a VL folder (TRL's own AutoProcessor call needs torchvision); None for text: TRL loads the tokenizer.
    processor = load_processor(ns.model)
    prompt_tokens = measured_prompt_tokens(processor, rows) if processor is not None else None

    def reward(completions: list[list[dict[str, str]]], **kwargs: Any) -> list[float]:
        """Cheap and varied, so advantages are not all zero (the answers of a random model are noise)."""
        return [float(len(c[0]["content"]) % 7) for c in completions]

    timer = StepTimer()
    engine = None
    if ns.mode == "vllm":
        engine = vllm_engine_kwargs(
            ns.workload, str(ns.model), ns.overrides, gpu_memory_gib=gpu_memory_gib(torch.device("cuda", 0))
        )
    if engine is not None:
        set_vllm_env(1)  # vLLM's environment as our rollout sets it on one GPU
    run_dir = ns.out.parent / ("trl_run" if ns.mode == "hf" else f"trl_{ns.mode}_run")
    forbidden = forbidden_token_ids(transformers.AutoConfig.from_pretrained(ns.model))
    config = trl.GRPOConfig(**grpo_settings(work, ns.steps, cuda, run_dir, engine, forbidden))
    seen: dict[str, Any] = {}
    with trl_llm_with(llm_settings(engine), seen) if engine is not None else contextlib.nullcontext():
        trainer = trl.GRPOTrainer(
            model=str(ns.model),
            reward_funcs=reward,
            args=config,
            train_dataset=prompts,
            processing_class=processor,
            callbacks=[timer],
        )
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    lengths = [
        e[k]
        for e in trainer.state.log_history
        for k in ("completions/min_length", "completions/max_length")
        if k in e
    ]
    vllm: dict[str, Any] = {}
    if engine is not None:
        import vllm as vllm_package

        vllm = {
            "vllm": vllm_package.__version__,
            "vllm_env": {k: v for k, v in os.environ.items() if k.startswith("VLLM_")},
            "notes": (
                f"our engine's {', '.join(sorted(llm_settings(engine)))} reached vLLM by wrapping "
                "trl.generation.vllm_generation.LLM while GRPOTrainer was built (TRL 1.16's GRPOConfig has no field "
                "for them); the rest of the engine's settings went through GRPOConfig's vllm_* fields"
            ),
            "vllm_llm_kwargs": _json_safe(seen),  # TRL's vllm.LLM call, our compilation settings included
            "our_vllm_llm_kwargs": _json_safe(engine),
            "importance_sampling": {
                key: getattr(config, f"vllm_importance_sampling_{key}")
                for key in ("correction", "mode", "clip_min", "clip_max")
            },
            "generation_kwargs": config.generation_kwargs,
        }
    return {
        "peer": "trl",
        "mode": ns.mode,
        "trl": trl.__version__,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "workload": ns.workload,
        "model": f"{work.arch}-{work.size} (random init)",
        "params": sum(p.numel() for p in trainer.model.parameters()),
        "dtype": "bf16" if config.bf16 else "fp32",
        "micro_batch": config.per_device_train_batch_size,
        "beta": config.beta,
        **figures(work, timer.times, lengths, prompt_tokens),
        # PyTorch's counter: under vLLM's sleep mode it includes vLLM's pool, as our peak_mem_allocated_gib
        "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
        "differs": differences(
            ns.mode, engine, seen if engine is not None else None, images=processor is not None
        ),
        **vllm,
    }


def main(argv: list[str] | None = None) -> None:
    ns = parse_args(argv)
    result = run(ns)
    ns.out.parent.mkdir(parents=True, exist_ok=True)
    ns.out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        json.dumps(
            {k: result[k] for k in ("workload", "mode", "step_s", "step_s_min", "step_s_max", "tokens_per_s")}
        )
    )


if __name__ == "__main__":
    main()
