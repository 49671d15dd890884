"""The DuckDB store's own API (``tasks.stores.db``) and its row log (``tasks.stores.rowlog``).

Run ids come from users (``--run-id``) and Prefect; pasted into SQL text, a quote breaks the
query or widens it. Every query takes them as parameters, so an id holding SQL is only an id.
Runs write units of rows to the row log and never open the store; ``ingest`` loads them by key, so a unit
written again, or loaded again after a crash, never duplicates a row.

Run: ``pytest tests/test_store.py``.
"""

from __future__ import annotations

import json
import shutil

import duckdb
import polars as pl
import pytest

from tasks.stores import db, rowlog

ODD = "x' OR '1'='1"


def _metrics(run_id: str, step: int, values: dict[str, float]) -> dict[str, pl.DataFrame]:
    return {"metrics": pl.DataFrame({"run_id": run_id, "step": step, "key": list(values),
                                     "value": list(values.values())})}


@pytest.fixture
def store(tmp_path):
    path = tmp_path / "s.duckdb"
    db.upsert_run(path, ODD, "tiny", {"seed": 0}, "ml1", "running")
    db.upsert_run(path, "plain", "tiny", {"seed": 1}, "ml2", "running")
    db.replace_step(path, ODD, 0, _metrics(ODD, 0, {"time/rollout_s": 1.5, "rollout/accuracy": 0.25}))
    db.replace_step(path, "plain", 0, _metrics("plain", 0, {"time/rollout_s": 9.0}))
    db.replace_eval(path, ODD, 2, "ckpt", {"eval/saar_off/all/pass_at_1": 0.5})
    return path


def _count(path, sql: str, params: list | None = None) -> int:
    return db.query(path, sql, params).item()


def test_an_id_holding_sql_selects_only_its_own_rows(store):
    rows = db.run_metrics(store, ODD)
    assert sorted(rows["key"]) == ["rollout/accuracy", "time/rollout_s"] and set(rows["value"]) == {1.5, 0.25}
    assert db.run_metrics(store, ODD, "time/")["value"].to_list() == [1.5]
    assert db.run_metrics(store, "x").height == 0
    assert db.evaluation_rows(store, [ODD, "plain"]).rows() == [(ODD, 2, "eval/saar_off/all/pass_at_1", 0.5)]
    assert db.evaluation_rows(store, ["plain"]).height == 0


def test_every_write_reached_the_store_when_it_was_free(store):
    assert not rowlog.pending(store)
    assert dict(db.query(store, "SELECT run_id, count(*) FROM metrics GROUP BY ALL").rows()) == {ODD: 2, "plain": 1}


def test_status_update_touches_one_run_and_end_run_only_a_running_one(store):
    assert db.set_status(store, ODD, "finished")
    db.end_run(store, ODD, "crashed")  # finished stays finished
    db.end_run(store, "plain", "crashed")
    got = dict(db.query(store, "SELECT run_id, status FROM runs").rows())
    assert got == {ODD: "finished", "plain": "crashed"}
    configs = db.query(store, "SELECT run_id, config FROM runs ORDER BY run_id").rows()
    assert [(r, json.loads(c)) for r, c in configs] == [("plain", {"seed": 1}), (ODD, {"seed": 0})]  # rewritten as is
    assert not db.set_status(store, "never-started", "finished")
    assert _count(store, "SELECT count(*) FROM runs") == 2


def test_a_rerun_step_replaces_its_rows_and_keeps_one_version(store):
    db.replace_step(store, ODD, 0, _metrics(ODD, 0, {"rollout/accuracy": 0.75}))
    assert db.query(store, "SELECT key, value FROM metrics WHERE run_id = ?", [ODD]).rows() == [("rollout/accuracy", 0.75)]
    assert db.run_metrics(store, ODD).rows() == [(0, "rollout/accuracy", 0.75)]
    unit = rowlog.rows_dir(store) / "runs" / ODD / "step-000000"
    assert len([p for p in unit.iterdir()]) == 1


