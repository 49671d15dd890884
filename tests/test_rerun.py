"""``cleaner compare --rerun``: the job's spec, the committed row's lookup and the errors a user meets before
any training (the end-to-end rerun is in tests/test_compare.py)."""

from __future__ import annotations

import json

import pytest

from flows.rerun import committed_row, noise_bound, parse_job, rerun, scratch_overrides


def test_parse_job_reads_arm_and_seed_and_names_the_option_when_bad():
    assert parse_job("cleaner:21") == ("cleaner", 21)
    assert parse_job("mask_raw07:3") == ("mask_raw07", 3)
    for bad in ("cleaner", "cleaner:", ":21", "cleaner:x1"):
        with pytest.raises(ValueError, match="--rerun: .* is not ARM:SEED"):
            parse_job(bad)


def test_scratch_overrides_move_every_store_under_the_folder(tmp_path):
    assert scratch_overrides(tmp_path / "r") == [
        f"output_dir={tmp_path}/r/runs", f"tracking.duckdb_path={tmp_path}/r/cleaner.duckdb",
        f"tracking.mlflow_uri=sqlite:///{tmp_path}/r/mlflow.db", f"tracking.artifact_root={tmp_path}/r/mlartifacts"]


def test_committed_row_is_found_in_a_report_or_in_json_holding_reports(tmp_path):
    row = {"run_id": "x-cleaner-s21", "seed": 21, "final_pass_at_1": 0.5}
    report = {"per_seed": {"dapo": [{"run_id": "x-dapo-s21", "seed": 21}], "cleaner": [row]},
              # as Part C's report: a training counter's per_seed maps seed -> count, a mediator's rows carry no run id
              "mediators": {"training": {"cleaner": {"counts": {"score/right_by_chance": {"total": 3.0,
                                                                                          "per_seed": {"21": 3.0}}}}},
                            "evaluation": {"per_seed": {"cleaner": [{"seed": 21, "fresh": {}}]}}}}
    (tmp_path / "compare.json").write_text(json.dumps(report))
    (tmp_path / "study.json").write_text(json.dumps({"t4": {"phase1": {"report": report}}, "t2": "pending"}))
    assert committed_row(tmp_path / "compare.json", "x-cleaner-s21") == row
    assert committed_row(tmp_path / "study.json", "x-cleaner-s21") == row
    with pytest.raises(ValueError, match="no per_seed row of run 'x-mask-s21'"):
        committed_row(tmp_path / "study.json", "x-mask-s21")
    with pytest.raises(ValueError, match="--against: .*missing.json is not a file"):
        committed_row(tmp_path / "missing.json", "x-cleaner-s21")
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(ValueError, match="--against: .*broken.json is not JSON"):
        committed_row(tmp_path / "broken.json", "x-cleaner-s21")


def test_a_run_the_comparison_does_not_have_lists_the_valid_ones_before_training(tmp_path):
    arms = json.dumps({"cleaner": ["rollout.saar.enabled=true"], "dapo": ["rollout.saar.enabled=false"]})
    ov = [f"output_dir={tmp_path}", f"compare.arms={arms}", "compare.seeds=[3, 4]", "compare.arm_seeds={}"]
    with pytest.raises(ValueError, match=r"'mask:3' is not a run of this comparison; valid: cleaner:3, cleaner:4, "
                                         r"dapo:3, dapo:4"):
        rerun("configs/tiny.yaml", ov, "cmp", "mask:3", tmp_path / "r")
    with pytest.raises(ValueError, match="--against: .* is not a file"):
        rerun("configs/tiny.yaml", ov, "cmp", "dapo:4", tmp_path / "r", tmp_path / "nope.json")
    assert not (tmp_path / "r").exists()


def test_noise_bound_is_twice_the_binomial_standard_error():
    assert noise_bound(0.5, 1024) == 0.03125  # 2 * sqrt(0.25 / 1024)
    assert noise_bound(0.75, 768) == 0.03125  # 2 * sqrt(0.1875 / 768)
    assert noise_bound(0.5, None) is None and noise_bound(0.5, 0) is None


def test_the_cli_names_the_missing_compare_id_and_a_bad_spec_with_exit_2(tmp_path):
    from typer.testing import CliRunner

    from flows.cli import app

    runner = CliRunner()
    no_id = runner.invoke(app, ["compare", "--rerun", "cleaner:21", "--into", str(tmp_path / "r")])
    assert no_id.exit_code == 2 and "--rerun needs the comparison's --compare-id" in no_id.output
    bad = runner.invoke(app, ["compare", "--compare-id", "cmp", "--rerun", "cleaner", "--into", str(tmp_path / "r")])
    assert bad.exit_code == 2 and "is not ARM:SEED" in bad.output
    assert not (tmp_path / "r").exists()


def test_each_rerun_trains_in_a_fresh_folder_and_first_calls_bound_first_call_success(tmp_path, monkeypatch):
    """A second ``--rerun`` into the same folder never finds the first one's stages or evaluations (it would report
    "equal" without training); first-call success is a rate over first calls, so its noise bound uses their count.
    Training is replaced by a stand-in that, like ``cleaner train``, writes the final evaluation into the store its
    overrides name — and fails if the folder already holds a run."""
    from flows import rerun as rerun_mod
    from tasks.stores import db

    trained = []

    def train(config_path, overrides, run_id, parent, log, api_url):
        where = dict(o.split("=", 1) for o in overrides if o.startswith(("output_dir=", "tracking.duckdb_path=")))
        assert not any(log.parent.iterdir()), f"{log.parent} holds an earlier rerun"
        assert where["output_dir"].startswith(str(log.parent)) and where["tracking.duckdb_path"].startswith(str(log.parent))
        db.replace_eval(where["tracking.duckdb_path"], run_id, 2, "ckpt", {
            "eval/saar_off/all/pass_at_1": 0.55, "eval/saar_off/eval/graded": 1000.0,
            "eval/saar_off/tools/first_attempt_success_rate": 0.55, "eval/saar_off/tools/first_attempt_total": 100.0})
        trained.append(log.parent)
        return run_id

    monkeypatch.setattr(rerun_mod, "_train_process", train)
    arms = json.dumps({"cleaner": ["rollout.saar.enabled=true"], "dapo": ["rollout.saar.enabled=false"]})
    ov = [f"output_dir={tmp_path}", f"compare.arms={arms}", "compare.seeds=[3]", "compare.arm_seeds={}"]
    row = {"run_id": "cmp-cleaner-s3", "final_pass_at_1": 0.5, "final_first_attempt_success": 0.5}
    (tmp_path / "c.json").write_text(json.dumps({"per_seed": {"cleaner": [row]}}))
    first = rerun("configs/tiny.yaml", ov, "cmp", "cleaner:3", tmp_path / "r", tmp_path / "c.json")
    second = rerun("configs/tiny.yaml", ov, "cmp", "cleaner:3", tmp_path / "r", tmp_path / "c.json")
    assert [first["folder"], second["folder"]] == [str(tmp_path / "r" / f"cmp-cleaner-s3-{n}") for n in (1, 2)]
    assert len(trained) == 2
    # 0.05 off: beyond 2·sqrt(.25/1000) = 0.032 over 1000 graded trajectories, within 2·sqrt(.25/100) = 0.1
    # over 100 first calls
    assert second["within_noise"] == {"final_pass_at_1": False, "final_first_attempt_success": True}
    assert second["rerun"]["counts"]["final_first_attempt_success"] == 100.0
