"""Trajectories as MLflow traces: a trace per trajectory, a span per assistant turn and tool execution.

A step's trajectories (all of them, or ``tracking.traces_per_step`` of a large step: the rolled-back
ones first, then a stable hash order) become traces in the run's experiment, linked to the run and
tagged so the Traces tab filters them (``tags.step = '3'``, ``tags.rollback = 'true'``,
``tags.reward = '1'``)::

    trajectory  AGENT      inputs: the question; outputs: the answer; tags: step prompt arm rollout reward rollback
    ├─ turn 0   CHAT_MODEL inputs: the messages since the previous turn; outputs: the turn's text; token counts
    │  ├─ code_interpreter attempt 0  TOOL  ERROR  (cut by SAAR)   code, stdout/stderr, error, duration
    │  └─ code_interpreter attempt 1  TOOL  OK
    └─ turn 1 ...

A SAAR rollback is recorded on the turn span it replaced: ``saar.*`` attributes (attempts, errors,
similarities, shallow/deep decisions, outcome) and one span event per decision carrying the failed
turn, the error and the regeneration, so the span shows what was cut. Earlier attempts at a position
are the ones SAAR erased; only the last one stays in the trajectory.

Simplifications: generation time is not recorded per turn, so spans are laid end to end from the
rollout's start and a turn lasts as long as its tool calls (tool spans carry the measured sandbox
durations). Texts longer than ``MAX_TEXT`` characters are cut. All spans of a batch are written in
one ``log_spans`` call (one transaction) and linked to the run with ``link_traces_to_run``; the
trace ids are derived from (MLflow run, batch key, trajectory id), so logging a step again rewrites
its traces instead of duplicating them.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass, field

import polars as pl

from models.chat import TOOL_NAME
from tasks.stores.config import TrackingConfig
from tasks.stores.tracking import named_errors

MAX_TEXT = 4000
LINKS_PER_CALL = 100  # MLflow's limit for link_traces_to_run


@dataclass(frozen=True)
class TraceBatch:
    """Where and how one batch of trajectories (a training step, an evaluation mode) is logged."""

    mlrun: str
    experiment_id: str
    key: str
    """Unique per batch within the run (``train:3``, ``eval:saar_off:5``); part of every trace id."""
    start_ns: int
    """When the batch's rollout started (span times are laid out from here)."""
    tags: dict[str, str] = field(default_factory=dict)
    """Tags every trace of the batch gets (run id, arm, kind, policy version, ...)."""


@named_errors
def batch_for(cfg: TrackingConfig, mlrun: str, key: str, start_s: float, tags: dict[str, str]) -> TraceBatch:
    """The batch ``key`` of MLflow run ``mlrun`` (its experiment looked up), starting at ``start_s`` (epoch s)."""
    from mlflow import MlflowClient

    experiment_id = MlflowClient(tracking_uri=cfg.mlflow_uri).get_run(mlrun).info.experiment_id
    return TraceBatch(mlrun, experiment_id, key, int(start_s * 1e9), tags)


def pick(trajs: pl.DataFrame, n: int) -> pl.DataFrame:
    """All trajectories when there are at most ``n``; else ``n``: rolled-back ones first (up to all
    ``n``), then the rest in a stable hash order of their ids."""
    if trajs.height <= n:
        return trajs
    if "rollbacks_triggered" not in trajs.columns:
        trajs = trajs.with_columns(pl.lit(0).alias("rollbacks_triggered"))
    digest = pl.col("traj_id").map_elements(lambda s: hashlib.md5(s.encode()).hexdigest(), return_dtype=pl.String)
    order = trajs.with_columns((pl.col("rollbacks_triggered") > 0).alias("_rb"), digest.alias("_h"))
    return order.sort(["_rb", "_h"], descending=[True, False]).head(n).drop("_rb", "_h")


def _clip(text: str | None) -> str:
    text = text or ""
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + f"… [{len(text) - MAX_TEXT} more characters]"


def _id(*parts: str, size: int = 16) -> bytes:
    return hashlib.md5("|".join(parts).encode()).digest()[:size]


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def trace_id_of(batch: TraceBatch, traj_id: str) -> str:
    """The MLflow trace id of a trajectory (stable: the same step logged again gets the same id)."""
    return "tr-" + _id(batch.mlrun, batch.key, traj_id).hex()


def turn_token_counts(prompt_len: int, mask: list[int]) -> list[tuple[int, int]]:
    """(context tokens before the turn, tokens of the turn) for every run of model tokens in the mask."""
    out: list[tuple[int, int]] = []
    start = None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            out.append((prompt_len + start, i - start))
            start = None
    return out


