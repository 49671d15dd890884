"""SAAR inside the rollout: token bookkeeping of splices, decisions, exhaustion, raw share.

The model is a scripted engine (real tokenizer, real end-of-turn id); code runs in the real
local sandbox, so error texts are the sandbox's own.
"""

from __future__ import annotations

import pytest

from models.chat import render_call
from sandbox.base import make_sandbox
from sandbox.config import SandboxConfig
from tasks.rollout.config import RolloutConfig, SAARConfig
from tasks.rollout.machine import Rollout
from tasks.rollout.saar import aggregate_stats, is_raw, similarity
from tasks.rollout.types import PromptItem, State
from tests.scripted import ScriptedEngine

ITEM = PromptItem("p0", [{"role": "user", "content": "What is 123 * 456?"}], "synthetic/arith", "56088")
LONG_FIX = "\n".join([
    "def multiply_by_repeated_addition(multiplicand, multiplier):",
    "    accumulated_total = 0",
    "    for iteration_index in range(multiplier):",
    "        accumulated_total = accumulated_total + multiplicand",
    "    return accumulated_total",
    "result_value = multiply_by_repeated_addition(123, 456)",
    "assert result_value == 123 * 456, 'repeated addition disagrees with multiplication'",
    "print(result_value)",
])


SCHEDULING = {"mode": "rounds"}


@pytest.fixture(autouse=True, params=["rounds", "continuous"])
def scheduling(request):
    """Every scenario runs under both drivers (round batches; continuous batching with threads)."""
    SCHEDULING["mode"] = request.param
    return request.param


@pytest.fixture(scope="module")
def box():
    with make_sandbox(SandboxConfig(backend="local", workers=1)) as b:
        yield b


def run(chat, box, script, max_turns=4, **saar) -> object:
    cfg = RolloutConfig(n_samples=1, max_turns=max_turns, saar=SAARConfig(raw_share=0.0, **saar),
                        scheduling=SCHEDULING["mode"])
    engine = ScriptedEngine(chat, [script])
    traj = Rollout(cfg, engine, chat, box).run([ITEM], seed=0, step=0, progress=False)[0]
    assert traj.state is State.TERMINATED
    return traj, engine


def tool_spans(chat, traj):
    """Decoded text of every maximal mask-0 span of the response."""
    spans, cur = [], []
    for tid, m in zip(traj.response_ids, traj.response_mask):
        if m == 0:
            cur.append(tid)
        elif cur:
            spans.append(chat.decode(cur))
            cur = []
    if cur:
        spans.append(chat.decode(cur))
    return spans


def check_bookkeeping(chat, traj):
    assert len(traj.response_ids) == len(traj.response_mask) == len(traj.logprobs) == len(traj.versions) \
        == len(traj.spliced)
    tool_msgs = [m["content"] for m in traj.messages if m["role"] == "tool"]
    spans = tool_spans(chat, traj)
    assert len(spans) == len(tool_msgs)
    for span, msg in zip(spans, tool_msgs):
        assert span == chat.decode(chat.tool_response_ids(msg)), "mask 0 must cover exactly the tool turns"
    assistant = [i for i, m in enumerate(traj.response_mask) if m == 1]
    assert all(traj.logprobs[i] != 0.0 for i in assistant)


