"""Trajectories as MLflow traces, on hand-built step tables and a real sqlite MLflow store.

A SAAR trajectory whose first call failed (NameError), was regenerated (deep, similarity 0.3) and then
ran: the failed attempt is a tool span marked as cut, the rollback sits on the turn span it replaced
(attempts, errors, similarity, decision, outcome, one event per decision with the failed turn), token
counts come from the response mask. Traces are tagged, linked to the run, found by tag filters, and
logging the same step again rewrites them instead of adding more.
"""

from __future__ import annotations

import json
import time

import polars as pl
import pytest

from tasks.stores import traces
from tasks.stores.config import TrackingConfig
from tasks.stores.system import sandbox_metrics

PROMPT = [{"role": "system", "content": "You can run Python."}, {"role": "user", "content": "What is 6*7?"}]


def traj(traj_id: str, raw: bool, rollbacks: int, messages: list[dict], mask: list[int], reward: float) -> dict:
    return {"traj_id": traj_id, "prompt_id": "p1", "sample_idx": int(traj_id[-1]), "raw": raw,
            "messages": json.dumps(PROMPT + messages), "prompt_ids": list(range(10)), "response_mask": mask,
            "finish_reason": "stop", "ground_truth": "42", "reward": reward, "correct": reward > 0,
            "advantage": 0.5, "kept": True, "rollbacks_triggered": rollbacks, "rollbacks_recovered": rollbacks,
            "tool_calls": 1 + rollbacks, "num_turns": 2}


def execution(traj_id: str, idx: int, attempt: int, ok: bool, code: str, out: str, kind: str | None) -> dict:
    return {"traj_id": traj_id, "exec_idx": idx, "position": 0, "attempt": attempt, "code": code, "ok": ok,
            "error_kind": kind, "exit_code": 0 if ok else 1, "timed_out": False, "memory_exceeded": False,
            "duration_s": 0.25, "stdout": out if ok else "", "stderr": "" if ok else out}


@pytest.fixture
def tables():
    call = '<tool_call>{"name": "code_interpreter", "arguments": {"code": "print(6*7)"}}</tool_call>'
    bad = '<tool_call>{"name": "code_interpreter", "arguments": {"code": "print(x)"}}</tool_call>'
    turns = [{"role": "assistant", "content": call}, {"role": "tool", "content": "42"},
             {"role": "assistant", "content": "\\boxed{42}"}]
    trajs = pl.DataFrame([
        traj("0:p1:0", False, 1, turns, [1] * 5 + [0] * 3 + [1] * 4, 1.0),
        traj("0:p1:1", True, 0, turns, [1] * 6 + [0] * 2 + [1] * 3, 0.0),
    ])
    execs = pl.DataFrame([
        execution("0:p1:0", 0, 0, False, "print(x)", "NameError: name 'x' is not defined", "NameError"),
        execution("0:p1:0", 1, 1, True, "print(6*7)", "42\n", None),
        execution("0:p1:1", 0, 0, True, "print(6*7)", "42\n", None),
    ])
    events = pl.DataFrame([
        {"traj_id": "0:p1:0", "position": 0, "attempt": 0, "kind": "triggered", "similarity": None,
         "error_kind": "NameError", "error_text": "NameError: x", "failed_turn": None, "new_turn": None},
        {"traj_id": "0:p1:0", "position": 0, "attempt": 1, "kind": "deep", "similarity": 0.3,
         "error_kind": "NameError", "error_text": "NameError: x", "failed_turn": bad, "new_turn": call},
        {"traj_id": "0:p1:0", "position": 0, "attempt": 1, "kind": "recovered", "similarity": None,
         "error_kind": None, "error_text": None, "failed_turn": None, "new_turn": None},
    ])
    return trajs, execs, events


def attrs(span: dict) -> dict:
    return {k: json.loads(v) for k, v in span["attributes"].items()}


def test_turn_token_counts_follow_the_mask():
    assert traces.turn_token_counts(10, [1, 1, 0, 0, 0, 1]) == [(10, 2), (15, 1)]
    assert traces.turn_token_counts(3, [0, 1, 1]) == [(4, 2)]
    assert traces.turn_token_counts(3, []) == []


