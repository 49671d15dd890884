"""SAAR's importance decision (``rollout.saar.decide: importance``, the CLEANER authors' Plan B), hand-computed.

A scripted engine samples every token at log-prob -0.25 and scores a regeneration R2 in the clean context with
-0.25 on every token but the first, which gets -0.25 + d; so the log importance ratio is exactly d
(``tasks.rollout.decisions``: one correctly rounded sum of the differences) and IS = exp(d):

    d = ln 0.25 → IS 0.25 < 0.5  → append:   | R1 (1) | error (0) | R2 (1) | tool (0) | answer (1) |   spliced all 0
    d = ln 0.5  → IS 0.5 (= thr.) → replace:  | R2 (1, spliced 1) | tool (0) | answer (1) |

Real tokenizer, real local sandbox, both drivers. Run: ``pytest tests/test_planb.py``.
"""

from __future__ import annotations

import math

import pytest

from models.chat import render_call
from tasks.rollout.config import RolloutConfig, SAARConfig
from tasks.rollout.decisions import DECISIONS
from tasks.rollout.machine import Rollout
from tasks.rollout.saar import TrajStats, aggregate_stats
from tasks.rollout.types import PromptItem
from tests.local_box import box_fixture, scheduling_fixture
from tests.scripted import ScriptedEngine

ITEM = PromptItem("p0", [{"role": "user", "content": "What is 123 * 456?"}], "synthetic/arith", "56088")
FAILED = "I will multiply. " + render_call("pritn(123 * 456)")
FIXED = "Fixing the name. " + render_call("print(123 * 456)")
FAILED_AGAIN = "Another try. " + render_call("print(123 * 456 +)")
ANSWER = "The answer is \\boxed{56088}."
LP = -0.25

box = box_fixture()
scheduling = scheduling_fixture()


class ScoringEngine(ScriptedEngine):
    """Samples at log-prob ``LP``; ``score`` answers ``LP`` per token, the first shifted by ``d``, and logs its calls."""

    def __init__(self, chat, script, d: float):
        super().__init__(chat, [script], lp=LP)
        self.d, self.scored = d, []

    def score(self, prompt_ids, response_ids):
        self.scored.append((list(prompt_ids), list(response_ids)))
        return [LP + self.d] + [LP] * (len(response_ids) - 1)


def run(chat, box, script, scheduling, d, threshold=0.5, **saar):
    cfg = RolloutConfig(n_samples=1, max_turns=5, scheduling=scheduling,
                        saar=SAARConfig(raw_share=0.0, decide="importance", importance_threshold=threshold, **saar))
    engine = ScoringEngine(chat, script, d)
    return Rollout(cfg, engine, chat, box).run([ITEM], seed=0, step=0, progress=False)[0], engine


def ids(chat, text):
    return chat.assistant_ids(text)


def test_below_the_threshold_the_regeneration_is_appended_after_the_kept_error(chat, box, scheduling):
    t, engine = run(chat, box, [FAILED, FIXED, ANSWER], scheduling, d=math.log(0.25))
    prompt = chat.prompt_ids(chat.messages(ITEM.messages))
    assert engine.scored == [(prompt, ids(chat, FIXED))], "scored once, in the context before the failed turn"
    [append] = [e for e in t.events if e.kind == "append"]
    assert append.is_log_ratio == math.log(0.25) and append.similarity is None
    error = chat.tool_response_ids(t.events[0].error_text)
    assert "NameError" in t.events[0].error_text
    ok = chat.tool_response_ids(t.executions[1].result.model_text(256))
    parts = [(ids(chat, FAILED), 1), (error, 0), (ids(chat, FIXED), 1), (ok, 0), (ids(chat, ANSWER), 1)]
    assert t.response_ids == [x for p, _ in parts for x in p]
    assert t.response_mask == [m for p, m in parts for _ in p]
    assert t.spliced == [0] * len(t.response_ids), "R2 was sampled in exactly this context: nothing spliced"
    assert t.logprobs == [LP if m else 0.0 for m in t.response_mask]
    assert t.assistant_turns == 3 and t.finish_reason == "stop"
    assert [(e.position, e.attempt, e.result.ok) for e in t.executions] == [(0, 0, False), (1, 0, True)]
    assert [(e.kind, e.position) for e in t.events] == [("triggered", 0), ("append", 0), ("recovered", 0)]
    s = t.stats
    assert (s.planb_append, s.planb_replace, s.rollbacks_recovered, s.errors_kept, s.shallow, s.deep) == (1, 0, 1, 1, 0, 0)


