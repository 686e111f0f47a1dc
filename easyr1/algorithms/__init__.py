"""The RL algorithm library: pure tensor functions and registries keyed by config names.

The trainer calls ``advantages.estimate`` (``ADVANTAGE_ESTIMATORS[algorithm.adv_estimator]``),
``losses.POLICY_LOSSES[worker.actor.loss_type]`` and ``kl.KL_ESTIMATORS[algorithm.kl_penalty]``.
Nothing is imported here, so reading the config (``config``) imports no torch.
"""
