"""Rollout modes of the training rollout stage, by name (``rollout.mode``): ``standard`` and ``r3l``.

A mode turns a batch of prompts into training rows and tells the stage, for DAPO refill, the
graded rewards of each advantage group; afterwards it hands over its extra tables and metrics:

* ``standard``: ``rollout.n_samples`` attempts per prompt (SAAR as configured), one group per prompt;
* ``r3l``: ``tasks.r3l.driver.R3LRollout`` (base attempts, reflections, guided retries); its
  groups are the prompt's explore group (base + distill) and singleton reflect/retry groups;
  it writes ``r3l_reflections`` and the ``r3l/*`` metrics.

Both write an ``r3l_reflections`` table (empty for ``standard``) so every step has the same files.
"""

from __future__ import annotations

from collections.abc import Callable

import polars as pl

from tasks.r3l.driver import R3LRollout, r3l_metrics
from tasks.r3l.records import empty_frame, reflection_frame
from tasks.rollout.config import RolloutConfig
from tasks.rollout.machine import Rollout
from tasks.rollout.types import PromptItem, Trajectory

Grade = Callable[[Trajectory], "float | None"]


class StandardMode:
    """Plain attempts: one GRPO group per prompt."""

    def __init__(self, runner: Rollout, cfg: RolloutConfig, grade: Grade):
        self.runner, self.grade = runner, grade

    def run(self, batch: list[PromptItem], seed: int, step: int, refill_round: int = 0) -> list[Trajectory]:
        return self.runner.run(batch, seed, step, refill_round=refill_round)

    def group_rewards(self, trajs: list[Trajectory]) -> dict[str, list[float]]:
        groups: dict[str, list[float]] = {}
        for t in trajs:
            r = self.grade(t)
            if r is not None:
                groups.setdefault(t.item.prompt_id, []).append(r)
        return groups

    def frames(self, run_id: str, step: int) -> dict[str, pl.DataFrame]:
        return {"r3l_reflections": empty_frame()}

    def metrics(self, trajs: list[Trajectory]) -> dict[str, float]:
        return {}


class R3LMode:
    """R3L: base attempts, reflections and guided retries (``tasks.r3l.driver``)."""

    def __init__(self, runner: Rollout, cfg: RolloutConfig, grade: Grade):
        self.driver = R3LRollout(runner, cfg.r3l, grade)
        self.success = cfg.r3l.success_threshold
        self.reflections: list = []
        self.rewards: dict[str, float] = {}

    def run(self, batch: list[PromptItem], seed: int, step: int, refill_round: int = 0) -> list[Trajectory]:
        res = self.driver.run(batch, seed, step, refill_round=refill_round)
        self.reflections += res.reflections
        self.rewards.update(res.rewards)
        return res.rows

    def group_rewards(self, trajs: list[Trajectory]) -> dict[str, list[float]]:
        """Explore groups only (base + distill), from the rewards the driver graded."""
        groups: dict[str, list[float]] = {}
        for t in trajs:
            if t.traj_id in self.rewards:
                groups.setdefault(t.group_id or t.item.prompt_id, []).append(self.rewards[t.traj_id])
        return groups

    def frames(self, run_id: str, step: int) -> dict[str, pl.DataFrame]:
        return {"r3l_reflections": reflection_frame(self.reflections, run_id, step)}

    def metrics(self, trajs: list[Trajectory]) -> dict[str, float]:
        return r3l_metrics(self.reflections, trajs, self.success)


ROLLOUT_MODES: dict[str, type] = {"standard": StandardMode, "r3l": R3LMode}


def make_mode(runner: Rollout, cfg: RolloutConfig, grade: Grade):
    if cfg.mode not in ROLLOUT_MODES:
        raise ValueError(f"rollout.mode: unknown mode {cfg.mode!r}; valid: {', '.join(sorted(ROLLOUT_MODES))}")
    return ROLLOUT_MODES[cfg.mode](runner, cfg, grade)
