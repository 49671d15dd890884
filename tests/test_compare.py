"""Evaluation metrics on scripted trajectories, the compare report, DAPO refill bound, reproducibility."""

from __future__ import annotations

import json
import re

import duckdb
import polars as pl
import pytest
from mlflow.tracking import MlflowClient

from tasks.reports.compare import ACC, ACC_ON, GRADED, TOOL, markdown, summarize, write_report
from tasks.rollout.saar import TrajStats, aggregate_stats
from tasks.stores.tracking import RUN_TAG
from tasks.training.evaluation import summarize as eval_summary
from tasks.training.mixing import fill_batch
from tests.flowrun import run_log_lines, tiny_overrides


def test_eval_metrics_on_known_answers():
    # prompt a: 2 of 4 correct, one of its failures a grader error (still a failure: n stays 4); prompt b: 0 of 4
    rows = [("a", True), ("a", True), ("a", False), ("a", None), ("b", False), ("b", False), ("b", False), ("b", False)]
    trajs = pl.DataFrame({
        "prompt_id": [p for p, _ in rows], "data_source": ["synthetic/arith"] * 4 + ["synthetic/algo"] * 4,
        "correct": [c for _, c in rows], "graded": [c is not None for _, c in rows],
        "tool_calls": [1, 1, 2, 0, 1, 1, 1, 1], "num_turns": [2, 2, 3, 1, 2, 2, 2, 2],
        "response_ids": [[1] * 10] * 8,
    })
    stats = [TrajStats(first_attempt_total=1, first_attempt_success=int(i % 2 == 0)) for i in range(8)]
    m = eval_summary(trajs, aggregate_stats(stats, [False] * 8), [1, 2])
    assert m["all/pass_at_1"] == pytest.approx((0.5 + 0.0) / 2)
    assert m["all/pass_at_2"] == pytest.approx((1 - (2 * 1) / (4 * 3) + 0.0) / 2)
    assert m["by_source/synthetic/arith/pass_at_1"] == pytest.approx(0.5)
    assert m["tools/first_attempt_failure_rate"] == pytest.approx(0.5)
    assert m["rollout/tool_use_rate"] == pytest.approx(7 / 8) and m["eval/grader_errors"] == 1


def _evals(curves: dict[str, dict[int, list[float]]], key: str) -> list[dict]:
    return [{"run_id": f"{arm}-s{i}", "policy_version": v, "key": key, "value": x}
            for arm, c in curves.items() for v, xs in c.items() for i, x in enumerate(xs)]


def test_compare_report_steps_to_baseline_final(tmp_path):
    acc = {"dapo": {0: [0.2, 0.2, 0.2], 5: [0.3, 0.3, 0.3], 10: [0.4, 0.4, 0.4], 20: [0.5, 0.5, 0.5]},
           "cleaner": {0: [0.2, 0.2, 0.2], 5: [0.4, 0.5, 0.6], 10: [0.6, 0.6, 0.6], 20: [0.7, 0.7, 0.7]}}
    tool = {"dapo": {v: [0.6] * 3 for v in (0, 5, 10, 20)}, "cleaner": {v: [0.8] * 3 for v in (0, 5, 10, 20)}}
    evals = pl.DataFrame(_evals(acc, ACC) + _evals(tool, TOOL))
    runs = {arm: [f"{arm}-s{i}" for i in range(3)] for arm in acc}
    kinds = pl.DataFrame({"run_id": ["cleaner-s0", "cleaner-s1", "cleaner-s0", "dapo-s0"],
                          "kind": ["purified", "purified", "clean first try", "errors kept"],
                          "n": [10, 30, 50, 20], "reward": [1.0, 0.0, 0.5, 0.0], "advantage": [0.5, -0.5, 0.0, -1.0]})
    s = summarize(evals, runs, "dapo", "cleaner", kinds)
    purified = [r for r in s["trained_by_kind"]["cleaner"] if r["kind"] == "purified"][0]
    assert purified["n"] == 40 and purified["reward"] == pytest.approx(0.25) and purified["advantage"] == pytest.approx(-0.25)
    assert s["baseline_final_pass_at_1"] == pytest.approx(0.5)
    assert s["steps_to_baseline_final"] == {"dapo": 20, "cleaner": 5}
    assert s["claim_half_the_steps"] and s["claim_higher_first_attempt_success"]
    assert s["claim_third_of_the_steps"]  # 5 <= 20 / 3
    files = write_report(s, tmp_path)
    assert {f.name for f in files} == {"compare.json", "compare.md", "compare.png", "compare_seeds.png"}
    page = (tmp_path / "compare.md").read_text()
    assert "| cleaner | 3 | 5 |" in page and "| cleaner | +0.500 ± 0.000 [+0.500, +0.500] |" in page
    assert "| cleaner | purified | 40 | 0.250 | -0.250 |" in page
    assert "within two standard errors" not in page  # the baseline gained +0.3 on every seed
    json.loads((tmp_path / "compare.json").read_text())


