"""Concurrent runs on one store: none waits or fails on it, every row arrives once (docs/store.md).

* several processes write units and ingest at once while another queries — each its own run, and all of them one
  shared unit — every write returns, and the store holds exactly the row log's newest versions;
* three ``cleaner train`` runs started together on one store all finish, one of them killed (SIGKILL) after its
  first step and resumed: ``cleaner query`` sees every run's rows with no duplicates, and no temporary Prefect server
  of theirs is left running;
* three ``cleaner train`` started together, each with its temporary Prefect server up, one killed with SIGKILL and
  the others stopped with SIGTERM: no server process of theirs (found by PID and ``PREFECT_HOME``) outlives them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tasks.stores import db, rowlog
from tests import storecheck
from tests.flowrun import tiny_overrides

ROOT = Path(__file__).resolve().parents[1]

WRITER = """
import sys, polars as pl
from tasks.stores import db
store, run, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
db.upsert_run(store, run, "tiny", {}, "ml", "running")
for step in range(steps):
    for attempt in range(2):  # every step written twice, as a rerun of it would
        db.replace_step(store, run, step, {"metrics": pl.DataFrame(
            {"run_id": run, "step": step, "key": ["a", "b", "c"], "value": [float(attempt)] * 3})})
    db.replace_step(store, "shared", 0, {"metrics": pl.DataFrame(  # every writer writes this unit too
        {"run_id": "shared", "step": 0, "key": ["w", run], "value": [float(step), 1.0]})})
db.set_status(store, run, "finished")
print("done", flush=True)
"""

READER = """
import sys, time
from tasks.stores import db
deadline = time.time() + float(sys.argv[2])
while time.time() < deadline:
    db.query(sys.argv[1], "SELECT count(*) FROM metrics")
print("read", flush=True)
"""


def test_writers_never_wait_and_every_row_arrives_once(tmp_path):
    store = tmp_path / "shared.duckdb"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    reader = subprocess.Popen([sys.executable, "-c", READER, str(store), "8"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(store), f"run-{i}", "12"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(4)]
    for w in [*writers, reader]:
        out, err = w.communicate(timeout=240)
        assert w.returncode == 0 and out.strip() in ("done", "read"), err[-2000:]
    counts = db.query(store, "SELECT run_id, count(*) AS n, sum(value) AS s FROM metrics WHERE run_id != 'shared' "
                             "GROUP BY ALL ORDER BY 1")
    assert counts.rows() == [(f"run-{i}", 36, 36.0) for i in range(4)]  # 12 steps × 3 keys, the second attempt (1.0)
    shared = db.query(store, "SELECT key, value FROM metrics WHERE run_id = 'shared' ORDER BY key").rows()
    assert len(shared) == 2 and shared[1] == ("w", 11.0) and shared[0][0] in {f"run-{i}" for i in range(4)}, shared
    assert storecheck.differences(store, ["shared", *(f"run-{i}" for i in range(4))]) == {}
    assert dict(db.query(store, "SELECT run_id, status FROM runs").rows()) == {f"run-{i}": "finished" for i in range(4)}
    assert not rowlog.pending(store)


def prefect_servers(home: Path) -> list[int]:
    """PIDs of Prefect's temporary servers (uvicorn on ``create_app``) whose ``PREFECT_HOME`` is ``home``."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmdline, environ = (proc / "cmdline").read_bytes(), (proc / "environ").read_bytes()
        except OSError:
            continue
        if b"prefect.server.api.server:create_app" in cmdline and \
                f"PREFECT_HOME={home}".encode() in environ.split(b"\0"):
            found.append(int(proc.name))
    return found


def _wait_no_servers(home: Path, timeout_s: float = 60) -> list[int]:
    deadline = time.time() + timeout_s
    while prefect_servers(home) and time.time() < deadline:
        time.sleep(0.5)
    return prefect_servers(home)


