"""APRIL partial rollouts on a paced engine (one token per row per step): the stop rule, the abort, the FIFO
drain of the buffer, continued turns and their policy versions, the buffer's round trip through Parquet and
DuckDB, and the bad inputs (a buffer from a newer policy, a prompt that left the dataset, too small an
over-sampling size)."""

from __future__ import annotations

import json

import pytest

from sandbox.result import ExecutionResult
from tasks.data.loader import PromptCursor
from tasks.rollout.buffer import buffer_frame, read_buffer, write_buffer
from tasks.rollout.config import PartialConfig, RolloutConfig
from tasks.rollout.machine import Rollout
from tasks.rollout.partial import PartialRollout
from tasks.rollout.types import PromptItem, State
from tests.paced import PacedEngine

CALL = '<tool_call>{"name": "code_interpreter", "arguments": {"code": "print(2 + 2)"}}</tool_call>'
SCRIPTS = {
    "p0": [["yes"], ["no"]],                               # short, informative
    "p1": [["no"], ["no"]],                                # short, all equal: filtered
    "p2": [["yes " * 6], ["no " * 6]],                     # medium, informative: the second pass
    "p3": [["yes " * 30], ["no " * 30]],                   # long: aborted at step 0, finished at step 1
    "p4": [["no"], ["no"]],                                # step 1: filtered
    "p5": [[CALL, "yes " * 40], ["no " * 40]],             # step 1: long, a tool call first: aborted
    "p6": [["no"], ["no"]],                                # step 1: filtered
    "p7": [["yes " * 3], ["no"]],                          # step 1, second submission: passes
}
# Turn lengths in tokens with the committed tokenizer (text + end-of-turn id), pinned so that the timeline
# below is computed by hand: p0 3/3, p1 3/3, p2 14/9, p3 62/33, p4 3/3, p5 26+82/43, p6 3/3, p7 8/3.
# (Re-pinned for the bound-input tiny-warm, whose tokenizer differs from the previous warm-up's.)
LENGTHS = {"p0": [[3], [3]], "p1": [[3], [3]], "p2": [[14], [9]], "p3": [[62], [33]], "p4": [[3], [3]],
           "p5": [[26, 82], [43]], "p6": [[3], [3]], "p7": [[8], [3]]}


class Box:
    """A sandbox double: every call prints 4."""

    def run(self, code, setup=None):
        return ExecutionResult(True, 0, "4\n", "", None, False, False, 0.001)


def items():
    return {p: PromptItem(p, [{"role": "user", "content": f"question {p}"}], "math", "4") for p in SCRIPTS}


def in_order(pool):
    """Fresh prompts in a fixed order (the cursor's seeded order is tested on its own)."""
    order = list(pool)

    def take(n, exclude):
        out = [p for p in order if p not in exclude][:n]
        for p in out:
            order.remove(p)
        return [pool[p] for p in out]
    return take


@pytest.fixture
def setup(chat):
    engine = PacedEngine(chat, SCRIPTS)
    cfg = RolloutConfig(n_samples=2, max_turns=3, max_new_tokens=96, max_response_tokens=400)
    runner = Rollout(cfg, engine, chat, Box())
    grade = lambda t: 1.0 if "yes" in chat.decode(t.response_ids) else 0.0
    return engine, runner, grade


def run(runner, grade, buffered, fresh, step, over=4, rule="in_flight"):
    """One step, target 2; the timelines below were first pinned with the ``in_flight`` rule (APRIL's: its own test)."""
    cfg = PartialConfig(enabled=True, over_sampling=over, submit_rule=rule)
    return PartialRollout(runner, cfg, 2, grade).run(buffered, fresh, 0, step)


