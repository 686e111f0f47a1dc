"""Built-in `dapo` reward (DAPO recipe): the last "Answer: X" line, compared after normalisation.

Scores (all logged): accuracy (1 correct, 0 wrong), overlong_penalty (<= 0),
overall = (+1 correct, -1 wrong) + overlong_penalty.
The overlong penalty is DAPO's soft punishment: 0 up to max_response_length - overlong_buffer_length
tokens, then linear down to -overlong_penalty_factor at max_response_length (and beyond).
Without max_response_length there is no penalty.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

from easyr1.rewards.math import closing_brace

REWARD_TYPE = "batch"

_ANSWER_LINE = re.compile(r"answer\s*:([^\n]*)", re.IGNORECASE)
_WRAPPER = re.compile(r"\\(text|textbf|textrm|mathrm|mbox|boxed|fbox|overline)\s*\{")
_NOISE = re.compile(r"\\left|\\right|\\[!,;:> ]|\^\s*\{?\\circ\}?|\\circ|\\%|%|\\\$|\$|\*\*?")
_NUMBER_THEN_WORDS = re.compile(r"([-+]?\d[\d,]*(?:\.\d+)?)\s+[A-Za-z][A-Za-z\s^\d]*")
_GROUPED_THOUSANDS = re.compile(r"[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_DECIMAL = re.compile(r"[-+]?\d+(?:\.\d+)?")


def _unwrap(text: str) -> str:
    """Replace \\text{..}, \\boxed{..} and friends by their content (brace-aware, any nesting).

    Text-like wrappers get spaces around their content so "5\\text{ cm}" still reads "5 cm".
    """
    while match := _WRAPPER.search(text):
        close = closing_brace(text, match.end() - 1)
        if close is None:
            break
        pad = "" if match.group(1) in ("boxed", "fbox", "overline") else " "
        text = text[: match.start()] + pad + text[match.end() : close] + pad + text[close + 1 :]
    return text


def normalize_answer(text: str) -> str:
    """Canonical string for a final answer: no LaTeX wrappers, spacing, units, degree or
    percent signs; "x = 5" -> "5"; "1,000" -> "1000"; "5.0" -> "5"; \\frac12 -> \\frac{1}{2}."""
    text = _unwrap(text)
    text = _NOISE.sub(" ", text)
    text = text.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    text = text.split("=")[-1].strip().rstrip(".").strip()
    number = _NUMBER_THEN_WORDS.fullmatch(text)
    if number:  # "12 cm", "5 dollars", "3 ways"
        text = number.group(1)
    text = re.sub(r"\s+", "", text)
    text = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", text)
    text = re.sub(r"\\frac\{([^{}]*)\}(\d)", r"\\frac{\1}{\2}", text)
    text = re.sub(r"\\sqrt(\w)", r"\\sqrt{\1}", text)
    if _GROUPED_THOUSANDS.fullmatch(text):
        text = text.replace(",", "")
    if _DECIMAL.fullmatch(text):
        text = format(Decimal(text).normalize(), "f")
    return text


def extract_answer(response: str) -> str | None:
    """Text after the last "Answer:" (case-insensitive); None when there is none or it is empty."""
    found = _ANSWER_LINE.findall(response)
    answer = found[-1].strip() if found else ""
    return answer or None


def overlong_penalty(
    response_length: int, max_response_length: int | None, overlong_buffer_length: int, factor: float
) -> float:
    if max_response_length is None:
        return 0.0
    if not 0 <= overlong_buffer_length <= max_response_length:
        raise ValueError(
            f"overlong_buffer_length={overlong_buffer_length} must be in "
            f"[0, max_response_length={max_response_length}]"
        )
    over = response_length - (max_response_length - overlong_buffer_length)
    if over <= 0:
        return 0.0
    if overlong_buffer_length == 0:
        return -factor
    return -factor * min(1.0, over / overlong_buffer_length)


def compute_score(
    reward_inputs: list[dict[str, Any]],
    max_response_length: int | None = None,
    overlong_buffer_length: int = 0,
    overlong_penalty_factor: float = 1.0,
) -> list[dict[str, float]]:
    scores = []
    for item in reward_inputs:
        answer = extract_answer(item["response"])
        normalized = normalize_answer(answer) if answer is not None else ""
        correct = bool(normalized) and normalized == normalize_answer(str(item["ground_truth"]))
        penalty = overlong_penalty(
            item["response_length"], max_response_length, overlong_buffer_length, overlong_penalty_factor
        )
        scores.append(
            {
                "overall": (1.0 if correct else -1.0) + penalty,
                "accuracy": float(correct),
                "overlong_penalty": penalty,
            }
        )
    return scores
