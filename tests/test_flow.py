"""A 2-step run of the Prefect ``train`` flow on the warm tiny model, checked in both stores."""

from __future__ import annotations

import json

import duckdb
import pytest
from mlflow.tracking import MlflowClient

from flows.train import train
from tasks.stores.tracking import RUN_TAG

TABLES_PER_STEP = ["trajectories", "turns", "tool_executions", "metrics", "steps"]


@pytest.fixture(scope="module")
def finished_run(prefect_harness, warm_model_dir, tmp_path_factory):
    work = tmp_path_factory.mktemp("flow")
    overrides = [
        f"model.path={warm_model_dir}", f"output_dir={work / 'runs'}",
        f"data.train_path={work / 'train.parquet'}", f"data.eval_path={work / 'eval.parquet'}",
        "data.n_train=64", "data.n_eval=8", "data.prompts_per_step=4", "data.refill_rounds=0", "rollout.n_samples=4", "train.eval_every=2",
        "eval.n_prompts=4", "eval.samples=2", "eval.ks=[1,2]",
        "train.steps=2", f"tracking.mlflow_uri=sqlite:///{work / 'mlflow.db'}",
        f"tracking.artifact_root={work / 'mlartifacts'}", f"tracking.duckdb_path={work / 'cleaner.duckdb'}",
    ]
    result = train("configs/tiny.yaml", overrides, "flowtest")
    return work, overrides, result


def test_flow_fills_duckdb_for_every_step(finished_run):
    work, _, result = finished_run
    con = duckdb.connect(str(work / "cleaner.duckdb"), read_only=True)
    for table in TABLES_PER_STEP:
        steps = {r[0] for r in con.execute(f"SELECT DISTINCT step FROM {table} WHERE run_id = 'flowtest'").fetchall()}
        assert steps == {0, 1}, table
    assert con.execute("SELECT count(*) FROM trajectories WHERE step = 0").fetchone()[0] == 16
    status = con.execute("SELECT status FROM runs WHERE run_id = 'flowtest'").fetchone()[0]
    assert status == "finished"
    masks_ok = con.execute(
        "SELECT bool_and(len(response_ids) = len(response_mask) AND len(response_ids) = len(rollout_logprobs)) FROM trajectories"
    ).fetchone()[0]
    assert masks_ok
    # a synchronous run: step s is sampled by policy_00000s, so every sampled token says s, every injected one -1,
    # and the update measures staleness 0
    stamps_ok = con.execute(
        "SELECT bool_and(list_transform(list_zip(sampled_version, response_mask), x -> CASE WHEN x[2] = 1 THEN "
        "x[1] = step ELSE x[1] = -1 END) = list_transform(response_mask, x -> true)) FROM trajectories "
        "WHERE run_id = 'flowtest'").fetchone()[0]
    assert stamps_ok
    stale = con.execute("SELECT key, max(value), count(*) FROM metrics WHERE run_id = 'flowtest' AND key LIKE "
                        "'perf/staleness_%' GROUP BY key ORDER BY key").fetchall()
    assert stale == [("perf/staleness_max", 0.0, 2), ("perf/staleness_mean", 0.0, 2)]
    evals = dict(con.execute("SELECT policy_version, count(*) FROM evaluations WHERE run_id = 'flowtest' GROUP BY ALL").fetchall())
    assert set(evals) == {0, 2} and min(evals.values()) > 10
    assert (work / "runs" / "flowtest" / "checkpoints" / "policy_000002" / "config.json").exists()
    assert result["final_checkpoint"].endswith("policy_000002")
    con.close()


def test_flow_logs_one_mlflow_run_with_step_metrics(finished_run):
    work, _, result = finished_run
    client = MlflowClient(tracking_uri=f"sqlite:///{work / 'mlflow.db'}")
    exp = client.get_experiment_by_name("tiny")
    runs = client.search_runs([exp.experiment_id], filter_string=f"tags.`{RUN_TAG}` = 'flowtest'")
    assert len(runs) == 1
    run = runs[0]
    assert run.data.params["rollout.saar.raw_share"] == "0.3"
    for key in ["rollout/accuracy", "tools/first_attempt_success_rate", "saar/rollbacks_triggered",
                "saar/shallow", "saar/deep", "rollout/raw_share", "time/rollout_s", "time/update_s"]:
        steps = [m.step for m in client.get_metric_history(run.info.run_id, key)]
        assert sorted(steps) == [0, 1], key
    arts = {a.path for a in client.list_artifacts(run.info.run_id, "samples")}
    assert "samples/step_000000.md" in arts and "samples/step_000001.json" in arts
    local = client.download_artifacts(run.info.run_id, "config/resolved_config.json", str(work))
    config = json.loads(open(local).read())
    assert config["rollout"]["saar"]["max_tool_retries"] == 3
    assert "plots/summary.png" in {a.path for a in client.list_artifacts(run.info.run_id, "plots")}
    assert {a.path for a in client.list_artifacts(run.info.run_id, "viewer")} == {
        "viewer/step_000000.html", "viewer/step_000001.html"}


def test_rerun_of_finished_run_skips_steps_and_duplicates_nothing(finished_run):
    work, overrides, _ = finished_run
    con = duckdb.connect(str(work / "cleaner.duckdb"), read_only=True)
    before = con.execute("SELECT count(*) FROM trajectories").fetchone()[0]
    con.close()
    train("configs/tiny.yaml", overrides, "flowtest")
    con = duckdb.connect(str(work / "cleaner.duckdb"), read_only=True)
    assert con.execute("SELECT count(*) FROM trajectories").fetchone()[0] == before
    con.close()
    client = MlflowClient(tracking_uri=f"sqlite:///{work / 'mlflow.db'}")
    exp = client.get_experiment_by_name("tiny")
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 1
    assert len(client.get_metric_history(runs[0].info.run_id, "rollout/accuracy")) == 2


def test_default_run_id_follows_the_flow_run():
    """Stable for one flow run (a retry resumes it), distinct for flow runs created in the same millisecond."""
    from prefect._internal.uuid7 import uuid7

    from flows.train import default_run_id

    a = str(uuid7())
    b = a[:24] + format(int(a[24:], 16) ^ 1, "012x")  # same millisecond, another random tail
    assert default_run_id("tiny", a, "brave-otter") == default_run_id("tiny", a, "brave-otter")
    assert default_run_id("tiny", a, "brave-otter") != default_run_id("tiny", b, "brave-otter")
    assert default_run_id("tiny", a, "brave-otter") == f"tiny-brave-otter-{a.replace('-', '')[-8:]}"


def test_a_failed_stage_is_named_in_the_flow_runs_final_state(prefect_harness, warm_model_dir, tmp_path,
                                                              monkeypatch):
    """The rollout stage raises (an invalid fault-injection spec is a ValueError at its first crash point): the flow
    run ends Failed, and its state message — what ``prefect deployment run --watch``, ``flow-run inspect`` and the UI
    show — names the stage, the step and the error."""
    from tasks.training.faults import ENV
    from tests.flowrun import tiny_overrides

    monkeypatch.setenv(ENV, "bogus")
    state = train("configs/tiny.yaml", tiny_overrides(tmp_path, warm_model_dir, steps=1), "failing", return_state=True)
    assert state.is_failed()
    assert "StageFailed: stage 'rollout' of step 0 failed: ValueError: CLEANER_CRASH_AT='bogus': unknown crash " \
           "point" in state.message, state.message