def test_compare_report_says_no_when_treatment_never_gets_there():
    acc = {"dapo": {0: [0.2], 10: [0.5]}, "cleaner": {0: [0.2], 10: [0.4]}}
    evals = pl.DataFrame(_evals(acc, ACC) + _evals({"dapo": {10: [0.5]}, "cleaner": {10: [0.4]}}, TOOL))
    s = summarize(evals, {"dapo": ["dapo-s0"], "cleaner": ["cleaner-s0"]}, "dapo", "cleaner")
    assert s["steps_to_baseline_final"]["cleaner"] is None and s["claim_half_the_steps"] is False


def test_compare_report_does_not_pass_a_claim_it_cannot_test(tmp_path):
    # the baseline ends below where it started: step 0 already "reaches" its final value
    acc = {"dapo": {0: [0.5, 0.5], 10: [0.45, 0.47]}, "cleaner": {0: [0.5, 0.5], 10: [0.4, 0.42]}}
    evals = pl.DataFrame(_evals(acc, ACC) + _evals({"dapo": {10: [0.8] * 2}, "cleaner": {10: [0.7] * 2}}, TOOL))
    s = summarize(evals, {arm: [f"{arm}-s{i}" for i in range(2)] for arm in acc}, "dapo", "cleaner")
    assert s["steps_to_baseline_final"] == {"dapo": 0, "cleaner": 0}
    assert s["claim_half_the_steps"] is None and s["claim_higher_first_attempt_success"] is False
    assert s["gain_pass_at_1"]["dapo"]["mean"] == pytest.approx(-0.04)
    assert s["gain_pass_at_1"]["dapo"]["se"] == pytest.approx(0.01)  # deltas -0.05, -0.03
    write_report(s, tmp_path)
    page = (tmp_path / "compare.md").read_text()
    assert "not testable" in page and "| dapo | -0.040 ± 0.010 [-0.167, +0.087] |" in page
    assert "within two standard errors" not in page  # -0.04 is 4 se from zero


