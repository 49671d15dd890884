"""SAAR (Similarity-Aware Adaptive Rollback): the rules, free of any engine or sandbox.

This module is the single implementation of the SAAR decisions; the pipeline's rollout
(``tasks/rollout/machine.py``) calls it. What it decides (DESIGN §3):

* ``similarity(old, new)``: ``difflib.SequenceMatcher(None, old, new).ratio()`` of the decoded
  segments from the first ``<tool_call>`` to the end of the failed and of the regenerated turn.
* ``splice(...)``: ratio >= threshold → **shallow** (old reasoning ids before ``<tool_call>`` +
  the new turn's ids from its ``<tool_call>`` on); ratio < threshold, or either side without a
  call → **deep** (the new turn replaces the old one whole). Ids and log-probs are spliced,
  never re-tokenised; the call boundary is found in one pass over ids (``ChatFormat.call_start``).
* ``exhausted_note(...)``: the reference's note appended to the last error when 2+ retries failed.
* ``is_raw(...)``: whether a sample is rolled out raw (no SAAR) — a deterministic function of
  (seed, step, prompt id, sample index), unlike the reference's unseeded ``random``.
* ``TrajStats``: per-trajectory counters, aggregated per step by ``aggregate_stats`` (with the reference's keys,
  ``reference_metrics``, and the authors' Plan B keys, ``planb_metrics``).
"""

from __future__ import annotations

import difflib
import math
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

Decision = Literal["shallow", "deep"]


@dataclass(frozen=True)
class Splice:
    """Result of splicing a regenerated turn over a failed one."""

    decision: Decision
    similarity: float
    ids: list[int]
    logprobs: list[float]
    kept_old_prefix: int
    """How many ids of the old turn were kept (the reasoning before ``<tool_call>``; 0 for deep)."""


def similarity(old: str, new: str) -> float:
    return difflib.SequenceMatcher(None, old, new).ratio()


def splice(
    old_ids: list[int],
    old_lps: list[float],
    new_ids: list[int],
    new_lps: list[float],
    old_call: int | None,
    new_call: int | None,
    decode,
    threshold: float,
) -> Splice:
    """Decide shallow vs deep and build the spliced turn (ids + log-probs).

    ``old_call``/``new_call`` are the token indices where ``<tool_call>`` starts in each turn
    (``None`` when absent); ``decode`` turns ids into text for the similarity.
    """
    if old_call is None or new_call is None:
        return Splice("deep", 0.0, list(new_ids), list(new_lps), 0)
    ratio = similarity(decode(old_ids[old_call:]), decode(new_ids[new_call:]))
    if ratio >= threshold:
        ids = old_ids[:old_call] + new_ids[new_call:]
        lps = old_lps[:old_call] + new_lps[new_call:]
        return Splice("shallow", ratio, ids, lps, old_call)
    return Splice("deep", ratio, list(new_ids), list(new_lps), 0)


def exhausted_note(error_text: str, retries: int) -> str:
    """The tool text left at an exhausted position: the last error, plus the reference's note."""
    if retries < 2:
        return error_text
    return (
        f"{error_text}\n\nNote: This approach has been attempted {retries} times with the same type of error. "
        "Consider trying a different algorithm, method, or approach to solve this problem."
    )


def is_raw(seed: int, step: int, prompt_id: str, sample_idx: int, raw_share: float) -> bool:
    """Whether this sample is rolled out without SAAR; reproducible across reruns."""
    return random.Random(f"{seed}:{step}:{prompt_id}:{sample_idx}").random() < raw_share


@dataclass
class TrajStats:
    """SAAR and tool statistics of one trajectory (failures are counted per failure)."""

    tool_calls: int = 0
    tool_success: int = 0
    first_attempt_total: int = 0
    first_attempt_success: int = 0
    rollbacks_triggered: int = 0
    rollbacks_recovered: int = 0
    rollbacks_failed: int = 0
    shallow: int = 0
    deep: int = 0
    tool_rounds: int = 0
    errors_kept: int = 0
    """Tool errors that stay visible in the final trajectory (raw, exhausted, no-call)."""
    retry_loops: int = 0
    """Tool calls made after a visible error: the error-and-retry loops SAAR removes."""
    sampled_tokens: int = 0
    """Policy tokens sampled for this trajectory, turns SAAR regenerated or cut out included; tool responses and
    injected end-of-turn ids are not sampled (compute accounting, issue 41)."""
    sandbox_calls: int = 0
    """Calls sent to the sandbox (retries included; a call that could not be parsed never reaches it)."""
    planb_append: int = 0
    """``saar.decide: importance`` decisions that appended the regeneration (``tasks.rollout.decisions``)."""
    planb_replace: int = 0
    """``saar.decide: importance`` decisions that replaced the failed turn."""
    failure_reasons: Counter = field(default_factory=Counter)
    similarities: list[float] = field(default_factory=list)
    is_log_ratios: list[float] = field(default_factory=list)
    """Log importance ratio of every ``importance`` decision."""

    def scalars(self) -> dict[str, int]:
        return {k: v for k, v in self.__dict__.items() if isinstance(v, int)}


