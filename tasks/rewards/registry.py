"""Outcome rewards: small pure graders in a registry keyed by ``data_source`` pattern.

``compute_reward(data_source, solution_str, ground_truth, extra_info)`` picks the first
registered grader whose fnmatch pattern (case-insensitive) matches the data source, and
falls back to math. Every grader returns a ``RewardResult`` (reward, correct, named
sub-metrics, the extracted answer). Graders:

- **math** (default, ``synthetic/*``, ``aime*``, ``math*``): the last ``\\boxed{}`` answer
  checked against the ground truth with ``math-verify`` (fractions, radicals, intervals,
  sets, units, LaTeX variants), or the reference's strict rule (last ``\\boxed{}`` in the
  final 100 characters, exact string match) with ``RewardConfig.math_mode="strict"``;
- **multiple choice** (``gpqa*``): the option letter from the last ``\\boxed{}`` (or an
  "answer is (X)" phrase), compared with the ground-truth letter;
- **code** (``livecodebench*``, ``humaneval*``, ``*code*``): the last fenced Python block run against the
  tests in the sandbox, reward = fraction passed (see ``tasks.rewards.code``);
- **chain** (``synthetic-chain/*``): reads the trajectory's record in ``extra_info["rollout"]`` (its turns and
  the executions that ran, ``tasks.rewards.record``), never the text, and replays the calls in the sandbox
  (see ``tasks.rewards.chain``).

A grader that crashes raises ``GraderError`` naming the data source and row id: the caller
counts it, it is never a silent 0. A sandbox infrastructure failure is retried and, if it
persists, raised as ``GraderError`` with ``infra=True`` (never a reward).

``overlong_penalty`` is DAPO's soft overlong punishment as a pure function.

Simplifies: verl's ``default_compute_score`` if-chain over data sources and the reference's
``compute_score_outcome_reward``. Run the tests with ``pytest tests/test_rewards.py``.
"""

from __future__ import annotations

import fnmatch
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from sandbox.result import SandboxInfraError
from tasks.rewards.config import RewardConfig


@dataclass(frozen=True)
class RewardResult:
    """One graded response: the scalar reward, whether it is fully correct, sub-metrics, the parsed answer."""

    reward: float
    correct: bool
    metrics: dict[str, float] = field(default_factory=dict)
    extracted: str | None = None


class GraderError(RuntimeError):
    """A grader crashed (or the sandbox stayed broken): count it, never score it.

    ``infra`` is true when the cause is a sandbox infrastructure failure that outlived its retries.
    """

    def __init__(self, data_source: str, row_id: str | None, message: str, *, infra: bool = False):
        super().__init__(f"grader for data_source={data_source!r} row={row_id!r} failed: {message}")
        self.data_source = data_source
        self.row_id = row_id
        self.infra = infra


class RewardFn(Protocol):
    def __call__(
        self, solution_str: str, ground_truth, extra_info: dict, *, sandbox, cfg: RewardConfig
    ) -> RewardResult: ...


_REGISTRY: list[tuple[str, str, RewardFn]] = []


def register_reward(*patterns: str) -> Callable[[RewardFn], RewardFn]:
    """Register a grader for ``data_source`` patterns (fnmatch, case-insensitive); earlier registrations win."""

    def deco(fn: RewardFn) -> RewardFn:
        for pattern in patterns:
            _REGISTRY.append((pattern, pattern.lower(), fn))
        return fn

    return deco


def grader_for(data_source: str) -> tuple[str, RewardFn]:
    """The (pattern, grader) used for ``data_source``; math (pattern ``*``) when nothing matches."""
    _load_builtin_graders()
    name = (data_source or "").lower()
    for pattern, lowered, fn in _REGISTRY:
        if fnmatch.fnmatchcase(name, lowered):
            return pattern, fn
    return "*", math_reward


def registered_patterns() -> list[str]:
    """Registered patterns in match order (the math default ``*`` is implicit and last)."""
    _load_builtin_graders()
    return [pattern for pattern, _, _ in _REGISTRY]


