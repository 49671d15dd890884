"""Per-prompt turn budgets in the rollout (``tasks.rollout.machine.turn_budget``): a chain prompt's
``extra_info["max_turns"]`` (calls + 1) replaces ``rollout.max_turns``; SAAR's regenerations never count.

The rule, as the machine's docstring draws it (2 calls, budget 3, SAAR off, the second call fails)::

    turn 1  call ok | tool | turn 2  call fails | tool (error) | turn 3  call ──▶ turn_cap, never run
    mask    1 .. 1  | 0..0 | 1 .. 1             | 0 .. 0       | 1 .. 1

Scripted engine (real tokenizer and end-of-turn id), real local sandbox, both drivers.
"""

from __future__ import annotations

import pytest

from models.chat import render_call
from tasks.rollout.config import RolloutConfig, SAARConfig
from tasks.rollout.machine import Rollout, turn_budget
from tasks.rollout.types import PromptItem
from tests.local_box import box_fixture, scheduling_fixture
from tests.scripted import ScriptedEngine

SETUP = "a = 62384\nb = 6509"
QUESTION = [{"role": "user", "content": "Step 1: a % b, call it r. Step 2: digit sum of r."}]
CHAIN = PromptItem("c0", QUESTION, "synthetic-chain/2", "14", {"setup": SETUP, "max_turns": 3, "calls": 2})
PLAIN = PromptItem("p0", QUESTION, "synthetic-chain/2", "14", {"setup": SETUP})

OK1 = render_call("print(a % b)")
BAD2 = render_call("r = 3803\nprint(sum(int(d) for d in str(rr)))")
OK2 = render_call("r = 3803\nprint(sum(int(d) for d in str(r)))")


box = box_fixture()
scheduling = scheduling_fixture()


def run(chat, box, item, script, scheduling, saar=False, max_turns=4):
    cfg = RolloutConfig(n_samples=1, max_turns=max_turns, scheduling=scheduling,
                        saar=SAARConfig(enabled=saar, raw_share=0.0))
    return Rollout(cfg, ScriptedEngine(chat, [script]), chat, box).run([item], seed=0, step=0, progress=False)[0]


def spans(mask: list[int]) -> list[tuple[int, int]]:
    """(value, length) of each maximal run of equal mask values."""
    out: list[tuple[int, int]] = []
    for m in mask:
        if out and out[-1][0] == m:
            out[-1] = (m, out[-1][1] + 1)
        else:
            out.append((m, 1))
    return out


def test_the_prompts_budget_cuts_a_third_call(chat, box, scheduling):
    t = run(chat, box, CHAIN, [OK1, BAD2, OK2], scheduling)
    assert t.finish_reason == "turn_cap" and t.assistant_turns == 3
    assert [e.result.ok for e in t.executions] == [True, False], "the third turn's call never runs"
    assert [m for m, _ in spans(t.response_mask)] == [1, 0, 1, 0, 1]
    assert spans(t.response_mask)[-1][1] == len(chat.assistant_ids(OK2)), "the cut turn is trained, nothing after"


def test_without_a_prompt_budget_the_global_one_applies(chat, box, scheduling):
    t = run(chat, box, PLAIN, [OK1, BAD2, OK2, "\\boxed{14}"], scheduling)
    assert t.finish_reason == "stop" and t.assistant_turns == 4
    assert [e.result.ok for e in t.executions] == [True, False, True]
    assert run(chat, box, PLAIN, [OK1, BAD2, OK2], scheduling, max_turns=3).finish_reason == "turn_cap"


def test_the_prompts_budget_wins_over_a_larger_global_one(chat, box, scheduling):
    t = run(chat, box, CHAIN, [OK1, OK2, OK2], scheduling, max_turns=8)
    assert t.finish_reason == "turn_cap" and len(t.executions) == 2


def test_saar_regenerations_do_not_count_against_the_budget(chat, box, scheduling):
    t = run(chat, box, CHAIN, [OK1, BAD2, OK2, "The answer is \\boxed{14}."], scheduling, saar=True)
    assert t.finish_reason == "stop" and t.assistant_turns == 3
    assert [(e.position, e.attempt, e.result.ok) for e in t.executions] == [(0, 0, True), (1, 0, False), (1, 1, True)]
    assert [m for m, _ in spans(t.response_mask)] == [1, 0, 1, 0, 1], "the error turn is cut out"


@pytest.mark.parametrize("bad", [0, -1, "3", 2.0, True])
def test_a_malformed_budget_is_an_error_naming_the_prompt(bad):
    item = PromptItem("c9", QUESTION, "synthetic-chain/2", "14", {"max_turns": bad})
    with pytest.raises(ValueError, match=r"prompt c9: extra_info.max_turns="):
        turn_budget(item, 4)
    assert turn_budget(PromptItem("c8", QUESTION, "s", "1", {}), 4) == 4
    assert turn_budget(PromptItem("c7", QUESTION, "s", "1", {"max_turns": None}), 2) == 2
