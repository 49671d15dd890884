"""The attempt fence on a run's MLflow writes and on the train flow's own checks (issue 50, item 2).

This process claims the run folder as attempt ``A``; a second process claims it as ``B`` — before a write, or
(where the write follows a committed one in the same stage) right after the write before it, as a claim landing in
between does. Every write of the replaced attempt must raise ``FencedError`` and leave the MLflow run (a real sqlite
store), the registry, the row log and the run folder as they were: step and evaluation metrics, traces, logged
models, plots, registry aliases, the description, the run's end, system metrics. The checks before costly work
(``run_stage``, ``run_eval``, ``finish_task``) must stop the attempt before its task runs, and a stage failing after
its attempt was replaced must fail as that attempt's ``FencedError``. Dropping any one guard fails its test.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import polars as pl
import pytest
from mlflow import MlflowClient

from tasks.stores import db, fence, rowlog, tracking
from tasks.stores.config import TrackingConfig
from tasks.stores.fence import FencedError
from tests.test_fence import KEYS, ROOT, RUN, _replace
from tests.test_mlflow_traces import tables  # noqa: F401 - the fixture of hand-built step tables

STEP = Path("steps") / "000000"


@pytest.fixture
def run_dir(tmp_path):
    folder = tmp_path / "runs" / RUN
    fence.claim(folder, RUN, "A")
    (folder / STEP).mkdir(parents=True)
    yield folder
    fence.release(folder)


@pytest.fixture(scope="module")
def mlflow_store(tmp_path_factory) -> tuple[TrackingConfig, str]:
    """A real sqlite MLflow store (made once: its schema takes seconds) and its experiment."""
    work = tmp_path_factory.mktemp("mlflow")
    cfg = TrackingConfig(mlflow_uri=f"sqlite:///{work / 'm.db'}", artifact_root=str(work / "art"),
                         sample_trajectories=0, traces_per_step=64)
    tracking.open_run(cfg, "tiny", "first", {}, {})
    return cfg, MlflowClient(cfg.mlflow_uri).get_experiment_by_name("tiny").experiment_id


@pytest.fixture
def store(mlflow_store, tmp_path) -> tuple[TrackingConfig, str]:
    """A fresh MLflow run of our run in the store, and the run's row (running) in a store of the test's own."""
    cfg, experiment_id = mlflow_store
    cfg = cfg.model_copy(update={"duckdb_path": str(tmp_path / "c.duckdb")})
    mlrun = MlflowClient(cfg.mlflow_uri).create_run(experiment_id, tags={tracking.RUN_TAG: RUN}).info.run_id
    db.upsert_run(cfg.duckdb_path, RUN, "tiny", {}, mlrun, "running")
    return cfg, mlrun


def _mlflow_state(cfg: TrackingConfig, mlrun: str) -> dict:
    """What a write of the run could change in MLflow: metrics, tags, status, artifacts, logged models (any status),
    traces, registered models."""
    import mlflow

    client = MlflowClient(cfg.mlflow_uri, registry_uri=cfg.mlflow_uri)
    run = client.get_run(mlrun)
    mlflow.set_tracking_uri(cfg.mlflow_uri)
    return {"metrics": run.data.metrics, "tags": run.data.tags, "status": run.info.status,
            "artifacts": sorted(f.path for f in client.list_artifacts(mlrun)),
            "models": len(client.search_logged_models([run.info.experiment_id],
                                                      filter_string=f"source_run_id = '{mlrun}'")),
            "traces": len(mlflow.search_traces(locations=[run.info.experiment_id], run_id=mlrun,
                                               return_type="list")),
            "registered": len(client.search_registered_models())}


def test_step_metrics_commit_under_the_fence(run_dir, store, monkeypatch):
    """The claim lands right after the step's rows: its MLflow metrics are not written."""
    from tasks.training import stages
    from tasks.training.setups import LogSetup

    cfg, mlrun = store
    step = run_dir / STEP
    (step / "rollout.metrics.json").write_text(json.dumps({"rollout/accuracy": 0.5}))
    monkeypatch.setattr(stages, "read_table", lambda folder, name: pl.DataFrame(KEYS))
    monkeypatch.setattr(stages.db, "replace_step", lambda *args: _replace(run_dir))
    before = _mlflow_state(cfg, mlrun)
    with pytest.raises(FencedError, match="fenced — attempt B"):
        stages.log_stage(step, 0, RUN, mlrun, "ckpt", LogSetup(tracking=cfg.model_copy(
            update={"background_traces": True})))
    assert _mlflow_state(cfg, mlrun) == before
    assert not (step / "logged.json").exists()