def compute_reward(
    data_source: str,
    solution_str: str,
    ground_truth,
    extra_info: dict | None = None,
    *,
    sandbox=None,
    cfg: RewardConfig | None = None,
) -> RewardResult:
    """Grade one response with the grader registered for ``data_source``.

    Raises ``GraderError`` (with the row id from ``extra_info['id' | 'index']``) when the
    grader crashes or the sandbox stays broken after ``cfg.infra_retries`` retries.
    """
    cfg = cfg or RewardConfig()
    extra_info = extra_info or {}
    _, fn = grader_for(data_source)
    try:
        return fn(solution_str, ground_truth, extra_info, sandbox=sandbox, cfg=cfg)
    except GraderError:
        raise
    except Exception as err:
        row_id = extra_info.get("id", extra_info.get("index"))
        row_id = None if row_id is None else str(row_id)
        infra = isinstance(err, SandboxInfraError)
        raise GraderError(data_source, row_id, f"{type(err).__name__}: {err}", infra=infra) from err


def overlong_penalty(response_len: int, max_len: int, buffer_len: int, penalty_factor: float = 1.0) -> float:
    """DAPO soft overlong punishment, added to the outcome reward.

    0 while ``response_len <= max_len - buffer_len``; then linear down to ``-penalty_factor``
    at ``max_len``; ``-penalty_factor`` beyond it. ``buffer_len == 0`` disables shaping.
    """
    if max_len <= 0 or buffer_len < 0 or buffer_len > max_len:
        raise ValueError(f"overlong_penalty: need 0 <= buffer_len <= max_len, got buffer_len={buffer_len}, max_len={max_len}")
    if buffer_len == 0:
        return 0.0
    exceed = response_len - (max_len - buffer_len)
    if exceed <= 0:
        return 0.0
    return -penalty_factor * min(exceed / buffer_len, 1.0)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one task from ``n`` samples of which ``c`` are correct (Chen et al. 2021)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k: need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    miss = 1.0
    for i in range(k):
        miss *= (n - c - i) / (n - i)
    return 1.0 - miss


def pass_at_k_by_source(records, ks: tuple[int, ...] = (1,)) -> dict[str, float]:
    """Mean pass@k per data source from ``(data_source, task_id, correct)`` records.

    Keys are ``"<data_source>/pass@<k>"``; a task with fewer than k samples is left out of that k.
    """
    tasks: dict[tuple[str, str], list[int]] = {}
    for source, task_id, correct in records:
        tally = tasks.setdefault((source, str(task_id)), [0, 0])
        tally[0] += 1
        tally[1] += int(bool(correct))
    sums: dict[str, list[float]] = {}
    for (source, _), (n, c) in tasks.items():
        for k in ks:
            if n >= k:
                sums.setdefault(f"{source}/pass@{k}", []).append(pass_at_k(n, c, k))
    return {key: sum(vals) / len(vals) for key, vals in sorted(sums.items())}


# ---------------------------------------------------------------- answer extraction


