"""DuckDB store: every run, step, trajectory, turn, tool execution, SAAR event and metric.

Schema (primary keys in brackets)::

    runs            [run_id]                                  name, config, MLflow run id, status
    steps           [run_id, step]                            checkpoint, policy version, seconds
    trajectories    [run_id, step, traj_id]                   ids, mask, reward, advantage, dropped, SAAR stats, kind
    r3l_reflections [run_id, step, traj_id]                   R3L: report, validity, pivot, retry reward, replays
    turns           [run_id, step, traj_id, turn_idx]         final (purified) conversation
    tool_executions [run_id, step, traj_id, exec_idx]         every execution, failed attempts included
    saar_events     [run_id, step, traj_id, event_idx]        triggered / shallow / deep / recovered / ...
    metrics         [run_id, step, key]                       every logged metric
    env_steps       [run_id, step, traj_id, turn_idx]         environment mode: state, answer, actions, reward
    partial_buffer  [run_id, step, traj_id]                   partial rollouts: what step carried to the next
    evaluations     [run_id, policy_version, key]             held-out evaluation of a policy version

A step's rows are replaced in one transaction (a rerun of step N never duplicates rows);
rows go in as Arrow batches (``INSERT ... BY NAME``), never one by one. One process per file
(DuckDB's lock): opening waits up to ``LOCK_WAIT_S`` for another process's session to end (parallel runs on
one store write in short sessions), then a file still open elsewhere, even read-only, fails with a one-line
error naming that process.

Every SQL statement of the pipeline lives here, with its values as parameters (never pasted
into the text). Writers open the file with ``session(path)`` (closed on exit); readers use the
named queries (``run_metrics``, ``evaluation_rows``, ``kept_kinds``) or ``query(path, sql, params)``.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import duckdb
import polars as pl

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id VARCHAR PRIMARY KEY, name VARCHAR, config JSON, mlflow_run_id VARCHAR,
    status VARCHAR, created_at TIMESTAMP DEFAULT current_timestamp);
CREATE TABLE IF NOT EXISTS steps (
    run_id VARCHAR, step BIGINT, checkpoint VARCHAR, policy_version VARCHAR, seconds DOUBLE,
    logged_at TIMESTAMP DEFAULT current_timestamp, PRIMARY KEY (run_id, step));
CREATE TABLE IF NOT EXISTS trajectories (
    run_id VARCHAR, step BIGINT, traj_id VARCHAR, prompt_id VARCHAR, sample_idx BIGINT, raw BOOLEAN,
    data_source VARCHAR, ground_truth VARCHAR, prompt_ids INTEGER[], response_ids INTEGER[],
    response_mask TINYINT[], rollout_logprobs FLOAT[], response_text VARCHAR, messages JSON,
    finish_reason VARCHAR, num_turns BIGINT, tool_calls BIGINT, tool_success BIGINT,
    first_attempt_total BIGINT, first_attempt_success BIGINT, rollbacks_triggered BIGINT,
    rollbacks_recovered BIGINT, rollbacks_failed BIGINT, shallow BIGINT, deep BIGINT, tool_rounds BIGINT,
    errors_kept BIGINT, retry_loops BIGINT,
    failure_reasons JSON, score DOUBLE, correct BOOLEAN, overlong_penalty DOUBLE, reward DOUBLE,
    graded BOOLEAN, reward_metrics JSON, kept BOOLEAN, advantage DOUBLE,
    kind VARCHAR, group_id VARCHAR, fixed_reward DOUBLE, masked_turns BIGINT, parent VARCHAR, adv_scale DOUBLE,
    env_score DOUBLE, env_success BOOLEAN, env_penalty DOUBLE, env_actions BIGINT, dropped BOOLEAN,
    start_step BIGINT, token_versions INTEGER[], PRIMARY KEY (run_id, step, traj_id));
ALTER TABLE trajectories ADD COLUMN IF NOT EXISTS adv_scale DOUBLE;
ALTER TABLE trajectories ADD COLUMN IF NOT EXISTS env_score DOUBLE;
ALTER TABLE trajectories ADD COLUMN IF NOT EXISTS env_success BOOLEAN;
ALTER TABLE trajectories ADD COLUMN IF NOT EXISTS env_penalty DOUBLE;
ALTER TABLE trajectories ADD COLUMN IF NOT EXISTS env_actions BIGINT;
ALTER TABLE trajectories ADD COLUMN IF NOT EXISTS dropped BOOLEAN;
ALTER TABLE trajectories ADD COLUMN IF NOT EXISTS start_step BIGINT;
ALTER TABLE trajectories ADD COLUMN IF NOT EXISTS token_versions INTEGER[];
ALTER TABLE trajectories ADD COLUMN IF NOT EXISTS spliced TINYINT[];
CREATE TABLE IF NOT EXISTS env_steps (
    run_id VARCHAR, step BIGINT, traj_id VARCHAR, turn_idx BIGINT, env VARCHAR, seed BIGINT, state VARCHAR,
    response VARCHAR, think VARCHAR, parsed BOOLEAN, actions JSON, executed JSON, invalid JSON, reward DOUBLE,
    penalty DOUBLE, done BOOLEAN, effective BOOLEAN, actions_left BIGINT,
    PRIMARY KEY (run_id, step, traj_id, turn_idx));
CREATE TABLE IF NOT EXISTS turns (
    run_id VARCHAR, step BIGINT, traj_id VARCHAR, turn_idx BIGINT, role VARCHAR, content VARCHAR,
    PRIMARY KEY (run_id, step, traj_id, turn_idx));
CREATE TABLE IF NOT EXISTS tool_executions (
    run_id VARCHAR, step BIGINT, traj_id VARCHAR, exec_idx BIGINT, position BIGINT, attempt BIGINT,
    code VARCHAR, ok BOOLEAN, error_kind VARCHAR, exit_code BIGINT, timed_out BOOLEAN,
    memory_exceeded BOOLEAN, duration_s DOUBLE, stdout VARCHAR, stderr VARCHAR,
    PRIMARY KEY (run_id, step, traj_id, exec_idx));
CREATE TABLE IF NOT EXISTS saar_events (
    run_id VARCHAR, step BIGINT, traj_id VARCHAR, event_idx BIGINT, position BIGINT, attempt BIGINT,
    kind VARCHAR, similarity DOUBLE, error_kind VARCHAR, error_text VARCHAR, failed_turn VARCHAR,
    new_turn VARCHAR, PRIMARY KEY (run_id, step, traj_id, event_idx));
CREATE TABLE IF NOT EXISTS r3l_reflections (
    run_id VARCHAR, step BIGINT, traj_id VARCHAR, prompt_id VARCHAR, sample_idx BIGINT, base_reward DOUBLE,
    base_steps BIGINT, reflection_text VARCHAR, reflection_tokens BIGINT, finish_reason VARCHAR, report JSON,
    valid BOOLEAN, perfect BOOLEAN, reason VARCHAR, retry_from_step BIGINT, retry_traj_id VARCHAR,
    distill_traj_id VARCHAR, retry_reward DOUBLE, retry_steps BIGINT, retry_succeeded BOOLEAN, replays JSON,
    replay_changed BIGINT, note VARCHAR, retry_messages JSON, PRIMARY KEY (run_id, step, traj_id));
CREATE TABLE IF NOT EXISTS partial_buffer (
    run_id VARCHAR, step BIGINT, position BIGINT, prompt_id VARCHAR, sample_idx BIGINT, traj_id VARCHAR,
    start_step BIGINT, state VARCHAR, finish_reason VARCHAR, prompt_ids INTEGER[], response_ids INTEGER[],
    response_mask TINYINT[], logprobs DOUBLE[], token_versions INTEGER[], carry_ids INTEGER[], carry_logprobs DOUBLE[],
    carry_versions INTEGER[], max_version BIGINT, record JSON, PRIMARY KEY (run_id, step, traj_id));
CREATE TABLE IF NOT EXISTS metrics (
    run_id VARCHAR, step BIGINT, key VARCHAR, value DOUBLE, PRIMARY KEY (run_id, step, key));
ALTER TABLE trajectories ADD COLUMN IF NOT EXISTS kind VARCHAR;
ALTER TABLE trajectories ADD COLUMN IF NOT EXISTS group_id VARCHAR;
ALTER TABLE trajectories ADD COLUMN IF NOT EXISTS fixed_reward DOUBLE;
ALTER TABLE trajectories ADD COLUMN IF NOT EXISTS masked_turns BIGINT;
ALTER TABLE trajectories ADD COLUMN IF NOT EXISTS parent VARCHAR;
CREATE TABLE IF NOT EXISTS evaluations (
    run_id VARCHAR, policy_version BIGINT, checkpoint VARCHAR, key VARCHAR, value DOUBLE,
    PRIMARY KEY (run_id, policy_version, key));
"""

