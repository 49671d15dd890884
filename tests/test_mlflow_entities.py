"""A finished tiny run in MLflow's own entities (real sqlite store, real Prefect flow run).

The 2-step run evaluated at policies 0 and 2 (``tracked_run``) must leave: the experiment in the
training view, a description naming config, arm and final pass@1 with its flow run, both prompt sets
as dataset inputs, system and sandbox metrics, every trajectory of every step as a trace with the
stores' facts, both evaluated checkpoints as logged models with the DuckDB evaluation values linked,
the registry's ``@best`` / ``@latest`` loadable with ``mlflow.transformers.load_model`` and usable by
``cleaner eval --model``, and the flow run's Prefect artifacts (link, progress, summary). Marked slow.
"""

from __future__ import annotations

from types import SimpleNamespace

import duckdb
import pytest

from tasks.stores.registry import model_id_of
from tests.flowrun import EVAL_OVERRIDES, run_log_lines, tiny_overrides

pytestmark = pytest.mark.slow
PASS = "eval/saar_off/all/pass_at_1"


@pytest.fixture(scope="module")
def store(tracked_run):
    import mlflow
    from mlflow import MlflowClient

    work, result = tracked_run
    uri = f"sqlite:///{work / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    client = MlflowClient(uri, registry_uri=uri)
    con = duckdb.connect(str(work / "cleaner.duckdb"), read_only=True)
    evals = {v: p for v, p in con.execute(f"SELECT policy_version, value FROM evaluations WHERE key = '{PASS}'").fetchall()}
    trajs = con.execute("SELECT step, traj_id, rollbacks_triggered, reward FROM trajectories").pl()
    execs = con.execute("SELECT step, count(*) FROM tool_executions GROUP BY step").fetchall()
    con.close()
    run = client.get_run(result["mlflow_run_id"])
    return SimpleNamespace(work=work, result=result, uri=uri, client=client, run=run, evals=evals, trajs=trajs,
                           execs=dict(execs), experiment=client.get_experiment(run.info.experiment_id))


def test_the_experiment_is_a_training_experiment_and_the_run_describes_itself(store):
    assert store.experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    assert store.run.info.run_name == "browsertest"
    note = store.run.data.tags["mlflow.note.content"]
    assert "config `tiny`" in note and "arm **cleaner**" in note and "2 RL steps" in note
    assert f"final **{store.evals[2]:.3f}** (policy 2)" in note
    flow_run = store.run.data.tags["prefect.flow_run_id"]
    assert store.run.data.tags["prefect.flow_run_url"].endswith(f"/flow-runs/flow-run/{flow_run}")
    assert f"[{flow_run}](" in note and "`@best` is version" in note


def test_prompt_sets_are_dataset_inputs(store):
    inputs = {i.tags[0].value: i.dataset for i in store.run.inputs.dataset_inputs}
    assert set(inputs) == {"training", "evaluation"}
    assert '"num_rows": 64' in inputs["training"].profile and '"num_rows": 8' in inputs["evaluation"].profile
    assert inputs["training"].source.endswith(str(store.work / "train.parquet") + '"}')
    assert "prompt" in inputs["evaluation"].schema and "reward_model" in inputs["evaluation"].schema


def test_system_and_sandbox_metrics(store):
    history = {k: store.client.get_metric_history(store.run.info.run_id, k) for k in
               ("system/cpu_utilization_percentage", "system/system_memory_usage_megabytes", "sandbox/executions",
                "sandbox/p50_ms", "sandbox/p99_ms", "sandbox/infra_retries")}
    assert history["system/cpu_utilization_percentage"] and history["system/system_memory_usage_megabytes"]
    assert {m.step: m.value for m in history["sandbox/executions"]} == {s: float(n) for s, n in store.execs.items()}
    for p50, p99 in zip(history["sandbox/p50_ms"], history["sandbox/p99_ms"], strict=True):
        assert 0 < p50.value <= p99.value
    assert all(m.value == 0 for m in history["sandbox/infra_retries"])


def test_every_trajectory_of_a_small_step_is_a_tagged_trace(store):
    import mlflow

    for step in (0, 1):
        found = mlflow.search_traces(locations=[store.experiment.experiment_id], run_id=store.run.info.run_id,
                                     filter_string=f"tags.kind = 'train' AND tags.step = '{step}'",
                                     return_type="list", max_results=200)
        rows = store.trajs.filter(store.trajs["step"] == step)
        assert len(found) == rows.height  # 16 trajectories <= traces_per_step
        want = {(r["rollbacks_triggered"] > 0, f"{r['reward']:g}") for r in rows.iter_rows(named=True)}
        assert {(t.info.tags["rollback"] == "true", t.info.tags["reward"]) for t in found} == want
        assert {t.info.tags["arm"] for t in found} == {"cleaner"}
    evals = mlflow.search_traces(locations=[store.experiment.experiment_id], filter_string="tags.kind = 'eval'",
                                 return_type="list", max_results=200)
    assert {(t.info.tags["eval_mode"], t.info.tags["step"]) for t in evals} == {
        (m, v) for m in ("saar_off", "saar_on") for v in ("0", "2")}
    assert len(evals) == 2 * 2 * 8 * 2  # modes x evaluations x prompts x samples