def last_boxed(text: str) -> str | None:
    """The last ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text`` including the wrapper, braces balanced."""
    idx = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if idx < 0:
        return None
    if text.startswith("\\boxed ", idx):
        tail = text[idx + len("\\boxed ") :]
        match = re.match(r"[^\s$]+", tail)
        return "\\boxed " + match.group(0) if match else None
    depth = 0
    for i in range(idx, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[idx : i + 1]
    return None


def unbox(boxed: str | None) -> str | None:
    """The content of a ``\\boxed{...}`` / ``\\fbox{...}`` / ``\\boxed x`` string."""
    if boxed is None:
        return None
    if boxed.startswith("\\boxed "):
        return boxed[len("\\boxed ") :]
    for left in ("\\boxed{", "\\fbox{"):
        if boxed.startswith(left) and boxed.endswith("}"):
            return boxed[len(left) : -1]
    return None


# ---------------------------------------------------------------- math


def _math_verify_equal(gold: str, answer: str, timeout_s: int) -> bool:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    timeout = timeout_s if threading.current_thread() is threading.main_thread() else None
    gold_parsed = parse("\\boxed{" + gold + "}", [LatexExtractionConfig()], parsing_timeout=timeout)
    if not gold_parsed:
        gold_parsed = parse(gold, [ExprExtractionConfig()], parsing_timeout=timeout)
    pred_parsed = parse(
        "\\boxed{" + answer + "}",
        [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()],
        parsing_timeout=timeout,
    )
    if not gold_parsed or not pred_parsed:
        return False
    return bool(verify(gold_parsed, pred_parsed, timeout_seconds=timeout))


def _verified(gold: str, answer: str, timeout_s: int) -> bool:
    """``_math_verify_equal``; an answer math-verify cannot parse or compare (too deep, too big, too slow)
    is graded wrong, never a grader crash."""
    try:
        return _math_verify_equal(gold, answer, timeout_s)
    except Exception:  # noqa: BLE001 - answer content must not crash grading
        return False


def _norm_space(s: str) -> str:
    return re.sub(r"\s+", "", s)


@register_reward("synthetic/*", "aime*", "math*", "dapo*", "gsm8k*", "amc*", "olympiad*")
def math_reward(solution_str: str, ground_truth, extra_info: dict, *, sandbox=None, cfg: RewardConfig) -> RewardResult:
    """Math: the last ``\\boxed{}`` answer vs the ground truth (math-verify or strict string rule)."""
    gold = str(ground_truth).strip()
    if cfg.math_mode == "strict":
        answer = unbox(last_boxed(solution_str[-cfg.strict_window_chars :]))
        correct = answer is not None and answer == gold
    else:
        answer = unbox(last_boxed(solution_str))
        correct = answer is not None and (
            _norm_space(answer) == _norm_space(gold) or _verified(gold, answer, cfg.math_timeout_s)
        )
    reward = cfg.correct_reward if correct else cfg.incorrect_reward
    metrics = {"acc": float(correct), "has_answer": float(answer is not None)}
    return RewardResult(reward, correct, metrics, answer)


# ---------------------------------------------------------------- multiple choice

_LETTER_IN_BOX = re.compile(r"^\s*(?:\\text\{|\\textbf\{|\\mathrm\{)?\s*\(?\s*([A-Za-z])\s*\)?\s*\}?\s*(?:[.):\s]|$)")
_ANSWER_PHRASE = re.compile(
    r"(?:final\s+answer|answer|correct\s+(?:option|choice)|option)\s*(?:is|:)?\s*[:\-]?\s*\**\s*\(?([A-J])\)?\b",
    re.IGNORECASE,
)


def extract_choice(text: str, *, allow_unboxed: bool = True) -> str | None:
    """The option letter a response commits to: the last ``\\boxed{}`` letter, else an "answer is (X)" phrase."""
    boxed = unbox(last_boxed(text))
    if boxed is not None:
        match = _LETTER_IN_BOX.match(boxed)
        return match.group(1).upper() if match else None
    if not allow_unboxed:
        return None
    matches = _ANSWER_PHRASE.findall(text)
    return matches[-1].upper() if matches else None


def _gold_letter(ground_truth) -> str:
    letter = extract_choice(str(ground_truth), allow_unboxed=False) if "\\boxed" in str(ground_truth) else None
    if letter is None:
        match = _LETTER_IN_BOX.match(str(ground_truth).strip())
        letter = match.group(1).upper() if match else None
    if letter is None:
        raise ValueError(f"multiple-choice ground truth {ground_truth!r} is not an option letter")
    return letter


@register_reward("gpqa*", "mmlu*", "*multiple_choice*", "*mcq*")
def choice_reward(solution_str: str, ground_truth, extra_info: dict, *, sandbox=None, cfg: RewardConfig) -> RewardResult:
    """Multiple choice: the committed option letter equals the ground-truth letter.

    With ``math_mode="strict"`` the reference's rule applies here too (it grades GPQA with the
    same strict ``\\boxed{}`` string match as math).
    """
    if cfg.math_mode == "strict":
        answer = unbox(last_boxed(solution_str[-cfg.strict_window_chars :]))
        correct = answer is not None and answer == str(ground_truth).strip()
    else:
        gold = _gold_letter(ground_truth)
        answer = extract_choice(solution_str, allow_unboxed=cfg.mc_allow_unboxed)
        correct = answer == gold
    reward = cfg.correct_reward if correct else cfg.incorrect_reward
    return RewardResult(reward, correct, {"acc": float(correct), "has_answer": float(answer is not None)}, answer)


_LOADED = False
_PLUGINS = ("tasks.rewards.code", "tasks.rewards.chain")
"""Modules whose graders register themselves on import (``livecodebench*`` / ``*code*``; the chain task), imported by name on
first use (``synthetic-chain/*``: ``tasks.rewards.chain``): this module stays light and never imports a grader module back (no import cycle)."""


def _load_builtin_graders() -> None:
    """Import the grader modules of ``_PLUGINS`` once."""
    global _LOADED
    if not _LOADED:
        _LOADED = True
        import importlib

        for module in _PLUGINS:
            importlib.import_module(module)
