"""Turn budgets with slack and with SAAR's cost: ``rollout.extra_turns`` and ``rollout.saar.retries_cost_turns``.

``extra_turns`` is added to a prompt's own budget (a chain of k calls: k + 1 + extra), never to ``max_turns``.
``retries_cost_turns`` counts every regeneration that did not become a visible turn against the budget
(``tasks.rollout.decisions``, "Turn cost"), hand-computed on a 2-call chain (budget 3)::

    raw          R1 fails | error | R2 ok | tool | turn 3 call  ──▶ turn_cap
    off          R2 ok (spliced over R1) | tool | turn 2 ok | tool | turn 3 answer ──▶ stop
    on           R2 ok (spliced over R1) | tool | turn 2 call  ──▶ turn_cap (turns used: R1, R2, turn 2 = 3)

Scripted engine (real tokenizer and end-of-turn id), real local sandbox, both drivers.
Run: ``pytest tests/test_turn_cost.py``.
"""

from __future__ import annotations

from models.chat import render_call
from tasks.rollout.config import RolloutConfig, SAARConfig
from tasks.rollout.machine import Rollout, turn_budget
from tests.local_box import box_fixture, scheduling_fixture
from tests.scripted import ScriptedEngine
from tests.test_turn_budget import CHAIN, OK1, OK2, PLAIN, QUESTION, spans

BAD1 = render_call("print(a % bb)")
ANSWER = "The answer is \\boxed{14}."

box = box_fixture()
scheduling = scheduling_fixture()


def run(chat, box, item, script, scheduling, saar=True, max_turns=4, extra_turns=0, **saar_cfg):
    cfg = RolloutConfig(n_samples=1, max_turns=max_turns, extra_turns=extra_turns, scheduling=scheduling,
                        saar=SAARConfig(enabled=saar, raw_share=0.0, **saar_cfg))
    engine = ScriptedEngine(chat, [script])
    return Rollout(cfg, engine, chat, box).run([item], seed=0, step=0, progress=False)[0], engine


def runs(t) -> list[tuple[int, int, bool]]:
    return [(e.position, e.attempt, e.result.ok) for e in t.executions]


def test_extra_turns_are_added_to_the_prompts_budget_only():
    from tasks.rollout.types import PromptItem

    assert turn_budget(CHAIN, 4, 2) == 5 and turn_budget(CHAIN, 4) == 3
    assert turn_budget(PLAIN, 4, 2) == 4, "the fallback max_turns is not widened"
    assert turn_budget(PromptItem("c1", QUESTION, "s", "1", {"max_turns": 1}), 9, 3) == 4


def test_two_extra_turns_let_a_chain_finish_after_a_failed_call(chat, box, scheduling):
    script = [OK1, BAD1, OK2, ANSWER]
    capped, _ = run(chat, box, CHAIN, list(script), scheduling, saar=False)
    assert capped.finish_reason == "turn_cap" and capped.assistant_turns == 3
    t, _ = run(chat, box, CHAIN, list(script), scheduling, saar=False, extra_turns=2)
    assert t.finish_reason == "stop" and t.assistant_turns == 4
    assert runs(t) == [(0, 0, True), (1, 0, False), (2, 0, True)]
    plain, _ = run(chat, box, PLAIN, [OK1, BAD1, OK2], scheduling, saar=False, max_turns=3, extra_turns=2)
    assert plain.finish_reason == "turn_cap" and plain.assistant_turns == 3, "max_turns is the fallback, as set"


def test_a_recovered_retry_costs_a_turn(chat, box, scheduling):
    script = [BAD1, OK1, OK2, ANSWER]
    free, _ = run(chat, box, CHAIN, list(script), scheduling)
    assert free.finish_reason == "stop" and free.assistant_turns == 3 and free.retry_turns == 0
    assert runs(free) == [(0, 0, False), (0, 1, True), (1, 0, True)]
    t, engine = run(chat, box, CHAIN, list(script), scheduling, retries_cost_turns=True)
    assert t.finish_reason == "turn_cap" and t.assistant_turns == 2 and t.retry_turns == 1
    assert runs(t) == [(0, 0, False), (0, 1, True)], "turn 2's call never runs: R1, R2 and turn 2 used the 3 turns"
    assert engine.calls == 3, "the answer turn is never sampled"
    assert [m for m, _ in spans(t.response_mask)] == [1, 0, 1], "the error stays cut out"
    assert spans(t.response_mask)[-1][1] == len(chat.assistant_ids(OK2))
    assert [e.kind for e in t.events] == ["triggered", "shallow", "recovered"]


def test_exhausted_retries_cost_their_turns(chat, box, scheduling):
    script = [BAD1, BAD1, BAD1, OK1, ANSWER]
    free, _ = run(chat, box, PLAIN, list(script), scheduling, max_tool_retries=2)
    assert free.finish_reason == "stop" and free.assistant_turns == 3
    assert runs(free) == [(0, 0, False), (0, 1, False), (0, 2, False), (1, 0, True)]
    t, _ = run(chat, box, PLAIN, list(script), scheduling, max_tool_retries=2, retries_cost_turns=True)
    assert t.finish_reason == "turn_cap" and t.assistant_turns == 2 and t.retry_turns == 2
    assert runs(t) == [(0, 0, False), (0, 1, False), (0, 2, False)], "turn 2 arrives with 1 + 2 + 1 = 4 used"
    assert [e.kind for e in t.events] == ["triggered", "shallow", "shallow", "exhausted"]
    assert [m for m, _ in spans(t.response_mask)] == [1, 0, 1], "one failed turn, its error (with the note), turn 2"


def test_a_regeneration_reaching_the_cap_ends_the_trajectory_unrun(chat, box, scheduling):
    script = [BAD1, BAD1, BAD1, BAD1, ANSWER]
    free, _ = run(chat, box, CHAIN, list(script), scheduling)
    assert len(free.executions) == 4 and [e.kind for e in free.events][-1] == "exhausted"
    t, _ = run(chat, box, CHAIN, list(script), scheduling, retries_cost_turns=True)
    assert t.finish_reason == "turn_cap" and t.assistant_turns == 1 and t.retry_turns == 2
    assert runs(t) == [(0, 0, False), (0, 1, False)], "the second regeneration is the third turn used: never run"
    assert [e.kind for e in t.events] == ["triggered", "shallow", "shallow", "turn_cap"]
    assert t.stats.rollbacks_triggered == 1 and t.stats.rollbacks_failed == 1 and t.stats.rollbacks_recovered == 0
    assert [m for m, _ in spans(t.response_mask)] == [1], "the spliced regeneration alone: no error left"


def test_evaluations_take_the_runs_turn_settings():
    """Both evaluation modes roll out with the run's ``extra_turns`` and SAAR turn cost (``evaluation.rollout_config``)."""
    from pathlib import Path

    from flows.config import load_config
    from tasks.training.evaluation import rollout_config

    tiny = Path(__file__).resolve().parents[1] / "configs" / "tiny.yaml"
    setup = load_config(tiny, ["rollout.extra_turns=2", "rollout.saar.retries_cost_turns=true"]).setups().eval_setup()
    for mode in ("saar_on", "saar_off"):
        cfg = rollout_config(setup, mode)
        assert cfg.extra_turns == 2 and cfg.saar.retries_cost_turns is True
    assert load_config(tiny).setups().eval_setup().rollout.extra_turns == 0
