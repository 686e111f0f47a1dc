"""Built-in `r1v` reward (R1-V / geometry style), with the values of EasyR1's r1v example.

format: 1 when the whole response is <think>...</think>, optional whitespace, <answer>...</answer>
(nothing before or after). accuracy: mathruler's ``grade_answer`` (which unwraps a \\boxed{}) on
the first <answer> block that opens and closes on one line, stripped, or on the whole response when
there is none. overall = (1 - format_weight) * accuracy + format_weight * format; format_weight
defaults to 0.5, as in EasyR1's example, so migrated runs keep their scale.
"""

from __future__ import annotations

import re
from typing import Any

REWARD_TYPE = "sequential"

_FORMAT = re.compile(r"<think>.*?</think>\s*<answer>.*?</answer>", re.DOTALL)
_ANSWER = re.compile(r"<answer>(.*?)</answer>")  # no DOTALL: a block across lines is no block


def extract_answer(response: str) -> str:
    """What accuracy grades: the first one-line <answer> block's content, else the whole response."""
    block = _ANSWER.search(response)
    return (block.group(1) if block else response).strip()


def compute_score(reward_input: dict[str, Any], format_weight: float = 0.5) -> dict[str, float]:
    from mathruler.grader import grade_answer

    response = reward_input["response"]
    fmt = float(_FORMAT.fullmatch(response) is not None)
    try:
        acc = float(grade_answer(extract_answer(response), str(reward_input["ground_truth"]).strip()))
    except Exception:  # sympy's errors on malformed LaTeX, of many types: scored 0, as EasyR1 does
        acc = 0.0
    return {"overall": (1 - format_weight) * acc + format_weight * fmt, "format": fmt, "accuracy": acc}
