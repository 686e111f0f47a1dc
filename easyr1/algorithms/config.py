"""The algorithm section of the run config (``algorithm.*``): advantages, KL, online filtering.

Each field's docstring is its documentation (``easyr1 config --explain algorithm.KEY`` prints it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass
class AlgorithmConfig:
    gamma: float = 1.0
    """Discount factor of GAE's returns (``adv_estimator=gae``) and REINFORCE++'s."""
    lam: float = 1.0
    """GAE's lambda: 1 weighs the Monte Carlo return, 0 the one-step TD error."""
    adv_estimator: Literal["grpo", "gae", "reinforce_plus_plus", "remax", "rloo", "grpo_passk"] = "grpo"
    """How advantages are estimated from rewards (``algorithms/advantages.py``); ``gae`` trains a critic."""
    norm_adv_by_std_in_grpo: bool = True
    """GRPO divides each advantage by its group's standard deviation; false: Dr. GRPO (no division)."""
    disable_kl: bool = False
    """No reference model and no KL term at all (neither in the reward nor in the loss)."""
    use_kl_loss: bool = False
    """KL to the reference as a loss term; false: as a penalty subtracted from the reward."""
    kl_penalty: Literal["kl", "abs", "mse", "low_var_kl", "full"] = "kl"
    """The KL estimator (``algorithms/kl.py``)."""
    kl_coef: float = 1e-3
    """The KL term's coefficient (the adaptive controller's starting value)."""
    kl_type: Literal["fixed", "adaptive"] = "fixed"
    """A fixed KL coefficient, or one adapted towards ``kl_target``."""
    kl_horizon: float = 10000.0
    """The adaptive KL controller's horizon, in samples."""
    kl_target: float = 0.1
    """The KL the adaptive controller steers towards."""
    online_filtering: bool = False
    """DAPO's dynamic sampling: keep only groups whose mean ``filter_key`` score lies inside (``filter_low``, ``filter_high``)."""
    filter_key: str = "overall"
    """The reward score online filtering reads."""
    filter_low: float = 0.01
    """Groups whose mean score is at or below this are dropped by online filtering."""
    filter_high: float = 0.99
    """Groups whose mean score is at or above this are dropped by online filtering."""
