"""The small pure pieces of the MLflow entities, without a training run: ``models:/`` URIs, the run
description, the arm label, Prefect artifact keys, and ``cleaner eval --model`` refusing bad input
before any work. (The entities a real run leaves: tests/test_mlflow_entities.py, slow.)"""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from flows.cli import app
from flows.config import load_config
from flows.train import arm_of
from tasks.stores import links
from tasks.stores.registry import parse_uri

runner = CliRunner()


@pytest.mark.parametrize(("uri", "want"), [
    ("models:/tiny@best", (None, "tiny", None, "best")),
    ("models:/tiny/latest", (None, "tiny", "latest", None)),
    ("models:/tiny/3", (None, "tiny", "3", None)),
    ("models:/m-0123abcd", ("m-0123abcd", None, None, None)),
])
def test_models_uris_parse_into_id_or_name(uri, want):
    assert parse_uri(uri) == want


@pytest.mark.parametrize("bad", ["runs:/abc/model", "models:/", "tiny@best"])
def test_a_non_models_uri_is_refused_with_the_forms_listed(bad):
    with pytest.raises(ValueError, match=r"is not a models:/ URI \(models:/<name>@<alias>"):
        parse_uri(bad)


def test_pass_by_version_prefers_saar_off():
    rows = [{"policy_version": 5, "key": "eval/saar_on/all/pass_at_1", "value": 0.9},
            {"policy_version": 5, "key": "eval/saar_off/all/pass_at_1", "value": 0.5},
            {"policy_version": 0, "key": "eval/saar_on/all/pass_at_1", "value": 0.25}]
    assert links.pass_by_version(rows) == {5: 0.5, 0: 0.25}


def test_the_description_names_config_arm_final_and_best_pass_and_the_flow_run():
    text = links.describe("r1", "tiny", "dapo", 10, "fr-1", {0: 0.25, 5: 0.5, 10: 0.375},
                          {"final": "4", "run_best": "3", "best": "2"}, parent="cmp-1")
    assert "config `tiny`, arm **dapo**, 10 RL steps" in text
    assert "final **0.375** (policy 10); best **0.500** (policy 5)" in text
    assert "version 4 (final, `@latest`) and 3 (this run's best); `@best` is version 2" in text
    assert "comparison `cmp-1`" in text and "[fr-1](" in text and text.count("/flow-runs/flow-run/fr-1)") == 1
    assert "Not started by a Prefect flow run." in links.describe("r1", "tiny", "cleaner", 2, None)


def test_a_tie_in_pass_at_1_names_the_later_policy_best():
    assert "best **0.500** (policy 10)" in links.describe("r", "t", "a", 10, None, {5: 0.5, 10: 0.5})


def test_the_arm_follows_the_config_unless_named():
    assert arm_of(load_config("configs/tiny.yaml", [])) == "cleaner"
    assert arm_of(load_config("configs/tiny.yaml", ["rollout.saar.enabled=false"])) == "dapo"
    assert arm_of(load_config("configs/tiny.yaml", ["rollout.saar.raw_share=0"])) == "saar_all"
    assert arm_of(load_config("configs/tiny.yaml", ["rollout.saar.enabled=false", "tracking.arm=mine"])) == "mine"


def test_links_open_the_training_view_and_artifact_keys_are_prefect_safe():
    from tasks.stores.config import TrackingConfig

    cfg = TrackingConfig(mlflow_uri="http://mlflow.lan:5000/")
    assert links.experiment_url(cfg, "7") == "http://mlflow.lan:5000/#/experiments/7/runs?workflowType=machine_learning"
    assert links.mlflow_ui(TrackingConfig()) == "http://127.0.0.1:5000"
    assert links.artifact_key("SmolLM2_135M", "mlflow run") == "smollm2-135m-mlflow-run"


def _stores(tmp_path) -> list[str]:
    return ["--set", f"tracking.mlflow_uri=sqlite:///{tmp_path / 'mlflow.db'}",
            "--set", f"tracking.duckdb_path={tmp_path / 'cleaner.duckdb'}", "--set", f"output_dir={tmp_path / 'runs'}"]


def test_eval_takes_a_checkpoint_or_a_model_not_both(tmp_path):
    res = runner.invoke(app, ["eval", "--checkpoint", str(tmp_path), "--model", "models:/tiny@best", *_stores(tmp_path)])
    assert res.exit_code == 2 and "exclude each other" in res.output


def test_eval_of_a_model_the_registry_lacks_names_it(tmp_path):
    res = runner.invoke(app, ["eval", "--model", "models:/nope@best", *_stores(tmp_path)])
    out = " ".join(res.output.split())
    assert res.exit_code == 2 and "--model models:/nope@best:" in out and "nope" in out.split(":", 2)[-1]
    assert not (tmp_path / "runs").exists()  # refused before any work


def _sections(keys: list[str]) -> list[str]:
    """Chart sections of MLflow 3.17's run page, in its order: the key minus its last `/` part, sorted by code
    unit (``getBaseChartAndSectionConfigs`` / ``extractChartSectionName`` in its UI bundle)."""
    return sorted({k.rsplit("/", 1)[0] for k in keys if "/" in k and not k.startswith("system/")})


def test_the_charts_a_user_needs_first_head_the_run_and_zero_flags_stay_out(tmp_path):
    """In a real store: held-out pass@1, reward and SAAR recovery are the first chart section ("Key metrics"),
    with the values of their sources; an early-stop flag reaches MLflow only at the step it is set."""
    from mlflow import MlflowClient

    from tasks.stores import tracking
    from tasks.stores.config import TrackingConfig

    cfg = TrackingConfig(mlflow_uri=f"sqlite:///{tmp_path / 'mlflow.db'}", artifact_root=str(tmp_path / "art"))
    mlrun = tracking.open_run(cfg, "charts", "r1", {}, {})
    for step, (reward, stopped) in enumerate([(0.25, 0.0), (0.5, 0.0), (0.75, 1.0)]):
        tracking.log_step(cfg, mlrun, step, {"rollout/reward_mean": reward, "saar/global_recovery_rate": reward / 2,
                                             "rollout/accuracy": 0.5, "early_stopped/empty_filtered_steps": stopped},
                          {})
    tracking.log_eval(cfg, mlrun, 3, {"eval/saar_off/all/pass_at_1": 0.375, "eval/saar_on/all/pass_at_1": 0.5})
    client = MlflowClient(cfg.mlflow_uri)
    keys = list(client.get_run(mlrun).data.metrics)
    assert _sections(keys)[0] == "Key metrics"
    assert sorted(k for k in keys if k.startswith("Key metrics/")) == [
        "Key metrics/heldout_pass_at_1", "Key metrics/reward_mean", "Key metrics/saar_recovery_rate"]

    def history(key: str) -> list[tuple[int, float]]:
        return sorted((m.step, m.value) for m in client.get_metric_history(mlrun, key))

    assert history("Key metrics/reward_mean") == history("rollout/reward_mean") == [(0, 0.25), (1, 0.5), (2, 0.75)]
    assert history("Key metrics/saar_recovery_rate") == [(0, 0.125), (1, 0.25), (2, 0.375)]
    assert history("Key metrics/heldout_pass_at_1") == [(3, 0.375)]  # SAAR off: the policy on its own
    assert history("early_stopped/empty_filtered_steps") == [(2, 1.0)]
