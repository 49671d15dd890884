"""The stages of one RL step as plain functions over files: what the Prefect tasks call.

Every stage reads the step folder, writes its own files there, and records its metrics and
wall time in ``<stage>.metrics.json``; it returns only paths or small dicts, never tensors.

    rollout   → trajectories / turns / executions / saar_events / r3l_reflections .parquet
                (+ partial_buffer.parquet, partial_state.json with rollout.partial)
    score     → scores.parquet
    mix       → mix.parquet
    advantage → advantages.parquet
    update    → the next checkpoint folder
    log       → DuckDB rows + MLflow metrics and artifacts

The in-process engine and the sandbox pool are kept per process (``tasks.training.live``) and
reused by later steps; the engine receives each new checkpoint's weights (the weight sync).
"""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from pathlib import Path

import polars as pl

from models.checkpoint import copy_checkpoint, policy_version
from models.config import ChatConfig
from models.splice import trains
from models.trainer import Sample, update
from tasks.data.loader import load_prompts, refill_batch
from tasks.r3l.grouping import SINGLETON_KINDS
from tasks.r3l.records import empty_frame
from tasks.reports.plots import sample_texts
from tasks.reports.viewer import render_step_viewer
from tasks.rewards.record import trajectory_info
from tasks.rewards.registry import GraderError, compute_reward
from tasks.rewards.scoring import score_step
from tasks.rollout.buffer import BUFFER_FILE
from tasks.rollout.machine import Rollout
from tasks.rollout.saar import aggregate_stats
from tasks.stores import db, fence, registry, trace_writer, traces, tracking
from tasks.stores.config import TrackingConfig
from tasks.stores.datasets import dataset_ref
from tasks.stores.records import read_table, trajectory_frames, write_frames
from tasks.stores.registry import ModelRef
from tasks.stores.system import sandbox_metrics
from tasks.training.evaluation import evaluate, evaluate_fresh
from tasks.training.faults import maybe_crash
from tasks.training.live import get_chat, get_engine, get_sandbox
from tasks.training.mixing import advantage_step, fill_batch, mix_step
from tasks.training.partial_stage import partial_rollout
from tasks.training.rollout_modes import make_mode
from tasks.training.setups import AdvantageSetup, EvalSetup, LogSetup, MixSetup, RolloutSetup, ScoreSetup, UpdateSetup


@contextmanager
def _timed(step_dir: Path, stage: str, metrics: dict):
    """Time a stage, then write ``<stage>.metrics.json`` — the file that marks the stage done."""
    t0 = time.perf_counter()
    yield
    metrics[f"time/{stage}_s"] = time.perf_counter() - t0
    fence.publish_text(done_marker(step_dir, stage), json.dumps(metrics, indent=1))
    maybe_crash(f"after_{stage}", _step_of(step_dir))


def done_marker(step_dir: Path, stage: str) -> Path:
    return Path(step_dir) / f"{stage}.metrics.json"


def _step_of(step_dir: Path) -> int:
    return int(Path(step_dir).name)


