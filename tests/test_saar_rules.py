"""SAAR rules pinned with hand-made cases: each test fails when one rule changes by one line.

What is pinned: the similarity segment (``<tool_call>`` to the end of the turn, not the whole
turn), the threshold's ``>=``, the exhaustion note's retry cutoff and wording, the last error kept
at an exhausted position, the raw draw's step, raw only where SAAR could act, stops that did not
sample the end-of-turn id (never trained), length cuts, the reference switch for a malformed
regenerated call, refill rounds' seeds and the trimmed refill batch, and the reference's metric keys
with their meaning (``tool_calls/success_rate`` = first attempts). Scripted engine, real tokenizer,
real local sandbox.
"""

from __future__ import annotations

import pytest

from models.chat import render_call
from models.engine import GenOutput
from tasks.rollout.config import RolloutConfig, SAARConfig
from tasks.rollout.machine import Rollout, sampling_salt
from tasks.rollout.saar import TrajStats, aggregate_stats, exhausted_note, is_raw, reference_metrics, splice
from tasks.rollout.types import Carry, PromptItem, State
from tasks.training.mixing import fill_batch
from tests.local_box import box_fixture, scheduling_fixture
from tests.scripted import ScriptedEngine, Turn

ITEM = PromptItem("p0", [{"role": "user", "content": "What is 6 * 7?"}], "synthetic/arith", "42")


box = box_fixture()
scheduling = scheduling_fixture()


def roll(chat, box, script, scheduling="rounds", **saar):
    cfg = RolloutConfig(n_samples=1, max_turns=4, scheduling=scheduling, saar=SAARConfig(raw_share=0.0, **saar))
    engine = ScriptedEngine(chat, [script])
    traj = Rollout(cfg, engine, chat, box).run([ITEM], seed=0, step=0, progress=False)[0]
    assert traj.state is State.TERMINATED
    assert len(traj.response_ids) == len(traj.response_mask) == len(traj.logprobs)
    return traj, engine


def trained(traj) -> list[tuple[int, float]]:
    return [(i, lp) for i, m, lp in zip(traj.response_ids, traj.response_mask, traj.logprobs) if m == 1]


# -- similarity segment and threshold -------------------------------------------------------------------

def test_similarity_is_taken_on_the_call_segment_not_the_whole_turn(chat):
    """Long, unrelated reasoning around near-identical calls is shallow; the same reasoning around
    unrelated calls is deep. On whole turns both decisions would flip."""
    call_a, call_b = render_call("print(6 * 7)"), render_call("print(6*7)")
    other = render_call("\n".join(f"partial_sum_{k} = sum(range({k}, {k} + 6))" for k in range(8)) + "\nprint(42)")
    plan_a = "First I restate the problem carefully and think about units and edge cases at length. " * 3
    plan_b = "Quick: ok. " + "Z" * 200 + " "

    def decide(old_text, new_text):
        old, new = chat.encode(old_text), chat.encode(new_text)
        return splice(old, [0.0] * len(old), new, [0.0] * len(new), chat.call_start(old), chat.call_start(new),
                      chat.decode, 0.5)

    near = decide(plan_a + call_a, plan_b + call_b)
    assert near.decision == "shallow" and near.similarity > 0.9
    assert near.ids == chat.encode(plan_a) + chat.encode(plan_b + call_b)[len(chat.encode(plan_b)):]
    far = decide(plan_a + call_a, plan_a + other)
    assert far.decision == "deep" and far.similarity < 0.5


def test_threshold_is_inclusive():
    """ratio('ab', 'ac') is exactly 0.5: at the threshold the fix is spliced shallow (reference: deep only below)."""
    letters = {5: "r", 6: "s", 10: "a", 11: "b", 12: "c"}
    decode = lambda ids: "".join(letters[i] for i in ids)
    sp = splice([5, 10, 11], [-1.0, -2.0, -3.0], [6, 10, 12], [-4.0, -5.0, -6.0], 1, 1, decode, 0.5)
    assert sp.similarity == 0.5 and sp.decision == "shallow"
    assert sp.ids == [5, 10, 12] and sp.logprobs == [-1.0, -5.0, -6.0] and sp.kept_old_prefix == 1
    below = splice([5, 10, 11], [-1.0] * 3, [6, 10, 12], [-4.0] * 3, 1, 1, decode, 0.51)
    assert below.decision == "deep" and below.ids == [6, 10, 12] and below.kept_old_prefix == 0


