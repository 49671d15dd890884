"""Prefect flow ``train``: RL steps of rollout → score → mix → advantage → update → log.

The flow only sequences stages; each task wraps one function of ``tasks.training.stages``, hands
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
import os
import shutil
import time
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from flows.attempts import ending, fenced_end, retry_unless_fenced
from flows.config import RunConfig, load_config
from flows.dispatch import check_worker
from flows.prepare import ORIGIN, RunInfo, ckpt_dir, default_run_id, prepare_run, step_dir
from flows.train_log import eval_line, step_line
from models.termination import arm
from tasks.stores import db, fence, links, registry, rowlog, trace_writer, tracking
from tasks.stores.registry import ModelRef
from tasks.stores.system import system_metrics
from tasks.training import live
from tasks.training.setups import StepSetups

TASK_STAGE = {"evaluate": "eval"}
"""Task name → stage name of ``StepSetups`` where they differ."""


def stage_key(context, params: dict) -> str:
    """Cache key of a stage task: (run, step, stage, hash of the setups it reads, policy version)."""
    step = params["version"] if "version" in params else params["step"]
    stage = TASK_STAGE.get(context.task.name, context.task.name)
    return params["setups"].key(params["info"].run_id, step, stage, params["policy"], params.get("final", False))


STAGE = dict(cache_key_fn=stage_key, persist_result=True, retries=1, retry_delay_seconds=2,
             retry_condition_fn=retry_unless_fenced)


@task(name="rollout", **STAGE)
def rollout_task(setups: StepSetups, info: RunInfo, step: int, policy: str) -> str:
    if setups.rollout.env is not None:
        from tasks.training.env_stages import env_rollout_stage

        return str(env_rollout_stage(step_dir(info, step), step, policy, info.run_id, setups.rollout))
    from tasks.training import stages

    return str(stages.rollout_stage(step_dir(info, step), step, policy, info.run_id, setups.rollout))


@task(name="score", **STAGE)
def score_task(setups: StepSetups, info: RunInfo, step: int, policy: str) -> str:
    if setups.score.env is not None:
        from tasks.training.env_stages import env_score_stage

        return str(env_score_stage(step_dir(info, step)))
    from tasks.training import stages

    return str(stages.score_stage(step_dir(info, step), setups.score))


@task(name="mix", **STAGE)
def mix_task(setups: StepSetups, info: RunInfo, step: int, policy: str) -> str:
    from tasks.training import stages
    from tasks.training.env_stages import previous_empty_steps

    here = step_dir(info, step)
    return str(stages.mix_stage(here, setups.mix, previous_empty_steps(here)))


@task(name="advantage", **STAGE)
def advantage_task(setups: StepSetups, info: RunInfo, step: int, policy: str) -> str:
    from tasks.training import stages

    return str(stages.advantage_stage(step_dir(info, step), setups.advantage))


@task(name="update", **STAGE)
def update_task(setups: StepSetups, info: RunInfo, step: int, policy: str) -> str:
    from tasks.training import stages

    return str(stages.update_stage(step_dir(info, step), policy, ckpt_dir(info, step + 1), setups.update))


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


@task(name="log", **STAGE)
def log_task(setups: StepSetups, info: RunInfo, step: int, policy: str, new_policy: str,
             tags: dict[str, str] | None = None) -> str:
    """Log the step to both stores; returns the step folder (``results``: what every attempt returns alike)."""
    from tasks.training import stages

    stages.log_stage(step_dir(info, step), step, info.run_id, info.mlflow_run_id, new_policy, setups.log, tags)
    return str(step_dir(info, step))


@task(name="evaluate", **STAGE)
def eval_task(setups: StepSetups, info: RunInfo, version: int, policy: str, final: bool = False,
              model: ModelRef | None = None, tags: dict[str, str] | None = None) -> str:
    """Evaluate policy ``version`` (at the size of the last evaluation when ``final``); ``model`` and ``tags``
    say where the metrics and traces go in MLflow (not part of the cache key). Returns the evaluation's key in
    the row log (``eval-<version>`` of the run: ``results``, what every attempt returns alike)."""
    if setups.eval.env is not None:
        from tasks.training.env_stages import env_eval_stage

        env_eval_stage(info.run_id, version, policy, info.mlflow_run_id, setups.eval, model, tags)
    else:
        from tasks.training import stages

        stages.eval_stage(info.run_id, version, policy, info.mlflow_run_id, setups.eval_setup(final), model, tags)
    return f"{info.run_id}/eval-{version:06d}"


def model_name(cfg: RunConfig) -> str:
    return cfg.tracking.registered_model or cfg.name


def eval_due(cfg: RunConfig, version: int) -> bool:
    """Whether the run evaluates policy ``version``: every ``train.eval_every`` steps, the last, and the start unless
    ``train.eval_at_start`` is off."""
    every = cfg.train.eval_every
    if version == 0 and not cfg.train.eval_at_start:
        return False
    return bool(every) and (version % every == 0 or version == cfg.train.steps)


STEP_TASKS = {"rollout": rollout_task, "score": score_task, "mix": mix_task, "advantage": advantage_task,
              "update": update_task, "log": log_task}


def results(info: RunInfo) -> Path:
    """Where stage results (and so the stage cache) live: in the run folder, not in a user's PREFECT_HOME, so a
    retry, ``cleaner resume`` from any shell, or a worker sharing the run folder finds them (Prefect stores a
    task's results under a ``Path`` given as its result storage).

    Prefect writes a result itself, outside the fence, so the results are idempotent instead: a stage task returns
    only what is the same for every attempt of the run — the path of its output (the step folder, the checkpoint),
    the key of its rows — never a figure it computed, and a result is keyed by the stage's cache key. A replaced
    attempt whose stage finished its own (fenced) writes just before the claim writes the same record the live
    attempt writes; the figures are read from the committed files."""
    return (Path(info.run_dir) / "results").resolve()


class StageFailed(RuntimeError):
    """A stage of the run failed (after its task retries); the message names the stage, the step and the error, so
    the flow run's final state says what failed (``prefect deployment run --watch``, the UI, ``flow-run inspect``)."""


@contextmanager
def named_stage(stage: str, step: int, run_dir: str | None = None):
    """Name the stage and step in a failure; a failure of an attempt that a newer one replaced (``run_dir``'s
    claim) is that attempt's ``FencedError``, whatever failed first."""
    try:
        yield
    except fence.FencedError:
        raise
    except Exception as err:
        fenced = fence.superseded(run_dir) if run_dir else None
        if fenced is not None:
            raise fenced from err
        raise StageFailed(f"stage '{stage}' of step {step} failed: {type(err).__name__}: {err}") from err


def run_stage(name: str, setups: StepSetups, info: RunInfo, step: int, policy: str, *extra):
    """Run a stage task (unless a newer attempt replaced this one); its cached result is reused only while the
    stage's output files exist."""
    marker = step_dir(info, step) / ("logged.json" if name == "log" else f"{name}.metrics.json")
    with named_stage(name, step, info.run_dir):
        fence.check(info.run_dir)
        return STEP_TASKS[name].with_options(refresh_cache=not marker.exists(), result_storage=results(info))(
            setups, info, step, policy, *extra)


def eval_metrics(cfg: RunConfig, info: RunInfo, version: int) -> dict[str, float]:
    """The figures of policy ``version``'s evaluation as committed (the row log's unit ``eval-<version>``), whichever
    attempt wrote them: what the evaluation line prints and the run returns."""
    rows = rowlog.read_unit(cfg.tracking.duckdb_path, info.run_id, "eval", version)
    return dict(zip(rows["evaluations"]["key"], rows["evaluations"]["value"])) if rows else {}


def run_eval(setups: StepSetups, info: RunInfo, version: int, policy: str, final: bool, model: ModelRef,
             tags: dict[str, str]) -> str:
    """Run the evaluation task of policy ``version`` (unless a newer attempt replaced this one)."""
    with named_stage("evaluate", version, info.run_dir):
        fence.check(info.run_dir)
        return eval_task.with_options(result_storage=results(info))(setups, info, version, policy, final, model, tags)


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


def _prune(info: RunInfo, keep: int, current: Path) -> None:
    """Remove all but the newest ``keep`` checkpoints (never ``current``), and the temporary checkpoint folders
    other processes left (a crashed or replaced attempt's: no other attempt writes while this one holds the run);
    fenced: a replaced attempt removes none of its replacement's."""
    with fence.guarded(info.run_dir):
        for tmp in (Path(info.run_dir) / "checkpoints").glob(".policy_??????.*.tmp"):
            if not tmp.name.split(".")[2].startswith(f"{os.getpid()}-"):
                shutil.rmtree(tmp, ignore_errors=True)
        folders = sorted((Path(info.run_dir) / "checkpoints").glob("policy_??????"))
        for old in folders[:-keep]:
            if old != current:
                shutil.rmtree(old, ignore_errors=True)
                shutil.rmtree(old.with_name(old.name + "-merged"), ignore_errors=True)  # an SGLang server's copy


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
        ckpt, walls, evals = _steps(cfg, info, artifacts)
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


def _steps(cfg: RunConfig, info: RunInfo,
           artifacts: links.FlowArtifacts) -> tuple[str, dict[int, float], dict[int, dict[str, float]]]:
    """The evaluations and RL steps of a run (each stage a task), a line printed for each; returns the final
    checkpoint, the step times and the evaluations (policy version → metrics, read from the committed rows)."""
    from tasks.training.stages import stage_metrics

    ckpt = info.start_ckpt
    setups = cfg.setups(info.start_ckpt)
    tags, model = trace_tags(cfg, info), ModelRef(name=model_name(cfg))
    evals: dict[int, dict[str, float]] = {}

    def evaluate(version: int, policy: str) -> None:
        run_eval(setups, info, version, policy, version == cfg.train.steps, model, tags)
        evals[version] = eval_metrics(cfg, info, version)
        print(eval_line(version, evals[version], evals.get(0)))

    if eval_due(cfg, 0):
        evaluate(0, ckpt)
    walls: dict[int, float] = {}
    for step in range(cfg.train.steps):
        t0 = time.perf_counter()
        step_dir(info, step).mkdir(parents=True, exist_ok=True)
        for stage in ("rollout", "score", "mix", "advantage"):
            run_stage(stage, setups, info, step, ckpt)
        new_ckpt = run_stage("update", setups, info, step, ckpt)
        run_stage("log", setups, info, step, ckpt, new_ckpt, tags)
        metrics = stage_metrics(step_dir(info, step))
        ckpt = new_ckpt
        walls[step] = time.perf_counter() - t0
        print(step_line(step, metrics, walls[step]))
        if eval_due(cfg, step + 1):
            evaluate(step + 1, ckpt)
        _prune(info, cfg.train.keep_checkpoints, Path(ckpt))
        artifacts.step_done(step, step_line(step, metrics))
        if _empty_stop(cfg, metrics):
            print(f"early stop: the group filter kept nothing for {cfg.mix.group_filter.empty_stop_steps} steps in a "
                  "row")
            break
    return ckpt, walls, evals


def _empty_stop(cfg: RunConfig, metrics: dict) -> bool:
    """RAGEN-2's early stop: ``empty_stop_steps`` consecutive steps whose group filter kept nothing."""
    return metrics.get("early_stopped/empty_filtered_steps", 0.0) >= 1.0