def rollout_stage(step_dir: Path, step: int, ckpt: str, run_id: str, setup: RolloutSetup) -> Path:
    """Roll out the step's prompts in ``rollout.mode`` (plus DAPO refill rounds while too few groups are informative);
    with ``rollout.partial`` APRIL's partial rollouts instead (``tasks.training.partial_stage``)."""
    metrics: dict = {}
    seed, rollout = setup.seed, setup.rollout
    with _timed(step_dir, "rollout", metrics):
        chat = get_chat(ckpt, setup.chat)
        items = load_prompts(setup.train_path)
        box = get_sandbox(setup.sandbox)
        runner = Rollout(rollout, get_engine(setup.engine, ckpt, chat), chat, box)
        runner.policy_version = policy_version(ckpt)  # stamped on every sampled token (``sampled_version``)
        used: set[str] = set()

        def draw(round_: int, n: int):
            batch = refill_batch(items, n, seed, step, round_, used)
            used.update(i.prompt_id for i in batch)
            return batch

        def grade(t) -> float | None:
            try:
                return compute_reward(t.item.data_source, chat.decode(t.response_ids), t.item.ground_truth,
                                      trajectory_info(t), sandbox=box, cfg=setup.reward).reward
            except GraderError:
                return None

        mode = make_mode(runner, rollout, grade)
        before, t0 = _pool_stats(box), time.perf_counter()
        if rollout.partial.enabled:
            trajs, refill = partial_rollout(Path(step_dir), step, seed, run_id, runner, items, rollout,
                                            setup.prompts_per_step, grade, setup.dynamic_sampling)
        else:
            trajs, refill = fill_batch(draw, lambda batch, round_: mode.run(batch, seed, step, refill_round=round_),
                                       mode.group_rewards, setup.prompts_per_step, setup.refill_rounds,
                                       group_of=lambda t: t.item.prompt_id)
        frames = trajectory_frames(trajs, run_id, step, chat.decode)
        metrics.update(sandbox_metrics(frames["executions"], before, _pool_stats(box), time.perf_counter() - t0))
        write_frames({**frames, **mode.frames(run_id, step)}, Path(step_dir))
        rolled = [t for t in trajs if t.kind not in SINGLETON_KINDS]  # R3L reflect/retry rows repeat others' turns
        metrics.update(aggregate_stats([t.stats for t in rolled], [t.raw for t in rolled]))
        metrics.update(mode.metrics(trajs))
        metrics.update(refill)
        metrics["rollout/tool_wait_s"] = runner.tool_wait_s
    return Path(step_dir)


def _pool_stats(box) -> dict[str, float]:
    """The sandbox pool's counters (empty for a sandbox without them)."""
    return box.stats() if hasattr(box, "stats") else {}


def score_stage(step_dir: Path, setup: ScoreSetup) -> Path:
    metrics: dict = {}
    with _timed(step_dir, "score", metrics):
        metrics.update(score_step(step_dir, setup.reward, setup.score, setup.max_response_tokens,
                                  get_sandbox(setup.sandbox)))
    return Path(step_dir)


def mix_stage(step_dir: Path, setup: MixSetup, empty_before: int = 0) -> Path:
    """Mix one step; ``empty_before``: consecutive steps before this one whose filter kept nothing."""
    metrics: dict = {}
    with _timed(step_dir, "mix", metrics):
        metrics.update(mix_step(step_dir, setup.mix, setup.mini_batches, empty_before))
    return Path(step_dir)


def advantage_stage(step_dir: Path, setup: AdvantageSetup) -> Path:
    metrics: dict = {}
    with _timed(step_dir, "advantage", metrics):
        metrics.update(advantage_step(step_dir, setup.mix))
    return Path(step_dir)


def update_stage(step_dir: Path, ckpt: str, out_ckpt: Path, setup: UpdateSetup) -> Path:
    """Train on the kept rows; with none kept the policy is unchanged (copied), ``train/skipped`` = 1 and
    ``train/no_informative_groups`` = the step's group count (no loss is logged: there was none).

    ``setup.reference`` is the KL reference (the run's starting policy), read only when ``trainer.kl_coef > 0``.

    The checkpoint's ``trainer_state.json`` records the step and policy version. Data order,
    raw-share draws, sampling and update randomness are pure functions of (seed, step) — the
    update of step s is seeded with ``seed * 100_003 + s`` — so the optimizer state is the only
    state a resumed run needs besides the weights.
    """
    metrics: dict = {}
    trainer, seed, ref_ckpt = setup.trainer, setup.seed * 100_003 + _step_of(step_dir), setup.reference
    with _timed(step_dir, "update", metrics):
        samples = [Sample(r["prompt_ids"], r["response_ids"], r["response_mask"], r["advantage"],
                          r.get("rollout_logprobs"), r.get("reward") or 0.0, r.get("group_id") or r["prompt_id"],
                          r.get("traj_id") or "", r.get("spliced"), r.get("sampled_version"))
                   for r in training_rows(step_dir).iter_rows(named=True)
                   if trains(r["response_mask"], r.get("spliced"), trainer.splice)]
        pad = get_chat(ckpt, ChatConfig()).tokenizer.pad_token_id or 0
        step = _step_of(step_dir)
        state = {"step": step, "policy_version": Path(out_ckpt).name, "seed": seed}
        if samples:
            metrics.update(update(Path(ckpt), samples, trainer, Path(out_ckpt), pad, seed, state,
                                  on_step=lambda: maybe_crash("in_update", step),
                                  ref_dir=Path(ref_ckpt) if ref_ckpt else None, commit=fence.guarded))
            metrics.update({"train/skipped": 0, "train/no_informative_groups": 0})
        else:
            copy_checkpoint(Path(ckpt), Path(out_ckpt), state, commit=fence.guarded)
            groups = int(json.loads(done_marker(step_dir, "mix").read_text()).get("mix/groups", 0))
            print(f"step {step}: no informative groups ({groups} groups, all dropped: equal rewards in each); "
                  "the policy is unchanged")
            metrics.update({"train/skipped": 1, "train/no_informative_groups": groups})
    return Path(out_ckpt)


