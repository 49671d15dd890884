"""The partial-rollout buffer as run state: what step N carries to step N+1, one Parquet file per step.

A step's rollout writes ``partial_buffer.parquet`` (its buffer *after* the step) and ``partial_state.json``
(the fresh-prompt cursor) into its step folder; step N+1 reads step N's. Because each step reads the
previous step's files and writes its own, a crash anywhere — and ``cleaner resume`` or a Prefect retry —
reruns a step from the same buffer: nothing is lost, nothing is trained twice. The log stage copies the
file into the DuckDB table ``partial_buffer``.

One row per trajectory of a buffered group (``position`` = the group's FIFO place)::

    prompt_id, sample_idx, traj_id, start_step, state, finish_reason     where the sample stands
    prompt_ids, response_ids, response_mask, logprobs, token_versions    the response so far (per token)
    carry_ids, carry_logprobs, carry_versions                            the turn an abort cut short
    max_version                                                          the newest policy version in it
    record                                                               JSON: messages, SAAR statistics,
                                                                         events, executions, snapshot, ...

Reading checks the stored versions against the current policy (a newer one is an error naming the file and
the ``max_version`` column) and drops a group whose prompt left the dataset (counted by the caller).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import polars as pl

from sandbox.result import ExecutionResult
from tasks.rollout.partial import Group
from tasks.rollout.saar import TrajStats
from tasks.rollout.types import Carry, Execution, PromptItem, SaarEvent, Snapshot, State, Trajectory

BUFFER_FILE = "partial_buffer.parquet"
STATE_FILE = "partial_state.json"

_LISTS = {"prompt_ids": pl.List(pl.Int32), "response_ids": pl.List(pl.Int32), "response_mask": pl.List(pl.Int8),
          "logprobs": pl.List(pl.Float64), "token_versions": pl.List(pl.Int32), "carry_ids": pl.List(pl.Int32),
          "carry_logprobs": pl.List(pl.Float64), "carry_versions": pl.List(pl.Int32)}
SCHEMA = {"run_id": pl.String, "step": pl.Int64, "position": pl.Int64, "prompt_id": pl.String,
          "sample_idx": pl.Int64, "traj_id": pl.String, "start_step": pl.Int64, "state": pl.String,
          "finish_reason": pl.String, **_LISTS, "max_version": pl.Int64, "record": pl.String}


def buffer_frame(groups: list[Group], run_id: str, step: int) -> pl.DataFrame:
    """The buffer after ``step``, FIFO order, one row per trajectory."""
    rows = []
    for pos, g in enumerate(groups):
        for t in g.trajs:
            if t.state is State.EXECUTING:
                raise ValueError(f"{t.traj_id}: a trajectory is buffered while its tool call runs (settle it first)")
            c = t.carry or Carry([], [], [])
            rows.append({
                "run_id": run_id, "step": step, "position": pos, "prompt_id": g.key, "sample_idx": t.sample_idx,
                "traj_id": t.traj_id, "start_step": t.start_step, "state": t.state.value,
                "finish_reason": t.finish_reason, "prompt_ids": t.prompt_ids, "response_ids": t.response_ids,
                "response_mask": t.response_mask, "logprobs": t.logprobs, "token_versions": t.versions,
                "carry_ids": c.ids, "carry_logprobs": c.logprobs, "carry_versions": c.versions,
                "max_version": max([*t.versions, *c.versions], default=t.start_step), "record": json.dumps(_record(t)),
            })
    return pl.DataFrame(rows, schema=SCHEMA)


def _record(t: Trajectory) -> dict:
    s = t.stats
    return {
        "raw": t.raw, "saar_on": t.saar_on, "assistant_turns": t.assistant_turns, "messages": t.messages,
        "stats": {**s.scalars(), "failure_reasons": dict(s.failure_reasons), "similarities": s.similarities,
                  "is_log_ratios": s.is_log_ratios},
        "events": [e.__dict__ for e in t.events],
        "executions": [{"position": e.position, "attempt": e.attempt, "code": e.code, "result": e.result.to_dict()}
                       for e in t.executions],
        "snapshot": t.snapshot.__dict__ if t.snapshot else None, "kind": t.kind, "group_id": t.group_id,
        "fixed_reward": t.fixed_reward, "pivot": t.pivot, "parent": t.parent, "budget_extra": t.budget_extra,
        "has_carry": t.carry is not None, "spliced": t.spliced, "retry_turns": t.retry_turns,
        "appended": list(t.appended) if t.appended else None,
    }


def trajectory_of(row: dict, item: PromptItem) -> Trajectory:
    """The trajectory a buffer row stores, bound to the dataset's current ``item``."""
    rec = json.loads(row["record"])
    st = rec["stats"]
    stats = TrajStats(**{k: v for k, v in st.items() if k not in ("failure_reasons", "similarities", "is_log_ratios")},
                      failure_reasons=Counter(st["failure_reasons"]), similarities=list(st["similarities"]),
                      is_log_ratios=list(st.get("is_log_ratios") or []))
    carry = Carry(list(row["carry_ids"]), list(row["carry_logprobs"]), list(row["carry_versions"]))
    return Trajectory(
        traj_id=row["traj_id"], item=item, sample_idx=row["sample_idx"], raw=rec["raw"],
        prompt_ids=list(row["prompt_ids"]), messages=rec["messages"], response_ids=list(row["response_ids"]),
        response_mask=list(row["response_mask"]), logprobs=list(row["logprobs"]), state=State(row["state"]),
        assistant_turns=rec["assistant_turns"], saar_on=rec["saar_on"],
        snapshot=Snapshot(**rec["snapshot"]) if rec["snapshot"] else None, finish_reason=row["finish_reason"],
        stats=stats, events=[SaarEvent(**e) for e in rec["events"]],
        executions=[Execution(e["position"], e["attempt"], e["code"], ExecutionResult(**e["result"]))
                    for e in rec["executions"]],
        kind=rec["kind"], group_id=rec["group_id"], fixed_reward=rec["fixed_reward"], pivot=rec["pivot"],
        parent=rec["parent"], budget_extra=rec["budget_extra"], versions=list(row["token_versions"]),
        version=max(row["max_version"], row["start_step"]), start_step=row["start_step"],
        carry=carry if rec["has_carry"] else None, spliced=list(rec.get("spliced") or [0] * len(row["response_ids"])),
        retry_turns=rec.get("retry_turns", 0), appended=tuple(rec["appended"]) if rec.get("appended") else None,
    )