def test_shallow_recovery_keeps_old_reasoning_and_erases_error(chat, box):
    failed = "I will multiply the numbers. " + render_call("pritn(123 * 456)")
    fixed = "Oops, fixing the name. " + render_call("print(123 * 456)")
    traj, engine = run(chat, box, [failed, fixed, "The answer is \\boxed{56088}."])
    check_bookkeeping(chat, traj)
    text = chat.decode(traj.response_ids)
    assert "NameError" not in text and "pritn" not in text and "Oops" not in text
    assert text.startswith("I will multiply the numbers. <tool_call>")
    reasoning = chat.encode("I will multiply the numbers. ")
    assert traj.response_ids[: len(reasoning)] == reasoning
    assert traj.stats.rollbacks_triggered == 1 and traj.stats.rollbacks_recovered == 1 and traj.stats.shallow == 1
    assert [e.kind for e in traj.events] == ["triggered", "shallow", "recovered"]
    # the retry request saw the real error text, which is gone from the final trajectory
    assert "NameError" in chat.decode(engine.requests[1].input_ids)
    # old reasoning keeps its original log-probs, the new call carries the regeneration's
    assert traj.logprobs[0] == pytest.approx(-0.01) and traj.logprobs[len(reasoning)] == pytest.approx(-0.02)
    assert traj.assistant_turns == 2 and traj.stats.first_attempt_total == 1 and traj.stats.first_attempt_success == 0
    assert traj.stats.errors_kept == 0 and traj.stats.retry_loops == 0
    # exactly the regenerated call is marked spliced, with the error context's (behaviour) log-probs
    spliced = [i for i, f in enumerate(traj.spliced) if f]
    assert spliced == list(range(len(reasoning), traj.response_mask.index(0)))
    assert all(traj.logprobs[i] == pytest.approx(-0.02) for i in spliced)


def test_deep_recovery_replaces_the_whole_turn(chat, box):
    failed = "Multiply. " + render_call("print(123 * 456")
    fixed = "A loop is safer here. " + render_call(LONG_FIX)
    traj, _ = run(chat, box, [failed, fixed, "So \\boxed{56088}."])
    check_bookkeeping(chat, traj)
    event = next(e for e in traj.events if e.kind in ("shallow", "deep"))
    assert event.kind == "deep" and event.similarity < 0.5
    new_ids = chat.encode(fixed) + [chat.eos_id]
    assert traj.response_ids[: len(new_ids)] == new_ids
    assert [i for i, f in enumerate(traj.spliced) if f] == list(range(len(new_ids)))
    assert "Multiply." not in chat.decode(traj.response_ids)
    assert "SyntaxError" not in chat.decode(traj.response_ids)


def test_exhausted_keeps_last_error_with_note(chat, box):
    bad = [f"Try {i}. " + render_call(f"print(1/0 + {i})") for i in range(4)]
    traj, _ = run(chat, box, [*bad, "I cannot compute it."], max_tool_retries=3)
    check_bookkeeping(chat, traj)
    s = traj.stats
    assert s.tool_calls == 4 and s.rollbacks_triggered == 1 and s.rollbacks_failed == 1 and s.rollbacks_recovered == 0
    assert s.failure_reasons["ZeroDivisionError"] == 4
    text = chat.decode(traj.response_ids)
    assert text.count("ZeroDivisionError") == 1 and "attempted 3 times" in text
    assert text.count("<tool_call>") == 1 and "print(1/0 + 3)" in text
    last = traj.events[-1]
    assert (last.position, last.attempt, last.kind, last.error_kind) == (0, 3, "exhausted", "ZeroDivisionError")
    assert "division by zero" in last.error_text
    assert not traj.saar_on


def test_regeneration_without_call_keeps_everything(chat, box):
    failed = "Compute. " + render_call("print(undefined_name)")
    traj, _ = run(chat, box, [failed, "The answer is \\boxed{56088}."])
    check_bookkeeping(chat, traj)
    text = chat.decode(traj.response_ids)
    assert "undefined_name" in text and "NameError" in text and text.endswith("\\boxed{56088}.<|im_end|>")
    assert traj.stats.rollbacks_failed == 1 and traj.stats.errors_kept == 1
    assert (traj.events[-1].position, traj.events[-1].attempt, traj.events[-1].kind) == (0, 1, "no_call")
    assert traj.events[-1].new_turn == "The answer is \\boxed{56088}.<|im_end|>"
    assert traj.finish_reason == "stop" and traj.assistant_turns == 2
    # both turns train (mask 1, their sampled end-of-turn ids included); the error between them does not
    n1, n3 = len(chat.encode(failed)) + 1, len(chat.encode("The answer is \\boxed{56088}.")) + 1
    assert traj.response_mask == [1] * n1 + [0] * (len(traj.response_ids) - n1 - n3) + [1] * n3
    end = "<|im_end|>"
    assert traj.messages[-3:] == [{"role": "assistant", "content": failed + end},
                                  {"role": "tool", "content": traj.events[-1].error_text},
                                  {"role": "assistant", "content": "The answer is \\boxed{56088}." + end}]


