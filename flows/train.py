"""Prefect flow ``train``: RL steps of rollout → score → mix → advantage → update → log.

The flow only sequences stages (the stage tasks and the schedule of the steps: ``flows.train_steps``; with
``rollout.staleness`` ≥ 1 the rollout of the next step runs beside the update, with ``eval.beside_training`` the
evaluations beside training); each task wraps one function of ``tasks.training.stages``, hands
it its own frozen setup (``RunConfig.setups()``) and hands the next one a path (the step folder,
a checkpoint folder). Stage tasks are cached on (run, step, stage, hash of the setups the stage
reads, policy version) with persisted results (see ``tasks.training.setups``), so training the
same run id again — ``cleaner resume <run>`` after a crash, or with more ``train.steps`` —
skips every finished stage and continues at the first one left to do, from the last
checkpoint (with its optimizer state) and the same MLflow run. A cached result counts only
while the stage's output files exist. The stage modules (torch) are imported inside the tasks,
so importing this module — what Prefect does to read the flow's parameters — loads no torch. The run's start (data
files, starting policy, run folder, MLflow run, row: the ``prepare-run`` task) is ``flows.prepare``.

Results live in the run folder (``runs/<id>/results``), so the cache belongs to the run, whatever
PREFECT_HOME the shell has. A run started without ``run_id`` gets one derived from its Prefect flow run, so a
Prefect retry of that flow run (UI Retry, ``prefect flow-run retry``) resumes it; an attempt that crashes, is
cancelled or fails leaves its MLflow run and DuckDB row with that status (flow hooks) until resumed.

One writer per run folder: each attempt claims the run folder when it starts (``tasks.stores.fence``), and every
write of a stage (step files, checkpoints, row-log units, done markers) is fenced, so an attempt that a newer one
replaced — a rescheduled dispatched run whose old process was only stalled, a ``cleaner resume`` started beside
the running attempt — stops at its next write with ``FencedError`` and writes nothing more. It ends visibly: its
flow run fails with the fencing message; when the newer attempt is the same flow run (a reschedule), the replaced
one logs the message and aborts without reporting a state (Prefect's ``Abort``: the state is the newer attempt's).

Run: ``cleaner train --config configs/tiny.yaml`` (ephemeral Prefect; no server needed).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from flows.attempts import ending, fenced_end
from flows.config import RunConfig, load_config
from flows.dispatch import check_worker
from flows.prepare import ORIGIN, RunInfo, default_run_id, prepare_run
from flows.train_steps import (
    STAGE,
    STEP_TASKS,
    StageFailed,
    _prune,
    eval_due,
    eval_metrics,
    eval_task,
    log_task,
    named_stage,
    results,
    run_eval,
    run_stage,
    stage_key,
    steps,
)
from models.termination import arm
from tasks.stores import db, fence, links, registry, trace_writer, tracking
from tasks.stores.registry import ModelRef
from tasks.stores.system import system_metrics
from tasks.training import live

__all__ = ["STAGE", "STEP_TASKS", "RunInfo", "StageFailed", "_prune", "eval_due", "eval_metrics", "eval_task",
           "log_task", "named_stage", "results", "run_eval", "run_stage", "stage_key", "train"]

def arm_of(cfg: RunConfig) -> str:
    """The arm label of a run: ``tracking.arm``, else what its config does (cleaner, dapo, saar_all, r3l)."""
    if cfg.tracking.arm:
        return cfg.tracking.arm
    if cfg.rollout.mode != "standard":
        return cfg.rollout.mode
    if not cfg.rollout.saar.enabled:
        return "dapo"
    return "saar_all" if cfg.rollout.saar.raw_share == 0 else "cleaner"


def trace_tags(cfg: RunConfig, info: RunInfo) -> dict[str, str]:
    return {"arm": arm_of(cfg)}


def model_name(cfg: RunConfig) -> str:
    return cfg.tracking.registered_model or cfg.name


@task(name="annotate-run", cache_policy=NO_CACHE)
def annotate_task(cfg: RunConfig, info: RunInfo, flow_run_id: str, parent: str | None) -> str:
    """Prompt sets as dataset inputs, the run description and its Prefect links; returns the run's UI URL. Fenced:
    a replaced attempt writes none of them."""
    text = links.describe(info.run_id, cfg.name, arm_of(cfg), cfg.train.steps, flow_run_id, parent=parent)
    with fence.guarded(info.run_dir):
        return links.annotate_run(cfg.tracking, info.mlflow_run_id, {"training": cfg.data.train_path,
                                                                  "evaluation": cfg.data.eval_path}, text, flow_run_id)


@task(name="finish-run", cache_policy=NO_CACHE)
def finish_task(cfg: RunConfig, info: RunInfo, final_ckpt: str, flow_run_id: str, parent: str | None) -> dict:
    """Plots, the registered models, the final description; marks the run finished. Returns a Markdown summary
    (``markdown``) and the registered versions (``registered``: final, run_best, best; empty when none).

    Fenced (``tasks.stores.fence``): checked before the final checkpoint's upload (itself fenced where it becomes
    READY), then every write — plots, registry aliases, description, the MLflow run's and the row's status — is one
    commit under the run's fence, so a replaced attempt finishes nothing of its replacement's run."""
    fence.check(info.run_dir)
    if cfg.tracking.log_models and not registry.run_models(cfg.tracking, info.mlflow_run_id, info.run_id):
        registry.log_checkpoint(cfg.tracking, info.mlflow_run_id, info.run_id, model_name(cfg), Path(final_ckpt),
                                cfg.train.steps, {})
    with fence.guarded(info.run_dir):
        png, (text, registered) = _plots(cfg, info), _register(cfg, info, flow_run_id, parent)
        tracking.finish_run(cfg.tracking, info.mlflow_run_id)
        db.set_status(cfg.tracking.duckdb_path, info.run_id, "finished")
    url = links.run_url(cfg.tracking, links.experiment_of(cfg.tracking, info.mlflow_run_id), info.mlflow_run_id)
    print(f"MLflow run {info.run_id}: {url}")
    return {"markdown": links.summary_markdown(text, url, str(png)), "registered": registered or {}}


def _plots(cfg: RunConfig, info: RunInfo) -> Path:
    """The run's plots, in its folder and as MLflow artifacts; returns the summary plot."""
    from tasks.reports.plots import plot_panels, plot_run

    metrics = db.run_metrics(cfg.tracking.duckdb_path, info.run_id)
    png = plot_run(metrics, Path(info.run_dir) / "plots" / "summary.png", f"{info.run_id}")
    extra = []
    if cfg.env is not None:
        from tasks.envs.plots import plot_collapse

        extra.append(plot_collapse(metrics, Path(info.run_dir) / "plots" / "collapse.png", info.run_id))
    for f in [png, *plot_panels(metrics, Path(info.run_dir) / "plots", info.run_id), *extra]:
        tracking.log_file(cfg.tracking, info.mlflow_run_id, f, "plots")
    return png


