"""DuckDB store: every run, step, trajectory, turn, tool execution, SAAR event and metric.

Tables and keys: ``tasks.stores.schema``. Runs never open the DuckDB file: ``upsert_run``, ``set_status``,
``replace_step`` and ``replace_eval`` write a unit of rows to the row log beside the store
(``tasks.stores.rowlog``), then try to ``ingest`` without waiting; ``ingest`` loads every pending unit in one
process at a time (DuckDB's lock), replacing the unit's rows by key in one transaction, so any number of runs
write at once, none waits or fails on the store, and a unit loaded twice (after a crash) is loaded once. A
dispatched run (``ROWS_ONLY_ENV`` set in its environment by ``flows.dispatch``) writes its units and nothing else:
it never opens the file for writing, and the compare that dispatched it ingests them from one process
(docs/team.md). ``query`` (``cleaner query``) ingests first, waiting up to ``LOCK_WAIT_S`` for another ingest or
reader; a file still held then, even read-only, fails with a one-line error naming that process. The named readers of some
runs' rows (``run_metrics``, ``eval_pass_at_1``, ``evaluation_rows``, ``kept_kinds``) read those runs' row-log
files, not the store. Why this design: docs/store.md.

Every SQL statement of the pipeline lives here or in the row log, with its values as parameters (never pasted
into the text). Rows go in as Arrow batches or Parquet files, never one by one.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

import duckdb
import polars as pl

from tasks.stores import fence, rowlog
from tasks.stores.schema import SCHEMA, STEP_TABLES, UNITS


class StoreLockedError(RuntimeError):
    """The DuckDB file is open in another process (a writer, or a read-only reader such as a notebook)."""


def _holder(message: str) -> str:
    """``PID n (command line)`` of the process DuckDB says holds the lock, from its error message."""
    found = re.search(r"\(PID (\d+)\)", message)
    if not found:
        return "another process"
    pid = found.group(1)
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        argv = []
    short = [" ".join(a.split())[:40] + ("…" if len(a) > 40 else "") for a in argv if a]
    return f"PID {pid}" + (f" ({' '.join(short)[:240]})" if short else "")


ROWS_ONLY_ENV = "CLEANER_ROWS_ONLY"
"""Environment variable that makes a process a row-log writer only (``1``): ``connect`` refuses to open the file
for writing there and ``_write`` does not ingest. ``flows.dispatch`` sets it for every dispatched run, so the file
has one writer, the compare, wherever the runs go."""


class NotTheWriterError(RuntimeError):
    """A process with ``ROWS_ONLY_ENV`` set tried to open the DuckDB file for writing."""


def rows_only() -> bool:
    """Whether this process writes row-log units only (``ROWS_ONLY_ENV``)."""
    return os.environ.get(ROWS_ONLY_ENV, "") not in ("", "0")


LOCK_WAIT_S = 5.0
"""How long ``connect`` retries a file another process holds: longer than any ingest takes."""


def connect(path: str | Path, wait_s: float = LOCK_WAIT_S, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """Open (and create, unless ``read_only``) the store, retrying for ``wait_s`` while another process holds it; a
    file still held then is a one-line error naming that process. A rows-only process (``rows_only``) may open it
    read-only, never for writing."""
    if not read_only and rows_only():
        raise NotTheWriterError(
            f"tracking.duckdb_path: {path} is not opened for writing in this process ({ROWS_ONLY_ENV} is set: a "
            "dispatched run writes its row-log units only; the compare that dispatched it ingests them)")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            con = duckdb.connect(str(path), read_only=read_only)
            break
        except duckdb.IOException as err:
            if "lock" not in str(err).lower():
                raise
            if time.monotonic() >= deadline:
                raise StoreLockedError(
                    f"tracking.duckdb_path: {path} is open in {_holder(str(err))} (waited {wait_s:g} s); DuckDB "
                    "allows one process per file, even a read-only one: close it there, or set "
                    "tracking.duckdb_path") from None
            time.sleep(0.1)
    if not read_only:
        con.execute(SCHEMA)
    return con


@contextmanager
def session(path: str | Path) -> Iterator[duckdb.DuckDBPyConnection]:
    """``connect(path)`` for the length of a ``with`` block; the file is closed on exit."""
    con = connect(path)
    try:
        yield con
    finally:
        con.close()


@contextmanager
def _transaction(con: duckdb.DuckDBPyConnection) -> Iterator[None]:
    con.execute("BEGIN TRANSACTION")
    try:
        yield
    except BaseException:
        con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")


_INGEST = threading.Lock()
"""One ingest at a time in this process (threads share DuckDB's file lock)."""


def ingest(path: str | Path, wait_s: float = LOCK_WAIT_S) -> int:
    """Load every pending unit of the row log into the store (waiting up to ``wait_s`` for the file); returns
    the units loaded. Each unit replaces its rows by key in one transaction; a marker goes once a version at least
    as new as the one it names is in (a marker written just before its version's rename stays for the next
    ingest)."""
    with _INGEST:
        marks = rowlog.pending(path)
        if not marks and Path(path).exists():
            return 0
        con = connect(path, wait_s)
        try:
            done = 0
            for (run_id, unit), found in marks.items():
                loaded = _load_unit(con, path, run_id, unit)
                if loaded is None:
                    continue
                done += 1
                for mark in found:
                    if mark.version <= loaded:
                        mark.path.unlink(missing_ok=True)
            return done
        finally:
            con.close()


def try_ingest(path: str | Path) -> int | None:
    """``ingest`` if the store is free right now, else None (the units stay pending for the next ingest)."""
    try:
        return ingest(path, wait_s=0)
    except (StoreLockedError, duckdb.ConnectionException):
        return None


_GONE = 10**30
"""What ``_load_unit`` reports for a unit whose run's row log was removed: every marker of it is satisfied."""


def _load_unit(con: duckdb.DuckDBPyConnection, path: str | Path, run_id: str, unit: str) -> int | None:
    """Replace one unit's rows by its newest version; the version loaded, or None when there was none yet (a
    first write before its rename) or versions kept changing under the read."""
    kind, key = rowlog.parse_unit(unit)
    tables, column = UNITS[kind]
    for _ in range(3):
        newest = rowlog.latest(path, run_id, unit)
        if newest is None:  # its run's row log was removed: nothing to load; or its first version is not in yet
            return _GONE if not (rowlog.rows_dir(path) / "runs" / run_id / unit).is_dir() else None
        try:
            with _transaction(con):
                for table in tables:
                    where = "run_id = ?" + (f" AND {column} = ?" if column else "")
                    con.execute(f"DELETE FROM {table} WHERE {where}", [run_id, *([key] if column else [])])
                    if (newest / f"{table}.parquet").exists():
                        con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM read_parquet(?, hive_partitioning = false)",
                                    [str(newest / f"{table}.parquet")])
            return int(newest.name)
        except duckdb.IOException:  # a newer version replaced this one while it was read
            continue
    return None


