"""The steps of a train run (``flows.train``): the stage tasks, and the schedule that runs them.

Each task wraps one function of ``tasks.training.stages``, hands it its own frozen setup (``RunConfig.setups()``)
and hands the next one a path (the step folder, a checkpoint folder). Stage tasks are cached on (run, step, stage,
hash of the setups the stage reads, policy version) with persisted results in the run folder (``results``); a
cached result counts only while the stage's output files exist. The stage modules (torch) are imported inside the
tasks, so importing this module loads no torch.

``steps`` runs a run's steps through ``tasks.training.schedule``: at ``rollout.staleness`` 0 (and evaluations in
line) every stage runs in the flow process in today's order. At k ≥ 1 the rollout and score tasks of step s
(policy version s − k) are submitted as task runs on the flow's task runner (``beside``) and their bodies call the
stage in the rollout lane (``tasks.training.lanes``: a worker process with ``engine.threads`` torch threads, its
engine kept loaded), while mix, advantage, update and log run in the flow process (``trainer.threads``); with
``eval.beside_training`` the evaluations go to an evaluation lane likewise. The lanes write row-log units only; the
flow process ingests them after each log and at the end. A step's waits (``tasks.training.schedule.PERF``) go
into its ``perf.metrics.json`` before its log, so the step's metrics (DuckDB, MLflow) carry them.

Run: through ``cleaner train --config configs/tiny.yaml`` (``flows.train``).
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import time
from collections.abc import Callable
from contextlib import contextmanager
from functools import partial
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from flows.attempts import retry_unless_fenced
from flows.config import RunConfig
from flows.prepare import RunInfo, ckpt_dir, step_dir
from flows.train_log import eval_line, step_line
from tasks.stores import db, fence, links, rowlog
from tasks.stores.registry import ModelRef
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


def in_lane(lane: str | None, threads: int, module: str, function: str, *args):
    """``module.function(*args)``: in this process (``lane`` None, as every synchronous run), else in the process's
    lane ``lane`` (``tasks.training.lanes``: a worker with ``threads`` torch threads, its engine kept loaded)."""
    if lane is None:
        return getattr(importlib.import_module(module), function)(*args)
    from tasks.training.lanes import get_lane

    return get_lane(lane, threads).call(module, function, *args)


@task(name="rollout", **STAGE)
def rollout_task(setups: StepSetups, info: RunInfo, step: int, policy: str, lane: str | None = None) -> str:
    """Roll out the step with ``policy`` (in the rollout lane ``lane`` when it runs beside the update)."""
    args, threads = (step_dir(info, step), step, policy, info.run_id, setups.rollout), setups.rollout.engine.threads
    if setups.rollout.env is not None:
        return str(in_lane(lane, threads, "tasks.training.env_stages", "env_rollout_stage", *args))
    return str(in_lane(lane, threads, "tasks.training.stages", "rollout_stage", *args))


@task(name="score", **STAGE)
def score_task(setups: StepSetups, info: RunInfo, step: int, policy: str, lane: str | None = None) -> str:
    threads = setups.rollout.engine.threads
    if setups.score.env is not None:
        return str(in_lane(lane, threads, "tasks.training.env_stages", "env_score_stage", step_dir(info, step)))
    return str(in_lane(lane, threads, "tasks.training.stages", "score_stage", step_dir(info, step), setups.score))


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


@task(name="log", **STAGE)
def log_task(setups: StepSetups, info: RunInfo, step: int, policy: str, new_policy: str,
             tags: dict[str, str] | None = None) -> str:
    """Log the step to both stores; returns the step folder (``results``: what every attempt returns alike)."""
    from tasks.training import stages

    stages.log_stage(step_dir(info, step), step, info.run_id, info.mlflow_run_id, new_policy, setups.log, tags)
    return str(step_dir(info, step))


@task(name="evaluate", **STAGE)
def eval_task(setups: StepSetups, info: RunInfo, version: int, policy: str, final: bool = False,
              model: ModelRef | None = None, tags: dict[str, str] | None = None, lane: str | None = None,
              helpers: tuple[tuple[str, int], ...] = ()) -> str:
    """Evaluate policy ``version`` (at the size of the last evaluation when ``final``; in the evaluation lane
    ``lane`` when it runs beside training, its prompts rolled out in parts pulled by ``lane`` and the idle
    ``helpers`` lanes, (name, threads) each, as each comes free: ``tasks.training.eval_shards``); ``model`` and
    ``tags`` say where the metrics and traces go in MLflow (not part of the cache key, nor is where it runs).
    Returns the evaluation's key in the row log (``eval-<version>`` of the run: ``results``, what every attempt
    returns alike)."""
    threads = setups.eval.engine.threads if lane else 0
    if setups.eval.env is not None:
        in_lane(lane, threads, "tasks.training.env_stages", "env_eval_stage", info.run_id, version, policy,
                info.mlflow_run_id, setups.eval, model, tags)
        return f"{info.run_id}/eval-{version:06d}"
    setup, rolled, parts, lanes = setups.eval_setup(final), None, 1, ((lane, threads), *helpers) if lane else ()
    if len(lanes) > 1:
        from tasks.training.eval_shards import part_count, roll_across

        parts = part_count(len(lanes))
        rolled = roll_across([partial(in_lane, name, n) for name, n in lanes], policy, setup, parts)
    in_lane(lane, threads, "tasks.training.stages", "eval_stage", info.run_id, version, policy, info.mlflow_run_id,
            setup, model, tags, rolled, parts)
    return f"{info.run_id}/eval-{version:06d}"


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
             tags: dict[str, str], lane: str | None = None, helpers: tuple[tuple[str, int], ...] = ()) -> str:
    """Run the evaluation task of policy ``version`` (unless a newer attempt replaced this one)."""
    with named_stage("evaluate", version, info.run_dir):
        fence.check(info.run_dir)
        return eval_task.with_options(result_storage=results(info))(setups, info, version, policy, final, model, tags,
                                                                    lane, helpers)



def _prune(info: RunInfo, keep: int, current: Path, *used: Path) -> None:
    """Remove all but the newest ``keep`` checkpoints (never ``current`` nor those still ``used``: sampled by a
    rollout to come, evaluated beside training), and the temporary checkpoint folders
    other processes left (a crashed or replaced attempt's: no other attempt writes while this one holds the run);
    fenced: a replaced attempt removes none of its replacement's."""
    with fence.guarded(info.run_dir):
        for tmp in (Path(info.run_dir) / "checkpoints").glob(".policy_??????.*.tmp"):
            if not tmp.name.split(".")[2].startswith(f"{os.getpid()}-"):
                shutil.rmtree(tmp, ignore_errors=True)
        folders = sorted((Path(info.run_dir) / "checkpoints").glob("policy_??????"))
        for old in folders[:-keep]:
            if old != current and old not in used:
                shutil.rmtree(old, ignore_errors=True)
                shutil.rmtree(old.with_name(old.name + "-merged"), ignore_errors=True)  # an SGLang server's copy



@task(name="beside", cache_policy=NO_CACHE)
def beside_task(call: Callable, args: tuple):
    """A call the schedule runs beside the trainer (``tasks.training.schedule``): the rollout and score tasks of a
    step, or an evaluation task, each a task run of its own inside this one, their bodies in a lane."""
    return call(*args)


def submit(call: Callable, *args):
    """The schedule's ``submit``: ``call(*args)`` as a task run on the flow's task runner (Prefect's future)."""
    return beside_task.submit(call, args)


def steps(cfg: RunConfig, info: RunInfo, artifacts: links.FlowArtifacts, tags: dict[str, str],
          model: ModelRef) -> tuple[str, dict[int, float], dict[int, dict[str, float]]]:
    """The evaluations and RL steps of a run (each stage a task) at staleness ``rollout.staleness``, evaluations
    beside training with ``eval.beside_training`` (``tasks.training.schedule``), a line printed for each; returns
    the final checkpoint, the step times and the evaluations (policy version → metrics, read from the committed
    rows)."""
    from tasks.training.schedule import StepFns, eval_on_both_lanes, run_steps

    setups = cfg.setups(info.start_ckpt)
    k, beside = cfg.rollout.staleness, cfg.eval.beside_training
    evals: dict[int, dict[str, float]] = {}
    walls: dict[int, float] = {}
    mark = [time.perf_counter()]  # when the trainer became free for the next step

    def policy(version: int) -> str:
        return info.start_ckpt if version == 0 else str(ckpt_dir(info, version))

    def rollout(step: int, version: int) -> None:
        step_dir(info, step).mkdir(parents=True, exist_ok=True)
        for stage in ("rollout", "score"):
            run_stage(stage, setups, info, step, policy(version), *(("rollout",) if k else ()))

    def train(step: int) -> None:
        for stage in ("mix", "advantage", "update"):
            run_stage(stage, setups, info, step, policy(step))

    def log(step: int, perf: dict[str, float]) -> bool:
        return _log(cfg, info, setups, step, policy(step), policy(step + 1), tags, perf, walls, mark, artifacts,
                    [Path(policy(v)) for v in range(1, step + 2) if v >= step + 1 - k or v in pending_evals(step)])

    def pending_evals(step: int) -> set[int]:  # handed over or to come, not yet done (``evals`` is set when done)
        return {v for v in range(step + 2) if eval_due(cfg, v) and v not in evals}

    def evaluate(version: int) -> None:  # the last one also on the rollout lane, idle by then
        last = version == cfg.train.steps
        run_eval(setups, info, version, policy(version), last, model, tags, "eval" if beside else None,
                 (("rollout", setups.rollout.engine.threads),) if eval_on_both_lanes(last, k, beside) else ())
        evals[version] = eval_metrics(cfg, info, version)
        print(eval_line(version, evals[version], evals.get(0)))
        if not beside:
            mark[0] = time.perf_counter()

    timeline = run_steps(cfg.train.steps, StepFns(rollout, train, log, evaluate, lambda v: eval_due(cfg, v)), k,
                         submit, beside)
    if k or beside:
        _ingest(cfg)
    if beside:
        print(f"the run's end waited {timeline.eval_wait_s:.1f} s for the evaluations beside training")
    return policy(max(walls) + 1 if walls else 0), walls, evals


def _log(cfg: RunConfig, info: RunInfo, setups: StepSetups, step: int, ckpt: str, new_ckpt: str, tags: dict,
         perf: dict[str, float], walls: dict[int, float], mark: list[float], artifacts: links.FlowArtifacts,
         used: list[Path]) -> bool:
    """Log a step (its waits ``perf`` in ``perf.metrics.json`` first, so the log stage writes them), print its line,
    prune old checkpoints (not those ``used``); returns whether the run stops early."""
    from tasks.training.stages import stage_metrics

    here = step_dir(info, step)
    if perf and not (here / "logged.json").exists():
        fence.publish_text(here / PERF_FILE, json.dumps(perf, indent=1))
    run_stage("log", setups, info, step, ckpt, new_ckpt, tags)
    if perf:
        _ingest(cfg)  # the rows the lanes wrote (they write row-log units only)
    metrics = stage_metrics(here)
    now = time.perf_counter()
    walls[step], mark[0] = now - mark[0], now
    print(step_line(step, metrics, walls[step]))
    _prune(info, cfg.train.keep_checkpoints, Path(new_ckpt), *used)
    artifacts.step_done(step, step_line(step, metrics))
    if _empty_stop(cfg, metrics):
        print(f"early stop: the group filter kept nothing for {cfg.mix.group_filter.empty_stop_steps} steps in a row")
        return True
    return False


PERF_FILE = "perf.metrics.json"
"""A step's waits (``tasks.training.schedule.PERF``) when stages ran beside each other, logged with its metrics."""


def _ingest(cfg: RunConfig) -> None:
    """Load the row-log units the lanes wrote into the store (a rows-only flow process leaves it to its compare)."""
    if not db.rows_only():
        db.try_ingest(cfg.tracking.duckdb_path)


def _empty_stop(cfg: RunConfig, metrics: dict) -> bool:
    """RAGEN-2's early stop: ``empty_stop_steps`` consecutive steps whose group filter kept nothing."""
    return metrics.get("early_stopped/empty_filtered_steps", 0.0) >= 1.0
