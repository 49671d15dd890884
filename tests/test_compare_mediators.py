"""What a failed call costs, measured at evaluation and reported per arm (``tasks.training.eval_measures``,
``tasks.reports.mediators``), and the training counters the report sums, by hand.

Run: ``pytest tests/test_compare_mediators.py``.
"""

from __future__ import annotations

import math

import polars as pl
import pytest

from tasks.reports import mediators
from tasks.reports.compare import markdown, summarize
from tasks.rewards.scoring import _count_hacks
from tasks.training.eval_measures import cluster_ratio, measures, per_trajectory, prompt_shares

# t1 clean and right; t2 first call failed, cut at the cap; t3 (SAAR on) first attempt failed, its regeneration ran,
# wrong; t4 no call; t5 ungraded (a grader error) after a clean call, cut at the cap; t6 cut by length, no call
TRAJS = pl.DataFrame({"traj_id": ["t1", "t2", "t3", "t4", "t5", "t6"], "prompt_id": ["p1", "p1", "p2", "p2", "p2", "p1"],
                      "finish_reason": ["stop", "turn_cap", "stop", "stop", "turn_cap", "length"],
                      "graded": [True, True, True, True, False, True],
                      "correct": [True, False, False, False, None, False]})
EXECS = pl.DataFrame({"traj_id": ["t1", "t1", "t2", "t2", "t3", "t3", "t3", "t5"],
                      "exec_idx": [0, 1, 0, 1, 0, 1, 2, 0], "position": [0, 1, 0, 1, 0, 0, 1, 0],
                      "ok": [True, True, False, True, False, True, True, True]})


def test_eval_measures_by_hand():
    """First-call success: t1, t5 of the 4 that call = 0.5 (t3's first attempt failed; its regeneration does not
    count); cut at the cap: t2, t5 of all 6 (t6 was cut by length); every call clean: t1 and t3 (the last execution at each position
    ran; t5 is ungraded), of which t1 is right: 0.5 over 2."""
    m = measures(TRAJS, EXECS)
    assert m == {"tools/first_call_success_rate": 0.5, "rollout/turn_cap_share": 2 / 6,
                 "tools/p_correct_all_clean": 0.5, "tools/all_clean_trajectories": 2.0}


def test_eval_measures_of_nothing_are_zero():
    m = measures(TRAJS.filter(pl.col("traj_id") == "t4"), EXECS.clear())
    assert m == {"tools/first_call_success_rate": 0.0, "rollout/turn_cap_share": 0.0,
                 "tools/p_correct_all_clean": 0.0, "tools/all_clean_trajectories": 0.0}


def test_cluster_ratio_by_hand():
    """Prompts with 1, 2, 0 hits of 2 each (and one with none of 0, left out): r = 3/6 = 0.5; residuals 0, 1, −1;
    s.e. √(3/2 · 2) / 6 = 0.2886751; t(2) = 4.303."""
    d = cluster_ratio([1, 2, 0, 5], [2, 2, 2, 0])
    assert d["share"] == 0.5 and d["prompts"] == 3 and d["n"] == 6
    assert d["se"] == pytest.approx(math.sqrt(3) / 6)
    assert d["ci95"] == pytest.approx([0.5 - 4.303 * math.sqrt(3) / 6, 0.5 + 4.303 * math.sqrt(3) / 6])
    assert cluster_ratio([1], [2])["se"] is None and cluster_ratio([], [])["share"] is None


def test_prompt_shares_pool_each_prompt():
    """p1: 1 right of 3, p2: 0 of 3 → pass@1 1/6; P(correct | all clean): p1 1 of 1 (t1), p2 0 of 1 (t3) → 0.5."""
    s = prompt_shares(per_trajectory(TRAJS, EXECS))
    assert s["pass@1"]["share"] == pytest.approx(1 / 6) and s["pass@1"]["prompts"] == 2
    assert s["p_correct_all_clean"]["share"] == 0.5 and s["p_correct_all_clean"]["n"] == 2
    assert s["first_call_success"]["share"] == 0.5 and s["turn_cap_share"]["share"] == pytest.approx(1 / 3)


RUNS = {arm: [f"c-{arm}-s{s}" for s in (1, 2)] for arm in ("a1", "b1", "b3", "a3")}
FCS = "eval_fresh/saar_off/tools/first_call_success_rate"
CAP = "eval/saar_off/rollout/turn_cap_share"
ACC_F = "eval_fresh/saar_off/all/pass_at_1"


