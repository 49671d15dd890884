"""Answer comparison for code rewards, host side: does what a solution produced equal the expected answer.

The sandbox reports a solution's stdout or return value (``tasks.rewards.harness`` reads the
verdict); the expected answer never enters the sandbox, so the comparison happens here:

- **stdin/stdout**: the same lines once each is stripped (trailing blank lines dropped), tokens
  equal as text or as finite numbers within 1e-6 (``outputs_match``; a number beyond the float
  range, such as a 5000-digit int, only as text);
- **functional**: the return value after a JSON round trip equals the expected JSON, floats within
  1e-6, bools only equal bools, tuples count as lists, sets never match (``values_match``, as
  LiveCodeBench compares them; ints of any length, beyond Python's 4300-digit str limit);
- long answers (over ``harness.INLINE_CHARS``) come back as the sha256 of a canonical form and are
  compared exactly (whitespace-normalised lines / canonical JSON), without the number tolerance.

Run: imported by ``tasks.rewards.harness``; ``tests/test_rewards_code.py`` pins the rules.
"""

from __future__ import annotations

import math

from tasks.rewards.judge import wire as judge


def tokens_equal(got: str, want: str) -> bool:
    """Two whitespace-free tokens are equal as text, or as finite numbers within 1e-6 (a number past the
    float range, such as a 400-digit int, is equal only as text)."""
    if got == want:
        return True
    try:
        a, b = float(got), float(want)
    except (ValueError, OverflowError):
        return False
    return math.isfinite(a) and math.isfinite(b) and math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-6)


def outputs_match(got: str, want: str) -> bool:
    """Stdout vs expected: same lines once each is stripped and trailing blank lines dropped; numbers within 1e-6."""
    got_lines = [ln.strip() for ln in got.strip().splitlines()]
    want_lines = [ln.strip() for ln in want.strip().splitlines()]
    if got_lines == want_lines:
        return True
    if len(got_lines) != len(want_lines):
        return False
    for g, w in zip(got_lines, want_lines):
        gt, wt = g.split(), w.split()
        if len(gt) != len(wt) or not all(tokens_equal(x, y) for x, y in zip(gt, wt)):
            return False
    return True


def same_value(got, want) -> bool:
    """JSON values equal, floats within 1e-6 (recursively through lists and dicts); bools only equal bools."""
    if isinstance(got, bool) or isinstance(want, bool):
        return got is want
    if isinstance(got, (int, float)) and isinstance(want, (int, float)):
        if got == want:
            return True
        try:
            return math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-6)
        except OverflowError:  # an int beyond float range equals only itself (``==`` above)
            return False
    if isinstance(got, list) and isinstance(want, list):
        return len(got) == len(want) and all(same_value(a, b) for a, b in zip(got, want))
    if isinstance(got, dict) and isinstance(want, dict):
        return got.keys() == want.keys() and all(same_value(got[k], want[k]) for k in got)
    return got == want


def expected_value(want_text: str):
    """The expected answer as a JSON value, ints of any length (the text itself when it is not JSON)."""
    try:
        return judge.loads(want_text)
    except (ValueError, RecursionError):
        return want_text


def values_match(value, want_text: str) -> bool:
    """A decoded return value vs the expected JSON text, as LiveCodeBench compares them: after a JSON
    round trip (tuples count as lists; sets never match)."""
    try:
        got = judge.json_plain(value)
    except judge.Unencodable:
        return False
    return same_value(got, expected_value(want_text))


def answer_matches(mode: str, expected: str, verdict: dict) -> bool | None:
    """Does the output / value a verdict reports equal ``expected`` (``mode``: ``stdin`` or ``functional``);
    None when the report is malformed."""
    sha = verdict.get("sha256")
    if mode == "stdin":
        if isinstance(verdict.get("out"), str):
            return outputs_match(verdict["out"], expected)
        return sha == judge.digest(judge.normal_lines(expected)) if isinstance(sha, str) else None
    if "value" in verdict:
        try:
            return values_match(judge.decode(verdict["value"]), expected)
        except (ValueError, TypeError, RecursionError):
            return None
    if not isinstance(sha, str):
        return None
    canonical = judge.dump(judge.json_plain(expected_value(expected)), sort=True)
    return sha == judge.digest(canonical)