def _register(cfg: RunConfig, info: RunInfo, flow_run_id: str, parent: str | None) -> str:
    """Register the run's models (when it registers) and set its final description; returns the description."""
    registered, skipped = None, None
    if cfg.tracking.log_models:
        origin = json.loads((Path(info.run_dir) / ORIGIN).read_text())
        if registry.wants_registration(cfg.tracking.register_models, origin.get("deployment_id"), parent):
            registered = registry.register_run(cfg.tracking, info.mlflow_run_id, info.run_id, model_name(cfg))
        else:
            skipped = registry.NOT_REGISTERED
            print(skipped.replace("`", ""))
    evals = db.eval_pass_at_1(cfg.tracking.duckdb_path, info.run_id)
    text = links.describe(info.run_id, cfg.name, arm_of(cfg), cfg.train.steps, flow_run_id,
                          links.pass_by_version(evals.to_dicts()), registered, parent, skipped)
    links.set_description(cfg.tracking, info.mlflow_run_id, text)
    return text, registered


def _ended(mlflow_status: str, db_status: str):
    """A flow hook giving an attempt that ended without finishing a terminal status in both stores; a retry of the
    same flow run resumes the run and sets it running again. An attempt a newer one replaced (fenced, or a later
    run of the same flow run) leaves both to the newer attempt; the check and the writes are one step
    (``flows.attempts.ending``)."""

    def hook(flow, flow_run, state) -> None:
        params = flow_run.parameters or {}
        cfg = load_config(params.get("config_path", "configs/tiny.yaml"), params.get("overrides"))
        run_id = params.get("run_id") or default_run_id(cfg.name, str(flow_run.id), flow_run.name)
        with ending(Path(cfg.output_dir) / run_id, flow_run) as newer:
            if newer is not None:
                print(f"{newer}: the run's status is left to the newer attempt")
                return
            tracking.end_run(cfg.tracking, cfg.tracking.experiment or cfg.name, run_id, mlflow_status)
            db.end_run(cfg.tracking.duckdb_path, run_id, db_status)

    hook.__name__ = f"mark_run_{db_status}"
    return hook