def test_stop_rule_abort_and_fifo_drain_with_carried_turns(setup, chat):
    engine, runner, grade = setup
    pool = items()
    fresh = in_order(pool)
    r0 = run(runner, grade, [], fresh, step=0)
    assert [g.key for g in r0.batch] == ["p0", "p2", "p1"] and [g.verdict for g in r0.batch] == [True, True, False]
    assert [g.key for g in r0.buffer] == ["p3"]
    cut = max(len(engine.turn_ids(("p2", k), 0)) for k in (0, 1))  # the stop came when p2's longer sample ended
    p3 = r0.buffer[0].trajs
    assert [t.state for t in p3] == [State.GENERATING] * 2 and [t.response_ids for t in p3] == [[], []]
    assert [len(t.carry.ids) for t in p3] == [cut, cut] and all(t.carry.versions == [0] * cut for t in p3)
    assert r0.counts["aborted_tokens"] == 2 * cut

    # step 1 drains p3 first, then p4, p5, p6; p3 and p7 (a second submission) pass; p5 is cut again
    r1 = run(runner, grade, r0.buffer, fresh, step=1)
    assert [g.key for g in r1.batch] == ["p3", "p7", "p4", "p6"] and r1.batch[0].resumed
    assert r1.counts["submissions"] == 2 and r1.counts["resumed_groups"] == 1
    assert [g.key for g in r1.buffer] == ["p5"]
    for k, t in enumerate(r1.batch[0].trajs):
        full = engine.turn_ids(("p3", k), 0)
        assert t.response_ids == full and t.state is State.TERMINATED
        assert t.versions == [0] * cut + [1] * (len(full) - cut)
        assert t.logprobs == pytest.approx([-0.001 * (i + 1) for i in range(len(full))])
        req = engine.requests[("p3", k)][-1]  # the continuation: the carried ids sent, the budget reduced
        assert req.input_ids[-cut:] == full[:cut] and req.max_new_tokens == 96 - cut
    p5 = r1.buffer[0].trajs
    assert p5[0].assistant_turns == 1 and p5[0].executions[0].result.stdout == "4\n"  # its call ran before the stop
    assert p5[0].state is State.GENERATING and p5[1].state is State.TERMINATED  # a group is carried whole
    # its second turn was cut (or, had the call's result come in after the stop, not started yet)
    assert p5[0].carry is None or set(p5[0].carry.versions) == {1}


def test_stop_counts(setup):
    engine, runner, grade = setup
    r0 = run(runner, grade, [], in_order(items()), step=0)
    cut = max(len(engine.turn_ids(("p2", k), 0)) for k in (0, 1))
    assert r0.counts == {"submissions": 1, "submitted_groups": 4, "resumed_groups": 0, "passed_groups": 2,
                         "filtered_groups": 1, "aborted_requests": 2, "aborted_tokens": 2 * cut}


def test_nothing_passes_the_step_ends_when_submissions_run_out(setup):
    _, runner, grade = setup
    pool = {p: i for p, i in items().items() if p in ("p1", "p4", "p6")}  # all filtered
    r = PartialRollout(runner, PartialConfig(enabled=True, over_sampling=2, max_submissions=2), 2, grade).run(
        [], in_order(pool), 0, 0)
    assert r.counts["passed_groups"] == 0 and r.counts["filtered_groups"] == 3 and r.buffer == []
    assert r.counts["submissions"] == 2


def test_buffer_round_trip_through_parquet_and_duckdb(setup, tmp_path):
    from tasks.stores import db

    _, runner, grade = setup
    pool = items()
    fresh = in_order(pool)
    r0 = run(runner, grade, [], fresh, step=0)
    r1 = run(runner, grade, r0.buffer, fresh, step=1)
    groups = r1.buffer + [r1.batch[0]]  # a carried group (tool call, carry) and a finished one
    frame = buffer_frame(groups, "run", 1)
    write_buffer(tmp_path, frame, cursor=7)
    back, dropped, cursor = read_buffer(tmp_path, pool, version=2)
    assert (dropped, cursor) == (0, 7)
    assert [g.key for g in back] == ["p5", "p3"]
    for a, b in zip(groups, back):
        assert a.trajs == b.trajs
    db.replace_step(tmp_path / "c.duckdb", "run", 1, {"partial_buffer": frame})
    con = db.connect(tmp_path / "c.duckdb")
    rows = con.execute("SELECT position, prompt_id, sample_idx, state, len(carry_ids), max_version FROM partial_buffer "
                       "ORDER BY position, sample_idx").fetchall()
    assert rows == [(r["position"], r["prompt_id"], r["sample_idx"], r["state"], len(r["carry_ids"]), r["max_version"])
                    for r in frame.sort("position", "sample_idx").iter_rows(named=True)]
    assert json.loads(con.execute("SELECT record FROM partial_buffer WHERE traj_id = '1:p5:0'").fetchone()[0])[
        "executions"][0]["result"]["stdout"] == "4\n"
    con.close()


