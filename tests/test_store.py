"""The DuckDB store's own API: sessions, transactions, parameterised queries (``tasks.stores.db``).

Run ids come from users (``--run-id``) and Prefect; pasted into SQL text, a quote breaks the
query or widens it. Every query takes them as parameters, so an id holding SQL is only an id.

Run: ``pytest tests/test_store.py``.
"""

from __future__ import annotations

import duckdb
import polars as pl
import pytest

from tasks.stores import db

ODD = "x' OR '1'='1"


def _metrics(run_id: str, step: int, values: dict[str, float]) -> dict[str, pl.DataFrame]:
    return {"metrics": pl.DataFrame({"run_id": run_id, "step": step, "key": list(values),
                                     "value": list(values.values())})}


@pytest.fixture
def store(tmp_path):
    path = tmp_path / "s.duckdb"
    with db.session(path) as con:
        db.upsert_run(con, ODD, "tiny", {"seed": 0}, "ml1", "running")
        db.upsert_run(con, "plain", "tiny", {"seed": 1}, "ml2", "running")
        db.replace_step(con, ODD, 0, _metrics(ODD, 0, {"time/rollout_s": 1.5, "rollout/accuracy": 0.25}))
        db.replace_step(con, "plain", 0, _metrics("plain", 0, {"time/rollout_s": 9.0}))
        db.replace_eval(con, ODD, 2, "ckpt", {"eval/saar_off/all/pass_at_1": 0.5})
    return path


def test_an_id_holding_sql_selects_only_its_own_rows(store):
    rows = db.run_metrics(store, ODD)
    assert sorted(rows["key"]) == ["rollout/accuracy", "time/rollout_s"] and set(rows["value"]) == {1.5, 0.25}
    assert db.run_metrics(store, ODD, "time/")["value"].to_list() == [1.5]
    assert db.run_metrics(store, "x").height == 0
    assert db.evaluation_rows(store, [ODD, "plain"]).rows() == [(ODD, 2, "eval/saar_off/all/pass_at_1", 0.5)]
    assert db.evaluation_rows(store, ["plain"]).height == 0


def test_status_update_touches_one_run(store):
    with db.session(store) as con:
        db.set_status(con, ODD, "finished")
    got = dict(db.query(store, "SELECT run_id, status FROM runs").rows())
    assert got == {ODD: "finished", "plain": "running"}


def test_session_closes_the_file(store):
    with db.session(store) as con:
        pass
    with pytest.raises(duckdb.ConnectionException):
        con.execute("SELECT 1")


def test_a_failed_step_replacement_keeps_the_old_rows(store):
    bad = _metrics(ODD, 0, {"x": 1.0})
    bad["turns"] = pl.DataFrame({"run_id": [ODD], "step": [0], "no_such_column": [1]})
    with db.session(store) as con, pytest.raises(duckdb.Error):
        db.replace_step(con, ODD, 0, bad)
    assert sorted(db.run_metrics(store, ODD)["key"]) == ["rollout/accuracy", "time/rollout_s"]


def test_unknown_table_names_the_valid_ones(store):
    with db.session(store) as con, pytest.raises(ValueError, match="unknown tables \\['runz'\\].*'metrics'"):
        db.replace_step(con, ODD, 0, {"runz": pl.DataFrame({"a": [1]})})