def training_rows(step_dir: Path) -> pl.DataFrame:
    """The rows the update trains on: kept by the mix stage, not dropped by the advantage estimator; their
    ``response_mask`` is the advantage stage's ``loss_mask`` when it wrote one (``mix.failed_turns=mask``)."""
    keys = ["run_id", "step", "traj_id"]
    df = read_table(step_dir, "trajectories").join(read_table(step_dir, "advantages"), on=keys)
    df = df.join(read_table(step_dir, "scores").select([*keys, "reward"]), on=keys)
    df = df.join(read_table(step_dir, "mix"), on=keys).filter(pl.col("kept"))
    if "dropped" in df.columns:  # absent in step folders written before estimators could drop rows
        df = df.filter(~pl.col("dropped"))
    if "loss_mask" in df.columns:  # mix.failed_turns=mask: the failed turns out of the loss
        df = df.with_columns(pl.col("loss_mask").alias("response_mask")).drop("loss_mask")
    return df


def read_reflections(step_dir: Path) -> pl.DataFrame:
    """The step's R3L reflections (an empty table for steps rolled out before the table existed)."""
    if not (Path(step_dir) / "r3l_reflections.parquet").exists():
        return empty_frame()
    return read_table(step_dir, "r3l_reflections")


def stage_metrics(step_dir: Path) -> dict[str, float]:
    out: dict[str, float] = {}
    for f in sorted(Path(step_dir).glob("*.metrics.json")):
        out.update(json.loads(f.read_text()))
    return out


