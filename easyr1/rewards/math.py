"""Built-in `math` reward: reasoning in <think>...</think>, then the answer in \\boxed{...}.

Scores (all logged): accuracy (last boxed answer equals the ground truth), format,
overall = (1 - format_weight) * accuracy + format_weight * format.
"""

from __future__ import annotations

import os
import re
import threading
from typing import Any

REWARD_TYPE = "batch"

_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")
# Tags may carry stray spaces ("< /think >"), as some VLMs write them.
_THINK_THEN = re.compile(r"\s*<\s*think\s*>.*<\s*/\s*think\s*>(.*)", re.DOTALL)
_TEXT_WRAPPER = re.compile(r"\\(?:text|textbf|mathrm|mbox)\s*\{([^{}]*)\}")
_WORDS = re.compile(r"[A-Za-z]{2,}")
# math-verify's own timeouts use SIGALRM: fine in a main thread, refused in others.
_MATH_VERIFY_TIMEOUT_S = 5


def closing_brace(text: str, open_at: int) -> int | None:
    """Index of the '}' that closes the '{' at text[open_at]; None when it never closes.

    Escaped braces (\\{ \\}) are skipped, so sets like \\{1,2\\} stay inside their box.
    """
    depth, i = 0, open_at
    while i < len(text):
        char = text[i]
        if char == "\\":
            i += 2
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


def last_boxed(text: str) -> str | None:
    """Content of the last top-level \\boxed{...} (nested braces kept).

    None when there is no box, or when the last one never closes: a truncated answer is no answer.
    """
    found, pos = None, 0
    while match := _BOX.search(text, pos):
        close = closing_brace(text, match.end() - 1)
        if close is None:
            return None
        found, pos = text[match.end() : close], close + 1
    return found


def _squash(text: str) -> str:
    """Whitespace, surrounding $ and a final period never change an answer."""
    return re.sub(r"\s+", "", text).strip("$").rstrip(".")


def _math_verify_timeout() -> int | None:
    on_main_thread = threading.current_thread() is threading.main_thread()
    return _MATH_VERIFY_TIMEOUT_S if on_main_thread and os.name == "posix" else None


def is_equivalent(answer: str, ground_truth: str) -> bool:
    """True when answer and ground truth are the same value.

    Order: exact match after squashing (cheap), then word answers as case-insensitive text
    (math-verify reads "yes" as the product y*e*s, so "yes" == "sey" there), then math-verify.
    math-verify has a timeout only on the main thread (its SIGALRM cannot be used elsewhere);
    score from processes, not threads, if answers might be pathological (e.g. 9^{9^{9^9}}).
    """
    from math_verify import parse, verify

    answer, ground_truth = _squash(answer), _squash(ground_truth)
    if not answer or not ground_truth:
        return False
    if answer == ground_truth:
        return True
    plain_truth = _TEXT_WRAPPER.sub(r"\1", ground_truth)
    if _WORDS.fullmatch(plain_truth):
        return _TEXT_WRAPPER.sub(r"\1", answer).lower() == plain_truth.lower()
    timeout = _math_verify_timeout()
    gold = parse(f"${ground_truth}$", parsing_timeout=timeout)
    pred = parse(f"${answer}$", parsing_timeout=timeout)
    return bool(gold and pred) and verify(gold, pred, timeout_seconds=timeout)


def format_score(response: str) -> float:
    """1.0 for <think>...</think> followed by a closed \\boxed{...}, else 0.0."""
    match = _THINK_THEN.match(response)
    return float(match is not None and last_boxed(match.group(1)) is not None)


def accuracy_score(response: str, ground_truth: str) -> float:
    answer = last_boxed(response)
    return float(answer is not None and is_equivalent(answer, ground_truth))


def compute_score(reward_inputs: list[dict[str, Any]], format_weight: float = 0.1) -> list[dict[str, float]]:
    scores = []
    for item in reward_inputs:
        fmt = format_score(item["response"])
        acc = accuracy_score(item["response"], str(item["ground_truth"]))
        overall = (1 - format_weight) * acc + format_weight * fmt
        scores.append({"overall": overall, "format": fmt, "accuracy": acc})
    return scores
