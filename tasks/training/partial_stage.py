"""The rollout stage with APRIL partial rollouts (``rollout.partial.enabled``): buffer in, batch and buffer out.

Step N reads step N−1's buffer and prompt cursor (``tasks.rollout.buffer``), drops carried groups whose
prompt left the dataset, runs ``tasks.rollout.partial.PartialRollout`` until ``prompts_per_step``
groups passed the dynamic-sampling filter, and writes its own buffer and cursor into its step folder
before the trajectories; the crash point ``in_partial_rollout`` sits between the two (fault tests).

Metrics (``partial/*``), all for this step: ``submissions``, ``submitted_groups``, ``resumed_groups``
(carried groups drained), ``passed_groups``, ``filtered_groups``, ``aborted_requests`` (requests cut or
never started at the stop), ``aborted_tokens``, ``buffer_groups`` (carried to the next step),
``dropped_groups`` (prompt gone), ``off_policy_tokens`` and ``off_policy_ratio`` (policy tokens of the
batch sampled by an older policy version, over all its policy tokens), ``version_lag_mean`` /
``version_lag_max`` and the histogram ``version_lag/<k>`` (policy tokens sampled k versions ago).

Versions are policy versions (``Rollout.version_at``: the checkpoint's, ``models.checkpoint.policy_version``; the
step in a synchronous run), so a carried token keeps the version that sampled it and a stale rollout
(``rollout.staleness``) is checked and measured against the version it samples with.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

from tasks.data.loader import PromptCursor
from tasks.rollout.buffer import buffer_frame, read_buffer, write_buffer
from tasks.rollout.config import RolloutConfig
from tasks.rollout.machine import Rollout
from tasks.rollout.partial import PartialResult, PartialRollout
from tasks.rollout.types import PromptItem, Trajectory
from tasks.stores import fence
from tasks.training.faults import maybe_crash


def partial_rollout(step_dir: Path, step: int, seed: int, run_id: str, runner: Rollout, items: tuple[PromptItem, ...],
                    rollout: RolloutConfig, prompts_per_step: int, grade: Callable[[Trajectory], float | None],
                    dynamic_sampling: bool) -> tuple[list[Trajectory], dict[str, float]]:
    """One step of partial rollouts; returns the batch's trajectories and the ``partial/*`` metrics."""
    step_dir = Path(step_dir)
    prev = step_dir.parent / f"{step - 1:06d}" if step > 0 else None
    version = runner.version_at(step)
    buffered, dropped, position = read_buffer(prev, {i.prompt_id: i for i in items}, version=version)
    cursor = PromptCursor(items, seed, position)
    driver = PartialRollout(runner, rollout.partial, prompts_per_step, grade, dynamic_sampling)
    res = driver.run(buffered, cursor.take, seed, step)
    write_buffer(step_dir, buffer_frame(res.buffer, run_id, step), cursor.position, fence.publish)
    maybe_crash("in_partial_rollout", step)
    trajs = [t for g in res.batch for t in g.trajs]
    return trajs, partial_metrics(res, trajs, version, dropped)


def partial_metrics(res: PartialResult, trajs: list[Trajectory], version: int, dropped: int) -> dict[str, float]:
    lags: Counter = Counter()
    for t in trajs:
        lags.update(version - v for v, m in zip(t.versions, t.response_mask) if m)
    total = sum(lags.values())
    off = total - lags[0]
    out: dict[str, float] = {f"partial/{k}": float(v) for k, v in res.counts.items()}
    out.update({
        "partial/buffer_groups": float(len(res.buffer)), "partial/dropped_groups": float(dropped),
        "partial/off_policy_tokens": float(off), "partial/off_policy_ratio": off / total if total else 0.0,
        "partial/version_lag_mean": sum(k * n for k, n in lags.items()) / total if total else 0.0,
        "partial/version_lag_max": float(max(lags, default=0)),
    })
    out.update({f"partial/version_lag/{k}": float(n) for k, n in sorted(lags.items())})
    return out
