"""Compute accounting (issue 41): every trajectory counts the policy tokens sampled for it — turns SAAR cut out and
regenerated included, tool responses and injected end-of-turn ids excluded — and the calls that reached the
sandbox; ``aggregate_stats`` sums them into ``rollout/sampled_tokens`` and ``rollout/sandbox_calls`` per step.

Run: ``pytest tests/test_compute_accounting.py``.
"""

from __future__ import annotations

import pytest

from models.chat import render_call
from tasks.rollout.config import RolloutConfig, SAARConfig
from tasks.rollout.machine import Rollout
from tasks.rollout.saar import aggregate_stats
from tasks.rollout.types import PromptItem
from tests.local_box import box_fixture
from tests.scripted import ScriptedEngine

ITEM = PromptItem("p0", [{"role": "user", "content": "What is 6 * 7?"}], "synthetic/arith", "42")


box = box_fixture()


def roll(chat, box, script, scheduling, enabled):
    cfg = RolloutConfig(n_samples=1, max_turns=4, scheduling=scheduling,
                        saar=SAARConfig(enabled=enabled, raw_share=0.0))
    return Rollout(cfg, ScriptedEngine(chat, [script]), chat, box).run([ITEM], seed=0, step=0, progress=False)[0]


def sampled(chat, script) -> int:
    """What the scripted engine samples: each turn's ids and its end-of-turn id."""
    return sum(len(chat.encode(text)) + 1 for text in script)


@pytest.mark.parametrize("scheduling", ["rounds", "continuous"])
def test_saar_counts_the_turn_it_cut_out_and_the_calls_that_ran(chat, box, scheduling):
    """An unparseable call (never reaches the sandbox), its regeneration (runs, succeeds), the answer: three turns
    sampled, two left in the response; one sandbox call of two calls."""
    script = ["Go. <tool_call>{not json}</tool_call>", "Go. " + render_call("print(6 * 7)"), "\\boxed{42}"]
    traj = roll(chat, box, script, scheduling, enabled=True)
    assert traj.stats.rollbacks_recovered == 1
    assert traj.stats.sampled_tokens == sampled(chat, script)
    assert traj.stats.sampled_tokens > sum(traj.response_mask)  # the cut-out turn is gone from the response
    assert (traj.stats.tool_calls, traj.stats.sandbox_calls) == (2, 1)


@pytest.mark.parametrize("scheduling", ["rounds", "continuous"])
def test_without_saar_every_sampled_token_is_a_trained_one(chat, box, scheduling):
    """SAAR off: the failed call and its error stay; the sampled tokens are exactly the response's mask-1 tokens
    (the error text is a tool response: in the response, never counted)."""
    script = ["Go. " + render_call("pritn(6 * 7)"), "Go. " + render_call("print(6 * 7)"), "\\boxed{42}"]
    traj = roll(chat, box, script, scheduling, enabled=False)
    assert "NameError" in chat.decode(traj.response_ids)
    assert traj.stats.sampled_tokens == sum(traj.response_mask) == sampled(chat, script)
    assert len(traj.response_ids) > traj.stats.sampled_tokens
    assert traj.stats.sandbox_calls == 2
    m = aggregate_stats([traj.stats, traj.stats], [False, False])
    assert (m["rollout/sampled_tokens"], m["rollout/sandbox_calls"]) == (2 * sampled(chat, script), 4)


def test_the_store_keeps_the_counters_and_sums_them_per_run(tmp_path):
    """The trajectory rows carry both counters into DuckDB; ``step_totals`` sums a per-step metric over a run's
    steps (5 + 7 tokens over 2 steps) and leaves other runs and keys out."""
    import polars as pl

    from tasks.rollout.types import Trajectory
    from tasks.stores import db
    from tasks.stores.records import trajectory_frames

    path = tmp_path / "store.duckdb"
    for run, step, tokens in (("r1", 0, 5.0), ("r1", 1, 7.0), ("r2", 0, 100.0)):
        t = Trajectory(f"{step}:p0:0", ITEM, 0, False, [1, 2], [])
        t.stats.sampled_tokens, t.stats.sandbox_calls = 17, 2
        frames = trajectory_frames([t], run, step, lambda ids: "")
        metrics = pl.DataFrame({"run_id": [run, run], "step": [step, step], "key": ["rollout/sampled_tokens", "x"],
                                "value": [tokens, 1.0]})
        db.replace_step(path, run, step, {"trajectories": frames["trajectories"], "metrics": metrics})
    rows = db.query(path, "SELECT sampled_tokens, sandbox_calls FROM trajectories WHERE run_id = 'r1'")
    assert rows.rows() == [(17, 2), (17, 2)]
    totals = db.step_totals(path, ["r1"], ["rollout/sampled_tokens", "rollout/sandbox_calls"])
    assert totals.rows() == [("r1", "rollout/sampled_tokens", 12.0, 2)]


def test_a_carried_turn_counts_its_carried_tokens_once_when_delivered(chat, box):
    """Partial rollouts: a turn an abort cut short (2 tokens carried) finishes with 1 new token; delivering it counts
    all 3, in the step that finishes the turn (the aborted request delivered nothing, so nothing twice)."""
    from models.engine import GenOutput
    from tasks.rollout.types import Carry

    rollout = Rollout(RolloutConfig(n_samples=1), ScriptedEngine(chat, []), chat, box)
    [t] = rollout.new_trajectories([ITEM], 0, 7)
    t.carry = Carry([11, 12], [-0.5, -0.25], [6, 6])
    rollout.deliver(t, GenOutput([13], [-0.125], "length"))
    assert t.stats.sampled_tokens == 3 and t.response_ids == [11, 12, 13]