@flow(name="train", log_prints=True, on_running=[arm], on_crashed=[_ended("FAILED", "crashed")],
      on_cancellation=[_ended("KILLED", "cancelled")], on_failure=[_ended("FAILED", "failed")])
def train(config_path: str = "configs/tiny.yaml", overrides: list[str] | None = None, run_id: str | None = None,
          parent_mlflow_run: str | None = None, store_token: dict[str, str] | None = None) -> dict:
    """Train a policy with CLEANER; returns the run id, MLflow run id and final checkpoint. ``store_token`` (set by
    a dispatching compare: token file → token) makes the run check, before anything else, that it shares the
    compare's stores (``flows.dispatch.check_worker``)."""
    from prefect.runtime import flow_run

    cfg = load_config(config_path, overrides)
    run_id = run_id or default_run_id(cfg.name, flow_run.get_id(), flow_run.get_name())
    flow_run_id = str(flow_run.get_id() or "")
    if store_token is not None:
        check_worker(cfg, run_id, store_token)
    try:
        return _train(cfg, run_id, flow_run_id, parent_mlflow_run)
    except fence.FencedError as err:
        ending = fenced_end(err, flow_run_id)
        if ending is err:
            raise
        raise ending from err


def _train(cfg: RunConfig, run_id: str, flow_run_id: str, parent_mlflow_run: str | None) -> dict:
    with named_stage("prepare-run", 0):
        info = prepare_run(cfg, run_id, flow_run_id, parent_mlflow_run)
    artifacts = links.FlowArtifacts(cfg.name, cfg.train.steps)
    artifacts.start(annotate_task(cfg, info, flow_run_id, parent_mlflow_run), run_id)
    with system_metrics(cfg.tracking, info.mlflow_run_id, info.run_id):
        ckpt, walls, evals = steps(cfg, info, artifacts, trace_tags(cfg, info), ModelRef(name=model_name(cfg)))
        trace_writer.flush()  # every step's traces are in MLflow (or the run fails) before it is finished
        write_walltime(Path(info.run_dir), flow_run_id, walls)
        with named_stage("finish-run", cfg.train.steps, info.run_dir):
            finished = finish_task(cfg, info, ckpt, flow_run_id, parent_mlflow_run)
    artifacts.finish(finished["markdown"])
    live.close_live()
    png = str(Path(info.run_dir) / "plots" / "summary.png")
    return {**asdict(info), "final_checkpoint": ckpt, "plot": png, "step_wall_s": walls, "evaluations": evals,
            "registered": finished["registered"]}


def write_walltime(run_dir: Path, flow_run_id: str, walls: dict[int, float]) -> None:
    """The step times of this flow run's attempt, ``walltime-<flow run>.json`` in the run folder (fenced)."""
    fence.publish_text(run_dir / f"walltime-{flow_run_id or 'local'}.json", json.dumps(walls))


