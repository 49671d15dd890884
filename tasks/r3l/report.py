"""Parse and validate a reflection report (R3L ``get_reflect`` + ``utils.validate_reflect_report``).

**Parse** (``parse_reflection``): take the text from the first ``{`` to the last ``}`` (the whole
text when there is no such pair) and ``json.loads`` it; anything that does not load is
``not_json``. Never raises.

**Validate** (``check_report(report, total_steps)``), the reference's table; the first rule that
applies decides:

==========================================================  =========  =========  ======================
report                                                      valid      perfect    reason
==========================================================  =========  =========  ======================
not a JSON object (list, string, number, None)              False      False      ``not_object``
missing trajectory_summary / root_cause_analysis / outcome  False      False      ``missing_keys``
trajectory_outcome == "success"                             True       True       ``perfect``
outcome not success / success_but_inefficient / failure     False      False      ``bad_outcome``
improvement_suggestion or retry_from_step null or missing   False      False      ``missing_guidance``
retry_from_step not an integer                              False      False      ``pivot_not_int``
retry_from_step < 0 or >= total_steps                       False      False      ``pivot_out_of_range``
otherwise                                                   True       False      ``ok``
==========================================================  =========  =========  ======================

"An integer" follows the reference's ``int(x)``: ints and integer strings (``"2"``) pass. Two
deliberate tightenings, since ``int`` would silently truncate them: a bool (``true`` → 1) and a
non-integral number (``2.7`` → 2) are ``pivot_not_int``; an integral float (``2.0``) passes.
``validate_reflect_report`` returns the reference's ``(is_valid, is_perfect)`` pair.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from tasks.r3l.prompts import OUTCOMES

BASE_KEYS = ("trajectory_summary", "root_cause_analysis", "trajectory_outcome")
REASONS = ("not_json", "not_object", "missing_keys", "perfect", "bad_outcome", "missing_guidance", "pivot_not_int",
           "pivot_out_of_range", "ok")


@dataclass(frozen=True)
class ReportCheck:
    """Outcome of validating one report; ``pivot`` is set only when ``reason == "ok"``."""

    valid: bool
    perfect: bool
    reason: str
    pivot: int | None = None


def parse_reflection(text: str) -> tuple[object | None, str | None]:
    """``(report, None)`` when the text holds JSON, else ``(None, "not_json")``; never raises."""
    first, last = text.find("{"), text.rfind("}")
    body = text[first : last + 1] if first != -1 and last != -1 and first < last else text
    try:
        return json.loads(body), None
    except (ValueError, RecursionError):
        return None, "not_json"


def _as_int(value) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, float):
        return int(value) if value.is_integer() else None
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        return None


def check_report(report, total_steps: int) -> ReportCheck:
    """Validate a parsed report against an attempt of ``total_steps`` steps (table in the module docstring)."""
    if not isinstance(report, dict):
        return ReportCheck(False, False, "not_object")
    if any(k not in report for k in BASE_KEYS):
        return ReportCheck(False, False, "missing_keys")
    outcome = report["trajectory_outcome"]
    if outcome == "success":
        return ReportCheck(True, True, "perfect")
    if outcome not in OUTCOMES:
        return ReportCheck(False, False, "bad_outcome")
    if report.get("improvement_suggestion") is None or report.get("retry_from_step") is None:
        return ReportCheck(False, False, "missing_guidance")
    pivot = _as_int(report["retry_from_step"])
    if pivot is None:
        return ReportCheck(False, False, "pivot_not_int")
    if not 0 <= pivot < total_steps:
        return ReportCheck(False, False, "pivot_out_of_range")
    return ReportCheck(True, False, "ok", pivot)


def validate_reflect_report(report, total_steps: int) -> tuple[bool, bool]:
    """The reference's ``(is_valid, is_perfect)``."""
    check = check_report(report, total_steps)
    return check.valid, check.perfect


def read_reflection(text: str, total_steps: int) -> tuple[object | None, ReportCheck]:
    """Parse then validate a reflection's text: ``(report or None, check)``."""
    report, error = parse_reflection(text)
    if error is not None:
        return None, ReportCheck(False, False, error)
    return report, check_report(report, total_steps)