def test_at_the_threshold_the_regeneration_replaces_the_whole_failed_turn(chat, box, scheduling):
    t, engine = run(chat, box, [FAILED, FIXED, ANSWER], scheduling, d=math.log(0.5))
    assert math.exp(math.log(0.5)) == 0.5, "IS is exactly the threshold"
    [replace] = [e for e in t.events if e.kind == "replace"]
    assert replace.is_log_ratio == math.log(0.5)
    ok = chat.tool_response_ids(t.executions[1].result.model_text(256))
    parts = [(ids(chat, FIXED), 1, 1), (ok, 0, 0), (ids(chat, ANSWER), 1, 0)]
    assert t.response_ids == [x for p, _, _ in parts for x in p]
    assert t.response_mask == [m for p, m, _ in parts for _ in p]
    assert t.spliced == [f for p, _, f in parts for _ in p], "the whole turn is R2, marked; no shallow splice"
    assert "I will multiply" not in chat.decode(t.response_ids) and "NameError" not in chat.decode(t.response_ids)
    assert t.assistant_turns == 2 and t.finish_reason == "stop"
    assert [(e.kind, e.position) for e in t.events] == [("triggered", 0), ("replace", 0), ("recovered", 0)]
    assert (t.stats.planb_append, t.stats.planb_replace, t.stats.errors_kept) == (0, 1, 0)
    appended, _ = run(chat, box, [FAILED, FIXED, ANSWER], scheduling, d=math.log(0.5), threshold=math.nextafter(0.5, 1))
    assert [e.kind for e in appended.events][1] == "append", "just above IS it appends"


def test_an_appended_turn_that_fails_triggers_saar_again_at_its_own_position(chat, box, scheduling):
    t, _ = run(chat, box, [FAILED, FAILED_AGAIN, FIXED, ANSWER], scheduling, d=math.log(0.25))
    assert [(e.kind, e.position) for e in t.events] == [
        ("triggered", 0), ("append", 0), ("append_failed", 0), ("triggered", 1), ("append", 1), ("recovered", 1)]
    assert [(e.position, e.result.ok) for e in t.executions] == [(0, False), (1, False), (2, True)]
    assert t.assistant_turns == 4 and t.finish_reason == "stop"
    s = t.stats
    assert (s.rollbacks_triggered, s.rollbacks_recovered, s.rollbacks_failed, s.planb_append) == (2, 1, 1, 2)
    assert s.is_log_ratios == [math.log(0.25)] * 2


def test_an_appended_turn_counts_against_the_turn_budget(chat, box, scheduling):
    item = PromptItem("c0", ITEM.messages, "synthetic-chain/1", "56088", {"max_turns": 2})
    cfg = RolloutConfig(n_samples=1, scheduling=scheduling,
                        saar=SAARConfig(raw_share=0.0, decide="importance"))
    engine = ScoringEngine(chat, [FAILED, FIXED, ANSWER], math.log(0.25))
    t = Rollout(cfg, engine, chat, box).run([item], seed=0, step=0, progress=False)[0]
    assert t.finish_reason == "turn_cap" and t.assistant_turns == 2 and len(t.executions) == 1
    assert [(e.kind, e.position) for e in t.events] == [("triggered", 0), ("append", 0), ("turn_cap", 0)], \
        "R2 is the second turn: its call never runs, the rollback failed"
    assert (t.stats.rollbacks_triggered, t.stats.rollbacks_failed, t.stats.rollbacks_recovered) == (1, 1, 0)
    assert t.appended is None


def test_similarity_decisions_never_score(chat, box, scheduling):
    cfg = RolloutConfig(n_samples=1, scheduling=scheduling, saar=SAARConfig(raw_share=0.0))
    engine = ScoringEngine(chat, [FAILED, FIXED, ANSWER], 0.0)
    t = Rollout(cfg, engine, chat, box).run([ITEM], seed=0, step=0, progress=False)[0]
    assert engine.scored == [] and all(e.is_log_ratio is None for e in t.events)
    assert [e.kind for e in t.events] == ["triggered", "shallow", "recovered"]