def test_step_traces_commit_under_the_fence(run_dir, store, tables):  # noqa: F811
    from tasks.training.stages import TRACES_DONE, _step_traces

    cfg, mlrun = store
    trajs, execs, events = tables
    step = run_dir / STEP
    trajs.write_parquet(step / "trajectories.parquet")
    frames = {"trajectories": trajs, "tool_executions": execs, "saar_events": events}
    _replace(run_dir)
    before = _mlflow_state(cfg, mlrun)
    with pytest.raises(FencedError, match="fenced — attempt B"):
        _step_traces(step, 0, mlrun, cfg, frames, {}, 0.0)
    assert _mlflow_state(cfg, mlrun) == before and not (step / TRACES_DONE).exists()
    fence.release(run_dir)
    _step_traces(step, 0, mlrun, cfg, frames, {}, 0.0)  # unfenced, the same call writes them
    assert _mlflow_state(cfg, mlrun)["traces"] == 2


def test_evaluation_metrics_commit_under_the_fence(run_dir, store):
    from tasks.training.stages import track_eval

    cfg, mlrun = store
    _replace(run_dir)
    before = _mlflow_state(cfg, mlrun)
    with pytest.raises(FencedError, match="fenced — attempt B"):
        track_eval(cfg, mlrun, RUN, 0, "ckpt", {"eval/saar_off/all/pass_at_1": 0.5}, None, None, {}, [])
    assert _mlflow_state(cfg, mlrun) == before


def test_a_replaced_attempts_logged_model_never_becomes_ready(run_dir, store, warm_model_dir):
    from tasks.stores import registry

    cfg, mlrun = store
    _replace(run_dir)
    with pytest.raises(FencedError, match="fenced — attempt B"):
        registry.log_checkpoint(cfg, mlrun, RUN, "tiny", warm_model_dir, 1, {"eval/saar_off/all/pass_at_1": 0.5})
    client = MlflowClient(cfg.mlflow_uri)
    found = client.search_logged_models([client.get_run(mlrun).info.experiment_id],
                                        filter_string=f"source_run_id = '{mlrun}'")
    assert [str(m.status) for m in found] == ["PENDING"], "the upload is its own, never READY"
    assert registry.run_models(cfg, mlrun, RUN) == [] and client.get_run(mlrun).outputs.model_outputs == []


def _finish_cfg(tmp_path: Path, cfg: TrackingConfig):
    from flows.config import load_config

    return load_config(str(ROOT / "configs/tiny.yaml"), [
        f"output_dir={tmp_path / 'runs'}", f"tracking.mlflow_uri={cfg.mlflow_uri}",
        f"tracking.artifact_root={cfg.artifact_root}", f"tracking.duckdb_path={cfg.duckdb_path}",
        "tracking.register_models=true", "train.steps=1"])


def test_a_replaced_attempt_finishes_nothing(run_dir, store, tmp_path, warm_model_dir):
    """No final model uploaded, no plot, no alias, no description, no end of the MLflow run or the row."""
    from flows.prepare import ORIGIN, RunInfo
    from flows.train import finish_task

    cfg, mlrun = store
    (run_dir / ORIGIN).write_text(json.dumps({"flow_run_id": "f", "deployment_id": None}))
    _replace(run_dir)
    before = _mlflow_state(cfg, mlrun)
    info = RunInfo(RUN, str(run_dir), mlrun, str(warm_model_dir))
    with pytest.raises(FencedError, match="fenced — attempt B"):
        finish_task.fn(_finish_cfg(tmp_path, cfg), info, str(warm_model_dir), "f", None)
    assert _mlflow_state(cfg, mlrun) == before
    assert not (run_dir / "plots").exists()
    assert rowlog.read_unit(cfg.duckdb_path, RUN, "run")["runs"]["status"].to_list() == ["running"]


