"""Rollout results as tables: the files one RL step's stages hand to each other.

A rollout writes four Parquet files into the step folder; every later stage reads them and
writes its own file, and the tracking stage loads them into DuckDB as they are::

    trajectories.parquet   one row per trajectory: ids, mask, log-probs, the policy version of each token
                           (``token_versions``; ``start_step`` < step for a partial rollout carried over), the
                           tokens SAAR spliced in from an error context (``spliced``), SAAR
                           statistics, and its training role (``kind``, advantage ``group_id``, ``fixed_reward``,
                           R3L ``masked_turns``, ``parent``) and its prompt's ``extra_info`` (JSON: what the
                           graders read beside the record, e.g. a chain's setup and kind)
    turns.parquet          one row per message of the final (purified) conversation
    executions.parquet     one row per sandbox execution, failed attempts included
    saar_events.parquet    one row per SAAR decision (triggered, shallow, deep, replace, append, recovered, ...;
                           ``is_log_ratio``: the importance decisions' log ratio, null otherwise and in step
                           folders written before the column existed)

Keys: ``(run_id, step, traj_id)`` plus ``turn_idx`` / ``exec_idx`` / ``event_idx``.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from tasks.rollout.types import Trajectory
from tasks.stores import fence

TABLES = ("trajectories", "turns", "executions", "saar_events")


def trajectory_frames(trajs: list[Trajectory], run_id: str, step: int, decode) -> dict[str, pl.DataFrame]:
    """All four tables of one rollout; ``decode`` turns response ids into text."""
    key = {"run_id": run_id, "step": step}
    rows, turns, execs, events = [], [], [], []
    for t in trajs:
        rows.append({
            **key, "traj_id": t.traj_id, "prompt_id": t.item.prompt_id, "sample_idx": t.sample_idx,
            "raw": t.raw, "data_source": t.item.data_source, "ground_truth": t.item.ground_truth,
            "prompt_ids": t.prompt_ids, "response_ids": t.response_ids, "response_mask": t.response_mask,
            "rollout_logprobs": t.logprobs, "response_text": decode(t.response_ids),
            "messages": json.dumps(t.messages, ensure_ascii=False), "finish_reason": t.finish_reason,
            "extra_info": json.dumps(t.item.extra_info or {}, ensure_ascii=False),
            "num_turns": t.assistant_turns, "kind": t.kind, "group_id": t.group_id or t.item.prompt_id,
            "fixed_reward": t.fixed_reward, "masked_turns": t.pivot, "parent": t.parent, "start_step": t.start_step,
            "token_versions": t.versions, "spliced": t.spliced, **t.stats.scalars(),
            "failure_reasons": json.dumps(dict(t.stats.failure_reasons)),
        })
        for i, m in enumerate(t.messages):
            turns.append({**key, "traj_id": t.traj_id, "turn_idx": i, "role": m["role"], "content": m["content"]})
        for i, e in enumerate(t.executions):
            r = e.result
            execs.append({
                **key, "traj_id": t.traj_id, "exec_idx": i, "position": e.position, "attempt": e.attempt,
                "code": e.code, "ok": r.ok, "error_kind": r.error_kind, "exit_code": r.exit_code,
                "timed_out": r.timed_out, "memory_exceeded": r.memory_exceeded, "duration_s": r.duration_s,
                "stdout": r.stdout, "stderr": r.stderr,
            })
        for i, ev in enumerate(t.events):
            events.append({**key, "traj_id": t.traj_id, "event_idx": i, **ev.__dict__})
    return {
        "trajectories": pl.DataFrame(rows, schema_overrides={**_ID_LISTS, **_ROW_META}),
        "turns": pl.DataFrame(turns, schema=_TURNS),
        "executions": pl.DataFrame(execs, schema=_EXECS),
        "saar_events": pl.DataFrame(events, schema=_EVENTS),
    }


_ID_LISTS = {
    "prompt_ids": pl.List(pl.Int32), "response_ids": pl.List(pl.Int32),
    "response_mask": pl.List(pl.Int8), "rollout_logprobs": pl.List(pl.Float32), "token_versions": pl.List(pl.Int32),
    "spliced": pl.List(pl.Int8),
}
_ROW_META = {"extra_info": pl.String, "kind": pl.String, "group_id": pl.String, "fixed_reward": pl.Float64, "masked_turns": pl.Int64,
             "parent": pl.String, "start_step": pl.Int64}
_KEY = {"run_id": pl.String, "step": pl.Int64, "traj_id": pl.String}
_TURNS = {**_KEY, "turn_idx": pl.Int64, "role": pl.String, "content": pl.String}
_EXECS = {
    **_KEY, "exec_idx": pl.Int64, "position": pl.Int64, "attempt": pl.Int64, "code": pl.String, "ok": pl.Boolean,
    "error_kind": pl.String, "exit_code": pl.Int64, "timed_out": pl.Boolean, "memory_exceeded": pl.Boolean,
    "duration_s": pl.Float64, "stdout": pl.String, "stderr": pl.String,
}
_EVENTS = {
    **_KEY, "event_idx": pl.Int64, "position": pl.Int64, "attempt": pl.Int64, "kind": pl.String,
    "similarity": pl.Float64, "error_kind": pl.String, "error_text": pl.String, "failed_turn": pl.String,
    "new_turn": pl.String, "is_log_ratio": pl.Float64,
}


def write_frames(frames: dict[str, pl.DataFrame], folder: Path) -> Path:
    """Each frame as ``<name>.parquet`` in ``folder``, whole (``fence.publish``: fenced when the run has a newer
    attempt)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, df in frames.items():
        fence.publish(folder / f"{name}.parquet", df.write_parquet)
    return folder


def read_table(folder: Path, name: str) -> pl.DataFrame:
    path = Path(folder) / f"{name}.parquet"
    if not path.exists():
        raise FileNotFoundError(f"{path}: missing; the stage that writes {name!r} has not run for this step")
    return pl.read_parquet(path)