def test_a_buffer_from_a_newer_policy_is_an_error_naming_the_column(setup, tmp_path):
    _, runner, grade = setup
    r0 = run(runner, grade, [], in_order(items()), step=0)
    write_buffer(tmp_path, buffer_frame(r0.buffer, "run", 0), cursor=4)
    with pytest.raises(ValueError, match=r"column max_version = 0 for 0:p3:0 is newer than the current policy version -1"):
        read_buffer(tmp_path, items(), version=-1)


def test_a_carried_prompt_that_left_the_dataset_is_dropped_and_counted(setup, tmp_path):
    _, runner, grade = setup
    r0 = run(runner, grade, [], in_order(items()), step=0)
    write_buffer(tmp_path, buffer_frame(r0.buffer, "run", 0), cursor=4)
    pool = {p: i for p, i in items().items() if p != "p3"}
    assert read_buffer(tmp_path, pool, version=1)[:2] == ([], 1)


def test_the_previous_step_must_have_left_its_buffer(tmp_path):
    with pytest.raises(FileNotFoundError, match="partial_buffer.parquet: missing"):
        read_buffer(tmp_path, items(), version=1)
    assert read_buffer(None, items(), version=0) == ([], 0, 0)


def test_prompt_cursor_walks_the_seeded_epochs_and_skips_prompts_in_flight():
    pool = tuple(items().values())
    a = PromptCursor(pool, seed=3)
    first = [i.prompt_id for i in a.take(3, set())]
    b = PromptCursor(pool, seed=3)
    skip = {first[1]}
    got = [i.prompt_id for i in b.take(3, skip)]
    assert got[:2] == [first[0], first[2]] and first[1] not in got
    assert b.position == 4
    later = PromptCursor(pool, seed=3, position=b.position)
    rest = [i.prompt_id for i in later.take(4, set())]
    assert set(rest).isdisjoint(got) and len(set(first + rest)) == 7  # an epoch is a permutation
    assert len(PromptCursor(pool, seed=3).take(20, set())) == len(pool)  # at most one epoch ahead


def test_over_sampling_below_the_batch_size_names_the_field():
    from flows.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"rollout.partial.over_sampling=4 is below the rollout batch size "
                                          r"data.prompts_per_step=8"):
        load_config("configs/tiny.yaml", ["rollout.partial.enabled=true", "rollout.partial.over_sampling=4"])
    with pytest.raises(ConfigError, match="partial rollouts need rollout.mode=standard"):
        load_config("configs/tiny.yaml", ["rollout.partial.enabled=true", "rollout.mode=r3l"])


def test_partial_metrics_count_off_policy_tokens_by_version_lag(setup):
    from tasks.training.partial_stage import partial_metrics

    _, runner, grade = setup
    fresh = in_order(items())
    r0 = run(runner, grade, [], fresh, step=0)
    cut = len(r0.buffer[0].trajs[0].carry.ids)
    r1 = run(runner, grade, r0.buffer, fresh, step=1)
    trajs = [t for g in r1.batch for t in g.trajs]
    m = partial_metrics(r1, trajs, 1, dropped=0)
    total = sum(len(t.response_ids) for t in trajs)  # no tool turns in this batch: every token is a policy token
    assert m["partial/off_policy_tokens"] == 2 * cut and m["partial/version_lag/1"] == 2 * cut
    assert m["partial/version_lag/0"] == total - 2 * cut
    assert m["partial/off_policy_ratio"] == pytest.approx(2 * cut / total)
    assert m["partial/version_lag_max"] == 1 and m["partial/buffer_groups"] == 1 and m["partial/resumed_groups"] == 1


def test_the_scripts_have_the_pinned_lengths(setup):
    engine, _, _ = setup
    got = {p: [[len(engine.turn_ids((p, k), j)) for j in range(len(turns))] for k, turns in enumerate(s)]
           for p, s in SCRIPTS.items()}
    assert got == LENGTHS


