"""Every ready query of ``docs/queries.md`` runs against a store filled by a 2-step flow run,
and the main ones agree with the same figure computed independently in polars."""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl
import pytest

from tasks.stores.db import query
from tests.flowrun import run_tiny_flow

DOC = Path(__file__).resolve().parents[1] / "docs" / "queries.md"


def doc_queries() -> dict[str, str]:
    """Title (the ``--`` comment before ``:``) → SQL, from the doc's ```sql block."""
    block = re.search(r"```sql\n(.*?)```", DOC.read_text(), re.S).group(1)
    out = {}
    for part in re.split(r"\n\s*\n", block.strip()):
        head, _, sql = part.partition("\n")
        out[head.removeprefix("-- ").split(":")[0].strip()] = sql.strip().rstrip(";")
    return out


@pytest.fixture(scope="module")
def store(prefect_harness, warm_model_dir, tmp_path_factory) -> str:
    work = tmp_path_factory.mktemp("queries")
    run_tiny_flow(work, warm_model_dir, "querytest")
    return str(work / "cleaner.duckdb")


def test_doc_lists_the_required_queries():
    titles = set(doc_queries())
    assert {"failure reasons by step", "rollbacks by kind", "slowest executions", "recovery rate by step"} <= titles


@pytest.mark.parametrize("title", list(doc_queries()))
def test_query_runs(store, title):
    df = query(store, doc_queries()[title])
    assert df.width >= 2


def _table(store: str, name: str) -> pl.DataFrame:
    return query(store, f"SELECT * FROM {name}")


def test_queries_agree_with_the_tables(store):
    q = doc_queries()
    execs, trajs, events = _table(store, "tool_executions"), _table(store, "trajectories"), _table(store, "saar_events")
    fails = query(store, q["failure reasons by step"])
    assert fails["failures"].sum() == execs.filter(~pl.col("ok")).height
    kinds = query(store, q["rollbacks by kind"])
    assert dict(zip(kinds["kind"], kinds["events"])) == dict(events.group_by("kind").len().iter_rows())
    slow = query(store, q["slowest executions"])
    assert slow.height == min(10, execs.height)
    if execs.height:
        assert slow["seconds"][0] == pytest.approx(execs["duration_s"].max(), abs=1e-3)
    rec = query(store, q["recovery rate by step"])
    assert rec["step"].to_list() == [0, 1]
    saar = trajs.filter(~pl.col("raw"))
    assert rec["triggered"].sum() == saar["rollbacks_triggered"].sum()
    assert rec["recovered"].sum() == saar["rollbacks_recovered"].sum()
    times = query(store, q["stage wall time by step"])
    assert {"rollout", "score", "update"} <= set(times["stage"])