def _evals() -> pl.DataFrame:
    first = {"a1": (0.80, 0.70), "b1": (0.60, 0.65), "b3": (0.50, 0.40), "a3": (0.90, 0.70)}
    cap = {"a1": (0.30, 0.50), "b1": (0.10, 0.20), "b3": (0.05, 0.05), "a3": (0.20, 0.20)}
    rows = []
    for arm, ids in RUNS.items():
        for i, r in enumerate(ids):
            rows += [{"run_id": r, "policy_version": 20, "key": FCS, "value": 0.0},  # not the final: never read
                     {"run_id": r, "policy_version": 24, "key": FCS, "value": first[arm][i]},
                     {"run_id": r, "policy_version": 24, "key": CAP, "value": cap[arm][i]},
                     {"run_id": r, "policy_version": 24, "key": "eval/saar_off/all/pass_at_1", "value": 0.3},
                     {"run_id": r, "policy_version": 24, "key": ACC_F, "value": 0.3}]
    return pl.DataFrame(rows)


def test_mediators_per_seed_and_paired_against_each_arms_baseline():
    """b3 is paired with a3 (``pair_with``), the others with a1: first-call success (fresh) b3 − a3 = −0.40, −0.30
    (mean −0.35, s.e. 0.05, t(1) 12.706: not different); b1 − a1 turn-cap share (usual) −0.20, −0.30: mean −0.25."""
    ev = mediators.evaluation(_evals(), RUNS, "a1", {"b3": "a3"})
    assert ev["per_seed"]["b1"] == [{"seed": 1, "fresh": {"first_call_success": 0.60},
                                     "usual": {"turn_cap_share": 0.10}},
                                    {"seed": 2, "fresh": {"first_call_success": 0.65},
                                     "usual": {"turn_cap_share": 0.20}}]
    assert ev["arms"]["a1"]["usual"]["turn_cap_share"] == pytest.approx(0.40)
    assert "a1" not in ev["paired"] and ev["paired"]["b3"]["against"] == "a3" and ev["paired"]["a3"]["against"] == "a1"
    d = ev["paired"]["b3"]["fresh"]["first_call_success"]
    assert d["values"] == pytest.approx([-0.40, -0.30]) and d["se"] == pytest.approx(0.05)
    assert d["ci95"] == pytest.approx([-0.35 - 12.706 * 0.05, -0.35 + 12.706 * 0.05]) and d["reading"] == "not different"
    assert ev["paired"]["b1"]["usual"]["turn_cap_share"]["mean"] == pytest.approx(-0.25)
    assert mediators.evaluation(_evals().filter(pl.col("key") == ACC_F), RUNS, "a1", {}) == {}


def _totals() -> pl.DataFrame:
    rows = [("c-b1-s1", "score/suspected_hacks/answer_not_from_a_call", 3.0, 24),
            ("c-b1-s2", "score/suspected_hacks/answer_not_from_a_call", 1.0, 24),
            ("c-b1-s1", "score/right_by_chance", 2.0, 24), ("c-b1-s2", "score/right_by_chance", 0.0, 24),
            ("c-b1-s1", "rollback/planb_append_count", 4.0, 24), ("c-b1-s2", "rollback/planb_append_count", 6.0, 16),
            ("c-b1-s1", "rollback/planb_replace_count", 1.0, 24), ("c-b1-s2", "rollback/planb_replace_count", 29.0, 16),
            ("c-b1-s1", "rollback/is_log_ratio_p50", 1.2, 24), ("c-b1-s2", "rollback/is_log_ratio_p50", -0.4, 16),
            ("c-a1-s1", "score/right_by_chance", 5.0, 24)]
    return pl.DataFrame(rows, schema=["run_id", "key", "total", "steps"], orient="row")


def test_training_counters_summed_and_pooled_over_seeds():
    """b1: hacks 3 + 1 = 4, right by chance 2 + 0; plan-B appends 4 + 6 = 10 of 10 + 30 decisions = 0.25; median
    log-ratio over 24 + 16 steps (1.2 − 0.4) / 40 = 0.02. a1 logged no plan-B counters: none reported."""
    tr = mediators.training(_totals(), RUNS)
    b1 = tr["b1"]
    assert b1["counts"]["score/suspected_hacks/answer_not_from_a_call"] == {"total": 4.0, "per_seed": {1: 3.0, 2: 1.0}}
    assert b1["counts"]["score/right_by_chance"]["total"] == 2.0
    assert b1["counts"]["rollback/planb_append_count"]["total"] == 10.0
    assert b1["planb_append_share"] == pytest.approx(0.25)
    assert b1["rollback/is_log_ratio_p50"] == pytest.approx(0.02)
    assert tr["a1"] == {"counts": {"score/right_by_chance": {"total": 5.0, "per_seed": {1: 5.0}}}}
    assert set(tr) == {"a1", "b1"} and mediators.training(None, RUNS) == {}


def test_the_report_carries_the_mediators_in_markdown():
    evals = _evals()
    s = summarize(evals, RUNS, "a1", "b1")
    s["mediators"] = mediators.summarize(evals, RUNS, "a1", {"b3": "a3"}, _totals())
    md = markdown(s)
    assert "| b3 − a3 | fresh | first_call_success | -0.350 ± 0.050 [-0.985, +0.285]: not different |" in md
    assert "| b1 | 4 | 2 | 10 | 30 | 0.250 | 0.020 |" in md  # hacks, by chance, plan-B appends / replaces, share, p50
    assert "| a1 | - | 5 | - | - | - | - |" in md
    assert mediators.summarize(evals.clear(), RUNS, "a1", {}, None) == {}