def test_hand_computed_timeline_of_two_steps(setup):
    """The ``in_flight`` rule. One token per row per decoding step; over-sampling 4 groups, target 2 passed
    groups, 2 samples each.

    Step 0 submits p0-p3 (8 rows). t=3: p0 ends (passes) and p1 ends (rewards equal: filtered); p2 and p3
    are in flight = the target, so nothing more is submitted; t=14: p2 passes = the target: p3's 2 rows are
    aborted after 14 tokens each (2 aborted requests, 28 tokens, all of policy version 0).
    Step 1 drains p3 first (each row continues after its 14 carried ids, 96 - 14 = 82 tokens left), then fresh
    p4, p5, p6. t=3: p4, p6 filtered (in flight: p3, p5 = the target); t=48: p3 passes (62 - 14 tokens more);
    1 group in flight < 2: a second submission takes the only fresh prompt left, p7; t=48+8=56: p7 passes,
    stop. p5's second sample ended at t=43; its first is in its second turn (after a tool call): 1 aborted.
    Step 1's batch: p3 (62+33), p7 (8+3), p4 (3+3), p6 (3+3) = 118 policy tokens, 28 of them sampled at
    version 0: off-policy 28, ratio 28/118 — APRIL's off / (tokens generated this step 90 + off 28)."""
    from tasks.training.partial_stage import partial_metrics

    engine, runner, grade = setup
    fresh = in_order(items())
    r0 = run(runner, grade, [], fresh, step=0)
    assert r0.counts == {"submissions": 1, "submitted_groups": 4, "resumed_groups": 0, "passed_groups": 2,
                         "filtered_groups": 1, "aborted_requests": 2, "aborted_tokens": 28}
    p3 = r0.buffer[0].trajs
    assert [t.carry.ids for t in p3] == [engine.turn_ids(("p3", k), 0)[:14] for k in (0, 1)]
    assert [t.carry.versions for t in p3] == [[0] * 14] * 2
    assert [t.carry.logprobs for t in p3] == [pytest.approx([-0.001 * i for i in range(1, 15)])] * 2

    r1 = run(runner, grade, r0.buffer, fresh, step=1)
    c = r1.counts
    assert {k: c[k] for k in ("submissions", "submitted_groups", "resumed_groups", "passed_groups",
                              "filtered_groups", "aborted_requests")} == {
        "submissions": 2, "submitted_groups": 5, "resumed_groups": 1, "passed_groups": 2, "filtered_groups": 2,
        "aborted_requests": 1}
    assert [g.key for g in r1.batch] == ["p3", "p7", "p4", "p6"]
    assert [engine.requests[("p3", k)][-1].max_new_tokens for k in (0, 1)] == [82, 82]
    assert [t.versions for t in r1.batch[0].trajs] == [[0] * 14 + [1] * 48, [0] * 14 + [1] * 19]
    p5 = r1.buffer[0].trajs[0]
    assert 27 <= c["aborted_tokens"] == len(p5.carry.ids) <= 30  # t=56 minus the start of its second turn (26-29)
    m = partial_metrics(r1, [t for g in r1.batch for t in g.trajs], 1, dropped=0)
    assert (m["partial/off_policy_tokens"], m["partial/version_lag/0"], m["partial/version_lag/1"]) == (28, 90, 28)
    assert m["partial/off_policy_ratio"] == pytest.approx(28 / 118)
    assert m["partial/version_lag_mean"] == pytest.approx(28 / 118) and m["partial/buffer_groups"] == 1


def test_april_is_the_default_submit_rule_and_unknown_rules_list_the_valid_ones(setup):
    _, runner, grade = setup
    assert PartialConfig().submit_rule == "april"
    cfg = PartialConfig.model_construct(enabled=True, over_sampling=4, submit_rule="greedy", max_submissions=4)
    with pytest.raises(ValueError, match="rollout.partial.submit_rule: unknown rule 'greedy'; valid: april, in_flight"):
        PartialRollout(runner, cfg, 2, grade)


