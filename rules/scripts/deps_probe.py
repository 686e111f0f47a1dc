"""Log-probs of a fixed batch under a model folder, in fp32: run by the dependency matrix inside a
combination's virtualenv (``python deps_probe.py MODEL OUT.json``), on the same model folder in
every combination, so that a difference between two combinations is one of their packages' (the
tokenizer's or the model code's), not of the weights.

It uses transformers directly, not the engine: it measures what the engine stands on.
"""

from __future__ import annotations

import json
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

# The fixed batch: prompts and answers in the tiny models' vocabulary (ASCII arithmetic), of
# different lengths so that padding is exercised.
BATCH = (
    "What is 3 + 4? Put the answer in \\boxed{}. The answer is \\boxed{7}.",
    "Compute 12 * 11. \\boxed{132}",
    "What is 9 - 17?",
    "<think>2 + 2 = 4, then 4 * 5</think> \\boxed{20}",
)


def logprobs(model_dir: str) -> list[list[float]]:
    """Each text's next-token log-probs (padding left out), in fp32, in one right-padded forward pass."""
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "right"
    batch = tokenizer(list(BATCH), return_tensors="pt", padding=True)
    with torch.no_grad():
        logits = model(**batch, use_cache=False).logits.float()
    token_logp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, batch["input_ids"][:, 1:, None])[..., 0]
    lengths = batch["attention_mask"].sum(dim=1) - 1
    return [row[:n].tolist() for row, n in zip(token_logp, lengths.tolist(), strict=True)]


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python deps_probe.py MODEL_DIR OUT.json")
    with open(sys.argv[2], "w") as out:
        json.dump(logprobs(sys.argv[1]), out)
