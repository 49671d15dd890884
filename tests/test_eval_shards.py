"""The last evaluation rolled out in parts (``tasks.training.eval_shards``), on the committed tiny policy.

Its figures must be the whole evaluation's exactly, its trajectories token for token (log-probs within another
decoding batch's float noise), the fresh split's too; the parts are contiguous, in order, and a failed part fails
the evaluation. The train flow's use of it (the last evaluation of a ``staleness: 1`` run beside training on two
lanes, its rows those of the run evaluating in line) is checked in tests/test_staleness.py.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch

from flows.config import load_config
from tasks.data.synthetic import write_task_parquet
from tasks.training import eval_shards
from tasks.training.stages import eval_stage

MODEL = "assets/tiny-warm"
WAIT_S = 10.0
LP_NOISE = 2e-5
"""As tests/test_paired_eval.py: log-probs of one turn decoded in batches of another make-up."""


@pytest.mark.parametrize("n, of, sizes", [(5, 2, [3, 2]), (6, 3, [2, 2, 2]), (7, 3, [3, 2, 2]), (1, 2, [1, 0])])
def test_parts_are_contiguous_cover_every_prompt_once_and_in_order(n, of, sizes):
    items = list(range(n))
    parts = [eval_shards.part(items, i, of) for i in range(of)]
    assert [len(p) for p in parts] == sizes
    assert [x for p in parts for x in p] == items


def test_a_part_that_does_not_exist_is_refused_naming_the_valid_ones():
    with pytest.raises(ValueError, match=r"part 2 of 2 does not exist \(parts 0\.\.1\)"):
        eval_shards.part([1, 2, 3], 2, 2)


def test_join_keeps_the_parts_order_split_by_split_and_mode_by_mode():
    a = {"eval": {"saar_off": ["a0", "a1"], "saar_on": ["A0", "A1"]}, "fresh": {"saar_off": ["f0"], "saar_on": ["F0"]}}
    b = {"eval": {"saar_off": ["b0"], "saar_on": ["B0"]}, "fresh": {"saar_off": ["f1"], "saar_on": ["F1"]}}
    assert eval_shards.join([a, b]) == {"eval": {"saar_off": ["a0", "a1", "b0"], "saar_on": ["A0", "A1", "B0"]},
                                        "fresh": {"saar_off": ["f0", "f1"], "saar_on": ["F0", "F1"]}}


def test_a_failed_part_fails_the_evaluation_after_the_parts_in_flight_end_and_no_part_starts_after_it():
    """Three lanes, six parts: parts 0 and 1 are in flight when part 2 fails; they end, nothing else starts."""
    started, ended, in_flight = [], [], threading.Barrier(3, timeout=WAIT_S)

    def call(module, function, *args):
        if function == "free":
            return None
        j = args[2]
        started.append(j)
        in_flight.wait()  # the first three parts (one a lane) are all taken before any ends
        if j == 2:
            raise RuntimeError("lane eval died")
        time.sleep(0.1)
        ended.append(j)
        return {"eval": {"saar_off": [j]}}

    with pytest.raises(RuntimeError, match="lane eval died"):
        eval_shards.roll_across([call, call, call], "ckpt", None, parts=6)
    assert sorted(started) == [0, 1, 2] and sorted(ended) == [0, 1]


def test_a_lane_busy_with_the_evaluation_before_takes_parts_only_once_free_and_the_join_keeps_the_order():
    """Lane A is busy (its ``free`` returns only once lane B took three of four parts; B's third ends only once A
    took one): B takes parts 0, 1, 2 as it comes free, A the last; the parts are joined in the prompts' order, not
    the order they ended."""
    b_done_three, a_took, took = threading.Event(), threading.Event(), {"A": [], "B": []}

    def lane(name):
        def call(module, function, *args):
            assert module == eval_shards.MODULE
            if function == "free":
                if name == "A":
                    assert b_done_three.wait(WAIT_S)
                return None
            ckpt, setup, j, of = args
            assert (ckpt, of) == ("ckpt", 4)
            took[name].append(j)
            if name == "A":
                a_took.set()
            elif len(took["B"]) == 3:
                b_done_three.set()
                assert a_took.wait(WAIT_S)
            return {"eval": {"saar_off": [f"t{j}"]}}
        return call

    rolled = eval_shards.roll_across([lane("A"), lane("B")], "ckpt", None)  # 2 lanes x PARTS_PER_LANE = 4 parts
    assert took == {"A": [3], "B": [0, 1, 2]}
    assert rolled == {"eval": {"saar_off": ["t0", "t1", "t2", "t3"]}}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """The tiny run's final evaluation setup: 9 held-out prompts × 4 samples and a 5-prompt fresh split."""
    torch.set_num_threads(1)
    folder = tmp_path_factory.mktemp("shards")
    held, fresh = (write_task_parquet(folder / f"{name}.parquet", k, seed, "eval") for name, k, seed in
                   (("held", 9, 0), ("fresh", 5, 7)))
    cfg = load_config("configs/tiny.yaml", ["sandbox.backend=local", f"tracking.duckdb_path={folder / 'rows.duckdb'}"])
    s = cfg.setups().eval
    return s.model_copy(update={"eval_path": str(held), "fresh_path": str(fresh),
                                "eval": s.eval.model_copy(update={"n_prompts": 9, "samples": 4})})


@pytest.fixture(scope="module")
def both(setup):
    """(whole, in three parts pulled by two lanes): each the metrics of ``eval_stage`` and the joined trajectories of
    the parts."""
    whole = eval_stage("whole", 1, MODEL, None, setup)
    calls = [lambda module, function, *args: getattr(eval_shards, function)(*args)] * 2
    rolled = eval_shards.roll_across(calls, MODEL, setup, parts=3)  # 9 and 5 prompts: parts of 3, 3, 3 and 2, 2, 1
    parted = eval_stage("parted", 1, MODEL, None, setup, rolled=rolled, parts=3)
    return whole, parted, rolled


def test_an_evaluation_rolled_in_parts_gives_every_figure_of_the_whole(both):
    whole, parted, _ = both
    assert parted.pop("time/eval_rollout_parts") == 3.0 and whole.pop("time/eval_rollout_parts") == 1.0
    strip = lambda m: {k: v for k, v in m.items() if k != "time/eval_s"}  # noqa: E731
    assert strip(parted) == strip(whole)  # every figure, exactly, the fresh split's too
    assert any(k.startswith("eval_fresh/saar_off/") for k in whole) and whole["eval/saar_off/eval/graded"] == 36


def test_the_parts_roll_the_whole_evaluations_tokens(both, setup):
    _, _, rolled = both
    from tasks.data.loader import load_prompts
    from tasks.training.evaluation import fresh_split, roll_modes

    whole = {"eval": roll_modes(MODEL, list(load_prompts(setup.eval_path))[:9], setup),
             "fresh": roll_modes(MODEL, *fresh_split(setup))}
    for split in ("eval", "fresh"):
        for mode in ("saar_off", "saar_on"):
            a, b = whole[split][mode], rolled[split][mode]
            assert [t.traj_id for t in a] == [t.traj_id for t in b], (split, mode)
            assert [t.response_ids for t in a] == [t.response_ids for t in b], (split, mode)
            worst = max((abs(x - y) for ta, tb in zip(a, b) for x, y in zip(ta.logprobs, tb.logprobs)),
                        default=0.0)
            assert worst <= LP_NOISE, (split, mode)
