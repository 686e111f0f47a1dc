"""Rewards: built-ins (math, r1v, dapo) and EasyR1-style reward files, behind one loader."""

from easyr1.rewards.loader import BUILTINS, RewardFunction, RewardFunctionError, load_reward_function

__all__ = ["BUILTINS", "RewardFunction", "RewardFunctionError", "load_reward_function"]