def log_stage(step_dir: Path, step: int, run_id: str, mlrun: str, ckpt: str, setup: LogSetup,
              trace_tags: dict[str, str] | None = None) -> dict:
    """Write the step's rows to DuckDB (replacing any earlier attempt), its trajectories as MLflow traces (tagged
    with ``trace_tags`` besides their own) and its metrics to MLflow.

    The stores never disagree about a step: DuckDB is written first, MLflow last (with a sentinel in the same
    batch); a step MLflow already holds is written to neither again, so a recomputed step cannot replace
    DuckDB's rows under MLflow's first values. Traces are rewritten, never added twice (stable trace ids).
    With ``tracking.background_traces`` the traces and then ``logged.json`` are written by the process's trace
    writer (``tasks.stores.trace_writer``) while the next step runs; a step whose traces never got written (the
    process died first) has no ``logged.json``, so a resumed run comes back here and writes them.
    """
    tracking_cfg, tags = setup.tracking, trace_tags or {}
    t0 = time.perf_counter()
    metrics = stage_metrics(step_dir)
    if step in tracking.logged_steps(tracking_cfg, mlrun):
        print(f"step {step} is already in both stores (MLflow run {mlrun}); it is not written again")
        if not (Path(step_dir) / TRACES_DONE).exists():
            _step_traces(step_dir, step, mlrun, tracking_cfg, _trace_frames(step_dir), tags,
                         metrics.get("time/rollout_s", 0.0))
        _mark_logged(step_dir, ckpt)
        return metrics
    keys = ["run_id", "step", "traj_id"]
    trajs = (read_table(step_dir, "trajectories").join(read_table(step_dir, "scores"), on=keys)
             .join(read_table(step_dir, "mix"), on=keys).join(read_table(step_dir, "advantages"), on=keys))
    metric_rows = pl.DataFrame({"run_id": run_id, "step": step, "key": list(metrics),
                                "value": [float(v) for v in metrics.values()]})
    reflections = read_reflections(step_dir)
    buffer = Path(step_dir) / BUFFER_FILE
    frames = {
        **({"partial_buffer": pl.read_parquet(buffer)} if buffer.exists() else {}),
        "trajectories": trajs, "turns": read_table(step_dir, "turns"),
        "tool_executions": read_table(step_dir, "executions"), "saar_events": read_table(step_dir, "saar_events"),
        "r3l_reflections": reflections, "metrics": metric_rows,
        **({"env_steps": pl.read_parquet(Path(step_dir) / "env_steps.parquet")}
           if (Path(step_dir) / "env_steps.parquet").exists() else {}),
        "steps": pl.DataFrame({"run_id": [run_id], "step": [step], "checkpoint": [ckpt], "policy_version": [Path(ckpt).name],
                               "seconds": [sum(v for k, v in metrics.items() if k.startswith("time/"))]}),
    }
    db.replace_step(tracking_cfg.duckdb_path, run_id, step, frames)
    metrics["time/log_s"] = time.perf_counter() - t0

    def write_traces() -> float:
        return _step_traces(step_dir, step, mlrun, tracking_cfg, frames, tags, metrics.get("time/rollout_s", 0.0))

    metrics["time/traces_s"] = 0.0 if tracking_cfg.background_traces else write_traces()  # what the step waited
    texts = sample_texts(trajs, step, tracking_cfg.sample_trajectories)
    if tracking_cfg.sample_trajectories:
        texts[f"viewer/step_{step:06d}.html"] = render_step_viewer(
            trajs, read_table(step_dir, "saar_events"), step, tracking_cfg.sample_trajectories, metrics, reflections,
            env_steps=frames.get("env_steps"))
    with fence.guarded(step_dir):  # the step's MLflow metrics commit for the attempt holding the run, or not at all
        tracking.log_step(tracking_cfg, mlrun, step, metrics, texts)
    if tracking_cfg.background_traces:
        trace_writer.writer().submit(f"step {step} ({step_dir})", lambda: (write_traces(), _mark_logged(step_dir, ckpt)))
    else:
        _mark_logged(step_dir, ckpt)
    maybe_crash("after_log", step)
    return metrics


TRACES_DONE = "traces.json"
"""Written in a step folder once the step's traces are in MLflow."""


def _mark_logged(step_dir: Path, ckpt: str) -> None:
    fence.publish_text(Path(step_dir) / "logged.json", json.dumps({"checkpoint": ckpt}))


def _trace_frames(step_dir: Path) -> dict[str, pl.DataFrame]:
    """What ``_step_traces`` reads, from the step folder (a resumed log of a step MLflow already holds)."""
    keys = ["run_id", "step", "traj_id"]
    trajs = (read_table(step_dir, "trajectories").join(read_table(step_dir, "scores"), on=keys)
             .join(read_table(step_dir, "mix"), on=keys).join(read_table(step_dir, "advantages"), on=keys))
    return {"trajectories": trajs, "tool_executions": read_table(step_dir, "executions"),
            "saar_events": read_table(step_dir, "saar_events")}