def _train(tmp_path: Path, warm: Path, run_id: str, env: dict, *extra: str) -> subprocess.Popen:
    args = [a for o in [*tiny_overrides(tmp_path, warm, steps=2), "data.prompts_per_step=2", "rollout.n_samples=2"]
            for a in ("--set", o)]
    log = open(tmp_path / f"{run_id}.log", "w")
    return subprocess.Popen([sys.executable, "-m", "flows.cli", *(extra or ("train", "--config", "configs/tiny.yaml",
                                                                            *args, "--run-id", run_id))],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_three_cli_runs_started_together_all_finish_with_every_row_once(warm_model_dir, tmp_path):
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_HOME": str(tmp_path / "prefect"),
           "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    env.pop("PREFECT_API_URL", None)
    # a fresh PREFECT_HOME: the three commands' temporary servers find its database migrated once
    # (flows.prefect_home), not three times at once
    ids = ["c-0", "c-1", "c-2"]
    procs = {rid: _train(tmp_path, warm_model_dir, rid, env) for rid in ids}
    logged = tmp_path / "runs" / "c-2" / "steps" / "000000" / "logged.json"
    deadline = time.time() + 900
    while not logged.exists() and procs["c-2"].poll() is None:
        assert time.time() < deadline, "c-2 never logged its first step"
        time.sleep(0.5)
    assert procs["c-2"].poll() is None, (tmp_path / "c-2.log").read_text()[-3000:]
    os.kill(procs["c-2"].pid, signal.SIGKILL)  # a crash after the first step
    for rid in ids:
        assert procs[rid].wait(timeout=900) == (-signal.SIGKILL if rid == "c-2" else 0), \
            (tmp_path / f"{rid}.log").read_text()[-3000:]
    resumed = _train(tmp_path, warm_model_dir, "c-2", env, "resume", "c-2", "--output-dir", str(tmp_path / "runs"))
    assert resumed.wait(timeout=900) == 0, (tmp_path / "c-2.log").read_text()[-3000:]
    store = tmp_path / "cleaner.duckdb"
    query = subprocess.run([sys.executable, "-m", "flows.cli", "query", "SELECT run_id, step, count(*) AS n FROM "
                            "trajectories GROUP BY ALL ORDER BY ALL", "--set", f"tracking.duckdb_path={store}"],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert query.returncode == 0, query.stdout + query.stderr
    # data.prompts_per_step=2 × rollout.n_samples=2 = 4 trajectories per step, 2 steps per run
    got = db.query(store, "SELECT run_id, step, count(*) FROM trajectories GROUP BY ALL ORDER BY ALL").rows()
    assert got == [(rid, step, 4) for rid in ids for step in (0, 1)]
    assert storecheck.differences(store, ids) == {}
    assert dict(db.query(store, "SELECT run_id, status FROM runs").rows()) == {rid: "finished" for rid in ids}
    assert _wait_no_servers(tmp_path / "prefect") == []  # not even the one of the command killed with SIGKILL


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_no_temporary_prefect_server_outlives_commands_started_together(warm_model_dir, tmp_path):
    """Three `cleaner train` at once, each with its temporary Prefect server up; one is killed with SIGKILL (no
    atexit runs), the others get SIGTERM: afterwards no server process of theirs runs (before: the killed
    command's server ran on with parent PID 1)."""
    home = tmp_path / "prefect"
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_HOME": str(home),
           "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    env.pop("PREFECT_API_URL", None)
    procs = [_train(tmp_path, warm_model_dir, f"s-{i}", env) for i in range(3)]
    try:
        deadline = time.time() + 600
        while len(prefect_servers(home)) < 3:
            assert time.time() < deadline, f"{len(prefect_servers(home))} of 3 temporary servers started"
            assert all(p.poll() is None for p in procs), [(tmp_path / f"s-{i}.log").read_text()[-2000:]
                                                         for i in range(3)]
            time.sleep(0.5)
        procs[0].send_signal(signal.SIGKILL)
        for proc in procs[1:]:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(timeout=120)
        assert _wait_no_servers(home) == []
    finally:
        for pid in prefect_servers(home):
            os.kill(pid, signal.SIGKILL)
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