def test_a_side_without_call_is_deep():
    decode = lambda ids: "x" * len(ids)
    for old_call, new_call in [(None, 0), (0, None)]:
        sp = splice([1, 2], [-1.0] * 2, [3, 4], [-2.0, -3.0], old_call, new_call, decode, 0.0)
        assert (sp.decision, sp.similarity, sp.kept_old_prefix) == ("deep", 0.0, 0)
        assert sp.ids == [3, 4] and sp.logprobs == [-2.0, -3.0]


# -- exhaustion ------------------------------------------------------------------------------------------

def test_exhaustion_note_cutoff_and_wording():
    assert exhausted_note("E", 0) == "E" and exhausted_note("E", 1) == "E"
    assert exhausted_note("E", 2) == (
        "E\n\nNote: This approach has been attempted 2 times with the same type of error. "
        "Consider trying a different algorithm, method, or approach to solve this problem.")
    assert "attempted 3 times" in exhausted_note("E", 3)


def test_exhausted_position_keeps_the_last_error_and_call(chat, box, scheduling):
    bad = [f"Try {i}. " + render_call(f"print(a{i})") for i in range(4)]
    traj, engine = roll(chat, box, [*bad, "I cannot."], scheduling, max_tool_retries=3)
    text = chat.decode(traj.response_ids)
    assert "name 'a3' is not defined" in text and "attempted 3 times" in text
    assert all(f"a{i}" not in text for i in range(3)), "earlier attempts must be erased"
    # each retry saw the error of the attempt just before it
    for k in (1, 2, 3):
        ctx = chat.decode(engine.requests[k].input_ids)
        assert f"name 'a{k - 1}' is not defined" in ctx and f"name 'a{k - 2}'" not in ctx


def test_a_position_given_up_on_keeps_the_last_error_not_the_first(chat, box, scheduling):
    """Two failed calls, then a regeneration without a call: SAAR gives up and the error left before
    the new turn — in the tokens, the messages and the event — is the second call's, the one the
    spliced call just before it raised."""
    bad = [f"Try {i}. " + render_call(f"print(c{i})") for i in range(2)]
    traj, _ = roll(chat, box, [*bad, "I give up."], scheduling)
    assert [e.kind for e in traj.events][0::2] == ["triggered", "no_call"] and len(traj.events) == 3
    tools = [m["content"] for m in traj.messages if m["role"] == "tool"]
    assert len(tools) == 1 and "name 'c1' is not defined" in tools[0] and "c0" not in tools[0]
    assert "name 'c1' is not defined" in traj.events[-1].error_text and traj.events[-1].error_kind == "NameError"
    text = chat.decode(traj.response_ids)
    assert "name 'c1' is not defined" in text and "c0" not in text

def test_one_retry_exhausted_gets_no_note(chat, box):
    bad = [f"Try {i}. " + render_call(f"print(b{i})") for i in range(2)]
    traj, _ = roll(chat, box, [*bad, "I cannot."], max_tool_retries=1)
    text = chat.decode(traj.response_ids)
    assert "name 'b1' is not defined" in text and "Note:" not in text and "b0" not in text


# -- raw draws -------------------------------------------------------------------------------------------

def test_raw_draw_depends_on_the_step():
    for step in range(1, 4):
        a = [is_raw(0, 0, f"p{i}", k, 0.5) for i in range(40) for k in range(4)]
        b = [is_raw(0, step, f"p{i}", k, 0.5) for i in range(40) for k in range(4)]
        assert a != b
    assert [is_raw(0, 0, "p0", k, 0.0) for k in range(50)] == [False] * 50
    assert [is_raw(0, 0, "p0", k, 1.0) for k in range(50)] == [True] * 50