def test_raw_trajectory_keeps_error_and_retry_loop(chat, box):
    cfg = RolloutConfig(n_samples=1, saar=SAARConfig(raw_share=1.0))
    script = ["Go. " + render_call("pritn(1)"), "Fix. " + render_call("print(1)"), "\\boxed{1}"]
    traj = Rollout(cfg, ScriptedEngine(chat, [script]), chat, box).run([ITEM], 0, 0, progress=False)[0]
    check_bookkeeping(chat, traj)
    assert traj.raw and traj.events == [] and "NameError" in chat.decode(traj.response_ids)
    assert traj.stats.first_attempt_total == 2 and traj.stats.first_attempt_success == 1
    assert traj.stats.errors_kept == 1 and traj.stats.retry_loops == 1


def test_malformed_call_is_a_failure_saar_handles(chat, box):
    broken = "Go. <tool_call>{\"name\": \"code_interpreter\", \"arguments\": {\"code\": \"print(2)\"}</tool_call>"
    traj, _ = run(chat, box, [broken, "Go. " + render_call("print(2)"), "\\boxed{2}"])
    assert traj.stats.failure_reasons["malformed_call"] == 1 and traj.stats.rollbacks_recovered == 1
    assert traj.executions[0].code is None and traj.executions[1].result.ok


def test_malformed_call_reference_mode_ends_trajectory(chat, box):
    broken = "Go. <tool_call>{not json}</tool_call>"
    traj, _ = run(chat, box, [broken], malformed_call_is_failure=False)
    assert traj.finish_reason == "malformed_call" and traj.executions == []


def test_safety_switch_turns_saar_off(chat, box):
    script = ["A. " + render_call("print(x)"), "B. " + render_call("print(y)"), "C. " + render_call("print(1)"), "\\boxed{1}"]
    traj, _ = run(chat, box, script, max_tool_rounds=1)
    assert traj.stats.rollbacks_triggered == 1 and traj.stats.rollbacks_failed == 1 and traj.stats.tool_rounds == 3


def test_retries_do_not_use_turn_budget(chat, box):
    cfg = RolloutConfig(n_samples=1, max_turns=2, saar=SAARConfig(raw_share=0.0))
    script = ["A. " + render_call("print(q)"), "A. " + render_call("print(w)"), "A. " + render_call("print(3)"), "\\boxed{3}"]
    traj = Rollout(cfg, ScriptedEngine(chat, [script]), chat, box).run([ITEM], 0, 0, progress=False)[0]
    assert traj.finish_reason == "stop" and traj.assistant_turns == 2 and traj.stats.rollbacks_recovered == 1


def test_raw_share_is_seeded_and_reproducible():
    draws = [is_raw(7, s, f"p{i}", k, 0.3) for s in range(5) for i in range(20) for k in range(8)]
    again = [is_raw(7, s, f"p{i}", k, 0.3) for s in range(5) for i in range(20) for k in range(8)]
    other = [is_raw(8, s, f"p{i}", k, 0.3) for s in range(5) for i in range(20) for k in range(8)]
    assert draws == again and draws != other
    assert 0.25 < sum(draws) / len(draws) < 0.35


def test_aggregate_counts_failures_not_trajectories(chat, box):
    bad = [f"T{i}. " + render_call(f"print(1/0 + {i})") for i in range(4)]
    traj, _ = run(chat, box, [*bad, "no"])
    m = aggregate_stats([traj.stats], [traj.raw])
    assert m["tools/failures/ZeroDivisionError"] == 4 and m["saar/global_recovery_rate"] == 0.0


def test_similarity_is_difflib_ratio():
    assert similarity("abcd", "abcd") == 1.0
    assert similarity("abcd", "wxyz") == 0.0


