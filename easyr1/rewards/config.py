"""The reward section of the run config (``worker.reward.*``): which function scores responses.

Each field's docstring is its documentation (``easyr1 config --explain worker.reward.KEY`` prints it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class RewardConfig:
    reward_function: str | None = None
    """``path/file.py:function`` (EasyR1's reward files) or a built-in (``math``, ``r1v``, ``dapo``)."""
    reward_function_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments passed to the reward function at each call."""
    skip_special_tokens: bool = True
    """Decode responses without special tokens before scoring them."""
    num_cpus: int = 1
    """Threads of the reward worker (its ``OMP_NUM_THREADS``), as Ray gives EasyR1's reward actor that many CPUs."""
    # Not in EasyR1. A batch function gets the rank's whole batch per call, a sequential one one input;
    # past the limit the run ends with an error naming the input, instead of hanging. Generous, so
    # that a slow but working function (a remote judge) is not cut off.
    timeout: float = 300.0
    """Seconds one call of the reward function may take before the run stops with an error naming the input."""
