"""TRL's GRPOTrainer on one of ``easyr1.bench``'s text workloads: the peer of ``easyr1 bench --trl``.

It trains the very model folder and prompt file that the benchmark built for its own run (the
same random weights, tokenizer and chat-templated prompts), with TRL's own generation (Hugging
Face ``generate``) and update, so that the two step times compare the same work on one machine.
The shapes come from ``easyr1.bench.WORKLOADS``: prompts x n rollouts per optimizer step, one
generation for the whole step, responses of exactly the workload's length (EOS is masked until
the last token, as ``ignore_eos`` does on our side), KL to a reference model with our
coefficient, gradient checkpointing, bf16 unless the model is the tiny one.

Each optimizer step is timed from the end of the step before (the first from the start of
training), so a step's time covers everything TRL does in it. The figures are the median, min
and max over the steps after the first (``easyr1.bench.step_stats``, the rule our summary uses);
every step's time is kept too. ``easyr1 bench --trl`` runs it after its own run; by hand:

  python bench/trl_peer.py --workload anchor --model runs/bench/anchor/model \\
      --prompts runs/bench/anchor/train.jsonl --steps 5 --out trl.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

from easyr1.bench import KL_COEF, WORKLOADS, Workload, step_stats

# Text prompts of one length (the peer's token count per step assumes it), on the benchmark's own
# settings (the memory workloads' EasyR1 settings have no TRL equivalent).
TEXT_WORKLOADS = sorted(name for name, work in WORKLOADS.items() if not work.image_size and work.min_prompt_tokens is None and not work.engine)
# Completions per forward/backward pass, as in the TRL runs recorded so far: TRL's loss forms the
# full-vocabulary logits (8 x 768 x 151936 floats per pass on the anchor).
MICRO_BATCH = 8


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=TEXT_WORKLOADS, required=True)
    parser.add_argument("--model", type=Path, required=True, help="model folder the benchmark built")
    parser.add_argument("--prompts", type=Path, required=True, help="its prompts: JSON lines with a 'problem'")
    parser.add_argument("--steps", type=int, default=5, help="optimizer steps (the first is not counted)")
    parser.add_argument("--out", type=Path, required=True, help="result JSON")
    return parser.parse_args(argv)


def grpo_settings(work: Workload, steps: int, cuda: bool, output_dir: Path) -> dict[str, Any]:
    """GRPOConfig's arguments for ``work``: one optimizer step per prompts x n rollouts."""
    rollouts = work.prompts * work.n
    micro = min(MICRO_BATCH, rollouts)
    bf16 = work.size != "tiny"  # as our summary's dtype
    return {
        "output_dir": str(output_dir),
        "max_steps": steps,
        "per_device_train_batch_size": micro,
        "gradient_accumulation_steps": rollouts // micro,  # TRL then generates all rollouts at once
        "num_generations": work.n,
        "max_completion_length": work.response_tokens,
        "generation_kwargs": {"min_new_tokens": work.response_tokens},  # never stop early
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


def figures(work: Workload, times: list[float], lengths: list[float]) -> dict[str, Any]:
    """The step-time figures of a run (``lengths``: the completion lengths TRL logged)."""
    tokens = work.prompts * work.n * (work.prompt_tokens + work.response_tokens)
    step = step_stats(times)
    return {
        "rollouts_per_step": work.prompts * work.n,
        "n": work.n,
        "prompt_tokens": work.prompt_tokens,
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


def run(ns: argparse.Namespace) -> dict[str, Any]:
    """Train ``ns.steps`` steps with TRL's GRPOTrainer; the result as written to ``ns.out``."""
    import datasets
    import transformers
    import trl

    work = WORKLOADS[ns.workload]
    cuda = torch.cuda.is_available()
    rows = [json.loads(line) for line in ns.prompts.read_text().splitlines() if line.strip()]
    prompts = datasets.Dataset.from_list([{"prompt": [{"role": "user", "content": r["problem"]}]} for r in rows])

    def reward(completions: list[list[dict[str, str]]], **kwargs: Any) -> list[float]:
        """Cheap and varied, so advantages are not all zero (the answers of a random model are noise)."""
        return [float(len(c[0]["content"]) % 7) for c in completions]

    timer = StepTimer()
    config = trl.GRPOConfig(**grpo_settings(work, ns.steps, cuda, ns.out.parent / "trl_run"))
    trainer = trl.GRPOTrainer(
        model=str(ns.model), reward_funcs=reward, args=config, train_dataset=prompts, callbacks=[timer]
    )
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    lengths = [e[k] for e in trainer.state.log_history for k in ("completions/min_length", "completions/max_length") if k in e]
    return {
        "peer": "trl",
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
        **figures(work, timer.times, lengths),
        "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
    }


def main(argv: list[str] | None = None) -> None:
    ns = parse_args(argv)
    result = run(ns)
    ns.out.parent.mkdir(parents=True, exist_ok=True)
    ns.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("workload", "step_s", "step_s_min", "step_s_max", "tokens_per_s")}))


if __name__ == "__main__":
    main()