def _rate(num: float, den: float) -> float:
    return num / den if den else 0.0


def aggregate_stats(stats: list[TrajStats], raw_flags: list[bool]) -> dict[str, float]:
    """Per-step metrics: the project's own (``tools/``, ``saar/``, ``rollout/``) plus the reference's keys
    with the reference's meaning (``reference_metrics``; the table in docs/metrics.md)."""
    tot = Counter()
    reasons = Counter()
    sims: list[float] = []
    for s in stats:
        tot.update(s.scalars())
        reasons.update(s.failure_reasons)
        sims.extend(s.similarities)
    out = {
        "tools/calls": tot["tool_calls"],
        "tools/call_rate": _rate(sum(s.tool_calls > 0 for s in stats), len(stats)),
        "tools/success_rate": _rate(tot["tool_success"], tot["tool_calls"]),
        "tools/first_attempt_total": tot["first_attempt_total"],
        "tools/first_attempt_success_rate": _rate(tot["first_attempt_success"], tot["first_attempt_total"]),
        "saar/rollbacks_triggered": tot["rollbacks_triggered"],
        "saar/rollbacks_recovered": tot["rollbacks_recovered"],
        "saar/rollbacks_failed": tot["rollbacks_failed"],
        "saar/global_recovery_rate": _rate(tot["rollbacks_recovered"], tot["rollbacks_triggered"]),
        "saar/shallow": tot["shallow"],
        "saar/deep": tot["deep"],
        "saar/similarity_mean": sum(sims) / len(sims) if sims else 0.0,
        "rollout/raw_share": _rate(sum(raw_flags), len(raw_flags)),
        "rollout/tool_rounds_mean": _rate(tot["tool_rounds"], len(stats)),
        "rollout/retry_loop_share": _rate(sum(s.retry_loops > 0 for s in stats), len(stats)),
        "rollout/errors_kept_mean": _rate(tot["errors_kept"], len(stats)),
        "rollout/sampled_tokens": tot["sampled_tokens"],
        "rollout/sandbox_calls": tot["sandbox_calls"],
    }
    for kind, n in sorted(reasons.items()):
        out[f"tools/failures/{kind}"] = n
    out.update(reference_metrics(stats))
    out.update(planb_metrics(stats))
    return out


def reference_metrics(stats: list[TrajStats]) -> dict[str, float]:
    """The paper's metric keys, computed as Open-CLEANER's trainer aggregates its agent loop's counters.

    ``tool_calls/success_rate`` is the FIRST-attempt success rate (calls that were not a SAAR retry;
    every call of a raw or SAAR-off trajectory is a first attempt), falling back to all calls only when
    a step has no first attempt; ``tool_calls/failure_reason/<kind>`` counts the trajectories with at
    least one failure of that kind (retries included) — not failures, which ``tools/failures/<kind>``
    counts; ``rollback/global_recovery_rate`` is only logged when a rollback was triggered.
    """
    tot = Counter()
    reasons = Counter()
    for s in stats:
        tot.update(s.scalars())
        reasons.update(set(s.failure_reasons))
    first = tot["first_attempt_total"] > 0
    attempts = tot["first_attempt_total"] if first else tot["tool_calls"]
    success = tot["first_attempt_success"] if first else tot["tool_success"]
    out = {
        "tool_calls/total_attempts": attempts,
        "tool_calls/success_rate": _rate(success, attempts),
        "rollback/global_triggered": tot["rollbacks_triggered"],
        "rollback/global_recovered": tot["rollbacks_recovered"],
        "rollback/global_failed": tot["rollbacks_failed"],
        "rollback/rollback_full_turn_count": tot["deep"],
        "rollback/rollback_tool_call_only_count": tot["shallow"],
    }
    if tot["rollbacks_triggered"]:
        out["rollback/global_recovery_rate"] = tot["rollbacks_recovered"] / tot["rollbacks_triggered"]
    for kind, n in sorted(reasons.items()):
        out[f"tool_calls/failure_reason/{kind}"] = n
    return out


def planb_metrics(stats: list[TrajStats]) -> dict[str, float]:
    """The authors' Plan B step metrics, present when the step made an importance decision: append / replace counts,
    the append rate, and the 10th / 50th / 90th percentiles of the decisions' log importance ratios."""
    append, replace = sum(s.planb_append for s in stats), sum(s.planb_replace for s in stats)
    ratios = sorted(x for s in stats for x in s.is_log_ratios)
    if not append + replace:
        return {}
    out = {"rollback/planb_append_count": append, "rollback/planb_replace_count": replace,
           "rollback/planb_append_rate": append / (append + replace)}
    for q in (10, 50, 90):
        out[f"rollback/is_log_ratio_p{q}"] = _percentile(ratios, q)
    return out


def _percentile(xs: list[float], q: int) -> float:
    """Linear-interpolated percentile of sorted ``xs`` (numpy's default rule)."""
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)