def test_the_finish_commits_under_the_fence_once_its_model_is_logged(run_dir, store, tmp_path, warm_model_dir,
                                                                       monkeypatch):
    """The claim lands while the final model uploads: the plots, registry, description and end are not written."""
    from flows import train
    from flows.prepare import ORIGIN, RunInfo

    cfg, mlrun = store
    (run_dir / ORIGIN).write_text(json.dumps({"flow_run_id": "f", "deployment_id": None}))
    monkeypatch.setattr(train.registry, "log_checkpoint", lambda *args: _replace(run_dir))
    before = _mlflow_state(cfg, mlrun)
    info = RunInfo(RUN, str(run_dir), mlrun, str(warm_model_dir))
    with pytest.raises(FencedError, match="fenced — attempt B"):
        train.finish_task.fn(_finish_cfg(tmp_path, cfg), info, str(warm_model_dir), "f", None)
    assert _mlflow_state(cfg, mlrun) == before and not (run_dir / "plots").exists()
    assert rowlog.read_unit(cfg.duckdb_path, RUN, "run")["runs"]["status"].to_list() == ["running"]


def test_system_metrics_stop_at_the_claim(run_dir, store):
    from tasks.stores.system import system_metrics

    cfg, mlrun = store
    client = MlflowClient(cfg.mlflow_uri)

    def samples() -> int:
        return len(client.get_metric_history(mlrun, "system/cpu_utilization_percentage"))

    with system_metrics(cfg.model_copy(update={"system_metrics_interval_s": 0.2}), mlrun, RUN):
        deadline = time.monotonic() + 60
        while samples() < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert samples() >= 2, "the monitor wrote no sample"
        _replace(run_dir)
        at_claim = samples()
        time.sleep(1.5)
    assert samples() == at_claim, "the replaced attempt's monitor wrote samples after the claim"


class _Recorded:
    """A stage task stand-in with the contract ``run_stage`` / ``run_eval`` use: ``with_options(...)(*args)``."""

    def __init__(self):
        self.calls = []

    def with_options(self, **_options):
        return lambda *args: self.calls.append(args) or "ran"


def test_a_replaced_attempt_runs_no_stage_task(run_dir, monkeypatch):
    from flows import train
    from flows.prepare import RunInfo

    recorded = _Recorded()
    monkeypatch.setitem(train.STEP_TASKS, "mix", recorded)
    info = RunInfo(RUN, str(run_dir), "ml", "start")
    assert train.run_stage("mix", None, info, 0, "start") == "ran"  # the attempt holding the run runs it
    _replace(run_dir)
    with pytest.raises(FencedError, match="fenced — attempt B"):
        train.run_stage("mix", None, info, 0, "start")
    assert len(recorded.calls) == 1, "the replaced attempt ran the stage"


def test_a_replaced_attempt_runs_no_evaluation(run_dir, monkeypatch):
    from flows import train_steps as train
    from flows.prepare import RunInfo

    recorded = _Recorded()
    monkeypatch.setattr(train, "eval_task", recorded)
    info = RunInfo(RUN, str(run_dir), "ml", "start")
    assert train.run_eval(None, info, 0, "start", False, None, {}) == "ran"
    _replace(run_dir)
    with pytest.raises(FencedError, match="fenced — attempt B"):
        train.run_eval(None, info, 0, "start", False, None, {})
    assert len(recorded.calls) == 1, "the replaced attempt ran the evaluation"


def test_a_stage_failing_after_its_attempt_was_replaced_fails_as_fenced(run_dir):
    from flows.train import StageFailed, named_stage

    with pytest.raises(StageFailed, match="stage 'mix' of step 0 failed: OSError: disk full"):
        with named_stage("mix", 0, str(run_dir)):
            raise OSError("disk full")
    _replace(run_dir)
    with pytest.raises(FencedError, match="fenced — attempt B") as caught:
        with named_stage("mix", 0, str(run_dir)):
            raise OSError("disk full")
    assert isinstance(caught.value.__cause__, OSError)


