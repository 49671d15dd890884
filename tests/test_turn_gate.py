"""The turn-budget gate's shares (``tasks.training.turn_gate.gate_metrics``), computed by hand on a tiny table."""

from __future__ import annotations

import polars as pl
import pytest

from tasks.training.turn_gate import gate_metrics


def test_gate_counts_answers_in_turn_two_after_a_clean_call():
    # five trajectories: (turns, finish, tool calls, first call ok, correct)
    rows = [(2, "stop", 1, 1, True, True),        # call ran, answered in turn 2
            (2, "stop", 1, 1, True, False),       # call ran, answered (wrong) in turn 2
            (2, "turn_cap", 2, 0, True, False),   # call failed, called again where the answer had to be
            (2, "stop", 1, 0, False, None),       # call failed, answered anyway; the grader failed on it
            (1, "stop", 0, 0, True, False)]       # answered without a call
    df = pl.DataFrame(rows, schema=["num_turns", "finish_reason", "tool_calls", "first_attempt_success", "graded",
                                    "correct"], orient="row")
    m = gate_metrics(df)
    assert m["trajectories"] == 5
    assert m["answered"] == pytest.approx(4 / 5) and m["answered_turn2"] == pytest.approx(3 / 5)
    assert m["answered_after_ok_call"] == pytest.approx(2 / 2) and m["ok_first_call"] == pytest.approx(2 / 5)
    assert m["turn_cap"] == pytest.approx(1 / 5) and m["no_call"] == pytest.approx(1 / 5)
    assert m["pass@1"] == pytest.approx(1 / 4), "over the graded trajectories: a grader failure is not a wrong answer"
    assert m["ungraded"] == 1


def test_gate_refuses_an_empty_rollout():
    empty = pl.DataFrame(schema={"num_turns": pl.Int64, "finish_reason": pl.String, "tool_calls": pl.Int64,
                                 "first_attempt_success": pl.Int64, "graded": pl.Boolean,
                                 "correct": pl.Boolean})
    with pytest.raises(ValueError, match="no trajectories"):
        gate_metrics(empty)
