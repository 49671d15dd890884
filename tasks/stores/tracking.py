"""MLflow tracking: one experiment per config name, one run per training run, resumed by tag.

* ``open_run`` finds the MLflow run tagged ``cleaner.run_id`` = our run id (a rerun continues it)
  or creates it, logging the flattened config as params once and the resolved config as JSON.
* ``log_step`` logs a step's metrics in one batch with ``step=`` and its artifacts.
* The run page's "Model metrics" shows one chart section per key prefix (all but the last ``/`` part), sections
  sorted by name (MLflow 3.17's ``getBaseChartAndSectionConfigs``: capitals before lower case). The charts a user
  wants first — held-out pass@1, reward, SAAR recovery — are therefore logged a second time under
  ``Key metrics/`` (``KEY_METRICS``), the first section; bookkeeping flags that are 0 in nearly every run
  (``QUIET_WHEN_ZERO``, e.g. ``early_stopped/empty_filtered_steps``, the first section otherwise) reach MLflow only
  when set. DuckDB keeps every metric as it was computed.
* A tracking server that is down is a clear error before any work (``check_server``).

The default store is ``sqlite:///mlflow.db`` with artifacts in ``./mlartifacts``; browse it
with ``mlflow ui --backend-store-uri sqlite:///mlflow.db``.
"""

from __future__ import annotations

import functools
import json
import os
import time
from pathlib import Path

import httpx

from tasks.stores.config import TrackingConfig
from tasks.stores.locks import locked

RUN_TAG = "cleaner.run_id"
STEP_SENTINEL = "run/step"
EVAL_SENTINEL = "run/eval_version"
KEY_METRICS = {"eval/saar_off/all/pass_at_1": "Key metrics/heldout_pass_at_1",
               "rollout/reward_mean": "Key metrics/reward_mean",
               "saar/global_recovery_rate": "Key metrics/saar_recovery_rate"}
"""MLflow copies of the metrics a user looks at first, in the section the run page shows first."""
QUIET_WHEN_ZERO = ("early_stopped/empty_filtered_steps",)
"""Bookkeeping flags sent to MLflow only when nonzero (a chart of zeros would head the run's metrics)."""
KIND_TAG, TRAINING_KIND = "mlflow.experimentKind", "custom_model_development"
"""MLflow's experiment kind: the model-training view (not GenAI: no Evaluations breadcrumb or assistant panel)."""


class TrackingUnavailable(RuntimeError):
    """The MLflow tracking server does not answer."""


def check_server(uri: str, timeout_s: float = 5.0) -> None:
    """Fail fast with a clear message when an HTTP tracking server is down."""
    if not uri.startswith(("http://", "https://")):
        return
    try:
        httpx.get(uri.rstrip("/") + "/health", timeout=timeout_s).raise_for_status()
    except httpx.HTTPError as err:
        raise TrackingUnavailable(f"tracking.mlflow_uri: MLflow server {uri} is unreachable ({err})") from err


def _client(cfg: TrackingConfig):
    """A client whose requests to a tracking server are retried ``http_retries`` times, not MLflow's 7."""
    from mlflow.tracking import MlflowClient

    os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = str(cfg.http_retries)
    os.environ["MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"] = "1"
    os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = str(int(max(1, cfg.http_timeout_s)))
    if cfg.mlflow_uri.startswith("sqlite:///") and cfg.mlflow_uri not in _CREATED:
        return _create_once(cfg.mlflow_uri)
    return MlflowClient(tracking_uri=cfg.mlflow_uri)


_CREATED: set[str] = set()


def _create_once(uri: str):
    """The first client of a sqlite store in this process, made under a lock file beside it: MLflow creates (or
    migrates) the schema of the file then, and runs started together on a new file raced there ('table datasets
    already exists')."""
    from mlflow.tracking import MlflowClient

    path = Path(uri.removeprefix("sqlite:///"))
    path.parent.mkdir(parents=True, exist_ok=True)
    with locked(f"{path}.lock"):
        client = MlflowClient(tracking_uri=uri)
    _CREATED.add(uri)
    return client


def _unreachable(err: Exception) -> bool:
    """Whether an MLflow client error means the server did not answer (not a bad request)."""
    import requests

    text = str(err)
    return isinstance(err, requests.exceptions.RequestException) or (
        "API request to" in text and "failed with exception" in text)


def named_errors(fn):
    """Re-raise a tracking server that stopped answering as ``TrackingUnavailable`` naming the config key."""

    @functools.wraps(fn)
    def wrapper(cfg: TrackingConfig, *args, **kwargs):
        try:
            return fn(cfg, *args, **kwargs)
        except Exception as err:
            if not cfg.mlflow_uri.startswith("http") or not _unreachable(err):
                raise
            raise TrackingUnavailable(
                f"tracking.mlflow_uri: MLflow server {cfg.mlflow_uri} did not answer after "
                f"{cfg.http_retries} retries ({str(err).splitlines()[0][:300]})") from err

    return wrapper