class _Spans:
    """Builds the span dicts of one trace (MLflow's span JSON: OTel ids in base64, JSON-encoded attributes)."""

    def __init__(self, trace_id: str):
        self.trace_id = trace_id
        self.otel_id = _b64(bytes.fromhex(trace_id[3:]))
        self.spans: list[dict] = []

    def add(self, key: str, parent: str | None, name: str, kind: str, start: int, end: int, inputs, outputs,
            attrs: dict | None = None, error: str | None = None, events: list[dict] | None = None) -> str:
        span_id = _b64(_id(self.trace_id, key, size=8))
        attributes = {"mlflow.traceRequestId": self.trace_id, "mlflow.spanType": kind, "mlflow.spanInputs": inputs,
                      "mlflow.spanOutputs": outputs, **(attrs or {})}
        self.spans.append({
            "trace_id": self.otel_id, "span_id": span_id, "parent_span_id": parent, "name": name,
            "start_time_unix_nano": start, "end_time_unix_nano": end, "events": events or [], "links": [],
            "status": {"code": "STATUS_CODE_ERROR" if error else "STATUS_CODE_OK", "message": error or ""},
            "attributes": {k: json.dumps(v, ensure_ascii=False) for k, v in attributes.items()},
        })
        return span_id


def _rollback(evs: list[dict], execs: list[dict]) -> tuple[dict, list[dict]]:
    """``saar.*`` attributes and span events of the SAAR decisions at one position."""
    decisions = [e for e in evs if e["kind"] in ("shallow", "deep", "replace", "append")]
    ends = [e["kind"] for e in evs if e["kind"] in ("recovered", "exhausted", "no_call", "length", "turn_cap",
                                                    "append_failed")]
    attrs = {
        "saar.rollback": True, "saar.attempts": max((e["attempt"] for e in execs), default=0),
        "saar.errors": [e["error_kind"] for e in execs if not e["ok"]],
        "saar.similarity": [round(e["similarity"], 4) for e in decisions if e["similarity"] is not None],
        "saar.is_log_ratio": [round(e["is_log_ratio"], 4) for e in decisions if e.get("is_log_ratio") is not None],
        "saar.decisions": [e["kind"] for e in decisions], "saar.outcome": ends[-1] if ends else "open",
    }
    events = [{"name": f"saar.{e['kind']}", "time_unix_nano": 0, "attributes": {
        k: (_clip(v) if isinstance(v, str) else v) for k, v in e.items()
        if k in ("attempt", "similarity", "is_log_ratio", "error_kind", "error_text", "failed_turn", "new_turn")
        and v is not None}}
        for e in evs]
    return attrs, events


def trajectory_spans(batch: TraceBatch, row: dict, execs: list[dict], events: list[dict]) -> list[dict]:
    """The span dicts of one trajectory (``row``: a trajectories row joined with its scores)."""
    tid = trace_id_of(batch, row["traj_id"])
    sp = _Spans(tid)
    messages = json.loads(row["messages"])
    starts = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    n_turns = len(starts) if row.get("num_turns") is None else int(row["num_turns"])
    first = starts[-n_turns] if 0 < n_turns <= len(starts) else starts[0] if starts else len(messages)  # few-shot first
    tokens = turn_token_counts(len(row["prompt_ids"]), list(row["response_mask"]))
    tokens = tokens if len(tokens) == n_turns else [None] * n_turns
    root = sp.add("root", None, f"trajectory {row['prompt_id']} #{row['sample_idx']}", "AGENT", 0, 0, None, None)
    cursor, turn, since = batch.start_ns, 0, 0
    for i, m in enumerate(messages[first:], start=first):
        if m["role"] != "assistant":
            continue
        at = sorted((e for e in execs if e["position"] == turn), key=lambda e: e["attempt"])
        evs = [e for e in events if e["position"] == turn]
        attrs: dict = {"turn": turn}
        if tokens[turn]:
            ctx, out = tokens[turn]
            attrs["mlflow.chat.tokenUsage"] = {"input_tokens": ctx, "output_tokens": out, "total_tokens": ctx + out}
        span_events: list[dict] = []
        if evs:
            extra, span_events = _rollback(evs, at)
            attrs.update(extra)
        start = cursor
        turn_id = sp.add(f"turn{turn}", root, f"turn {turn}", "CHAT_MODEL", 0, 0,
                         {"messages": [{"role": x["role"], "content": _clip(x["content"])} for x in messages[since:i]]},
                         _clip(m["content"]), attrs, events=span_events)
        for e in at:
            cursor = _tool_span(sp, turn_id, e, cut=e["attempt"] < at[-1]["attempt"], start=cursor)
        _times(sp.spans, turn_id, start, cursor, span_events)
        turn, since = turn + 1, i + 1
    answer = next((m["content"] for m in reversed(messages) if m["role"] == "assistant"), "")
    question = next((m["content"] for m in reversed(messages[:first]) if m["role"] == "user"), "")
    root_span = sp.spans[0]
    root_span["start_time_unix_nano"], root_span["end_time_unix_nano"] = batch.start_ns, cursor
    root_span["attributes"].update({k: json.dumps(v, ensure_ascii=False)
                                    for k, v in _root_attrs(batch, row, question, answer).items()})
    return sp.spans


