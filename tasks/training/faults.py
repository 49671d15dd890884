"""Fault injection: named crash points that kill the process with SIGKILL, for resume tests.

Set ``CLEANER_CRASH_AT`` to ``<point>`` (first time the point is reached) or ``<point>@<step>``.
Points: ``after_rollout``, ``after_score``, ``after_mix``, ``after_advantage``, ``in_update``
(after the first optimizer step, before the checkpoint is written), ``after_update``,
``after_log``; with partial rollouts also ``in_partial_rollout``. SIGKILL gives no chance to clean up —
exactly what a crash looks like.
"""

from __future__ import annotations

import os
import signal

ENV = "CLEANER_CRASH_AT"
POINTS = ("after_rollout", "after_score", "after_mix", "after_advantage", "in_update", "after_update", "after_log")
PARTIAL_POINTS = ("in_partial_rollout",)
"""Reached only with ``rollout.partial``: inside the rollout stage, after the step's buffer is written and before
its trajectories and done-marker are."""


def maybe_crash(point: str, step: int) -> None:
    spec = os.environ.get(ENV, "")
    if not spec:
        return
    name, _, at = spec.partition("@")
    if name not in POINTS + PARTIAL_POINTS:
        raise ValueError(f"{ENV}={spec!r}: unknown crash point; valid: {', '.join(POINTS + PARTIAL_POINTS)}")
    if name == point and (not at or int(at) == step):
        os.kill(os.getpid(), signal.SIGKILL)