def _replace(path: Path, write: Callable[[Path], object]) -> Path:
    tmp = path.with_name(f".{path.name}.tmp")
    write(tmp)
    tmp.replace(path)
    return path


def write_buffer(folder: Path, frame: pl.DataFrame, cursor: int,
                 publish: Callable[[Path, Callable[[Path], object]], Path] = _replace) -> None:
    """Write the buffer and the fresh-prompt cursor atomically, each file through ``publish(path, write)`` (by
    default via a temporary name; the train flow passes its attempt fence's, ``tasks.stores.fence.publish``)."""
    publish(Path(folder) / BUFFER_FILE, frame.write_parquet)
    state = json.dumps({"cursor": cursor, "groups": frame["position"].n_unique() if frame.height else 0})
    publish(Path(folder) / STATE_FILE, lambda tmp: tmp.write_text(state))


def read_buffer(folder: Path | None, items: dict[str, PromptItem], version: int) -> tuple[list[Group], int, int]:
    """The groups ``folder``'s step carried over, FIFO; how many were dropped (prompt no longer in the
    dataset); the fresh-prompt cursor. ``folder`` None (the first step): an empty buffer at cursor 0."""
    if folder is None:
        return [], 0, 0
    path, state = Path(folder) / BUFFER_FILE, Path(folder) / STATE_FILE
    if not path.exists() or not state.exists():
        raise FileNotFoundError(f"{path}: missing; the previous step ran without rollout.partial (its buffer and "
                                f"{STATE_FILE} are part of the run's state)")
    df = pl.read_parquet(path)
    newer = df.filter(pl.col("max_version") > version)
    if newer.height:
        r = newer.row(0, named=True)
        raise ValueError(f"{path}: column max_version = {r['max_version']} for {r['traj_id']} is newer than the current "
                         f"policy version {version}; the buffer belongs to a later point of the run")
    groups, dropped = [], 0
    for (_, prompt_id), part in df.sort("position", "sample_idx").group_by(["position", "prompt_id"],
                                                                          maintain_order=True):
        if prompt_id not in items:
            dropped += 1
            continue
        groups.append(Group(items[prompt_id], [trajectory_of(r, items[prompt_id]) for r in part.iter_rows(named=True)]))
    return groups, dropped, int(json.loads(state.read_text())["cursor"])