def test_raw_only_when_saar_could_act(chat):
    items = [PromptItem(f"p{i}", [{"role": "user", "content": f"q{i}"}], "synthetic/arith", "1") for i in range(25)]
    on = Rollout(RolloutConfig(n_samples=4, saar=SAARConfig(raw_share=0.3)), None, chat, None)
    flags = [t.raw for t in on.new_trajectories(items, 5, 2)]
    assert flags == [is_raw(5, 2, f"p{i}", k, 0.3) for i in range(25) for k in range(4)] and 15 < sum(flags) < 45
    assert all(t.saar_on != t.raw for t in on.new_trajectories(items, 5, 2))
    off = Rollout(RolloutConfig(n_samples=4, saar=SAARConfig(enabled=False, raw_share=0.3)), None, chat, None)
    trajs = off.new_trajectories(items, 5, 2)
    assert not any(t.raw for t in trajs) and not any(t.saar_on for t in trajs)
    assert aggregate_stats([t.stats for t in trajs], [t.raw for t in trajs])["rollout/raw_share"] == 0.0


def test_duplicate_prompts_in_one_step_are_refused(chat):
    runner = Rollout(RolloutConfig(n_samples=2), None, chat, None)
    other = PromptItem("p1", ITEM.messages, ITEM.data_source, ITEM.ground_truth)
    with pytest.raises(ValueError, match=r"prompt ids drawn twice in one batch: \['p0'\] "):
        runner.new_trajectories([ITEM, other, ITEM], 0, 7)


# -- stops: nothing the policy did not sample is trained ------------------------------------------------

def test_turn_ending_on_another_eos_gets_an_untrained_end_of_turn(chat, box, scheduling):
    eot = chat.tokenizer.convert_tokens_to_ids("<|endoftext|>")
    first = "Go. " + render_call("print(6 * 7)")
    traj, engine = roll(chat, box, [Turn(first, "endoftext"), Turn("\\boxed{42}", "endoftext")], scheduling)
    turn = chat.encode(first) + [eot]
    assert traj.response_ids[: len(turn) + 1] == turn + [chat.eos_id]
    assert traj.response_mask[: len(turn) + 1] == [1] * len(turn) + [0]
    assert traj.logprobs[len(turn)] == 0.0
    assert all(lp != 0.0 for _, lp in trained(traj)), "a mask-1 token without a sampled log-prob"
    assert traj.response_ids[-1] == chat.eos_id and traj.response_mask[-1] == 0
    assert traj.executions[0].result.ok and traj.finish_reason == "stop"
    # the next request's context is the closed turn + the tool turn
    ctx = engine.requests[1].input_ids
    assert ctx == traj.prompt_ids + traj.response_ids[: len(ctx) - len(traj.prompt_ids)]
    assert ctx[len(traj.prompt_ids) + len(turn)] == chat.eos_id


def test_shallow_splice_of_turns_ending_on_another_eos(chat, box):
    eot = chat.tokenizer.convert_tokens_to_ids("<|endoftext|>")
    failed = "I will multiply. " + render_call("pritn(6 * 7)")
    fixed = "Fixing. " + render_call("print(6 * 7)")
    traj, _ = roll(chat, box, [Turn(failed, "endoftext"), Turn(fixed, "endoftext"), "\\boxed{42}"])
    assert [e.kind for e in traj.events] == ["triggered", "shallow", "recovered"]
    spliced = chat.encode("I will multiply. ") + chat.encode(render_call("print(6 * 7)")) + [eot]
    n = len(spliced)
    assert chat.decode(traj.response_ids[:n]) == chat.decode(spliced)
    assert traj.response_mask[:n + 1] == [1] * n + [0] and traj.response_ids[n] == chat.eos_id
    assert "pritn" not in chat.decode(traj.response_ids) and "NameError" not in chat.decode(traj.response_ids)
    assert all(lp != 0.0 for _, lp in trained(traj))


def test_turn_cut_by_length_never_runs_its_call(chat, box, scheduling):
    cut = "Go. " + render_call("print(6 * 7)") + " and then I"
    traj, _ = roll(chat, box, [Turn(cut, "length")], scheduling)
    assert traj.finish_reason == "length" and traj.executions == []
    assert traj.response_ids == chat.encode(cut) and set(traj.response_mask) == {1}


