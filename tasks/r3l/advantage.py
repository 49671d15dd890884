"""Positive amplification advantages (R3L ``opmd_reweight_adv`` and its GRPO variant), on plain lists.

``opmd_reweight_adv`` (``OPMDReweightAdvGroupAdvantage``), per group of rewards:

    b = mean(r)  (b = 0 for a group of one)
    s = r - b;   if r >= 1: s = 1.0   elif s >= 0: s = alpha * s   (negatives unchanged)

so a success always gets exactly 1 (an all-success group gets 1 each, not 0), partial-reward
trajectories above the mean get ``alpha`` (3) times their lift, and a singleton reflect/retry
row (reward 1) gets 1. ``grpo_reweight_adv`` applies the same rule to
``(r - mean) / (std + eps)`` (unbiased std; mean 0 and std 1 for a group of one).
"""

from __future__ import annotations

import statistics


def reweight(reward: float, score: float, alpha: float = 3.0, success: float = 1.0) -> float:
    """The amplification rule on one score."""
    if reward >= success:
        return 1.0
    return alpha * score if score >= 0 else score


def opmd_reweight_adv(rewards: list[float], alpha: float = 3.0, success: float = 1.0) -> list[float]:
    """Advantages of one group (see the module docstring)."""
    base = statistics.fmean(rewards) if len(rewards) > 1 else 0.0
    return [reweight(r, r - base, alpha, success) for r in rewards]


def grpo_reweight_adv(rewards: list[float], alpha: float = 3.0, success: float = 1.0, eps: float = 1e-6) -> list[float]:
    """GRPO-normalised scores with the same amplification rule."""
    if len(rewards) > 1:
        mean, std = statistics.fmean(rewards), statistics.stdev(rewards)
    else:
        mean, std = 0.0, 1.0
    return [reweight(r, (r - mean) / (std + eps), alpha, success) for r in rewards]
