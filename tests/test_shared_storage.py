"""The storage contract of a dispatched compare (``tasks.stores.shared``, ``flows.dispatch``) and its one DuckDB writer.

* the compare refuses relative or machine-local stores before any run starts, naming each field;
* a dispatched run refuses to train when it does not see the compare's token files or data files, naming the path
  and the host;
* a dispatched run's process (``CLEANER_ROWS_ONLY=1``) writes row-log units and never opens the DuckDB file for
  writing; the compare's ingest loads each unit once.

The served, two-worker case: ``tests/test_fanout.py``. Run: ``pytest tests/test_shared_storage.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import polars as pl
import pytest

from flows.config import load_config
from flows.dispatch import check_storage, check_worker, shared_files
from tasks.stores import db, rowlog
from tasks.stores.shared import StorageError, local_storage, token_paths, verify_token, write_token

ROOT = Path(__file__).resolve().parents[1]


def shared(tmp: Path) -> list[str]:
    """Overrides that put every store of a run under the absolute folder ``tmp`` with an MLflow server URI."""
    return [f"output_dir={tmp / 'runs'}", f"data.train_path={tmp / 'train.parquet'}",
            f"data.eval_path={tmp / 'eval.parquet'}", f"tracking.duckdb_path={tmp / 'cleaner.duckdb'}",
            "tracking.mlflow_uri=http://stack:5000"]


def test_relative_paths_and_a_sqlite_mlflow_are_each_named():
    problems = local_storage({"output_dir": "runs", "data.train_path": "/shared/rl.parquet", "data.fresh_path": None,
                              "tracking.duckdb_path": "cleaner.duckdb"}, "sqlite:///mlflow.db")
    assert problems == [
        "output_dir: 'runs' is a relative path (each worker would resolve it in its own folder)",
        "tracking.duckdb_path: 'cleaner.duckdb' is a relative path (each worker would resolve it in its own folder)",
        "tracking.mlflow_uri: 'sqlite:///mlflow.db' is a file on this machine (use a tracking server every worker "
        "reaches, e.g. the stack's http://host:5000)"]
    assert local_storage({"output_dir": "/shared/runs"}, "file:///tmp/mlruns")[0].startswith("tracking.mlflow_uri")
    assert local_storage({"output_dir": "/shared/runs"}, "/tmp/mlruns")[0].startswith("tracking.mlflow_uri")
    assert local_storage({"output_dir": "/shared/runs"}, "http://stack:5000") == []


def test_the_defaults_are_refused_unless_told_they_are_shared(tmp_path):
    with pytest.raises(StorageError) as err:
        check_storage(load_config("configs/tiny.yaml"), "compare.dispatch (train/x)")
    text = str(err.value)
    assert text.startswith("compare.dispatch (train/x): a dispatched run must share its stores")
    for field in ("output_dir: 'runs'", "data.train_path: 'data/synthetic-v2/rl.parquet'",
                  "data.eval_path: 'data/synthetic-v2/eval.parquet'", "tracking.duckdb_path: 'cleaner.duckdb'",
                  "tracking.mlflow_uri: 'sqlite:///mlflow.db'", "compare.local_storage=true"):
        assert field in text
    check_storage(load_config("configs/tiny.yaml", ["compare.local_storage=true"]), "compare")
    check_storage(load_config("configs/tiny.yaml", shared(tmp_path)), "compare")


def test_a_dispatch_with_a_relative_output_dir_is_refused_before_any_run_starts(tmp_path):
    """``cleaner compare --dispatch`` as a user runs it, one store forgotten: no Prefect API is even asked (the
    deployment does not exist), no run folder is made."""
    overrides = [o for o in shared(tmp_path) if not o.startswith("output_dir=")] + ["output_dir=runs-forgotten"]
    argv = [sys.executable, "-m", "flows.cli", "compare", "--config", str(ROOT / "configs" / "tiny.yaml"),
            "--compare-id", "cmp-x",
            "--dispatch", "train/nowhere", *[a for o in overrides for a in ("--set", o)]]
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    out = done.stdout + done.stderr
    assert done.returncode != 0
    assert "output_dir: 'runs-forgotten' is a relative path" in out, out[-3000:]
    assert "no deployment" not in out and not (tmp_path / "runs-forgotten").exists()
    assert not list(tmp_path.glob("**/dispatch-token.json"))


def test_a_worker_that_does_not_see_the_store_is_refused_naming_path_and_host(tmp_path):
    cfg = load_config("configs/tiny.yaml", shared(tmp_path))
    data = tmp_path / "train.parquet"
    data.write_bytes(b"x" * 100)
    paths = token_paths(tmp_path / "runs" / "cmp", cfg.tracking.duckdb_path)
    assert paths == [tmp_path / "runs" / "cmp" / "dispatch-token.json",
                     rowlog.rows_dir(tmp_path / "cleaner.duckdb") / "cmp-dispatch-token.json"]
    token = write_token(paths, shared_files(cfg))
    assert set(token) == {str(p) for p in paths} and len(set(token.values())) == 1
    body = json.loads(paths[0].read_text())
    assert body["host"] == socket.gethostname() and body["files"] == {
        "data.train_path": {"path": str(data), "size": 100}}
    assert write_token(paths, shared_files(cfg)) == token  # a rerun of the compare keeps its token
    check_worker(cfg, "cmp-a-s0", token)

    host = socket.gethostname()
    paths[1].unlink()  # this worker mounts the runs folder but not the store's
    with pytest.raises(StorageError, match=f"dispatched run cmp-a-s0 on host {host}: {paths[1]} is missing: this "
                                           "worker does not see the dispatcher's store"):
        verify_token("cmp-a-s0", token)
    paths[1].write_text(json.dumps({**body, "token": "another", "host": "elsewhere"}))
    with pytest.raises(StorageError, match="holds another token \\(written by elsewhere\\)"):
        verify_token("cmp-a-s0", token)
    paths[1].write_text(json.dumps(body))
    data.write_bytes(b"x" * 99)  # its own copy of the data
    with pytest.raises(StorageError, match=f"data.train_path {data} has 99 bytes, not 100 \\(the dispatcher {host}"):
        verify_token("cmp-a-s0", token)
    data.unlink()
    with pytest.raises(StorageError, match=f"data.train_path {data} is missing"):
        verify_token("cmp-a-s0", token)
    relative = load_config("configs/tiny.yaml", [*shared(tmp_path), "output_dir=runs"])
    with pytest.raises(StorageError, match=f"^dispatched run cmp-a-s0 on host {host}: .*output_dir: 'runs'"):
        check_worker(relative, "cmp-a-s0", token)


def test_a_rows_only_process_never_opens_the_store_for_writing(tmp_path, monkeypatch):
    store = tmp_path / "cleaner.duckdb"
    monkeypatch.setenv(db.ROWS_ONLY_ENV, "1")
    with pytest.raises(db.NotTheWriterError, match=f"tracking.duckdb_path: {store} is not opened for writing"):
        db.connect(store)
    db.upsert_run(store, "r1", "tiny", {}, "ml-1", "running")
    db.replace_eval(store, "r1", 0, "ckpt", {"eval/x": 0.5})
    assert db.set_status(store, "r1", "finished", only_from="running")
    assert not store.exists()  # the units are in the row log, the file untouched
    assert len(rowlog.pending(store)) == 2
    monkeypatch.setenv(db.ROWS_ONLY_ENV, "0")
    assert db.ingest(store) == 2 and db.ingest(store) == 0
    rows = db.query(store, "SELECT run_id, status FROM runs")
    assert rows.to_dicts() == [{"run_id": "r1", "status": "finished"}]
    evals = db.query(store, "SELECT key, value FROM evaluations")
    assert evals.equals(pl.DataFrame({"key": ["eval/x"], "value": [0.5]}))


def test_the_stacks_postgres_urls_and_a_folder_the_postgres_user_cannot_reach(tmp_path):
    from flows.serve_db import DatabaseError, Postgres, _check_reachable

    pg = Postgres(tmp_path / "postgres", 6543)
    (tmp_path / "postgres").mkdir()
    (tmp_path / "postgres" / "password").write_text("p@ss/word\n")
    assert pg.base_url() == "postgresql://cleaner:p%40ss%2Fword@127.0.0.1:6543"
    assert pg.database_url("prefect", "asyncpg") == "postgresql+asyncpg://cleaner:p%40ss%2Fword@127.0.0.1:6543/prefect"
    assert pg.argv()[1:7] == ["-D", str(tmp_path / "postgres" / "data"), "-p", "6543", "-h", "127.0.0.1"]
    yours = Postgres(tmp_path / "unused", url="postgresql://u:p@db:5432/")
    assert not yours.managed and yours.database_url("mlflow", "psycopg2") == "postgresql+psycopg2://u:p@db:5432/mlflow"
    with pytest.raises(DatabaseError, match="is mode 700"):  # pytest's own folders are 0700: the stack tests avoid them
        _check_reachable(tmp_path, uid=654321, gid=654321)
    base = Path(tempfile.mkdtemp())
    base.chmod(0o755)
    locked = base / "locked"
    (locked / "inner").mkdir(parents=True)
    locked.chmod(0o700)
    try:
        _check_reachable(base, uid=654321, gid=654321)
        with pytest.raises(DatabaseError, match=f"the postgres user cannot reach {locked / 'inner'}: {locked} is mode "
                                                f"700 \\(owner uid {os.getuid()}\\); .*chmod o\\+x {locked}$"):
            _check_reachable(locked / "inner", uid=654321, gid=654321)
    finally:
        shutil.rmtree(base)


@pytest.mark.parametrize(("args", "message"), [
    (["--database", "mysql"], "unknown --database 'mysql'; one of: sqlite, postgres"),
    (["--database", "postgres", "--mlflow-store", "sqlite:///x.db"], "--mlflow-store is for --database sqlite"),
    (["--database-url", "postgresql://u:p@db:5432"], "--database-url needs --database postgres"),
])
def test_serve_start_refuses_a_bad_database_choice_before_starting_anything(tmp_path, args, message):
    from typer.testing import CliRunner

    from flows.cli_serve import app

    done = CliRunner().invoke(app, ["start", "--dir", str(tmp_path / "serve"), *args])
    assert done.exit_code == 2 and message in done.output
    assert not (tmp_path / "serve" / "pids.json").exists() and not (tmp_path / "serve" / "postgres").exists()