def test_paired_difference_by_hand(tmp_path):
    # finals per seed: dapo 0.40 0.45 0.50 0.47, cleaner 0.44 0.47 0.55 0.48 -> diffs .04 .02 .05 .01
    # mean .03, sd sqrt(.001/3) = .018257, se .0091287, t(3) = 3.182 -> CI [.00095, .05905]
    finals = {"dapo": [0.40, 0.45, 0.50, 0.47], "cleaner": [0.44, 0.47, 0.55, 0.48], "saar_all": [0.30, 0.35]}
    acc = {arm: {12: xs} for arm, xs in finals.items()}
    tool = {arm: {12: [0.8] * len(xs)} for arm, xs in finals.items()}
    graded = [{"run_id": f"{arm}-s{i}", "policy_version": 12, "key": GRADED, "value": 1024.0}
              for arm, xs in finals.items() for i in range(len(xs))]
    evals = pl.DataFrame(_evals(acc, ACC) + _evals(tool, TOOL) + graded)
    runs = {arm: [f"{arm}-s{i}" for i in range(len(xs))] for arm, xs in finals.items()}
    s = summarize(evals, runs, "dapo", "cleaner", initial={ACC: 0.35, TOOL: 0.6})
    d = s["paired_pass_at_1"]["cleaner"]
    assert d["n"] == 4 and d["mean"] == pytest.approx(0.03) and d["se"] == pytest.approx(0.0091287, abs=1e-6)
    assert d["ci95"] == pytest.approx([0.00095, 0.05905], abs=1e-4)
    assert s["paired_pass_at_1"]["saar_all"]["seeds"] == [0, 1] and s["paired_pass_at_1"]["saar_all"]["mean"] == pytest.approx(-0.10)
    assert s["final"]["dapo"]["pass_at_1_std"] == pytest.approx(0.04203, abs=1e-4)
    assert [r["gain_pass_at_1"] for r in s["per_seed"]["cleaner"]] == pytest.approx([0.09, 0.12, 0.20, 0.13])
    assert s["steps_to_baseline_final"] == {"dapo": 12, "cleaner": 12, "saar_all": None}
    assert s["eval_noise"]["trajectories"] == 1024 and s["eval_noise"]["se"] == pytest.approx((0.455 * 0.545 / 1024) ** 0.5)
    assert "cleaner ends higher" in s["verdict"] and "+0.030 ± 0.009" in s["verdict"]
    write_report(s, tmp_path)
    assert "| cleaner − dapo | 4 | +0.030 ± 0.009 [+0.001, +0.059] |" in (tmp_path / "compare.md").read_text()
    assert s["settings"] == {}, "no run evaluated SAAR on: no second setting is made up"


def test_probe_entropy_is_paired_by_seed_and_compared_as_a_ratio(tmp_path):
    # dapo .50 .60 (mean .55), cleaner .55 .62 -> paired +.05 +.02: mean +.035, se .015; ratio .585/.55 = 1.063636
    probe = {"dapo-s0": {"entropy": 0.50, "tokens": 900.0}, "dapo-s1": {"entropy": 0.60, "tokens": 900.0},
             "cleaner-s0": {"entropy": 0.55, "tokens": 900.0}, "cleaner-s1": {"entropy": 0.62, "tokens": 900.0}}
    evals = pl.DataFrame(_evals({a: {12: [0.4, 0.5]} for a in ("dapo", "cleaner")}, ACC)
                         + _evals({a: {12: [0.8, 0.8]} for a in ("dapo", "cleaner")}, TOOL))
    runs = {arm: [f"{arm}-s{i}" for i in range(2)] for arm in ("dapo", "cleaner")}
    s = summarize(evals, runs, "dapo", "cleaner", probe=probe)
    row = s["probe_entropy"]["cleaner"]
    assert row["mean"] == pytest.approx(0.585) and row["ratio_to_baseline"] == pytest.approx(1.063636, abs=1e-6)
    assert row["paired"]["mean"] == pytest.approx(0.035) and row["paired"]["se"] == pytest.approx(0.015)
    assert "paired" not in s["probe_entropy"]["dapo"] and s["probe_entropy"]["dapo"]["tokens"] == 900.0
    write_report(s, tmp_path)
    assert "| cleaner | 0.5850 | 1.064 | +0.035 ± 0.015" in (tmp_path / "compare.md").read_text()


def test_probe_entropy_counts_the_probes_policy_tokens(warm_model_dir):
    from tasks.training.probe import probe_entropy

    probe = pl.DataFrame({"prompt_ids": [[1, 2, 3], [4, 5]], "response_ids": [[6, 7, 8, 9], [10, 11]],
                          "response_mask": [[1, 1, 0, 1], [0, 0]]})
    one, many = probe_entropy(warm_model_dir, probe, micro_batch=1), probe_entropy(warm_model_dir, probe)
    assert one["tokens"] == many["tokens"] == 3  # the second row has no policy token
    assert one["entropy"] == pytest.approx(many["entropy"], rel=1e-5) and 0 < one["entropy"]