def test_a_unit_loaded_again_after_a_crash_adds_nothing(store):
    """A crash after the store committed but before the marker went: the unit is pending again."""
    db.replace_step(store, "plain", 1, _metrics("plain", 1, {"a": 1.0, "b": 2.0}))
    newest = rowlog.latest(store, "plain", "step-000001")
    rowlog._mark_pending(store, "plain", "step-000001", newest.name)
    assert len(rowlog.pending(store)) == 1
    assert db.ingest(store) == 1 and not rowlog.pending(store)
    assert _count(store, "SELECT count(*) FROM metrics WHERE run_id = 'plain'") == 3


def test_a_write_that_crashed_midway_is_invisible(store):
    unit = rowlog.rows_dir(store) / "runs" / ODD / "step-000000"
    half = unit / ".tmp-99999999999999999999-1"
    half.mkdir()
    pl.DataFrame({"run_id": [ODD], "step": [0], "key": ["half"], "value": [9.0]}).write_parquet(half / "metrics.parquet")
    assert "half" not in db.run_metrics(store, ODD)["key"].to_list()
    db.replace_step(store, ODD, 0, _metrics(ODD, 0, {"whole": 1.0}))
    assert db.query(store, "SELECT key FROM metrics WHERE run_id = ?", [ODD]).rows() == [("whole",)]


def test_a_machine_with_a_slow_clock_still_supersedes(store, monkeypatch):
    monkeypatch.setattr(rowlog.time, "time_ns", lambda: 5)
    db.replace_step(store, ODD, 0, _metrics(ODD, 0, {"later": 1.0}))
    assert db.run_metrics(store, ODD)["key"].to_list() == ["later"]
    assert db.query(store, "SELECT key FROM metrics WHERE run_id = ?", [ODD]).rows() == [("later",)]


def test_a_failed_step_replacement_keeps_the_old_rows(store):
    bad = _metrics(ODD, 0, {"x": 1.0})
    bad["turns"] = pl.DataFrame({"run_id": [ODD], "step": [0], "no_such_column": [1]})
    with pytest.raises(duckdb.Error, match="no_such_column"):
        db.replace_step(store, ODD, 0, bad)
    assert sorted(db.run_metrics(store, ODD)["key"]) == ["rollout/accuracy", "time/rollout_s"]
    assert _count(store, "SELECT count(*) FROM metrics WHERE run_id = ?", [ODD]) == 2


def test_duplicate_keys_are_refused_in_the_run_that_wrote_them(store):
    twice = {"metrics": pl.DataFrame({"run_id": [ODD] * 2, "step": [0, 0], "key": ["k", "k"], "value": [1.0, 2.0]})}
    with pytest.raises(duckdb.ConstraintException):
        db.replace_step(store, ODD, 0, twice)


def test_a_unit_holds_only_its_own_rows(store):
    other_step = _metrics(ODD, 3, {"x": 1.0})
    with pytest.raises(ValueError, match=r"metrics: 1 row\(s\) are not of run .* step 0"):
        db.replace_step(store, ODD, 0, other_step)
    with pytest.raises(ValueError, match="metrics: 1 row"):
        db.replace_step(store, "plain", 0, _metrics(ODD, 0, {"x": 1.0}))


def test_unknown_table_names_the_valid_ones(store):
    with pytest.raises(ValueError, match="unknown tables \\['runz'\\].*'metrics'"):
        db.replace_step(store, ODD, 0, {"runz": pl.DataFrame({"a": [1]})})


def test_a_deleted_store_is_rebuilt_from_the_row_log(store):
    store.unlink()
    assert rowlog.mark_all_pending(store) == 5  # two run rows, two steps, one evaluation
    assert db.ingest(store) == 5
    assert dict(db.query(store, "SELECT run_id, count(*) FROM metrics GROUP BY ALL").rows()) == {ODD: 2, "plain": 1}
    assert db.query(store, "SELECT count(*) FROM evaluations").item() == 1


def test_a_removed_row_log_leaves_the_store_as_it_was(store):
    db.replace_step(store, "plain", 4, _metrics("plain", 4, {"a": 1.0}))
    before = _count(store, "SELECT count(*) FROM metrics")
    db.replace_step(store, "gone", 0, _metrics("gone", 0, {"a": 1.0}))  # ingested
    shutil.rmtree(rowlog.rows_dir(store) / "runs" / "gone")
    rowlog._mark_pending(store, "gone", "step-000000", "1")
    assert db.ingest(store) == 1 and _count(store, "SELECT count(*) FROM metrics") == before + 1