def test_turn_cap_positions_and_transcript(chat, box):
    """max_turns=4: the fourth turn's call is never run (finish "turn_cap"); a retry keeps its position
    with attempt 1; the transcript holds the spliced turns, not the failed ones; counters add up."""
    a, b, b2 = ("A. " + render_call("print(1)"), "B. " + render_call("pritn(2)"), "B. " + render_call("print(2)"))
    c, c2, d = ("C. " + render_call("pritn(3)"), "C. " + render_call("print(3)"), "D. " + render_call("print(4)"))
    traj, _ = run(chat, box, [a, b, b2, c, c2, d, "never asked"])
    check_bookkeeping(chat, traj)
    assert traj.finish_reason == "turn_cap" and traj.assistant_turns == 4 and traj.pending is None
    assert [(x.position, x.attempt, x.code) for x in traj.executions] == [
        (0, 0, "print(1)"), (1, 0, "pritn(2)"), (1, 1, "print(2)"), (2, 0, "pritn(3)"), (2, 1, "print(3)")]
    assert [(e.position, e.attempt, e.kind) for e in traj.events] == [
        (1, 0, "triggered"), (1, 1, "shallow"), (1, 1, "recovered"), (2, 0, "triggered"), (2, 1, "shallow"),
        (2, 1, "recovered")]
    triggered = [e for e in traj.events if e.kind == "triggered"]
    assert [e.error_kind for e in triggered] == ["NameError"] * 2
    assert "pritn" in triggered[0].error_text and "pritn" in triggered[1].error_text
    shallow = traj.events[1]
    assert (shallow.error_kind, shallow.failed_turn, shallow.new_turn) == ("NameError", b + "<|im_end|>", b2 + "<|im_end|>")
    assert shallow.error_text == triggered[0].error_text
    s = traj.stats
    assert (s.tool_calls, s.tool_success, s.first_attempt_total, s.first_attempt_success) == (5, 3, 3, 1)
    assert (s.rollbacks_triggered, s.rollbacks_recovered, s.shallow, s.errors_kept) == (2, 2, 2, 0)
    turns = traj.messages[-7:]
    assert [m["role"] for m in turns] == ["assistant", "tool"] * 3 + ["assistant"]
    end = "<|im_end|>"  # a turn's text is its sampled ids decoded, the end-of-turn id included
    assert [m["content"] for m in turns] == [a + end, "1", b2 + end, "2", c2 + end, "3", d + end]


def test_raw_counters_add_up_over_a_retry_loop(chat, box):
    """Raw: fail, fail, succeed. Every call after a kept error is a retry loop (2); all three are first attempts."""
    cfg = RolloutConfig(n_samples=1, saar=SAARConfig(raw_share=1.0))
    script = ["Go. " + render_call("pritn(1)"), "Again. " + render_call("prnt(1)"), "Fix. " + render_call("print(1)"),
              "\\boxed{1}"]
    traj = Rollout(cfg, ScriptedEngine(chat, [script]), chat, box).run([ITEM], 0, 0, progress=False)[0]
    s = traj.stats
    assert (s.retry_loops, s.errors_kept, s.tool_calls, s.tool_success) == (2, 2, 3, 1)
    assert (s.first_attempt_total, s.first_attempt_success, s.failure_reasons["NameError"]) == (3, 1, 2)
    assert [(x.position, x.attempt) for x in traj.executions] == [(0, 0), (1, 0), (2, 0)]


def test_the_rollout_bar_is_drawn_on_a_terminal_only(chat, box, capsys, monkeypatch):
    """``progress=True``: tqdm draws the bar when its stream is a terminal, and writes nothing into a log or a pipe
    (pytest's capture is neither a terminal nor, here, made to look like one until the second run)."""
    import sys

    cfg = RolloutConfig(n_samples=1, scheduling=SCHEDULING["mode"])

    def roll():
        Rollout(cfg, ScriptedEngine(chat, [["\\boxed{1}"]]), chat, box).run([ITEM], 0, 0, progress=True)
        return capsys.readouterr().err

    assert roll() == ""
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert "rollout step 0" in roll()