def test_both_evaluation_settings_paired_by_seed(tmp_path):
    # final SAAR off: dapo .40 .50, cleaner .38 .47; cleaner SAAR on .46 .55 (dapo on .41 .52, never its baseline)
    # internalisation: -.02 -.03 -> mean -.025, sd .0070711, se .005, t(1) 12.706 -> CI [-.08853, +.03853]
    # headline: .06 .05 -> mean +.055, se .005
    off = {"dapo": [0.40, 0.50], "cleaner": [0.38, 0.47]}
    on = {"dapo": [0.41, 0.52], "cleaner": [0.46, 0.55]}
    evals = pl.DataFrame(_evals({a: {6: [0.3, 0.3], 12: xs} for a, xs in off.items()}, ACC)
                         + _evals({a: {6: [0.9, 0.9], 12: xs} for a, xs in on.items()}, ACC_ON)
                         + _evals({a: {12: [0.8, 0.8]} for a in off}, TOOL))
    runs = {arm: [f"{arm}-s{i}" for i in range(2)] for arm in off}
    s = summarize(evals, runs, "dapo", "cleaner", initial={ACC: 0.30, ACC_ON: 0.42})
    # dapo reaches its final .45 at step 12, cleaner (.425) never: neither claim holds
    assert s["claim_half_the_steps"] is False and s["claim_third_of_the_steps"] is False
    row = s["settings"]["cleaner"]
    assert row["saar_off"] == pytest.approx(0.425) and row["saar_on"] == pytest.approx(0.505)
    assert row["internalisation"]["mean"] == pytest.approx(-0.025) and row["internalisation"]["se"] == pytest.approx(0.005)
    assert row["internalisation"]["ci95"] == pytest.approx([-0.08853, 0.03853], abs=1e-4)
    assert row["headline"]["mean"] == pytest.approx(0.055) and row["headline"]["seeds"] == [0, 1]
    assert "headline" not in s["settings"]["dapo"] and s["settings"]["dapo"]["saar_on"] == pytest.approx(0.465)
    write_report(s, tmp_path)
    page = (tmp_path / "compare.md").read_text()
    assert "| cleaner | 0.425 | 0.505 | -0.025 ± 0.005 [-0.089, +0.039] | +0.055 ± 0.005 [-0.009, +0.119] |" in page
    assert "0.300 SAAR off, 0.420 SAAR on: rollback alone gives +0.120 before any training" in page


def test_refill_stops_at_its_bound_and_when_full():
    calls = []

    def draw(round_, n):
        calls.append((round_, n))
        return [f"r{round_}p{i}" for i in range(n)]

    def uniform(items):
        return {p: [0.0, 0.0] for p in items}

    def run(items, round_):
        return list(items)

    out, m = fill_batch(draw, run, uniform, want=4, max_rounds=2, group_of=str)
    assert m == {"mix/refill_rounds": 2, "mix/informative_groups": 0, "mix/refill_dropped_groups": 8}
    assert len(calls) == 3 and out == ["r0p0", "r0p1", "r0p2", "r0p3"]  # trimmed back to the batch size

    def half(items):
        return {p: ([0.0, 1.0] if i % 2 == 0 else [1.0, 1.0]) for i, p in enumerate(items)}

    calls.clear()
    out, m = fill_batch(draw, run, half, want=4, max_rounds=5, group_of=str)
    assert m["mix/informative_groups"] == 4 and calls == [(0, 4), (1, 2), (2, 1)] and len(out) == 4


def test_same_seed_same_rollout(warm_model_dir, chat):
    from models.config import EngineConfig
    from models.engine import TransformersEngine
    from sandbox.base import make_sandbox
    from sandbox.config import SandboxConfig
    from tasks.rollout.config import RolloutConfig
    from tasks.rollout.machine import Rollout
    from tasks.rollout.types import PromptItem

    items = [PromptItem(f"p{i}", [{"role": "user", "content": f"What is {1234 + i} * 5678?"}], "synthetic/arith", "0")
             for i in range(3)]
    engine = TransformersEngine(EngineConfig(), warm_model_dir, chat.eos_id, chat.tokenizer.pad_token_id)
    with make_sandbox(SandboxConfig(workers=1)) as box:
        roll = Rollout(RolloutConfig(n_samples=2, max_new_tokens=64), engine, chat, box)
        a = [t.response_ids for t in roll.run(items, 5, 2, progress=False)]
        b = [t.response_ids for t in roll.run(items, 5, 2, progress=False)]
        c = [t.response_ids for t in roll.run(items, 6, 2, progress=False)]
    assert a == b and a != c