def test_score_counts_right_by_chance_beside_the_hacks():
    """Three responses: right by chance, one suspected hack, one with no chain metrics: 1 each, total 1."""
    counts: dict = {}
    for m in ({"right_by_chance": 1.0, "suspected_hacks/a": 0.0, "suspected_hacks/b": 0.0},
              {"right_by_chance": 0.0, "suspected_hacks/a": 1.0, "suspected_hacks/b": 0.0}, {"acc": 1.0}):
        _count_hacks(m, counts)
    assert counts == {"right_by_chance": 1, "suspected_hacks/a": 1, "suspected_hacks/b": 0, "suspected_hacks/total": 1}


def test_step_totals_takes_keys_and_prefixes(tmp_path):
    """``step_totals`` with prefixes: every key under ``score/suspected_hacks/`` and the named key, nothing else."""
    from tasks.stores import db

    path = tmp_path / "store.duckdb"
    for step in (0, 1):
        keys = ["score/suspected_hacks/total", "score/suspected_hacks/answer_not_from_a_call", "score/right_by_chance",
                "score/other", "x"]
        metrics = pl.DataFrame({"run_id": ["r1"] * 5, "step": [step] * 5, "key": keys,
                                "value": [1.0 + step, 2.0, 3.0, 4.0, 5.0]})
        db.replace_step(path, "r1", step, {"metrics": metrics})
    got = db.step_totals(path, ["r1"], [mediators.CHANCE], prefixes=[mediators.HACK_PREFIX]).sort("key")
    assert got.rows() == [("r1", "score/right_by_chance", 6.0, 2),
                          ("r1", "score/suspected_hacks/answer_not_from_a_call", 4.0, 2),
                          ("r1", "score/suspected_hacks/total", 3.0, 2)]
    assert db.step_totals(path, ["r1"], ["x"]).rows() == [("r1", "x", 10.0, 2)]


def test_the_report_task_reads_contrasts_and_mediators_from_the_store(tmp_path):
    """``flows.compare.report_task`` with the compare config: the evaluation rows and step metrics of a store become
    the ``contrasts`` and ``mediators`` sections (b − a on the fresh split 0.10, 0.20; right by chance 1 + 2)."""
    from flows.compare import report_task
    from flows.config import CompareConfig
    from tasks.stores import db

    path = str(tmp_path / "store.duckdb")
    runs = {arm: [f"c-{arm}-s{s}" for s in (1, 2)] for arm in ("a", "b")}
    finals = {"c-a-s1": 0.3, "c-a-s2": 0.2, "c-b-s1": 0.4, "c-b-s2": 0.4}
    for run, v in finals.items():
        db.replace_eval(path, run, 2, "ckpt", {ACC_F: v, "eval/saar_off/all/pass_at_1": v, "eval/saar_off/eval/graded": 8,
                                               "eval_fresh/saar_off/rollout/turn_cap_share": 1 - v})
        for step, n in ((0, 1.0), (1, 2.0)):
            db.replace_step(path, run, step, {"metrics": pl.DataFrame(
                {"run_id": [run], "step": [step], "key": ["score/right_by_chance"], "value": [n if "-b-" in run else 0.0]})})
    cmp = CompareConfig(arms={"a": [], "b": []}, baseline="a", treatment="b", contrasts={"d": {"b": 1, "a": -1}},
                        primary="d")
    s = report_task.fn(path, runs, "a", "b", str(tmp_path / "report"), None, None, None, cmp)
    d = s["contrasts"]["by_name"]["d"]
    assert d["outcome"]["fresh"]["values"] == pytest.approx([0.1, 0.2])
    assert d["mediators"]["fresh"]["turn_cap_share"]["values"] == pytest.approx([-0.1, -0.2])
    assert s["mediators"]["evaluation"]["paired"]["b"]["fresh"]["turn_cap_share"]["mean"] == pytest.approx(-0.15)
    assert s["mediators"]["training"]["b"]["counts"]["score/right_by_chance"] == {"total": 6.0, "per_seed": {1: 3.0, 2: 3.0}}
    assert "**Primary (registered): `d`** = b − a" in (tmp_path / "report" / "compare.md").read_text()


def test_the_budget_look_refuses_a_negative_extra_naming_the_field():
    """``python -m flows.budget_look --extra -1`` ran as "calls+0" before (a copy without validation)."""
    from pydantic import ValidationError

    from flows.budget_look import look

    with pytest.raises(ValidationError, match="extra_turns"):
        look("configs/regimes/multicall.yaml", ["sandbox.backend=local"], [-1], 2, 1)