def test_regeneration_cut_by_length_around_a_complete_call_is_not_spliced(chat, box, scheduling):
    """Deviation from the reference (which runs a complete call found in a cut regeneration): the
    regenerated turn was never finished, so it is neither spliced over the failed turn nor run."""
    failed = "Go. " + render_call("print(c0)")
    cut = "Fix. " + render_call("print(6 * 7)") + " and"
    traj, _ = roll(chat, box, [failed, Turn(cut, "length")], scheduling)
    assert len(traj.executions) == 1 and [e.kind for e in traj.events] == ["triggered", "length"]
    assert traj.finish_reason == "length" and not traj.saar_on
    text = chat.decode(traj.response_ids)
    assert "print(c0)" in text and "NameError" in text and text.endswith(" and")
    s = traj.stats
    assert (s.rollbacks_triggered, s.rollbacks_recovered, s.rollbacks_failed, s.errors_kept) == (1, 0, 1, 1)


def test_malformed_regenerated_call_under_the_reference_switch_is_dropped(chat, box, scheduling):
    failed = "Go. " + render_call("print(d0)")
    broken = "Go. <tool_call>{not json}</tool_call>"
    traj, _ = roll(chat, box, [failed, broken], scheduling, malformed_call_is_failure=False)
    assert [e.kind for e in traj.events] == ["triggered", "no_call"] and traj.finish_reason == "malformed_call"
    assert len(traj.executions) == 1 and dict(traj.stats.failure_reasons) == {"NameError": 1}
    assert "{not json}" in chat.decode(traj.response_ids) and "NameError" in chat.decode(traj.response_ids)
    # here (the default) the same regeneration is a failure SAAR retries
    fixed = "Go. " + render_call("print(42)")
    traj, _ = roll(chat, box, [failed, broken, fixed, "\\boxed{42}"], scheduling)
    assert dict(traj.stats.failure_reasons) == {"NameError": 1, "malformed_call": 1}
    assert traj.stats.rollbacks_recovered == 1 and "d0" not in chat.decode(traj.response_ids)


def test_an_unparseable_call_fails_on_its_own_with_its_parse_error(chat, box, scheduling):
    """The result of a call that could not run: nothing ran, no time passed, the parse error is the
    text the model sees on its retry."""
    from sandbox.result import ExecutionResult

    broken = "Go. <tool_call>{not json}</tool_call>"
    traj, engine = roll(chat, box, [broken, "Go. " + render_call("print(42)"), "\\boxed{42}"], scheduling)
    err = "Error: tool call is not valid JSON (Expecting property name enclosed in double quotes)"
    assert traj.executions[0].result == ExecutionResult(
        ok=False, exit_code=None, stdout="", stderr=err, error_kind="malformed_call", timed_out=False,
        memory_exceeded=False, duration_s=0.0)
    assert err in chat.decode(engine.requests[1].input_ids)


# -- DAPO refill -----------------------------------------------------------------------------------------

class SeedRecorder(ScriptedEngine):
    def __init__(self, chat, scripts):
        super().__init__(chat, scripts)
        self.seeds: list[int] = []

    def generate(self, requests, seed):
        self.seeds.append(seed)
        return super().generate(requests, seed)


def test_refill_rounds_sample_with_their_own_seeds(chat, box):
    cfg = RolloutConfig(n_samples=1, scheduling="rounds", saar=SAARConfig(raw_share=0.0))
    seeds = []
    for round_ in (0, 1, 2, 0):
        engine = SeedRecorder(chat, [["\\boxed{1}"]])
        Rollout(cfg, engine, chat, box).run([ITEM], 3, 5, progress=False, refill_round=round_)
        seeds.append(engine.seeds[0])
    assert len(set(seeds[:3])) == 3 and seeds[3] == seeds[0]



class StreamSeedRecorder(SeedRecorder):
    def stream(self, seed, keep_prefix=True):
        self.seeds.append(("stream", seed))
        return super().stream(seed, keep_prefix)


