"""Fault injection: named points where the process kills itself with SIGKILL (resume tests) or stops itself with
SIGSTOP (fencing tests: a paused attempt resumed after its replacement started).

Set ``CLEANER_CRASH_AT`` (SIGKILL) or ``CLEANER_PAUSE_AT`` (SIGSTOP; ``SIGCONT`` lets it run on) to ``<point>``
(first time the point is reached) or ``<point>@<step>``.
Points: ``after_rollout``, ``after_score``, ``after_mix``, ``after_advantage``, ``in_update``
(after the first optimizer step, before the checkpoint is written), ``after_update``,
``after_log``; with partial rollouts also ``in_partial_rollout``. SIGKILL gives no chance to clean up —
exactly what a crash looks like; SIGSTOP is a machine or network stall that outlasts ``compare.lost_after_s``.
In a lane (``tasks.training.lanes``: ``PARENT_ENV`` names the flow process) the signal goes to the flow process
first, then to the lane: the whole run crashes or pauses, as when the stage ran in the flow process.
"""

from __future__ import annotations

import os
import signal

ENV = "CLEANER_CRASH_AT"
PAUSE_ENV = "CLEANER_PAUSE_AT"
POINTS = ("after_rollout", "after_score", "after_mix", "after_advantage", "in_update", "after_update", "after_log")
PARTIAL_POINTS = ("in_partial_rollout",)
"""Reached only with ``rollout.partial``: inside the rollout stage, after the step's buffer is written and before
its trajectories and done-marker are."""
PARENT_ENV = "CLEANER_LANE_PARENT"
"""Set in a lane worker's environment: the pid of the flow process it serves."""
SIGNALS = {ENV: signal.SIGKILL, PAUSE_ENV: signal.SIGSTOP}
_FIRED: set[str] = set()
"""Fault variables that fired in this process: a paused process resumed does not pause again."""


def maybe_crash(point: str, step: int) -> None:
    """Send this process the signal of every fault variable set to ``point`` (at ``step``), once."""
    for env, sig in SIGNALS.items():
        spec = os.environ.get(env, "")
        if not spec or env in _FIRED:
            continue
        name, _, at = spec.partition("@")
        if name not in POINTS + PARTIAL_POINTS:
            kind = "crash" if env == ENV else "pause"
            raise ValueError(f"{env}={spec!r}: unknown {kind} point; valid: {', '.join(POINTS + PARTIAL_POINTS)}")
        if name == point and (not at or int(at) == step):
            _FIRED.add(env)
            if os.environ.get(PARENT_ENV):
                os.kill(int(os.environ[PARENT_ENV]), sig)
            os.kill(os.getpid(), sig)