def test_compare_flow_trains_every_arm_and_seed_under_one_parent(prefect_harness, warm_model_dir, tmp_path, capsys):
    from flows.compare import compare_flow

    arms = json.dumps({"cleaner": ["rollout.saar.enabled=true", "rollout.saar.raw_share=0.3"],
                       "dapo": ["rollout.saar.enabled=false"]})
    overrides = [*tiny_overrides(tmp_path, warm_model_dir, steps=1), f"compare.arms={arms}",
                 "compare.seeds=[0]", "compare.arm_seeds={}", "compare.steps=1", "compare.eval_every=1",
                 "compare.shared=[trainer.lr=1.0e-4]", "eval.n_prompts=4", "eval.samples=2", "eval.ks=[1,2]",
                 "compare.probe_prompts=3"]
    with run_log_lines() as lines:
        summary = compare_flow("configs/tiny.yaml", overrides, compare_id="cmp")
    probe = summary["probe_entropy"]  # both arms' final checkpoints scored the same probe tokens
    assert set(probe) == {"cleaner", "dapo"} and probe["cleaner"]["tokens"] == probe["dapo"]["tokens"] > 0
    assert probe["cleaner"]["mean"] > 0 and "paired" in probe["cleaner"]
    assert summary["runs"] == {"cleaner": ["cmp-cleaner-s0"], "dapo": ["cmp-dapo-s0"]}
    for arm in ("cleaner", "dapo"):  # the shared initial evaluation is step 0; each run evaluates step 1 (SAAR off)
        assert [row["policy_version"] for row in summary["curves"][arm]["accuracy"]] == [0, 1]
        assert summary["per_seed"][arm][0]["seed"] == 0
    logs = tmp_path / "runs" / "cmp" / "logs"
    assert sorted(p.name for p in logs.iterdir()) == ["cmp-cleaner-s0.log", "cmp-dapo-s0.log"], "one process per run"
    # what it printed: the starting policy's evaluation, a line per finished run, the report's headline table
    printed, logged = capsys.readouterr().out, "\n".join(lines)
    for run_id in ("cmp-cleaner-s0", "cmp-dapo-s0"):
        assert re.search(rf"^{run_id} finished in \d+ (min \d+ )?s: held-out pass@1 SAAR off: [\d.]+ after 1 step$",
                         printed, re.M), printed
        child = (logs / f"{run_id}.log").read_text()  # a child's own log: its step and evaluation lines, no states
        assert "step 0 | reward" in child and "eval policy 1 | pass@1 SAAR off" in child and "Task run" not in child
    assert "eval policy 0 (the starting policy) | pass@1 SAAR off" in logged
    assert "| arm | seeds | steps to baseline final |" in logged and "the full report: " in logged
    assert "Per seed:" not in logged  # the headline only; the rest is in compare.md
    con = duckdb.connect(str(tmp_path / "cleaner.duckdb"), read_only=True)
    keys = [k for (k,) in con.execute("SELECT DISTINCT key FROM evaluations").fetchall()]
    modes = {k.split("/")[1] for k in keys if k.startswith("eval/")}
    lrs = {json.loads(c)["trainer"]["lr"] for (c,) in con.execute("SELECT config FROM runs").fetchall()}
    con.close()
    assert modes == {"saar_off", "saar_on"} and lrs == {1.0e-4}
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("tiny")
    parent = client.search_runs([exp.experiment_id], filter_string=f"tags.`{RUN_TAG}` = 'cmp'")[0]
    children = client.search_runs([exp.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert sorted(r.data.tags[RUN_TAG] for r in children) == sorted(summary["runs"]["cleaner"] + summary["runs"]["dapo"])
    note = parent.data.tags["mlflow.note.content"]  # the parent describes the comparison, each child its arm
    assert "arms **cleaner**, **dapo**, seeds 0;" in note  # compare.seeds=[0]
    for arm, f in summary["final"].items():
        assert f"| {arm} | {f['pass_at_1']:.3f} ± {f['pass_at_1_std']:.3f} |" in note
    for child in children:
        run_id = child.data.tags[RUN_TAG]
        assert child.info.run_name == run_id
        child_note = child.data.tags["mlflow.note.content"]
        assert f"arm **{run_id.split('-')[1]}**" in child_note and f"comparison `{parent.info.run_id}`" in child_note
    assert {a.path for a in client.list_artifacts(parent.info.run_id, "report")} == {
        "report/compare.json", "report/compare.md", "report/compare.png", "report/compare_seeds.png"}
    assert (tmp_path / "runs" / "cmp" / "report" / "compare.png").stat().st_size > 1000
    # One run again, alone, into a scratch folder: the same final numbers as the committed report (exactly).
    from flows.rerun import rerun

    def store_rows():
        con = duckdb.connect(str(tmp_path / "cleaner.duckdb"), read_only=True)
        try:
            return [con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("runs", "evaluations", "metrics")]
        finally:
            con.close()

    before = store_rows()
    report = tmp_path / "runs" / "cmp" / "report" / "compare.json"
    [row] = json.loads(report.read_text())["per_seed"]["cleaner"]
    assert row["final_pass_at_1_saar_on"] is not None
    again = rerun("configs/tiny.yaml", overrides, "cmp", "cleaner:0", tmp_path / "again", report)
    assert again["equal"] == {"final_pass_at_1": True, "final_pass_at_1_saar_on": True,
                              "final_first_attempt_success": True}
    assert all(again["within_noise"].values()) and set(again["difference"].values()) == {0.0}
    assert again["rerun"]["final_pass_at_1"] == row["final_pass_at_1"] and again["rerun"]["policy_version"] == 1
    assert again["folder"] == str(tmp_path / "again" / "cmp-cleaner-s0-1")
    assert (tmp_path / "again" / "cmp-cleaner-s0-1" / "runs" / "cmp-cleaner-s0" / "checkpoints").is_dir()
    assert store_rows() == before  # the comparison's store is untouched


def test_compare_checks_every_arm_before_training(prefect_harness, warm_model_dir, tmp_path):
    from flows.compare import compare_flow
    from flows.config import ConfigError

    overrides = [*tiny_overrides(tmp_path, warm_model_dir), "compare.shared=[trainer.lrr=1.0e-4]"]
    with pytest.raises(ConfigError, match="trainer.lrr"):
        compare_flow("configs/tiny.yaml", overrides, compare_id="bad")
    assert not (tmp_path / "runs" / "bad-cleaner-s0").exists()


def test_compare_report_names_environment_metrics():
    """An environment comparison (eval/<env>/success, valid-action rate) is reported in those words, not as pass@1."""
    succ, valid = "eval/frozen_lake/success", "eval/frozen_lake/valid_action_rate"
    acc = {"all_groups": {0: [0.2, 0.2], 10: [0.25, 0.3]}, "starpo_s": {0: [0.2, 0.2], 10: [0.3, 0.4]}}
    evals = pl.DataFrame(_evals(acc, succ) + _evals({a: {0: [1.0] * 2, 10: [0.99] * 2} for a in acc}, valid))
    s = summarize(evals, {a: [f"{a}-s0", f"{a}-s1"] for a in acc}, "all_groups", "starpo_s",
                  acc_key=succ, tool_key=valid)
    page = markdown(s)
    assert page.startswith("# starpo_s vs all_groups on frozen_lake (held-out episodes)")
    assert "final success (± seed std) | final valid-action rate (± std) |" in page and "pass@1" not in page
    assert "first-attempt" not in page and s["verdict"].startswith("starpo_s − all_groups final success = +0.075")