def test_engine_seeds_follow_seed_step_stream_and_round(chat, box):
    """Rounds scheduling: one engine seed per round (two tool calls, then the answer: three rounds), pinned
    (``hash((seed, step, round)) % 2**31``: ints only, so every process and rerun samples the same), and
    different when the seed, the step or the stream changes. Continuous scheduling: one stream, seeded from
    ``hash((seed, step)) % 2**31``. Trajectories of step 5 are sampled by policy version 5."""
    script = [render_call("print(6 * 7)"), render_call("print(7 * 6)"), "\\boxed{42}"]

    def seeds(scheduling="rounds", seed=3, step=5, stream=""):
        cfg = RolloutConfig(n_samples=1, scheduling=scheduling, saar=SAARConfig(raw_share=0.0))
        engine = StreamSeedRecorder(chat, [list(script)])
        rollout = Rollout(cfg, engine, chat, box)
        [traj] = (rollout.drive_all(rollout.new_trajectories([ITEM], seed, step), seed, step, False, stream=stream)
                  if stream else rollout.run([ITEM], seed, step, progress=False))
        assert traj.state is State.TERMINATED and traj.assistant_turns == 3
        assert (traj.traj_id, traj.version, traj.start_step, set(traj.versions)) == (f"{step}:p0:0", step, step, {step})
        return engine.seeds

    assert seeds() == [240621063, 1908159193, 1527552562]
    others = [seeds(seed=4), seeds(step=6), seeds(stream="r3l-retry")]
    assert all(o[0] != 240621063 for o in others) and len({o[0] for o in others}) == 3
    assert others[2][0] == 905261458  # a second phase of the same step, refill round 0
    assert seeds("continuous") == [("stream", 2071888094)]
    assert seeds("continuous", seed=4, step=6) == [("stream", 502283019)]  # the hash is 2649766667 modulo 2**32


def test_run_draws_the_raw_samples_from_seed_and_step(chat, box):
    """``run`` hands its seed to the raw draw: seed 3, step 5, raw share 0.5 -> these eight flags."""
    cfg = RolloutConfig(n_samples=8, saar=SAARConfig(raw_share=0.5))
    trajs = Rollout(cfg, ScriptedEngine(chat, [["\\boxed{42}"]] * 8), chat, box).run([ITEM], 3, 5, progress=False)
    assert [t.raw for t in trajs] == [False, False, False, True, True, True, False, True]
    assert [t.saar_on for t in trajs] == [not t.raw for t in trajs]


def test_a_carried_turn_takes_the_finish_reason_of_its_last_piece(chat, box):
    """Partial rollouts: a turn cut by an abort resumes; the whole turn ends as its last piece ended."""
    rollout = Rollout(RolloutConfig(n_samples=1), ScriptedEngine(chat, []), chat, box)
    [t] = rollout.new_trajectories([ITEM], 0, 7)
    t.carry = Carry([11, 12], [-0.5, -0.25], [6, 6])
    out, versions = rollout.whole_turn(t, GenOutput([13], [-0.125], "length"))
    assert out == GenOutput([11, 12, 13], [-0.5, -0.25, -0.125], "length")
    assert versions == [6, 6, 7] and t.carry is None


class KeepStream(ScriptedEngine):
    def stream(self, seed, keep_prefix=True):
        self.last_stream = super().stream(seed, keep_prefix)
        return self.last_stream


def test_bound_inputs_token_budgets_and_released_streams(chat, box, scheduling):
    """A prompt's bound inputs (``extra_info.setup``) run before its call; each request asks for what is left of
    the response budget (``max_new_tokens`` 1000 never binds): 200 for the first turn, 200 minus the tokens of
    the first turn and the tool's output for the second; the continuous stream releases the finished key."""
    item = PromptItem("p1", ITEM.messages, ITEM.data_source, ITEM.ground_truth, {"setup": "x = 6"})
    cfg = RolloutConfig(n_samples=1, scheduling=scheduling, max_new_tokens=1000, max_response_tokens=200,
                        saar=SAARConfig(raw_share=0.0))
    engine = KeepStream(chat, [[render_call("print(x * 7)"), "\\boxed{42}"]])
    [traj] = Rollout(cfg, engine, chat, box).run([item], 0, 0, progress=False)
    [ex] = traj.executions
    assert (ex.result.ok, ex.result.stdout) == (True, "42\n")
    first, second = engine.requests
    used = len(second.input_ids) - len(traj.prompt_ids)
    assert traj.budget_extra == 0 and used > 0
    assert (first.max_new_tokens, second.max_new_tokens) == (200, 200 - used)
    if scheduling == "continuous":
        assert engine.last_stream.released == [traj.traj_id]


