"""The turn-budget gate's shares (``tasks.training.turn_gate.gate_metrics``), computed by hand on a tiny table."""

from __future__ import annotations

import polars as pl
import pytest

from tasks.training.turn_gate import gate_metrics


def test_gate_counts_answers_in_turn_two_after_a_clean_call():
    # five trajectories: (id, turns, finish, tool calls, graded, correct)
    rows = [("a", 2, "stop", 1, True, True),        # call ran, answered in turn 2
            ("b", 2, "stop", 1, True, False),       # call ran, answered (wrong) in turn 2
            ("c", 2, "turn_cap", 2, True, False),   # call failed, called again where the answer had to be
            ("d", 2, "stop", 1, False, None),       # call failed, answered anyway; the grader failed on it
            ("e", 1, "stop", 0, True, False),       # answered without a call
            ("f", 3, "stop", 2, True, True)]        # call failed, the second one ran (4 turns), answered in turn 3
    df = pl.DataFrame(rows, schema=["traj_id", "num_turns", "finish_reason", "tool_calls", "graded", "correct"],
                      orient="row")
    execs = pl.DataFrame([("a", 0, True), ("b", 0, True), ("c", 0, False), ("d", 0, False), ("f", 1, True),
                          ("f", 0, False)], schema=["traj_id", "exec_idx", "ok"], orient="row")
    m = gate_metrics(df, execs)
    assert m["trajectories"] == 6
    assert m["answered"] == pytest.approx(5 / 6) and m["answered_turn2"] == pytest.approx(3 / 6)
    assert m["ok_first_call"] == pytest.approx(2 / 6), "f's first call failed though a later one ran"
    assert m["answered_after_ok_call"] == pytest.approx(2 / 2)
    assert m["turn_cap"] == pytest.approx(1 / 6) and m["no_call"] == pytest.approx(1 / 6)
    assert m["pass@1"] == pytest.approx(2 / 5), "over the graded trajectories: a grader failure is not a wrong answer"
    assert m["ungraded"] == 1


def test_gate_refuses_an_empty_rollout():
    empty = pl.DataFrame(schema={"traj_id": pl.String, "num_turns": pl.Int64, "finish_reason": pl.String,
                                 "tool_calls": pl.Int64, "graded": pl.Boolean, "correct": pl.Boolean})
    with pytest.raises(ValueError, match="no trajectories"):
        gate_metrics(empty, pl.DataFrame(schema={"traj_id": pl.String, "exec_idx": pl.Int64, "ok": pl.Boolean}))


def test_the_gate_reads_the_evaluation_keys_the_evaluation_writes(monkeypatch):
    """The gate once read ``tools/first_call_failure_rate``, a key the evaluation renamed (issue 30): KeyError."""
    import tasks.training.turn_gate as tg
    from tasks.rollout.types import PromptItem
    from tasks.training.evaluation import summarize

    rows = [("a", 2, "stop", 1, True, True, "s", "p", [1, 2]), ("b", 2, "stop", 1, True, False, "s", "p", [1])]
    trajs = pl.DataFrame(rows, orient="row", schema=["traj_id", "num_turns", "finish_reason", "tool_calls", "graded",
                                                     "correct", "data_source", "prompt_id", "response_ids"])
    execs = pl.DataFrame([("a", 0, True), ("b", 0, False)], schema=["traj_id", "exec_idx", "ok"], orient="row")
    stats = {"tools/first_attempt_success_rate": 0.5, "tools/first_attempt_total": 2}
    monkeypatch.setattr(tg, "evaluate_mode", lambda *a: (summarize(trajs, stats, [1]),
                                                         {"trajectories": trajs, "executions": execs}))
    monkeypatch.setattr(tg, "load_prompts", lambda path: [PromptItem(str(i), [], "s", "1", {}) for i in range(3)])

    class Setup:
        eval_path = "x"

    out = tg.turn_gate("ckpt", Setup(), 0, 2, modes=("saar_off",))
    assert out["saar_off"]["first_attempt_failure_rate"] == pytest.approx(0.5)
