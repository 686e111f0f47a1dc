"""Built-in `dapo` reward (the DAPO recipe), scoring as EasyR1's `examples/reward_function/dapo.py`.

The answer is the text after the last "Answer:" (any case) in the response's last 300 characters
(EasyR1's cut: the longest MATH-500 answer has 159); it is compared with the ground truth after
the final-answer normalisation of the Minerva paper (Lewkowycz et al., 2022, appendix D), the one
the DAPO recipe uses. Scores, with EasyR1's keys:
- accuracy: +1 right, -1 wrong (no answer counts as wrong);
- accuracy_normalized: 1 right, 0 wrong (what EasyR1's DAPO example filters groups on);
- overlong: DAPO's soft punishment, 0 up to max_response_length - overlong_buffer_length
  tokens, then linear down to -1 at max_response_length, -1 beyond (0 without max_response_length);
- overall = accuracy + overlong_penalty_factor * overlong.
"""

from __future__ import annotations

import re
from typing import Any

REWARD_TYPE = "batch"

TAIL = 300  # characters of the response searched for the answer
_ANSWER = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")
NO_ANSWER = "[INVALID]"

# Minerva's normalisation, in its order: plain replacements, then words and TeX to drop, then the
# regular expressions that unwrap math, text and boxes and spell out TeX shorthand.
_REPLACE = (
    ("an ", ""),
    ("a ", ""),
    (".$", "$"),
    ("\\$", ""),
    ("\\ ", ""),
    (" ", ""),
    ("mbox", "text"),
    (",\\text{and}", ","),
    ("\\text{and}", ","),
    ("\\text{m}", "\\text{}"),
)
_DROP = (
    "square",
    "ways",
    "integers",
    "dollars",
    "mph",
    "inches",
    "hours",
    "km",
    "units",
    "\\ldots",
    "sue",
    "points",
    "feet",
    "minutes",
    "digits",
    "cents",
    "degrees",
    "cm",
    "gm",
    "pounds",
    "meters",
    "meals",
    "edges",
    "students",
    "childrentickets",
    "multiples",
    "\\text{s}",
    "\\text{.}",
    "\\text{\ns}",
    "\\text{}^2",
    "\\text{}^3",
    "\\text{\n}",
    "\\text{}",
    "\\mathrm{th}",
    "^\\circ",
    "^{\\circ}",
    "\\;",
    ",\\!",
    "{,}",
    '"',
    "\\dots",
)
_PATTERNS = (
    (re.compile(r"(.*?)(\$)(.*?)(\$)(.*)"), r"$\3$"),  # the first $...$ span, alone
    (re.compile(r"(\\text\{)(.*?)(\})"), r"\2"),
    (re.compile(r"(\\textbf\{)(.*?)(\})"), r"\2"),
    (re.compile(r"(\\overline\{)(.*?)(\})"), r"\2"),
    (re.compile(r"(\\boxed\{)(.*)(\})"), r"\2"),
    (re.compile(r"(frac)([^{])(.)"), r"frac{\2}{\3}"),  # \frac12 -> \frac{1}{2}
    (re.compile(r"(sqrt)([^{])"), r"sqrt{\2}"),  # \sqrt2 -> \sqrt{2}
)


def normalize_answer(text: str) -> str:
    """Minerva's canonical form of a final answer: the part after the last "=", without spaces,
    units, dollar signs and TeX wrappers; "1,000" -> "1000"."""
    text = text.split("=")[-1]
    for old, new in _REPLACE:
        text = text.replace(old, new)
    for word in _DROP:
        text = text.replace(word, "")
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    text = text.replace("$", "")
    if text.replace(",", "").isdigit():
        text = text.replace(",", "")
    return text.strip()


def extract_answer(response: str) -> str:
    """The text after the last "Answer:" in the response's tail, or ``NO_ANSWER``."""
    found = _ANSWER.findall(response[-TAIL:])
    return found[-1] if found else NO_ANSWER


def accuracy(response: str, ground_truth: str) -> float:
    return 1.0 if normalize_answer(extract_answer(response)) == normalize_answer(ground_truth) else -1.0


def overlong(response_length: int, max_response_length: int | None, overlong_buffer_length: int) -> float:
    """DAPO's soft overlong punishment, in [-1, 0]."""
    if max_response_length is None:
        return 0.0
    if not 0 <= overlong_buffer_length <= max_response_length:
        raise ValueError(
            f"overlong_buffer_length={overlong_buffer_length} must be in [0, max_response_length={max_response_length}]"
        )
    expected = max_response_length - overlong_buffer_length
    if response_length <= expected:
        return 0.0
    if response_length <= max_response_length:
        return (expected - response_length) / overlong_buffer_length
    return -1.0


def compute_score(
    reward_inputs: list[dict[str, Any]],
    max_response_length: int | None = None,
    overlong_buffer_length: int = 0,
    overlong_penalty_factor: float = 1.0,
) -> list[dict[str, float]]:
    scores = []
    for item in reward_inputs:
        right = accuracy(item["response"], str(item["ground_truth"]))
        penalty = overlong(item["response_length"], max_response_length, overlong_buffer_length)
        scores.append(
            {
                "overall": right + overlong_penalty_factor * penalty,
                "accuracy": right,
                "overlong": penalty,
                "accuracy_normalized": 0.5 * (right + 1.0),
            }
        )
    return scores
