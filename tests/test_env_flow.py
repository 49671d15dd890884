"""A 2-step environment-mode run of the Prefect ``train`` flow on the warmed-up text-game policy."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from mlflow.tracking import MlflowClient

from flows.train import train
from tasks.stores.tracking import RUN_TAG

ENV_MODEL = Path(__file__).resolve().parents[1] / "assets" / "tiny-env"
EVERY_STEP = ["rollout/in_group_std", "rollout/in_group_std_max", "rollout/in_group_mean", "rollout/chosen_in_group_std",
              "train/entropy", "train/grad_norm", "train/clip_frac", "train/approx_kl", "response_length",
              "bandit/success", "bandit/pass_at_4", "bandit/hi_arm_rate", "bandit/valid_action_rate"]


@pytest.fixture(scope="module")
def env_run(prefect_harness, tmp_path_factory):
    work = tmp_path_factory.mktemp("envflow")
    overrides = [
        f"model.path={ENV_MODEL}", "model.build=none", f"output_dir={work / 'runs'}", "train.steps=2",
        "env.groups=4", "rollout.n_samples=4", "env.mi_every=1", "env.mi_samples=16", "train.eval_every=2",
        "eval.n_prompts=4", "eval.samples=2", f"tracking.mlflow_uri=sqlite:///{work / 'mlflow.db'}",
        f"tracking.artifact_root={work / 'mlartifacts'}", f"tracking.duckdb_path={work / 'cleaner.duckdb'}",
        "tracking.register_models=true",
    ]
    return work, train("configs/bandit.yaml", overrides, "envflow")


def test_env_steps_and_collapse_metrics_every_step(env_run):
    work, _ = env_run
    con = duckdb.connect(str(work / "cleaner.duckdb"), read_only=True)
    for step in (0, 1):
        assert con.execute(f"SELECT count(*) FROM env_steps WHERE run_id='envflow' AND step={step}").fetchone()[0] == 16
        keys = {r[0] for r in con.execute(f"SELECT key FROM metrics WHERE run_id='envflow' AND step={step}").fetchall()}
        assert set(EVERY_STEP) <= keys, set(EVERY_STEP) - keys
    mi = con.execute("SELECT value FROM metrics WHERE run_id='envflow' AND key='collapse/valid_thinking_rate'").fetchall()
    assert len(mi) == 2 and all(0 <= v <= 1 for (v,) in mi)
    row = con.execute("SELECT data_source, env_score, reward, num_turns FROM trajectories WHERE run_id='envflow' "
                      "AND step=0 LIMIT 1").fetchone()
    assert row[0] == "bandit" and row[1] == row[2] and row[3] == 1
    evals = {r[0] for r in con.execute("SELECT key FROM evaluations WHERE run_id='envflow'").fetchall()}
    assert {"eval/bandit_test/success", "eval/bandit_test/hi_arm_rate"} <= evals


def test_collapse_panel_and_env_viewer_are_mlflow_artifacts(env_run):
    work, result = env_run
    client = MlflowClient(f"sqlite:///{work / 'mlflow.db'}")
    run = client.search_runs(client.get_experiment_by_name("bandit").experiment_id,
                             f"tags.`{RUN_TAG}` = 'envflow'")[0]
    assert "plots/collapse.png" in [a.path for a in client.list_artifacts(run.info.run_id, "plots")]
    assert len(client.get_metric_history(run.info.run_id, "rollout/in_group_std")) == 2
    page = open(client.download_artifacts(run.info.run_id, "viewer/step_000001.html", str(work))).read()
    assert "bandit episodes turn by turn" in page and "SAAR (purified)" not in page
    assert page.count("<table class='turns'>") == 4 and "actions (asked → ran)" in page


def test_critic_variant_through_the_train_flow(prefect_harness, tmp_path):
    """``mix.advantage=gae``: 2 env steps train the value head; its loss is logged every step, critic.pt is saved."""
    overrides = [
        f"model.path={ENV_MODEL}", "model.build=none", f"output_dir={tmp_path / 'runs'}", "train.steps=2",
        "env.groups=2", "rollout.n_samples=4", "env.mi_every=0", "train.eval_every=0", "mix.advantage=gae",
        "mix.group_filter.kind=none", f"tracking.mlflow_uri=sqlite:///{tmp_path / 'mlflow.db'}",
        f"tracking.artifact_root={tmp_path / 'mlartifacts'}", f"tracking.duckdb_path={tmp_path / 'cleaner.duckdb'}",
    ]
    train("configs/bandit.yaml", overrides, "envgae")
    con = duckdb.connect(str(tmp_path / "cleaner.duckdb"), read_only=True)
    for step in (0, 1):
        keys = {r[0] for r in con.execute(f"SELECT key FROM metrics WHERE run_id='envgae' AND step={step}").fetchall()}
        assert {"train/value_loss", "train/value_mean", "train/return_mean", "rollout/in_group_std"} <= keys
    assert list((tmp_path / "runs").rglob("critic.pt"))


def test_env_evaluations_are_logged_models_traces_and_a_dataset_and_rank_best(env_run):
    """Policies 0 and 2 were evaluated on Bandit's held-out variant: each is a logged model carrying its held-out
    success as the ranking score, its metrics are linked to it, the held-out start states are a dataset input,
    the episodes are traces, and the registry's ``@best`` is the better of the two."""
    import mlflow

    from tasks.stores import registry
    from tasks.stores.config import TrackingConfig

    work, result = env_run
    uri = f"sqlite:///{work / 'mlflow.db'}"
    client = MlflowClient(uri, registry_uri=uri)
    cfg = TrackingConfig(mlflow_uri=uri, artifact_root=str(work / "mlartifacts"))
    models = registry.run_models(cfg, result["mlflow_run_id"], "envflow")
    con = duckdb.connect(str(work / "cleaner.duckdb"), read_only=True)
    success = dict(con.execute("SELECT policy_version, value FROM evaluations WHERE run_id='envflow' "
                               "AND key='eval/bandit_test/success'").fetchall())
    con.close()
    assert [m.tags["cleaner.policy_version"] for m in models] == ["0", "2"]
    for m in models:
        assert m.tags["cleaner.score_key"] == "eval/bandit_test/success"
        assert float(m.tags["cleaner.score"]) == pytest.approx(success[int(m.tags["cleaner.policy_version"])])
        linked = {x.key: x for x in client.get_logged_model(m.model_id).metrics}
        assert linked["eval/bandit_test/success"].dataset_name == "bandit_test/heldout"
    run = client.get_run(result["mlflow_run_id"])
    inputs = {i.dataset.name: i.tags[0].value for i in run.inputs.dataset_inputs}
    assert inputs["bandit_test/heldout"] == "evaluation"
    evals = mlflow.search_traces(locations=[run.info.experiment_id], filter_string="tags.kind = 'eval'",
                                 return_type="list")
    assert {(t.info.tags["eval_mode"], t.info.tags["step"]) for t in evals} == {("bandit_test", "0"),
                                                                                ("bandit_test", "2")}
    best = client.get_model_version_by_alias("bandit", "best")
    top = max(success.values())
    assert float(best.tags["cleaner.score"]) == pytest.approx(top)