def flatten(tree: dict, prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = json.dumps(v) if isinstance(v, (list, tuple)) else str(v)
    return out


@named_errors
def open_run(cfg: TrackingConfig, experiment: str, run_id: str, config: dict, tags: dict[str, str]) -> str:
    """The MLflow run id for our ``run_id``: resumed when it exists, else created with params."""
    from mlflow.entities import Param, RunTag

    check_server(cfg.mlflow_uri)
    client = _client(cfg)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        location = None if cfg.mlflow_uri.startswith("http") else Path(cfg.artifact_root).resolve().as_uri()
        exp_id = client.create_experiment(experiment, artifact_location=location, tags={KIND_TAG: TRAINING_KIND})
    else:
        exp_id = exp.experiment_id
        if KIND_TAG not in exp.tags:
            client.set_experiment_tag(exp_id, KIND_TAG, TRAINING_KIND)
    found = client.search_runs([exp_id], filter_string=f"tags.`{RUN_TAG}` = '{run_id}'", max_results=1)
    if found:
        mlrun = found[0].info.run_id
        client.update_run(mlrun, status="RUNNING")
        return mlrun
    mlrun = client.create_run(exp_id, run_name=run_id, tags={RUN_TAG: run_id, **tags}).info.run_id
    params = [Param(k, v[:6000]) for k, v in flatten(config).items()]
    for lo in range(0, len(params), 100):
        client.log_batch(mlrun, params=params[lo : lo + 100])
    client.log_batch(mlrun, tags=[RunTag("mlflow.note.content", f"CLEANER run `{run_id}`")])
    client.log_text(mlrun, json.dumps(config, indent=2), "config/resolved_config.json")
    return mlrun


def for_mlflow(metrics: dict[str, float]) -> dict[str, float]:
    """The metrics as MLflow gets them: ``KEY_METRICS`` copied under ``Key metrics/``, ``QUIET_WHEN_ZERO`` flags
    left out while 0."""
    out = {k: v for k, v in metrics.items() if not (k in QUIET_WHEN_ZERO and v == 0)}
    out.update({KEY_METRICS[k]: v for k, v in metrics.items() if k in KEY_METRICS})
    return out


def _log_once(client, mlrun: str, step: int, metrics: dict[str, float], sentinel: str, model_id: str | None = None,
              dataset: tuple[str, str] | None = None) -> None:
    """Log ``metrics`` at ``step`` unless ``sentinel`` says this step is already in the run.

    The sentinel goes in the same batch (one transaction), so a crash never leaves half a step.
    ``model_id`` links the metrics to a logged model, ``dataset`` (name, digest) to the dataset they measure.
    """
    from mlflow.entities import Metric

    if step in {m.step for m in client.get_metric_history(mlrun, sentinel)}:
        return
    now = int(time.time() * 1000)
    name, digest = dataset or (None, None)
    batch = [Metric(k, float(v), now, step, model_id=model_id, dataset_name=name, dataset_digest=digest)
             for k, v in sorted(for_mlflow(metrics).items())]
    batch.append(Metric(sentinel, float(step), now, step))
    for lo in range(0, len(batch), 1000):
        client.log_batch(mlrun, metrics=batch[lo : lo + 1000])


@named_errors
def log_step(cfg: TrackingConfig, mlrun: str, step: int, metrics: dict[str, float], texts: dict[str, str]) -> None:
    """Metrics of one step in one batch, plus text artifacts (path → content).

    Idempotent: when this step's metrics are already in the run (a crash after logging, then
    a rerun), they are not logged twice; artifacts are simply overwritten.
    """
    client = _client(cfg)
    _log_once(client, mlrun, step, metrics, STEP_SENTINEL)
    for path, text in texts.items():
        client.log_text(mlrun, text, path)


@named_errors
def log_eval(cfg: TrackingConfig, mlrun: str, version: int, metrics: dict[str, float], model_id: str | None = None,
             dataset: tuple[str, str] | None = None) -> None:
    """Evaluation metrics of a policy version (MLflow step = version) and a table artifact; idempotent.

    ``model_id``: the logged model evaluated (its page shows the metrics); ``dataset``: the held-out set."""
    client = _client(cfg)
    _log_once(client, mlrun, version, metrics, EVAL_SENTINEL, model_id, dataset)
    client.log_text(mlrun, json.dumps(metrics, indent=1, sort_keys=True), f"eval/policy_{version:06d}.json")


@named_errors
def log_file(cfg: TrackingConfig, mlrun: str, local: Path, artifact_dir: str) -> None:
    _client(cfg).log_artifact(mlrun, str(local), artifact_dir)


@named_errors
def finish_run(cfg: TrackingConfig, mlrun: str, status: str = "FINISHED") -> None:
    _client(cfg).set_terminated(mlrun, status=status)


@named_errors
def logged_steps(cfg: TrackingConfig, mlrun: str, sentinel: str = STEP_SENTINEL) -> set[int]:
    """Steps whose metrics are already in the MLflow run."""
    return {m.step for m in _client(cfg).get_metric_history(mlrun, sentinel)}


@named_errors
def end_run(cfg: TrackingConfig, experiment: str, run_id: str, status: str) -> str | None:
    """Mark our run's MLflow run ``status`` (KILLED, FAILED) if it is still RUNNING; returns its id, if any."""
    client = _client(cfg)
    exp = client.get_experiment_by_name(experiment)
    found = exp and client.search_runs([exp.experiment_id], filter_string=f"tags.`{RUN_TAG}` = '{run_id}'",
                                       max_results=1)
    if not found:
        return None
    if found[0].info.status == "RUNNING":
        client.set_terminated(found[0].info.run_id, status=status)
    return found[0].info.run_id
