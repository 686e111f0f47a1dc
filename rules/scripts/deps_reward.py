"""The dependency matrix's GRPO reward: 1 for a response of odd length, else 0. A random tiny model
never solves arithmetic, so a correctness reward would be 0 everywhere and the losses compared
between combinations would all be 0; this one differs within a group, so advantages, the policy
loss and the update are not."""

from __future__ import annotations

from typing import Any


def compute_score(reward_inputs: list[dict[str, Any]]) -> list[dict[str, float]]:
    return [{"overall": float(len(item["response"]) % 2)} for item in reward_inputs]