def test_hand_computed_timeline_of_two_steps_under_aprils_rule(setup):
    """APRIL's rule (slime ``generate_rollout_async``: submit while ``remaining_batch_size`` = submitted minus
    filtered < target) on the same scripts. Step 0 is as under ``in_flight``: t=3 p0 passes, p1 is filtered:
    2 in flight + 1 passed = 3 >= 2, no submission; t=14 p2 passes, p3 is cut after 14 tokens per row.
    Step 1 drains p3, then p4, p5, p6. t=3: p4, p6 filtered → 2 in flight (p3, p5) + 0 passed = 2: no
    submission. t=48: p3 passes → 1 in flight + 1 passed = 2: still none (``in_flight`` submitted p7 here).
    p5's second sample ends at t=43, its first runs a tool call after 26 tokens and then 82 more: p5 passes
    last, with nothing left to abort. Batch p3 (62+33), p5 (26+82+43), p4 (3+3), p6 (3+3) = 258 policy
    tokens, 28 sampled at version 0; nothing carried, p7 never drawn."""
    from tasks.training.partial_stage import partial_metrics

    engine, runner, grade = setup
    fresh = in_order(items())
    r0 = run(runner, grade, [], fresh, step=0, rule="april")
    assert [g.key for g in r0.batch] == ["p0", "p2", "p1"] and [g.key for g in r0.buffer] == ["p3"]
    assert r0.counts == {"submissions": 1, "submitted_groups": 4, "resumed_groups": 0, "passed_groups": 2,
                         "filtered_groups": 1, "aborted_requests": 2, "aborted_tokens": 28}
    r1 = run(runner, grade, r0.buffer, fresh, step=1, rule="april")
    assert [g.key for g in r1.batch] == ["p3", "p5", "p4", "p6"] and r1.buffer == []
    assert r1.counts == {"submissions": 1, "submitted_groups": 4, "resumed_groups": 1, "passed_groups": 2,
                         "filtered_groups": 2, "aborted_requests": 0, "aborted_tokens": 0}
    assert [len(t.executions) for t in r1.batch[1].trajs] == [1, 0]
    assert [t.versions for t in r1.batch[0].trajs] == [[0] * 14 + [1] * 48, [0] * 14 + [1] * 19]
    assert fresh(8, set()) == [items()["p7"]]  # never submitted: still the cursor's
    m = partial_metrics(r1, [t for g in r1.batch for t in g.trajs], 1, dropped=0)
    assert (m["partial/off_policy_tokens"], m["partial/version_lag/0"], m["partial/version_lag/1"]) == (28, 230, 28)
    assert m["partial/off_policy_ratio"] == pytest.approx(28 / 258) and m["partial/buffer_groups"] == 0


def test_bench_counts_the_same_kind_of_tokens_on_both_sides():
    """``bench-partial`` credits each side with the groups that pass the filter and their policy tokens only: the
    on side's batch also holds filtered groups (p1 here), the off side's was trimmed — neither is counted."""
    import polars as pl

    from tasks.rewards.config import RewardConfig
    from tasks.training.bench_partial import passing

    rows = [("p0", "\\boxed{4}", [1, 1, 1, 0, 1]), ("p0", "\\boxed{5}", [1, 1]),       # passes: 4 + 2 tokens
            ("p1", "\\boxed{5}", [1, 1, 1]), ("p1", "\\boxed{5}", [1, 1, 1, 1]),       # all wrong: filtered
            ("p2", "\\boxed{4}", [1] * 6), ("p2", "no answer", [1, 0, 0, 1])]          # passes: 6 + 2 tokens
    trajs = pl.DataFrame({
        "run_id": "bench", "step": 0, "traj_id": [f"0:{p}:{i % 2}" for i, (p, _, _) in enumerate(rows)],
        "prompt_id": [p for p, _, _ in rows], "group_id": [p for p, _, _ in rows], "data_source": "synthetic/arith",
        "ground_truth": "4", "response_text": [t for _, t, _ in rows], "response_mask": [m for _, _, m in rows],
        "response_ids": [[7] * len(m) for _, _, m in rows], "fixed_reward": [None] * 6, "kind": "rollout",
        "raw": False, "num_turns": 1}, schema_overrides={"fixed_reward": pl.Float64})
    assert passing(trajs, RewardConfig()) == (2, 14)