ROW_FACTS = ("prompt_id", "traj_id", "sample_idx", "raw", "finish_reason", "ground_truth", "reward", "correct",
             "advantage", "kept", "num_turns", "tool_calls", "tool_success", "rollbacks_triggered",
             "rollbacks_recovered", "rollbacks_failed", "shallow", "deep", "errors_kept")
"""Columns of a trajectory row kept as attributes of its root span."""


def _root_attrs(batch: TraceBatch, row: dict, question: str, answer: str) -> dict:
    return {"mlflow.spanInputs": _clip(question), "mlflow.spanOutputs": _clip(answer),
            **{k: row.get(k) for k in ROW_FACTS},
            **{f"mlflow.traceTag.{k}": v for k, v in trace_tags(batch, row).items()}}


def _tool_span(sp: _Spans, parent: str, e: dict, cut: bool, start: int) -> int:
    """A tool execution's span (measured duration from ``start``); returns its end time."""
    end = start + int(max(e["duration_s"] or 0.0, 0.0) * 1e9)
    name = f"{TOOL_NAME} attempt {e['attempt']}" + (" (cut by SAAR)" if cut else "")
    attrs = {k: e[k] for k in ("ok", "error_kind", "exit_code", "timed_out", "memory_exceeded", "duration_s",
                               "attempt")}
    sp.add(f"exec{e['exec_idx']}", parent, name, "TOOL", start, end, {"code": _clip(e["code"])},
           {"stdout": _clip(e["stdout"]), "stderr": _clip(e["stderr"])}, {**attrs, "cut_by_saar": cut},
           error=None if e["ok"] else (e["error_kind"] or "failed"))
    return end


def _times(spans: list[dict], span_id: str, start: int, end: int, events: list[dict]) -> None:
    span = next(s for s in spans if s["span_id"] == span_id)
    span["start_time_unix_nano"], span["end_time_unix_nano"] = start, end
    for ev in events:
        ev["time_unix_nano"] = start


def trace_tags(batch: TraceBatch, row: dict) -> dict[str, str]:
    """The searchable tags of a trajectory's trace (strings, as MLflow stores them). Few on purpose: the
    store writes each tag of each trace as its own row (about 5 ms apiece on sqlite); the rest of a
    trajectory's facts are attributes of its root span."""
    reward = row.get("reward")
    return {
        **batch.tags, "prompt": str(row["prompt_id"]), "rollout": "raw" if row["raw"] else "purified",
        "reward": "none" if reward is None else f"{reward:g}",
        "rollback": "true" if row.get("rollbacks_triggered", 0) else "false",
    }


def batch_spans(batch: TraceBatch, trajs: pl.DataFrame, execs: pl.DataFrame, events: pl.DataFrame) -> list[dict]:
    """Span dicts of every trajectory in ``trajs`` with its executions and SAAR events."""
    ids = trajs["traj_id"].to_list()
    by_exec = _group(execs.filter(pl.col("traj_id").is_in(ids)))
    by_event = _group(events.filter(pl.col("traj_id").is_in(ids)))
    out: list[dict] = []
    for row in trajs.iter_rows(named=True):
        out.extend(trajectory_spans(batch, row, by_exec.get(row["traj_id"], []), by_event.get(row["traj_id"], [])))
    return out


def _group(df: pl.DataFrame) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in df.iter_rows(named=True):
        out.setdefault(r["traj_id"], []).append(r)
    return out


@named_errors
def log_traces(cfg: TrackingConfig, batch: TraceBatch, trajs: pl.DataFrame, execs: pl.DataFrame,
               events: pl.DataFrame, limit: int) -> list[str]:
    """Log up to ``limit`` trajectories of ``trajs`` as traces of ``batch.mlrun``; returns their trace ids."""
    if limit <= 0 or trajs.is_empty():
        return []
    from mlflow import MlflowClient
    from mlflow.entities import Span
    from mlflow.tracing.client import TracingClient

    chosen = pick(trajs, limit)
    spans = [Span.from_dict(s) for s in batch_spans(batch, chosen, execs, events)]
    TracingClient(cfg.mlflow_uri).log_spans(batch.experiment_id, spans)
    ids = [trace_id_of(batch, t) for t in chosen["traj_id"]]
    client = MlflowClient(cfg.mlflow_uri)
    for lo in range(0, len(ids), LINKS_PER_CALL):
        client.link_traces_to_run(ids[lo : lo + LINKS_PER_CALL], batch.mlrun)
    return ids