def test_a_checkpoint_write_clears_the_leftovers_of_crashed_or_replaced_writers(tmp_path, warm_model_dir):
    from models.checkpoint import copy_checkpoint

    ckpts = tmp_path / "checkpoints"
    for name in (".policy_000001.tmp", ".policy_000001.999999-0badc0de.tmp", ".policy_000002.999999-0badc0de.tmp",
                 "policy_000000"):
        (ckpts / name).mkdir(parents=True)
    copy_checkpoint(warm_model_dir, ckpts / "policy_000001")
    assert sorted(p.name for p in ckpts.iterdir()) == [".policy_000002.999999-0badc0de.tmp", "policy_000000",
                                                      "policy_000001"]



def test_stage_results_are_the_same_for_every_attempt(tmp_path, prefect_harness, monkeypatch):
    """Prefect writes a stage's result record itself (outside the fence), so it must be idempotent: the log and
    evaluation tasks, whose figures differ between attempts, return the step folder and the evaluation's key, and
    the record a replaced attempt writes under the stage's key is byte for byte the live attempt's."""
    import random
    from types import SimpleNamespace

    from flows import train
    from flows.prepare import RunInfo
    from tasks.training import stages

    info = RunInfo(RUN, str(tmp_path / "runs" / RUN), "ml", "start")
    setups = SimpleNamespace(log=None, eval=SimpleNamespace(env=None), eval_setup=lambda final: None)
    monkeypatch.setattr(stages, "log_stage", lambda *args: {"rollout/accuracy": random.random()})
    monkeypatch.setattr(stages, "eval_stage", lambda *args: {"eval/saar_off/all/pass_at_1": random.random()})
    for task, args, returned in ((train.log_task, (0, "p0", "p1"), str(tmp_path / "runs" / RUN / STEP)),
                                 (train.eval_task, (3, "p3"), f"{RUN}/eval-000003")):
        records = []
        for _attempt in range(2):
            run = task.with_options(cache_key_fn=lambda *_: "stage-key", refresh_cache=True,
                                    result_storage=tmp_path / task.name)
            assert run(setups, info, *args) == returned
            records.append((tmp_path / task.name / "stage-key").read_bytes())
        assert records[0] == records[1], f"{task.name}: the second attempt's result record differs"


def test_a_replaced_attempt_annotates_nothing(run_dir, store, tmp_path):
    from flows.prepare import RunInfo
    from flows.train import annotate_task

    cfg, mlrun = store
    _replace(run_dir)
    before = _mlflow_state(cfg, mlrun)
    with pytest.raises(FencedError, match="fenced — attempt B"):
        annotate_task.fn(_finish_cfg(tmp_path, cfg), RunInfo(RUN, str(run_dir), mlrun, "start"), "f", None)
    assert _mlflow_state(cfg, mlrun) == before


def test_a_replaced_attempt_opens_no_mlflow_run(tmp_path, monkeypatch, warm_model_dir):
    """Replaced in its own preparation (right after its origin file): it neither creates the MLflow run nor sets
    it RUNNING again under the newer attempt."""
    from flows import prepare

    cfg = TrackingConfig(mlflow_uri=f"sqlite:///{tmp_path / 'own.db'}", artifact_root=str(tmp_path / "art"))
    run_cfg = _finish_cfg(tmp_path, cfg.model_copy(update={"duckdb_path": str(tmp_path / "c.duckdb")}))
    run_cfg = run_cfg.model_copy(update={"model": run_cfg.model.model_copy(update={"path": str(warm_model_dir)})})
    real = prepare.write_origin

    def origin_then_replaced(run_dir, flow_run_id):
        real(run_dir, flow_run_id)
        _replace(run_dir)

    monkeypatch.setattr(prepare, "write_origin", origin_then_replaced)
    try:
        with pytest.raises(FencedError, match="fenced — attempt B"):
            prepare.prepare_run.fn(run_cfg, RUN, "f")
    finally:
        fence.release(tmp_path / "runs" / RUN)
    client = MlflowClient(cfg.mlflow_uri)
    exp = client.get_experiment_by_name("tiny")
    assert exp is None or not client.search_runs([exp.experiment_id])