def test_evaluated_checkpoints_are_logged_models_with_their_metrics(store):
    outputs = {o.step: o.model_id for o in store.run.outputs.model_outputs}
    assert sorted(outputs) == [0, 2]
    for version, model_id in outputs.items():
        model = store.client.get_logged_model(model_id)
        assert model.tags["cleaner.policy_version"] == str(version) and model.source_run_id == store.run.info.run_id
        linked = {m.key: m for m in model.metrics}
        assert linked[PASS].value == pytest.approx(store.evals[version]) and linked[PASS].step == version
        assert linked[PASS].dataset_name.endswith("/eval")


def test_the_registry_serves_best_and_latest_and_they_generate(store):
    import mlflow.transformers

    best = store.client.get_model_version_by_alias("tiny", "best")
    latest = store.client.get_model_version_by_alias("tiny", "latest")
    assert latest.tags["cleaner.policy_version"] == "2"
    best_version = max(store.evals, key=lambda v: (store.evals[v], v))
    assert best.tags["cleaner.policy_version"] == str(best_version)
    assert model_id_of(best) == best.tags["cleaner.model_id"]
    assert store.client.get_logged_model(model_id_of(best)).tags["mlflow.modelVersions"].count('"tiny"') >= 1
    pipe = mlflow.transformers.load_model("models:/tiny@best")
    out = pipe([{"role": "user", "content": "What is 12 + 30?"}], max_new_tokens=24, do_sample=False)
    reply = out[0]["generated_text"][-1]
    assert reply["role"] == "assistant" and len(reply["content"]) > 0


def test_a_smoke_run_from_the_shell_leaves_the_registry_alone(store, warm_model_dir):
    """A second, 1-step run into the same store, evaluated, without `tracking.register_models`: no new version, `@latest`
    and `@best` where they were, and its description says why."""
    from flows.train import train

    before = {a: store.client.get_model_version_by_alias("tiny", a).version for a in ("best", "latest")}
    versions = len(store.client.search_model_versions("name = 'tiny'"))
    result = train("configs/tiny.yaml", [*tiny_overrides(store.work, warm_model_dir, steps=1), *EVAL_OVERRIDES],
                   "smoke")
    assert {a: store.client.get_model_version_by_alias("tiny", a).version for a in ("best", "latest")} == before
    assert len(store.client.search_model_versions("name = 'tiny'")) == versions
    smoke = store.client.get_run(result["mlflow_run_id"])
    assert len(smoke.outputs.model_outputs) == 2  # policies 0 and 1 were evaluated and logged
    assert "No model version registered: a run started from the shell leaves the registry alone" in \
        smoke.data.tags["mlflow.note.content"]


def test_cleaner_eval_takes_a_registered_model_and_links_its_metrics(store, warm_model_dir):
    from flows.evaluate import evaluate_flow

    overrides = [*tiny_overrides(store.work, warm_model_dir), *EVAL_OVERRIDES, "eval.modes=[saar_off]"]
    with run_log_lines() as lines:
        metrics = evaluate_flow("configs/tiny.yaml", overrides, "models:/tiny@best", "eval-best")
    best = store.client.get_model_version_by_alias("tiny", "best")
    eval_run = store.client.search_runs([store.client.get_experiment_by_name("tiny-eval").experiment_id],
                                        filter_string="tags.`cleaner.run_id` = 'eval-best'")[0]
    assert eval_run.data.tags["cleaner.model_id"] == best.tags["cleaner.model_id"]
    linked = [m for m in store.client.get_logged_model(best.tags["cleaner.model_id"]).metrics
              if m.key == PASS and m.run_id == eval_run.info.run_id]
    assert [m.value for m in linked] == [pytest.approx(metrics[PASS])]
    line = f"eval models:/tiny@best | pass@1 SAAR off {metrics[PASS]:.3g} | first try "
    assert any(m.startswith(line) for m in lines), lines  # the evaluation line it printed


def test_the_flow_run_publishes_its_prefect_artifacts(store):
    from uuid import UUID

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    flow_run = UUID(store.run.data.tags["prefect.flow_run_id"])
    with get_client(sync_client=True) as client:
        arts = client.read_artifacts(artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run])))
    by_key = {a.key: a for a in arts}
    assert set(by_key) == {"tiny-mlflow-run", "tiny-progress", "tiny-summary"}
    assert f"/runs/{store.run.info.run_id}?workflowType=machine_learning" in by_key["tiny-mlflow-run"].data
    assert by_key["tiny-progress"].type == "progress" and by_key["tiny-progress"].data == 100.0
    assert "# Training run summary" in by_key["tiny-summary"].data