def _write(path: str | Path, run_id: str, kind: str, key: int | None, frames: dict[str, pl.DataFrame]) -> None:
    """A new version of one unit of ``run_id``, then an ingest if the store is free (none in a rows-only process).
    Fenced (``tasks.stores.fence``): the attempt file's lock is held over the whole unit write — its Parquet files and
    marker written and flushed, the rename — so an attempt of the run that a newer one replaced writes none, and a
    claim waits for it."""
    with fence.guarded_run(run_id):
        rowlog.write_unit(path, run_id, kind, key, frames)
    _ingest_unless_rows_only(path)


def _ingest_unless_rows_only(path: str | Path) -> None:
    """After a unit write: ``try_ingest``, except in a rows-only process (``ROWS_ONLY_ENV``: the compare ingests)."""
    if not rows_only():
        try_ingest(path)


def upsert_run(path: str | Path, run_id: str, name: str, config: dict, mlflow_run_id: str, status: str) -> None:
    """The run's ``runs`` row (its creation time kept from an earlier attempt)."""
    old = rowlog.read_unit(path, run_id, "run")
    created = old["runs"]["created_at"][0] if old else datetime.now()
    _write(path, run_id, "run", None, {"runs": pl.DataFrame({
        "run_id": [run_id], "name": [name], "config": [json.dumps(config)], "mlflow_run_id": [mlflow_run_id],
        "status": [status], "created_at": [created]})})


def set_status(path: str | Path, run_id: str, status: str, only_from: str | None = None) -> bool:
    """Set the run's status (only while it is ``only_from``, when given); False when nothing changed."""
    with fence.guarded_run(run_id):  # the read and the write are one step for the attempt holding the run
        old = rowlog.read_unit(path, run_id, "run")
        if old is None or (only_from is not None and old["runs"]["status"][0] != only_from):
            return False
        rowlog.write_unit(path, run_id, "run", None,
                          {"runs": old["runs"].with_columns(pl.lit(status).alias("status"))})
    _ingest_unless_rows_only(path)
    return True


def end_run(path: str | Path, run_id: str, status: str) -> None:
    """Set a run row still ``running`` to ``status`` (crashed, cancelled, failed)."""
    set_status(path, run_id, status, only_from="running")


