"""A short look at the warm start (`make demo`): everything offline, on the CPU, in minutes.

For a tiny text model on the arithmetic task and a tiny Qwen2.5-VL on the shape-counting task:
build the model, write the data, score the random model, warm-start it, score it again, and
write the before/after table to ``OUT/summary.md`` and ``OUT/summary.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from easyr1.data.config import DataConfig
from easyr1.data.dataset import RLDataset
from easyr1.data.synthetic import write_task
from easyr1.evaluate import evaluate
from easyr1.models.loading import load_model, load_processor, load_tokenizer
from easyr1.models.tiny import build_tiny_model
from easyr1.models.warmstart import warm_start
from easyr1.rewards.loader import load_reward_function


@dataclass(frozen=True)
class Case:
    arch: str
    task: str
    reward: str
    steps: int
    n_train: int
    n_test: int


CASES = (
    Case("qwen2", "arithmetic", "math", 300, n_train=180, n_test=55),  # 235 distinct problems in all
    Case("qwen2_5_vl", "count_shapes", "math", 100, n_train=256, n_test=32),
)


def _score(model_dir: Path, data: DataConfig, reward_spec: str, max_tokens: int) -> dict[str, float]:
    tokenizer, processor = load_tokenizer(model_dir), load_processor(model_dir)
    dataset = RLDataset(data.val_files, tokenizer, processor, data)
    model = load_model(model_dir, dtype=torch.float32)
    return evaluate(model, tokenizer, dataset, load_reward_function(reward_spec), max_tokens=max_tokens)


def run_case(case: Case, out: Path, seed: int) -> dict[str, object]:
    root = out / f"{case.arch}-{case.task}"
    print(f"== {case.arch} on {case.task}", flush=True)
    model_dir = build_tiny_model(case.arch, root / "model", seed=seed)
    splits = write_task(case.task, root / "data", n_train=case.n_train, n_test=case.n_test, seed=seed)
    data = DataConfig(
        train_files=str(splits["train"]),
        val_files=str(splits["test"]),
        prompt_key="problem",
        answer_key="answer",
        max_prompt_length=256,
        min_pixels=None,
        max_pixels=None,
    )
    before = _score(model_dir, data, case.reward, max_tokens=32)
    start = time.time()
    warm = warm_start(
        model_dir, root / "warm", data, answer_formats=(case.reward,), steps=case.steps, seed=seed
    )
    seconds = time.time() - start
    after = _score(warm, data, case.reward, max_tokens=32)
    return {
        "arch": case.arch,
        "task": case.task,
        "before": before,
        "after": after,
        "warm_start_s": round(seconds, 1),
    }


def _table(rows: list[dict]) -> str:
    lines = [
        "| model | task | accuracy before -> after | format before -> after | warm start |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        b, a = r["before"], r["after"]
        lines.append(
            f"| tiny {r['arch']} | {r['task']} | {b['accuracy']:.2f} -> {a['accuracy']:.2f} "
            f"| {b['format']:.2f} -> {a['format']:.2f} | {r['warm_start_s']} s |"
        )
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    """``easyr1 demo``'s arguments."""
    parser = argparse.ArgumentParser(prog="easyr1 demo", description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("runs/demo"))
    parser.add_argument("--seed", type=int, default=0)
    return parser


def main(argv: list[str]) -> int:
    ns = build_parser().parse_args(argv)
    rows = [run_case(case, ns.out, ns.seed) for case in CASES]
    table = _table(rows)
    (ns.out / "summary.json").write_text(json.dumps(rows, indent=2))
    (ns.out / "summary.md").write_text(table)
    print(table)
    return 0