def test_a_budget_used_up_by_the_tool_output_ends_the_trajectory(chat, box, scheduling):
    """The budget ends exactly where the tool's output ends: finish ``length`` after one turn, no second request."""
    script = [render_call("print(6 * 7)"), "\\boxed{42}"]

    def roll(budget):
        cfg = RolloutConfig(n_samples=1, scheduling=scheduling, max_new_tokens=1000, max_response_tokens=budget,
                            saar=SAARConfig(raw_share=0.0))
        engine = ScriptedEngine(chat, [list(script)])
        return Rollout(cfg, engine, chat, box).run([ITEM], 0, 0, progress=False)[0], engine

    traj, engine = roll(200)
    used = len(engine.requests[1].input_ids) - len(traj.prompt_ids)
    traj, engine = roll(used)
    assert (traj.finish_reason, traj.assistant_turns, len(engine.requests)) == ("length", 1, 1)
    assert len(traj.response_ids) == used

def test_sampling_salts_are_ints_so_reruns_sample_the_same():
    """``hash`` of a str differs between processes: a phase name must enter the seed as a stable int."""
    salts = [sampling_salt(3, 5), sampling_salt(3, 5, "r3l-retry"), sampling_salt(3, 5, "", 1),
             sampling_salt(3, 5, "r3l-retry", 1)]
    assert all(type(x) is int for salt in salts for x in salt) and len(set(salts)) == 4
    assert sampling_salt(3, 5) == (3, 5) and sampling_salt(3, 5, "r3l-retry") == sampling_salt(3, 5, "r3l-retry")
    # the stream enters as its CRC-32, a refill round behind a marker
    assert sampling_salt(3, 5, "r3l-retry", 1) == (3, 5, 754466276, 1_000_003, 1)


def test_refill_batch_is_trimmed_to_its_size():
    """Round 0: 1 informative group of 4; round 1 (the last) draws 3, 2 informative: the batch is
    the 3 informative groups + the first uninformative one — 4 groups, not 7."""
    rewards = {"a0": [1, 0], "a1": [0, 0], "a2": [1, 1], "a3": [0, 0], "b0": [1, 0], "b1": [0, 0], "b2": [0, 1]}
    rounds_run = []

    def draw(round_, n):
        return [f"{'ab'[round_]}{i}" for i in range(n)]

    def run(prompts, round_):
        rounds_run.append(round_)
        return [(p, k) for p in prompts for k in range(2)]

    def group_rewards(trajs):
        return {p: rewards[p] for p, _ in trajs}

    batch, m = fill_batch(draw, run, group_rewards, want=4, max_rounds=1, group_of=lambda t: t[0])
    assert rounds_run == [0, 1]
    assert sorted({p for p, _ in batch}) == ["a0", "a1", "b0", "b2"] and len(batch) == 8
    assert m == {"mix/refill_rounds": 1, "mix/informative_groups": 3, "mix/refill_dropped_groups": 3}


def test_batch_without_refill_is_kept_whole():
    """Enough informative groups in round 0: no refill, nothing dropped, uninformative groups included."""
    def draw(round_, n):
        return [f"p{i}" for i in range(n)]

    def group_rewards(trajs):
        return {p: ([1, 0] if p != "p2" else [0, 0]) for p in trajs}

    batch, m = fill_batch(draw, lambda prompts, round_: list(prompts), group_rewards, want=3, max_rounds=0,
                          group_of=str)
    assert batch == ["p0", "p1", "p2"]
    assert m == {"mix/refill_rounds": 0, "mix/informative_groups": 2, "mix/refill_dropped_groups": 0}


# -- the reference's metric keys -------------------------------------------------------------------------

