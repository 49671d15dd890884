"""Config slices of rewards: outcome graders (``RewardConfig``) and reward shaping (``ScoreConfig``).

Pydantic only, so flow modules and the CLI read them without loading math-verify or polars.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class RewardConfig(BaseModel):
    """How outcome rewards are computed (the ``reward:`` section of a run config)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    math_mode: Literal["math_verify", "strict"] = "math_verify"
    """``math_verify``: the last ``\\boxed{}`` answer is equivalent to the ground truth under
    math-verify. ``strict``: the reference's rule, the last ``\\boxed{}`` within the final
    100 characters must equal the ground truth as a string (applied to multiple choice too)."""

    strict_window_chars: int = Field(100, ge=1)
    """Characters at the end of the response searched for ``\\boxed{}`` in strict mode (100 in the reference)."""

    correct_reward: float = 1.0
    """Reward of a correct math or multiple-choice answer."""

    incorrect_reward: float = 0.0
    """Reward of a wrong or missing math or multiple-choice answer (the reference's math_dapo uses -1.0)."""

    math_timeout_s: int = Field(5, ge=1)
    """Seconds math-verify may spend parsing or comparing one answer (enforced in the main thread only)."""

    mc_allow_unboxed: bool = True
    """Multiple choice: when no ``\\boxed{}`` letter exists, accept a final "answer is (X)" / "Answer: X" phrase."""

    code_timeout_s: float = Field(4.0, gt=0)
    """CPU-time limit per code test, in seconds (per stdin / functional test; per whole ``check`` in the
    assert format, which runs once as the reference harness runs it); past it the test fails
    (``timeout``), whatever the machine's load. The sandbox enforces it from outside the answer's process (plus
    0.5 s for the snippet's start-up; a test that blocks without computing meets the sandbox's wall-clock backstop);
    the judge's own alarm counts CPU time too (``ITIMER_PROF``). Keep it below ``sandbox.timeout_s``."""

    code_format_error_reward: float = -1.0
    """Code reward when the response has no fenced Python block or the block does not compile
    (-1.0 as in the reference's ``code_math.compute_score``); such a block never runs."""

    code_max_tests: int | None = Field(None, ge=1)
    """Grade at most this many stdin / functional tests per problem (the first N); ``None`` runs them all.
    An assert-format ``check`` always runs whole (its tests are not separable)."""

    infra_retries: int = Field(2, ge=0)
    """Extra attempts of a code grading batch after a ``SandboxInfraError`` before giving up (never scored)."""


class ScoreConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    overlong_buffer: int = Field(0, ge=0)
    """DAPO overlong shaping: penalty ramps over the last ``overlong_buffer`` response tokens (0 = off)."""

    overlong_penalty_factor: float = Field(1.0, ge=0)
    """Penalty at the full response budget."""
