"""Rollout, score and evaluation stages of environment mode (``env`` set in the run config).

They stand in for ``rollout_stage`` / ``score_stage`` / ``eval_stage`` and write the same step
files, so mix, advantage, update and log run unchanged:

    rollout   trajectories / turns / env_steps .parquet (executions and saar_events empty; every sampled token
              stamped with the checkpoint's policy version, ``sampled_version``), the
              per-step signals (success, pass@k, valid-action rate, response length) and, on
              schedule, RAGEN-2's MI probe
    score     scores.parquet from the episode scores (no grading from text)
    evaluate  held-out start states (or the held-out variant, e.g. ``bandit_test``), with the same MLflow
              entities as a tool-use evaluation (logged model, dataset input, traces)
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import polars as pl

from models.checkpoint import policy_version
from models.config import ChatConfig
from tasks.rollout.saar import TrajStats
from tasks.stores import db, fence
from tasks.stores.datasets import log_frame
from tasks.stores.records import read_table, trajectory_frames, write_frames
from tasks.stores.registry import ModelRef
from tasks.training.live import get_chat, get_engine
from tasks.training.setups import EvalSetup, RolloutSetup
from tasks.training.stages import _timed, track_eval

_TOOL_COLUMNS = {**TrajStats().scalars(), "failure_reasons": "{}"}
_EMPTY_TOOL_TABLES = {k: v for k, v in trajectory_frames([], "eval", 0, str).items() if k in ("executions", "saar_events")}


def env_rollout_stage(step_dir: Path, step: int, ckpt: str, run_id: str, setup: RolloutSetup) -> Path:
    """Play the step's groups of episodes with the live engine; write the step tables."""
    from tasks.envs.stage import play_step

    metrics: dict = {}
    env, rollout, seed = setup.env, setup.rollout, setup.seed
    with _timed(step_dir, "rollout", metrics):
        chat = get_chat(ckpt, ChatConfig())
        live = get_engine(setup.engine, ckpt, chat)
        frames, signals, _ = play_step(live, chat.tokenizer, env, run_id, seed, step, rollout.n_samples,
                                       rollout.max_new_tokens, rollout.max_response_tokens, ckpt, _TOOL_COLUMNS)
        frames["trajectories"] = stamped(frames["trajectories"], policy_version(ckpt))
        empty = trajectory_frames([], run_id, step, chat.decode)
        write_frames({**frames, "executions": empty["executions"], "saar_events": empty["saar_events"]},
                     Path(step_dir))
        metrics.update(signals)
    return Path(step_dir)


def stamped(trajs: pl.DataFrame, version: int) -> pl.DataFrame:
    """``trajs`` with ``sampled_version``: ``version`` (the policy that played the episodes) on every sampled token,
    −1 on injected ones (response mask 0: the environment's observations), as ``tasks.stores.records`` writes it."""
    versions = pl.col("response_mask").list.eval(pl.when(pl.element() == 1).then(version).otherwise(-1))
    return trajs.with_columns(versions.cast(pl.List(pl.Int32)).alias("sampled_version"))


def env_score_stage(step_dir: Path) -> Path:
    """Scores of an environment step: the episode score is the reward, success is ``correct``."""
    from tasks.envs.records import env_scores

    metrics: dict = {}
    with _timed(step_dir, "score", metrics):
        df, m = env_scores(read_table(step_dir, "trajectories"))
        fence.publish(Path(step_dir) / "scores.parquet", df.write_parquet)
        metrics.update(m)
    return Path(step_dir)


def env_eval_stage(run_id: str, version: int, ckpt: str, mlrun: str | None, setup: EvalSetup,
                   model: ModelRef | None = None, trace_tags: dict[str, str] | None = None) -> dict[str, float]:
    """Held-out episodes of policy ``version``; rows to DuckDB ``evaluations``; in MLflow, as a tool-use evaluation:
    the checkpoint as a logged model (``model``; ranked for ``@best`` by ``eval/<env>/success``), its metrics
    linked to it and to the held-out start states (a dataset input, context ``evaluation``), the episodes as traces."""
    from tasks.envs.evaluate import play_heldout, summarize

    env, rollout, cfg, tracking_cfg, seed = setup.env, setup.rollout, setup.eval, setup.tracking, setup.seed
    t0, start = time.perf_counter(), time.time()
    trajs, chat, seeds = play_heldout(Path(ckpt), env, cfg.n_prompts, cfg.samples, cfg.temperature,
                                      rollout.max_new_tokens, rollout.max_response_tokens, seed)
    name = env.eval_name or env.name
    metrics = summarize(trajs, f"eval/{name}")
    metrics["time/eval_s"] = time.perf_counter() - t0
    db.replace_eval(tracking_cfg.duckdb_path, run_id, version, ckpt, metrics)
    if mlrun:
        states = pl.DataFrame({"env": name, "seed": seeds, "options": json.dumps(env.options, sort_keys=True)})
        dataset = log_frame(tracking_cfg, mlrun, states, f"{name}/heldout", "evaluation")
        tables = {**env_frames_of(trajs, version, chat), **_EMPTY_TOOL_TABLES}
        track_eval(tracking_cfg, mlrun, run_id, version, ckpt, metrics, dataset, model, trace_tags or {},
                   [(name, start, tables)])
    return metrics


def env_frames_of(trajs, version: int, chat) -> dict[str, pl.DataFrame]:
    """The ``trajectories`` table of held-out episodes (run ``eval``, step = policy version), for traces."""
    from tasks.envs.records import env_frames

    return {"trajectories": env_frames(trajs, "eval", version, chat.decode, _TOOL_COLUMNS)["trajectories"]}


def env_steps_frame(step_dir: Path) -> pl.DataFrame | None:
    """The step's ``env_steps`` rows, or None for a tool-use step."""
    path = Path(step_dir) / "env_steps.parquet"
    return pl.read_parquet(path) if path.exists() else None


def previous_empty_steps(step_dir: Path) -> int:
    """Consecutive filter-emptied steps up to the previous step (from its mix metrics; 0 when none)."""
    step = int(Path(step_dir).name)
    prev = Path(step_dir).parent / f"{step - 1:06d}" / "mix.metrics.json"
    if step == 0 or not prev.exists():
        return 0
    return int(json.loads(prev.read_text()).get("rollout/consecutive_empty_after_filter_steps", 0))
