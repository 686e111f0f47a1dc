"""Warm start: a short supervised pass that teaches a tiny random model a task's answer format.

A real instruct model already answers in the requested format and is sometimes right; RL then
raises how often. A random tiny model does neither, so RL would have nothing to reinforce. A few
hundred steps of supervised training on ``<answer format>(ground truth)`` give it the format and
a partial skill, which is the starting point the learning tests and baselines need.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

import torch

from easyr1.data.config import DataConfig
from easyr1.data.dataset import RLDataset
from easyr1.files import share_weight_files
from easyr1.models.inputs import multimodal_kwargs, pad
from easyr1.models.loading import load_model, load_processor, load_tokenizer

# The response each reward's format check accepts, filled with the ground truth; "plain" is
# accepted by none of them. Mixing "plain" into a warm start (e.g. "math,plain") gives a model
# that knows answers but follows the format only part of the time, as instruct models often do:
# RL then has a skill to improve that carries over to prompts it never trained on.
ANSWER_FORMATS = {
    "math": "<think>The answer is {answer}.</think> \\boxed{{{answer}}}",
    "r1v": "<think>The answer is {answer}.</think> <answer>{answer}</answer>",
    "dapo": "Answer: {answer}",
    "plain": "The answer is {answer}.",
}


def _target(tokenizer, answer_format: str, ground_truth: str) -> torch.Tensor:
    ids = tokenizer(answer_format.format(answer=ground_truth), add_special_tokens=False)["input_ids"]
    return torch.tensor(ids + [tokenizer.convert_tokens_to_ids(tokenizer.eos_token)], dtype=torch.long)


def warm_start(
    model_dir: Path,
    out_dir: Path,
    data: DataConfig,
    *,
    answer_formats: tuple[str, ...] = ("math",),
    steps: int = 200,
    batch_size: int = 16,
    lr: float = 2e-3,
    seed: int = 0,
) -> Path:
    """Train ``model_dir`` on ``data.train_files``, each target in one of ``answer_formats``
    (drawn uniformly); save to ``out_dir``."""
    unknown = [f for f in answer_formats if f not in ANSWER_FORMATS]
    if unknown or not answer_formats:
        raise ValueError(f"unknown answer format(s) {unknown}; choose from {', '.join(ANSWER_FORMATS)}")
    torch.manual_seed(seed)
    tokenizer, processor = load_tokenizer(model_dir), load_processor(model_dir)
    model = load_model(model_dir, dtype=torch.float32)
    dataset = RLDataset(data.train_files, tokenizer, processor, data)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / 10) * (1 - s / steps)
    )
    generator = torch.Generator().manual_seed(seed)
    model.train()
    start = time.time()
    for step in range(steps):
        rows = torch.randint(len(dataset), (batch_size,), generator=generator).tolist()
        items = [dataset[i] for i in rows]
        picks = torch.randint(len(answer_formats), (batch_size,), generator=generator).tolist()
        targets = [
            _target(tokenizer, ANSWER_FORMATS[answer_formats[k]], item["ground_truth"])
            for item, k in zip(items, picks, strict=True)
        ]
        seqs = [torch.cat([item["input_ids"], target]) for item, target in zip(items, targets, strict=True)]
        input_ids, attention_mask = pad(seqs, tokenizer.pad_token_id, side="right")
        labels = torch.full_like(input_ids, -100)
        for r, (item, target) in enumerate(zip(items, targets, strict=True)):
            p = item["input_ids"].numel()
            labels[r, p : p + target.numel()] = target
        mm = multimodal_kwargs(input_ids, [item["multi_modal_inputs"] for item in items], model.config)
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, **mm).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 20 == 0 or step == steps - 1:
            print(
                f"warm-start step {step + 1}/{steps} loss {loss.item():.4f} ({time.time() - start:.0f}s)",
                flush=True,
            )
    out_dir = Path(out_dir)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    shutil.copytree(model_dir, out_dir)  # tokenizer, processor and generation files travel unchanged
    model.save_pretrained(out_dir)
    share_weight_files(out_dir)
    return out_dir


def _pixels(value: str) -> int | None:
    """An image pixel bound; 'none' leaves images unscaled on that side, so the warm start sees the
    images as the RL run will (the same data.min_pixels / data.max_pixels)."""
    return None if value.lower() == "none" else int(value)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, type=Path, help="model folder to start from")
    parser.add_argument(
        "--data", required=True, help="train data (EasyR1 format), e.g. data/arithmetic@train"
    )
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument(
        "--answer-format",
        default="math",
        help=f"one of {', '.join(ANSWER_FORMATS)}, or several comma-separated, mixed",
    )
    parser.add_argument("--prompt-key", default="problem")
    parser.add_argument("--answer-key", default="answer")
    parser.add_argument("--format-prompt", default=None, help="Jinja file, as data.format_prompt")
    parser.add_argument("--max-prompt-length", type=int, default=256)
    parser.add_argument(
        "--min-pixels",
        type=_pixels,
        default=DataConfig.min_pixels,
        help="as data.min_pixels ('none': no lower bound)",
    )
    parser.add_argument(
        "--max-pixels",
        type=_pixels,
        default=DataConfig.max_pixels,
        help="as data.max_pixels ('none': no upper bound)",
    )
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)


def run_from_args(ns: argparse.Namespace) -> int:
    data = DataConfig(
        train_files=ns.data,
        prompt_key=ns.prompt_key,
        answer_key=ns.answer_key,
        format_prompt=ns.format_prompt,
        max_prompt_length=ns.max_prompt_length,
        min_pixels=ns.min_pixels,
        max_pixels=ns.max_pixels,
    )
    out = warm_start(
        ns.model,
        ns.out,
        data,
        answer_formats=tuple(ns.answer_format.split(",")),
        steps=ns.steps,
        batch_size=ns.batch_size,
        lr=ns.lr,
        seed=ns.seed,
    )
    print(out)
    return 0
