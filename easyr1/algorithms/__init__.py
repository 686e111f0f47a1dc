"""The RL algorithm library: pure tensor functions and registries keyed by config names.

The trainer looks up ``ADVANTAGE_ESTIMATORS[algorithm.adv_estimator]``,
``POLICY_LOSSES[worker.actor.loss_type]`` and ``KL_ESTIMATORS[algorithm.kl_penalty]``.
"""

from easyr1.algorithms.advantages import ADVANTAGE_ESTIMATORS, OUTCOME_ESTIMATORS, global_sum, whiten
from easyr1.algorithms.kl import (
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    kl_estimate,
    make_kl_controller,
)
from easyr1.algorithms.losses import (
    AGGREGATION_MODES,
    POLICY_LOSSES,
    aggregate,
    value_loss,
)

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AGGREGATION_MODES",
    "KL_ESTIMATORS",
    "OUTCOME_ESTIMATORS",
    "POLICY_LOSSES",
    "AdaptiveKLController",
    "FixedKLController",
    "aggregate",
    "apply_kl_penalty",
    "global_sum",
    "kl_estimate",
    "make_kl_controller",
    "value_loss",
    "whiten",
]