def replace_step(path: str | Path, run_id: str, step: int, frames: dict[str, pl.DataFrame]) -> None:
    """Replace every row of (run_id, step) by ``frames`` (table name → rows): a new version of the step's unit."""
    unknown = set(frames) - set(STEP_TABLES)
    if unknown:
        raise ValueError(f"replace_step: unknown tables {sorted(unknown)}; valid: {list(STEP_TABLES)}")
    _write(path, run_id, "step", step, frames)


def replace_eval(path: str | Path, run_id: str, version: int, checkpoint: str, metrics: dict[str, float]) -> None:
    """Replace the evaluation rows of one policy version."""
    df = pl.DataFrame({"run_id": run_id, "policy_version": version, "checkpoint": checkpoint,
                       "key": list(metrics), "value": [float(v) for v in metrics.values()]})
    _write(path, run_id, "eval", version, {"evaluations": df})


def _runs_query(path: str | Path, run_ids: Sequence[str], tables: Sequence[str], sql: str,
                params: Sequence) -> pl.DataFrame:
    """``sql`` over the row-log rows of ``run_ids`` in ``tables`` (never the store file: a run reading its own
    rows never waits for it)."""
    con = rowlog.load(path, run_ids, tables)
    try:
        return con.execute(sql, params).pl()
    finally:
        con.close()


def query(path: str | Path, sql: str, params: Sequence | None = None) -> pl.DataFrame:
    """Ingest pending rows, then run read-only SQL against the store; values go in ``params`` (``?``)."""
    ingest(path)
    con = connect(path, read_only=True)
    try:
        return con.execute(sql, params or []).pl()
    finally:
        con.close()


def run_metrics(path: str | Path, run_id: str, prefix: str = "") -> pl.DataFrame:
    """(step, key, value) of every metric of ``run_id`` whose key starts with ``prefix``."""
    return _runs_query(path, [run_id], ["metrics"], "SELECT step, key, value FROM metrics WHERE run_id = ? "
                       "AND starts_with(key, ?)", [run_id, prefix])


def eval_pass_at_1(path: str | Path, run_id: str) -> pl.DataFrame:
    """(policy_version, key, value) of the overall pass@1 of every evaluation mode of ``run_id``."""
    return _runs_query(path, [run_id], ["evaluations"], "SELECT policy_version, key, value FROM evaluations "
                       "WHERE run_id = ? AND key LIKE 'eval/%/all/pass_at_1'", [run_id])


def evaluation_rows(path: str | Path, run_ids: Sequence[str]) -> pl.DataFrame:
    """(run_id, policy_version, key, value) of every evaluation of ``run_ids``."""
    return _runs_query(path, run_ids, ["evaluations"], "SELECT run_id, policy_version, key, value FROM evaluations "
                       "WHERE list_contains(?::VARCHAR[], run_id)", [list(run_ids)])


def step_totals(path: str | Path, run_ids: Sequence[str], keys: Sequence[str],
                prefixes: Sequence[str] = ()) -> pl.DataFrame:
    """(run_id, key, total, steps): the sum over training steps of each per-step metric in ``keys`` or whose key
    starts with one of ``prefixes``."""
    return _runs_query(path, run_ids, ["metrics"], "SELECT run_id, key, sum(value) AS total, count(*) AS steps "
                       "FROM metrics WHERE list_contains(?::VARCHAR[], run_id) AND (list_contains(?::VARCHAR[], key) "
                       "OR EXISTS (SELECT 1 FROM unnest(?::VARCHAR[]) AS p(prefix) WHERE starts_with(key, p.prefix))) "
                       "GROUP BY ALL", [list(run_ids), list(keys), list(prefixes)])


def kept_kinds(path: str | Path, run_ids: Sequence[str]) -> pl.DataFrame:
    """Trained (kept) trajectories of ``run_ids`` by kind — R3L's rows by their kind, then errors kept,
    purified, clean first try — with their count and mean reward and advantage."""
    return _runs_query(path, run_ids, ["trajectories"], """
        SELECT run_id, CASE WHEN coalesce(kind, 'rollout') NOT IN ('rollout', 'base') THEN 'R3L ' || kind
                            WHEN errors_kept > 0 THEN 'errors kept' WHEN rollbacks_recovered > 0 THEN 'purified'
                            ELSE 'clean first try' END AS kind, count(*) AS n, avg(reward) AS reward,
               avg(advantage) AS advantage
        FROM trajectories WHERE kept AND list_contains(?::VARCHAR[], run_id) GROUP BY ALL""", [list(run_ids)])
