"""Built-in `r1v` reward (R1-V / geometry style): <think>...</think> then <answer>...</answer>.

Scores (all logged): accuracy (the last <answer> equals the ground truth; a \\boxed{} inside it
is unwrapped), format, overall = (1 - format_weight) * accuracy + format_weight * format.
format_weight defaults to 0.5, as in EasyR1's r1v example, so migrated runs keep their scale.
"""

from __future__ import annotations

import re
from typing import Any

from easyr1.rewards.math import is_equivalent, last_boxed

REWARD_TYPE = "sequential"

_FORMAT = re.compile(r"\s*<think>.*?</think>\s*<answer>.*?</answer>\s*", re.DOTALL)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def extract_answer(response: str) -> str | None:
    """The last <answer> block's content (its box's content if it has one); None without one."""
    blocks = _ANSWER.findall(response)
    if not blocks:
        return None
    answer = blocks[-1].strip()
    boxed = last_boxed(answer)
    return answer if boxed is None else boxed


def compute_score(reward_input: dict[str, Any], format_weight: float = 0.5) -> dict[str, float]:
    response = reward_input["response"]
    fmt = float(_FORMAT.fullmatch(response) is not None)
    answer = extract_answer(response)
    acc = float(answer is not None and is_equivalent(answer, str(reward_input["ground_truth"])))
    return {"overall": (1 - format_weight) * acc + format_weight * fmt, "format": fmt, "accuracy": acc}