STEP_TABLES = ("trajectories", "turns", "tool_executions", "saar_events", "r3l_reflections", "env_steps", "metrics",
               "steps", "partial_buffer")


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


LOCK_WAIT_S = 5.0
"""How long ``connect`` retries a file another process holds: longer than any write session of a run."""


def connect(path: str | Path, wait_s: float = LOCK_WAIT_S) -> duckdb.DuckDBPyConnection:
    """Open (and create) the store, retrying for ``wait_s`` while another process holds it; a file still held
    then is a one-line error naming that process."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            con = duckdb.connect(str(path))
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


def _insert(con: duckdb.DuckDBPyConnection, table: str, df: pl.DataFrame) -> None:
    """Insert ``df`` into ``table`` (one of the schema's names) as one Arrow batch, columns by name."""
    if df.height:
        con.register("_batch", df.to_arrow())
        con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM _batch")
        con.unregister("_batch")


def end_run(path: str | Path, run_id: str, status: str) -> None:
    """Set a run row still ``running`` to ``status`` (crashed, cancelled, failed)."""
    with session(path) as con:
        con.execute("UPDATE runs SET status = ? WHERE run_id = ? AND status = 'running'", [status, run_id])


def set_status(con, run_id: str, status: str) -> None:
    con.execute("UPDATE runs SET status = ? WHERE run_id = ?", [status, run_id])


def upsert_run(con, run_id: str, name: str, config: dict, mlflow_run_id: str, status: str) -> None:
    con.execute(
        "INSERT OR REPLACE INTO runs (run_id, name, config, mlflow_run_id, status) VALUES (?, ?, ?, ?, ?)",
        [run_id, name, json.dumps(config), mlflow_run_id, status],
    )


def replace_step(con, run_id: str, step: int, frames: dict[str, pl.DataFrame]) -> None:
    """Replace every row of (run_id, step) by ``frames`` (table name → rows) in one transaction."""
    unknown = set(frames) - set(STEP_TABLES)
    if unknown:
        raise ValueError(f"replace_step: unknown tables {sorted(unknown)}; valid: {list(STEP_TABLES)}")
    with _transaction(con):
        for table in STEP_TABLES:
            con.execute(f"DELETE FROM {table} WHERE run_id = ? AND step = ?", [run_id, step])
        for table, df in frames.items():
            _insert(con, table, df)


def replace_eval(con, run_id: str, version: int, checkpoint: str, metrics: dict[str, float]) -> None:
    """Replace the evaluation rows of one policy version in one transaction."""
    df = pl.DataFrame({"run_id": run_id, "policy_version": version, "checkpoint": checkpoint,
                       "key": list(metrics), "value": [float(v) for v in metrics.values()]})
    with _transaction(con):
        con.execute("DELETE FROM evaluations WHERE run_id = ? AND policy_version = ?", [run_id, version])
        _insert(con, "evaluations", df)


def merge_stores(target: str | Path, sources: list[str | Path]) -> dict[str, int]:
    """Copy every row of each source store into ``target``, replacing the target's rows of the same runs.

    Used when runs trained in parallel processes each wrote their own file (DuckDB has one writer
    per file). Every table of a source that has a ``run_id`` column and exists in the target is
    copied; one transaction per source. Returns rows copied per table.
    """
    copied: dict[str, int] = {}
    with session(target) as con:
        for i, src in enumerate(sources):
            alias = f"src{i}"
            quoted = str(Path(src)).replace("'", "''")  # ATTACH takes no parameters: a quoted literal
            con.execute(f"ATTACH '{quoted}' AS {alias} (READ_ONLY)")
            tables = [t for (t,) in con.execute(
                "SELECT table_name FROM duckdb_columns() WHERE database_name = ? AND column_name = 'run_id' "
                "AND table_name IN (SELECT table_name FROM duckdb_tables() WHERE database_name = current_database())",
                [alias]).fetchall()]
            try:
                with _transaction(con):
                    for table in tables:  # identifiers from the source's own catalogue, not user input
                        con.execute(f"DELETE FROM {table} WHERE run_id IN (SELECT DISTINCT run_id FROM {alias}.{table})")
                        con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM {alias}.{table}")
                        n = con.execute(f"SELECT count(*) FROM {alias}.{table}").fetchone()[0]
                        copied[table] = copied.get(table, 0) + n
            finally:
                con.execute(f"DETACH {alias}")
    return copied


def query(path: str | Path, sql: str, params: Sequence | None = None) -> pl.DataFrame:
    """Run read-only SQL against the store; values go in ``params`` (``?`` placeholders)."""
    con = duckdb.connect(str(path), read_only=True)
    try:
        return con.execute(sql, params or []).pl()
    finally:
        con.close()


def run_metrics(path: str | Path, run_id: str, prefix: str = "") -> pl.DataFrame:
    """(step, key, value) of every metric of ``run_id`` whose key starts with ``prefix``."""
    return query(path, "SELECT step, key, value FROM metrics WHERE run_id = ? AND starts_with(key, ?)",
                 [run_id, prefix])


def eval_pass_at_1(path: str | Path, run_id: str) -> pl.DataFrame:
    """(policy_version, key, value) of the overall pass@1 of every evaluation mode of ``run_id``."""
    return query(path, "SELECT policy_version, key, value FROM evaluations WHERE run_id = ? "
                       "AND key LIKE 'eval/%/all/pass_at_1'", [run_id])


def evaluation_rows(path: str | Path, run_ids: Sequence[str]) -> pl.DataFrame:
    """(run_id, policy_version, key, value) of every evaluation of ``run_ids``."""
    return query(path, "SELECT run_id, policy_version, key, value FROM evaluations "
                       "WHERE list_contains(?::VARCHAR[], run_id)", [list(run_ids)])


def kept_kinds(path: str | Path, run_ids: Sequence[str]) -> pl.DataFrame:
    """Trained (kept) trajectories of ``run_ids`` by kind — R3L's rows by their kind, then errors kept,
    purified, clean first try — with their count and mean reward and advantage."""
    return query(path, """
        SELECT run_id, CASE WHEN coalesce(kind, 'rollout') NOT IN ('rollout', 'base') THEN 'R3L ' || kind
                            WHEN errors_kept > 0 THEN 'errors kept' WHEN rollbacks_recovered > 0 THEN 'purified'
                            ELSE 'clean first try' END AS kind, count(*) AS n, avg(reward) AS reward,
               avg(advantage) AS advantage
        FROM trajectories WHERE kept AND list_contains(?::VARCHAR[], run_id) GROUP BY ALL""", [list(run_ids)])