def test_reference_metrics_hand_computed():
    saar = TrajStats(tool_calls=4, tool_success=2, first_attempt_total=2, first_attempt_success=1,
                     rollbacks_triggered=1, rollbacks_recovered=1, shallow=1, deep=1, tool_rounds=4,
                     similarities=[0.8, 0.3], sampled_tokens=120, sandbox_calls=4)
    saar.failure_reasons.update({"NameError": 2})
    raw = TrajStats(tool_calls=3, tool_success=1, first_attempt_total=3, first_attempt_success=1, tool_rounds=3,
                    errors_kept=2, retry_loops=1, sampled_tokens=75, sandbox_calls=2)
    raw.failure_reasons.update({"NameError": 1, "ZeroDivisionError": 1})
    gave_up = TrajStats(rollbacks_triggered=1, rollbacks_failed=1)
    m = aggregate_stats([saar, raw, gave_up], [False, True, False])
    assert m["tool_calls/total_attempts"] == 5 and m["tool_calls/success_rate"] == pytest.approx(2 / 5)
    assert m["tools/success_rate"] == pytest.approx(3 / 7)  # ours: every call, retries included
    assert m["tool_calls/failure_reason/NameError"] == 2  # trajectories with one, as the reference counts
    assert m["tools/failures/NameError"] == 3  # ours: failures
    assert m["tool_calls/failure_reason/ZeroDivisionError"] == 1
    assert (m["rollback/global_triggered"], m["rollback/global_recovered"], m["rollback/global_failed"]) == (2, 1, 1)
    assert m["rollback/global_recovery_rate"] == 0.5
    assert (m["rollback/rollback_full_turn_count"], m["rollback/rollback_tool_call_only_count"]) == (1, 1)
    ours = {k: v for k, v in m.items() if not k.startswith(("tool_calls/", "rollback/"))}
    assert ours == pytest.approx({
        "tools/calls": 7, "tools/call_rate": 2 / 3, "tools/success_rate": 3 / 7, "tools/first_attempt_total": 5,
        "tools/first_attempt_success_rate": 2 / 5, "tools/failures/NameError": 3, "tools/failures/ZeroDivisionError": 1,
        "saar/rollbacks_triggered": 2, "saar/rollbacks_recovered": 1, "saar/rollbacks_failed": 1,
        "saar/global_recovery_rate": 0.5, "saar/shallow": 1, "saar/deep": 1, "saar/similarity_mean": 0.55,
        "rollout/raw_share": 1 / 3, "rollout/tool_rounds_mean": 7 / 3, "rollout/retry_loop_share": 1 / 3,
        "rollout/errors_kept_mean": 2 / 3, "rollout/sampled_tokens": 195, "rollout/sandbox_calls": 6})
    assert len(m) == len(ours) + 10  # the reference's keys: 8 + 2 failure reasons
    empty = aggregate_stats([], [])
    assert empty["saar/similarity_mean"] == empty["rollout/raw_share"] == empty["rollout/tool_rounds_mean"] == 0.0
    assert empty["tools/call_rate"] == 0.0
    one_call = aggregate_stats([TrajStats(tool_calls=1, tool_rounds=1), TrajStats()], [False, False])
    assert one_call["tools/call_rate"] == 0.5  # a trajectory with one call counts as one that calls the tool


def test_reference_metrics_edge_rules():
    assert "rollback/global_recovery_rate" not in reference_metrics([TrajStats(tool_calls=1, first_attempt_total=1)])
    fallback = reference_metrics([TrajStats(tool_calls=4, tool_success=3)])
    assert fallback["tool_calls/total_attempts"] == 4 and fallback["tool_calls/success_rate"] == 0.75
    assert reference_metrics([TrajStats()])["tool_calls/success_rate"] == 0.0


def test_success_rate_counts_first_attempts_of_a_real_rollout(chat, box):
    failed = "Go. " + render_call("pritn(6 * 7)")
    traj, _ = roll(chat, box, [failed, "Go. " + render_call("print(6 * 7)"), "\\boxed{42}"])
    m = aggregate_stats([traj.stats], [traj.raw])
    assert m["tool_calls/success_rate"] == 0.0 and m["tool_calls/total_attempts"] == 1
    assert m["tools/success_rate"] == 0.5 and m["rollback/global_recovery_rate"] == 1.0
    assert m["tool_calls/failure_reason/NameError"] == 1 and m["rollback/rollback_tool_call_only_count"] == 1