def test_rollback_is_recorded_on_the_span_it_replaced(tables):
    trajs, execs, events = tables
    batch = traces.TraceBatch("run1", "1", "train:0", 1_000_000_000, {"arm": "cleaner", "step": "0"})
    spans = traces.batch_spans(batch, trajs.head(1), execs, events)
    names = [s["name"] for s in spans]
    assert names == ["trajectory p1 #0", "turn 0", "code_interpreter attempt 0 (cut by SAAR)", "code_interpreter attempt 1",
                     "turn 1"]
    root, turn0, cut, kept, turn1 = (attrs(s) for s in spans)
    assert turn0["saar.rollback"] is True and turn0["saar.attempts"] == 1
    assert turn0["saar.errors"] == ["NameError"] and turn0["saar.similarity"] == [0.3]
    assert turn0["saar.decisions"] == ["deep"] and turn0["saar.outcome"] == "recovered"
    assert [e["name"] for e in spans[1]["events"]] == ["saar.triggered", "saar.deep", "saar.recovered"]
    assert spans[1]["events"][1]["attributes"]["failed_turn"].count("print(x)") == 1
    assert turn0["mlflow.chat.tokenUsage"] == {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15}
    assert turn1["mlflow.chat.tokenUsage"] == {"input_tokens": 18, "output_tokens": 4, "total_tokens": 22}
    assert "saar.rollback" not in turn1
    assert spans[2]["status"]["code"] == "STATUS_CODE_ERROR" and cut["cut_by_saar"] is True
    assert cut["mlflow.spanInputs"] == {"code": "print(x)"} and "NameError" in cut["mlflow.spanOutputs"]["stderr"]
    assert spans[3]["status"]["code"] == "STATUS_CODE_OK" and kept["cut_by_saar"] is False
    # tool spans carry their measured duration, laid end to end; the turn spans cover them
    assert spans[2]["end_time_unix_nano"] - spans[2]["start_time_unix_nano"] == 250_000_000
    assert spans[3]["start_time_unix_nano"] == spans[2]["end_time_unix_nano"]
    assert spans[0]["end_time_unix_nano"] == 1_500_000_000
    assert turn0["mlflow.spanInputs"]["messages"] == PROMPT
    assert turn1["mlflow.spanInputs"]["messages"] == [{"role": "tool", "content": "42"}]
    assert root["mlflow.traceTag.rollback"] == "true" and root["mlflow.traceTag.rollout"] == "purified"
    assert root["mlflow.traceTag.reward"] == "1" and root["mlflow.traceTag.arm"] == "cleaner"
    assert root["mlflow.spanOutputs"] == "\\boxed{42}" and root["mlflow.spanInputs"] == "What is 6*7?"
    assert root["reward"] == 1.0 and root["rollbacks_triggered"] == 1


def test_pick_prefers_rolled_back_trajectories():
    df = pl.DataFrame({"traj_id": [f"0:p:{i}" for i in range(6)], "rollbacks_triggered": [0, 2, 0, 0, 1, 0]})
    assert traces.pick(df, 10).height == 6
    got = traces.pick(df, 3)["traj_id"].to_list()
    assert set(got[:2]) == {"0:p:1", "0:p:4"} and len(got) == 3
    assert got == traces.pick(df.reverse(), 3)["traj_id"].to_list()  # a stable order, not the row order


def test_traces_are_searchable_linked_and_rewritten_not_duplicated(tables, tmp_path):
    import mlflow
    from mlflow import MlflowClient

    trajs, execs, events = tables
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = client.create_experiment("t", artifact_location=(tmp_path / "art").as_uri())
    run = client.create_run(exp).info.run_id
    batch = traces.TraceBatch(run, exp, "train:0", time.time_ns(), {"step": "0", "arm": "cleaner"})
    cfg = TrackingConfig(mlflow_uri=uri)
    ids = traces.log_traces(cfg, batch, trajs, execs, events, limit=64)
    again = traces.log_traces(cfg, batch, trajs, execs, events, limit=64)
    assert ids == again and len(ids) == 2
    mlflow.set_tracking_uri(uri)
    everything = mlflow.search_traces(locations=[exp], return_type="list")
    assert len(everything) == 2
    assert {t.info.trace_id for t in mlflow.search_traces(locations=[exp], run_id=run, return_type="list")} == set(ids)
    rolled = mlflow.search_traces(locations=[exp], filter_string="tags.rollback = 'true'", return_type="list")
    assert [t.data.spans[0].name for t in rolled] == ["trajectory p1 #0"]
    assert set(rolled[0].info.tags) >= {"step", "prompt", "arm", "rollout", "reward", "rollback"}
    assert len(mlflow.search_traces(locations=[exp], filter_string="tags.reward = '0'", return_type="list")) == 1
    spans = {s.name: s for s in rolled[0].data.spans}
    assert spans["turn 0"].attributes["saar.decisions"] == ["deep"]
    assert rolled[0].info.token_usage["output_tokens"] == 9


def test_sandbox_metrics_from_executions_and_counters():
    execs = pl.DataFrame({"duration_s": [0.001 * i for i in range(1, 101)]})
    got = sandbox_metrics(execs, {"infra_retries": 2, "timeouts": 1}, {"infra_retries": 5, "timeouts": 1}, 4.0)
    assert got["sandbox/exec_per_s"] == 25.0
    assert got["sandbox/p50_ms"] == pytest.approx(51.0) and got["sandbox/p99_ms"] == pytest.approx(99.0)
    assert got["sandbox/infra_retries"] == 3.0 and got["sandbox/timeouts"] == 0.0
    empty = sandbox_metrics(pl.DataFrame({"duration_s": []}, schema={"duration_s": pl.Float64}), {}, {}, 0.0)
    assert empty["sandbox/exec_per_s"] == 0.0 and empty["sandbox/p99_ms"] == 0.0
