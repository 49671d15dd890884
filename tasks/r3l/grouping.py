"""Which rows one base attempt contributes, in which group, with which reward and pivot (R3L ``run``).

For base attempt ``i`` of a prompt (there are ``n // 2`` of them), after its reflection::

    base     always                                   group <prompt>            reward graded (r1)
    reflect  report invalid or perfect,               group <prompt>/reflect/i  reward 1.0
             only if r1 >= success and perfect
    --- a valid, non-perfect report with pivot k: the guided retry ran ---
    distill  always (guidance-free copy of the retry) group <prompt>            reward graded (r2)
    reflect  if the retry succeeded (rule below)      group <prompt>/reflect/i  reward 1.0
    retry    if the retry succeeded (with guidance)   group <prompt>/retry/i    reward 1.0

The explore group ``<prompt>`` thus holds the n/2 base attempts and up to n/2 distill copies;
reflect and retry rows are groups of one. **Retry succeeded** when
``(r2 > r1 and r2 >= success) or (fewer_steps_rule and r2 >= success and steps2 < steps1)``
(the second clause is the reference's ALFWorld rule, off by default; its math workflows use only the first).
With pivotal credit the first ``k`` assistant turns are masked in base, distill and — when
``mask_retry`` (the ALFWorld reference; its math workflow leaves the retry unmasked) — retry.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from tasks.r3l.report import ReportCheck


class Kind(str, Enum):
    """What a training row is; ``rollout`` is an ordinary (non-R3L) trajectory."""

    ROLLOUT = "rollout"
    BASE = "base"
    DISTILL = "distill"
    REFLECT = "reflect"
    RETRY = "retry"


SINGLETON_KINDS = (Kind.REFLECT.value, Kind.RETRY.value)
"""Kinds that form groups of one: never dropped by group filters, advantage from the estimator's singleton rule."""


@dataclass(frozen=True)
class Planned:
    """One row to emit: its kind, group, fixed reward (None = graded by the score stage) and pivot mask."""

    kind: Kind
    group_id: str
    reward: float | None = None
    pivot: int = 0


def group_ids(prompt_id: str, i: int) -> dict[Kind, str]:
    return {Kind.BASE: prompt_id, Kind.DISTILL: prompt_id, Kind.REFLECT: f"{prompt_id}/reflect/{i}",
            Kind.RETRY: f"{prompt_id}/retry/{i}"}


def retry_succeeded(r1: float, r2: float, steps1: int, steps2: int, success: float = 1.0,
                    fewer_steps_rule: bool = False) -> bool:
    """The reference's rule for keeping the reflection and the guided retry as positive examples."""
    if r2 > r1 and r2 >= success:
        return True
    return fewer_steps_rule and r2 >= success and steps2 < steps1


def plan_rows(prompt_id: str, i: int, r1: float, check: ReportCheck, has_reflection: bool,
              retry: tuple[float, int, int] | None, success: float = 1.0, fewer_steps_rule: bool = False,
              pivotal_credit: bool = True, mask_retry: bool = True) -> list[Planned]:
    """Rows of base attempt ``i`` (table in the module docstring).

    ``check``: the validated reflection (``has_reflection``: the reflection produced ids at all);
    ``retry``: ``(r2, steps1, steps2)`` when the guided retry ran, else None (no retry: an invalid
    or perfect report, or a retry that could not be built).
    """
    ids = group_ids(prompt_id, i)
    if retry is None:
        rows = [Planned(Kind.BASE, ids[Kind.BASE])]
        if check.perfect and r1 >= success and has_reflection:
            rows.append(Planned(Kind.REFLECT, ids[Kind.REFLECT], 1.0))
        return rows
    r2, steps1, steps2 = retry
    pivot = check.pivot or 0
    credit = pivot if pivotal_credit else 0
    rows = [Planned(Kind.BASE, ids[Kind.BASE], None, credit), Planned(Kind.DISTILL, ids[Kind.DISTILL], None, credit)]
    if retry_succeeded(r1, r2, steps1, steps2, success, fewer_steps_rule):
        rows.append(Planned(Kind.REFLECT, ids[Kind.REFLECT], 1.0))
        rows.append(Planned(Kind.RETRY, ids[Kind.RETRY], 1.0, credit if mask_retry else 0))
    return rows
