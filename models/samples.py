"""One training row of an update (``Sample``): a prompt, the response that trains, its mask and advantage, and what
VCPO, OPOB and the splice treatments read beside them. Built by ``tasks.training.stages.update_stage`` from a
step's rows; read by ``models.trainer`` and ``models.old_logprobs``."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Sample:
    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    advantage: float
    rollout_lp: list[float] | None = None
    """The engine's log-probs of the response tokens (the behaviour policy), for VCPO's importance weights."""
    reward: float = 0.0
    """The row's reward (VCPO's OPOB baseline uses rewards, not advantages)."""
    group: str = ""
    """The row's advantage group (OPOB's baseline is per group; its mini-batches hold whole groups)."""
    row_id: str = ""
    """The row's trajectory id, for errors that name rows."""
    spliced: list[int] | None = None
    """1 on response tokens SAAR spliced in after a failed call (sampled in the error context); ``models.splice``."""
    sampled_version: list[int] | None = None
    """The policy version that sampled each response token (−1 on injected ones; the trajectories table's
    ``sampled_version``); None for rows of step folders written before it: ``perf/staleness_*`` (``models.behaviour``)."""