def _step_traces(step_dir: Path, step: int, mlrun: str, tracking_cfg: TrackingConfig, frames: dict[str, pl.DataFrame],
                 tags: dict[str, str], rollout_s: float) -> float:
    """Log the step's trajectories as traces (spans laid out from the rollout's start); returns the seconds taken."""
    t0 = time.perf_counter()
    rollout_start = (Path(step_dir) / "trajectories.parquet").stat().st_mtime - rollout_s
    batch = traces.batch_for(tracking_cfg, mlrun, f"train:{step}", rollout_start,
                             {**tags, "kind": "train", "step": str(step)})
    with fence.guarded(step_dir):  # the traces and their marker commit for the attempt holding the run
        ids = traces.log_traces(tracking_cfg, batch, frames["trajectories"], frames["tool_executions"],
                                frames["saar_events"], tracking_cfg.traces_per_step)
        fence.publish_text(Path(step_dir) / TRACES_DONE, json.dumps({"traces": len(ids)}))
    return time.perf_counter() - t0


def eval_stage(run_id: str, version: int, ckpt: str, mlrun: str | None, setup: EvalSetup,
               model: ModelRef | None = None, trace_tags: dict[str, str] | None = None,
               rolled: dict[str, dict] | None = None, parts: int = 1) -> dict[str, float]:
    """Evaluate policy ``version`` on held-out prompts; rows to DuckDB, metrics (step = version) to MLflow. The
    trajectories are rolled out here, or were ``rolled`` in ``parts`` parts elsewhere (``tasks.training.eval_shards``;
    ``time/eval_rollout_parts`` says how many, ``time/eval_s`` counts from the parts' end).

    With an MLflow run: the trajectories of every mode become traces, and ``model`` says which logged
    model the metrics belong to: an existing one (``model.model_id``), or the checkpoint logged now under
    ``model.name`` (when ``tracking.log_models``)."""
    tracking_cfg, cfg = setup.tracking, setup.eval
    t0 = time.perf_counter()
    items = list(load_prompts(setup.eval_path))[: cfg.n_prompts]
    modes: list[tuple[str, float, dict]] = []
    starts = [time.time()]

    def seen(mode: str, tables: dict) -> None:
        modes.append((mode, starts[-1], tables))
        starts.append(time.time())

    metrics = evaluate(ckpt, items, setup, on_mode=seen, rolled=rolled and rolled["eval"])
    if setup.fresh_path:  # the run's last evaluation: the fresh split too (no traces)
        metrics.update(evaluate_fresh(ckpt, setup, rolled and rolled["fresh"]))
    metrics["time/eval_s"] = time.perf_counter() - t0
    metrics["time/eval_rollout_parts"] = float(parts)
    db.replace_eval(tracking_cfg.duckdb_path, run_id, version, ckpt, metrics)
    if mlrun:
        track_eval(tracking_cfg, mlrun, run_id, version, ckpt, metrics, dataset_ref(setup.eval_path), model,
                    trace_tags or {}, modes)
    return metrics


def track_eval(tracking_cfg: TrackingConfig, mlrun: str, run_id: str, version: int, ckpt: str,
               metrics: dict[str, float], dataset: tuple[str, str] | None, model: ModelRef | None,
               tags: dict[str, str], modes: list[tuple[str, float, dict]]) -> None:
    """An evaluation in MLflow: the logged model, its metrics (linked to it and the held-out ``dataset``), the
    traces of every mode's ``trajectories`` / ``executions`` / ``saar_events`` tables (environment mode too)."""
    model_id = model.model_id if model else None
    if model and model.name and not model_id and tracking_cfg.log_models:
        model_id = registry.log_checkpoint(tracking_cfg, mlrun, run_id, model.name, Path(ckpt), version, metrics)
    batches = [(traces.batch_for(tracking_cfg, mlrun, f"eval:{mode}:{version}", start,
                                 {**tags, "kind": "eval", "eval_mode": mode, "step": str(version)}), tables)
               for mode, start, tables in modes]
    with fence.guarded_run(run_id):  # metrics and traces commit for the attempt holding the run, or not at all
        tracking.log_eval(tracking_cfg, mlrun, version, metrics, model_id, dataset)
        for batch, tables in batches:
            traces.log_traces(tracking_cfg, batch, tables["trajectories"], tables["executions"],
                              tables["saar_events"], tracking_cfg.traces_per_step)