def test_the_registry_matches_the_config_and_needs_a_scoring_engine(chat):
    assert set(DECISIONS) == set(SAARConfig.model_fields["decide"].annotation.__args__)
    cfg = RolloutConfig(saar=SAARConfig(decide="importance"))
    with pytest.raises(ValueError, match="rollout.saar.decide: importance needs an engine with score"):
        Rollout(cfg, ScriptedEngine(chat, []), chat, None)


def test_plan_b_step_metrics_use_the_authors_names():
    stats = [TrajStats(planb_append=2, is_log_ratios=[-2.0, -1.0]), TrajStats(planb_replace=3, is_log_ratios=[3.0, 0.0, 1.0]),
             TrajStats()]
    m = aggregate_stats(stats, [False] * 3)
    assert m["rollback/planb_append_count"] == 2 and m["rollback/planb_replace_count"] == 3
    assert m["rollback/planb_append_rate"] == pytest.approx(0.4)
    # sorted [-2, -1, 0, 1, 3]: p10 at 0.4 → -1.6, p50 at 2 → 0, p90 at 3.6 → 1 + 0.6 * 2
    assert (m["rollback/is_log_ratio_p10"], m["rollback/is_log_ratio_p50"], m["rollback/is_log_ratio_p90"]) == \
        pytest.approx((-1.6, 0.0, 2.2))
    assert not any(k.startswith("rollback/planb") or "is_log_ratio" in k for k in aggregate_stats([TrajStats()], [False]))


def test_decisions_reach_the_store_and_old_step_folders_still_load(chat, box, tmp_path):
    """``saar_events.is_log_ratio`` and the trajectories' ``planb_*`` counts go to the store; events written before
    the column existed (no ``is_log_ratio``) load with it null; traces and the viewer read both."""
    from tasks.reports.viewer import _cut_block
    from tasks.stores import db
    from tasks.stores.records import trajectory_frames
    from tasks.stores.traces import _rollback

    t, _ = run(chat, box, [FAILED, FIXED, ANSWER], "rounds", d=math.log(0.25))
    frames = trajectory_frames([t], "r", 0, chat.decode)
    store = tmp_path / "store.duckdb"
    db.replace_step(store, "r", 0, {"trajectories": frames["trajectories"], "saar_events": frames["saar_events"]})
    old = trajectory_frames([t], "r", 1, chat.decode)["saar_events"].drop("is_log_ratio")
    db.replace_step(store, "r", 1, {"saar_events": old})
    rows = db.query(store, "SELECT step, kind, is_log_ratio FROM saar_events ORDER BY step, event_idx").rows()
    assert rows[:3] == [(0, "triggered", None), (0, "append", math.log(0.25)), (0, "recovered", None)]
    assert [r[2] for r in rows[3:]] == [None] * 3
    counts = db.query(store, "SELECT planb_append, planb_replace FROM trajectories").rows()
    assert counts == [(1, 0)]
    events = frames["saar_events"].to_dicts()
    attrs, _ = _rollback(events, frames["executions"].to_dicts())
    assert attrs["saar.decisions"] == ["append"] and attrs["saar.is_log_ratio"] == [round(math.log(0.25), 4)]
    assert "log importance ratio" in _cut_block(0, events) and "was kept, its error too" in _cut_block(0, events)
    assert _rollback(old.to_dicts(), [])[0]["saar.is_log_ratio"] == []


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_in_process_engine_scores_as_it_samples_and_draws_nothing(warm_model_dir, chat, temperature):
    """``TransformersEngine.score`` of a turn in the context it was sampled in gives back its sampling log-probs (same
    weights, same temperature): IS = 1 for a regeneration that ignores the error. Scoring draws no random number: the
    torch generator is untouched and the next generation samples what it samples without the score."""
    import torch

    from models.config import EngineConfig
    from models.engine import GenRequest, TransformersEngine

    engine = TransformersEngine(EngineConfig(temperature=temperature), warm_model_dir, chat.eos_id,
                                chat.tokenizer.pad_token_id)
    prompt = chat.prompt_ids(chat.messages(ITEM.messages))
    [first] = engine.generate([GenRequest(prompt, 12)], seed=3)
    state = torch.get_rng_state()
    scored = engine.score(prompt, first.token_ids)
    assert torch.equal(state, torch.get_rng_state())
    assert scored == pytest.approx(first.logprobs, abs=1e-4)
    [again] = engine.generate([GenRequest(prompt, 12)], seed=3)
    assert again.token_ids == first.token_ids
    assert len(engine.score(prompt[:1], prompt[1:])) == len(prompt) - 1
