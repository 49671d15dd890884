"""The ``cleaner`` CLI as a user runs it: bad input gives a clear error, a run ends cleanly."""

from __future__ import annotations

import importlib.util
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli import app

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def _out(res) -> str:
    return " ".join(res.output.split())


def test_unknown_config_key_is_named():
    res = runner.invoke(app, ["train", "--set", "rollout.saar.treshold=0.4"])
    assert res.exit_code == 2 and "rollout.saar.treshold: unknown key" in _out(res)


def test_wrong_type_is_named():
    res = runner.invoke(app, ["eval", "--set", "sandbox.timeout_s=fast"])
    assert res.exit_code == 2 and "sandbox.timeout_s" in _out(res)


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    res = runner.invoke(app, ["eval", "--checkpoint", str(tmp_path / "nope")])
    assert res.exit_code == 2 and "does not exist" in _out(res)


def test_resume_of_unknown_run_is_a_clear_error(tmp_path):
    res = runner.invoke(app, ["resume", "no-such-run", "--output-dir", str(tmp_path)])
    assert res.exit_code == 2 and "no run 'no-such-run'" in _out(res)


def test_compare_with_unknown_baseline_arm_is_a_config_error():
    res = runner.invoke(app, ["compare", "--set", "compare.baseline=ppo"])
    assert res.exit_code == 2 and "compare: Value error, baseline 'ppo' is not one of compare.arms" in _out(res)


def test_query_errors_are_reported(tmp_path):
    db = tmp_path / "x.duckdb"
    res = runner.invoke(app, ["query", "SELECT 1", "--set", f"tracking.duckdb_path={db}"])
    assert res.exit_code == 2 and "does not exist yet" in _out(res)
    import duckdb

    duckdb.connect(str(db)).close()
    res = runner.invoke(app, ["query", "SELEC nonsense", "--set", f"tracking.duckdb_path={db}"])
    assert res.exit_code == 2 and "query failed" in _out(res)


HOME_CODE = ("import flows.cli; from prefect.settings import get_current_settings; from flows.serve_stack import "
             "StackConfig; from pathlib import Path; print(get_current_settings().home); "
             "print(StackConfig(Path('.serve')).env('worker')['PREFECT_HOME'])")


def test_cleaner_uses_the_projects_prefect_home_unless_the_shell_sets_one(tmp_path):
    """`.venv/bin/cleaner` run in a project without PREFECT_HOME uses `<project>/.prefect` (what `make` exports), and
    so do the servers and worker of its stack; an exported PREFECT_HOME wins."""
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_HOME", "PREFECT_API_URL")}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run([sys.executable, "-c", HOME_CODE], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.split() == [str(tmp_path / ".prefect")] * 2, out.stdout + out.stderr
    own = tmp_path / "elsewhere"
    out = subprocess.run([sys.executable, "-c", HOME_CODE], cwd=tmp_path, env={**env, "PREFECT_HOME": str(own)},
                         capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == [str(own)] * 2, out.stdout + out.stderr


def _check_demo():
    spec = importlib.util.spec_from_file_location("check_demo", ROOT / "infra" / "check_demo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_demo_prints_a_line_a_step_and_an_evaluation_and_exits_cleanly(warm_model_dir, tmp_path):
    """`cleaner demo` (2 steps, evaluations of policies 0 and 2) in a fresh process, its output piped as CI pipes
    ``make demo``: exit 0, no tracebacks at shutdown, and what a newcomer reads passes the check CI runs on the
    demo's log (``infra/check_demo.py::check_output``): one line a step, an evaluation line each, the summary, the
    where-to-look block, none of the libraries' bookkeeping, within the line bound. Prefect's own lines are not
    lost: its database (what the Prefect UI shows) holds every task run's state."""
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"), "PYTHONPATH": str(ROOT)}
    for name in ("PREFECT_LOGGING_SETTINGS_PATH", "HF_HUB_DISABLE_PROGRESS_BARS", "MLFLOW_LOGGING_LEVEL"):
        env.pop(name, None)
    sets = [f"model.path={warm_model_dir}", f"output_dir={tmp_path / 'runs'}", "train.steps=2",
            f"data.train_path={tmp_path / 'tr.parquet'}", f"data.eval_path={tmp_path / 'ev.parquet'}",
            "data.n_train=16", "data.n_eval=4", "data.prompts_per_step=2", "rollout.n_samples=2", "train.eval_every=2",
            "eval.n_prompts=4", "eval.samples=2", f"tracking.mlflow_uri=sqlite:///{tmp_path / 'm.db'}",
            f"tracking.artifact_root={tmp_path / 'art'}", f"tracking.duckdb_path={tmp_path / 'c.duckdb'}"]
    cmd = [sys.executable, "-m", "flows.cli", "demo", "--config", str(ROOT / "configs/tiny.yaml")]
    for s in sets:
        cmd += ["--set", s]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=600)
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:]
    for noise in ("Traceback", "CancelledError", "Error flushing", "leaked"):
        assert noise not in out, out[-3000:]
    assert _check_demo().check_output(out, 2, [0, 2]) == [], out
    assert "MLflow UI:" in out and "DuckDB:" in out
    with sqlite3.connect(tmp_path / "prefect" / "prefect.db") as db:
        states = db.execute("SELECT count(*) FROM log WHERE message = 'Finished in state Completed()'").fetchone()[0]
    assert states >= 2 * 6 + 2, states  # six stage tasks a step, two evaluations (and the run's own tasks)


@pytest.mark.parametrize("command", ["stop", "status"])
def test_serve_without_a_recorded_stack_says_so(command, tmp_path):
    res = runner.invoke(app, ["serve", command, "--dir", str(tmp_path)])
    assert res.exit_code == 1 and "no stack recorded here" in _out(res)


def _session(sid: int) -> list[int]:
    """Processes of session ``sid`` (not zombies)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[3]) == sid:
            out.append(int(stat.parent.name))
    return out


@pytest.mark.slow
def test_sigterm_stops_the_temporary_prefect_server_with_the_command(warm_model_dir, tmp_path):
    """`cleaner train` killed with SIGTERM while it trains: it exits, and the temporary Prefect server it started
    (a child process listening on a port) does not outlive it."""
    import signal
    import time

    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"), "PYTHONPATH": str(ROOT)}
    env.pop("PREFECT_API_URL", None)
    from tests.flowrun import tiny_overrides

    cmd = [sys.executable, "-m", "flows.cli", "train", "--config", str(ROOT / "configs/tiny.yaml")]
    for s in tiny_overrides(tmp_path, warm_model_dir, steps=50):
        cmd += ["--set", s]
    with open(tmp_path / "out.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not list((tmp_path / "runs").glob("*/steps/000000")):
            assert proc.poll() is None, (tmp_path / "out.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "training never started"
            time.sleep(0.5)
        server = [p for p in _session(proc.pid) if p != proc.pid]
        assert server, "no temporary Prefect server process below the command"
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
        deadline = time.monotonic() + 30
        while _session(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _session(proc.pid) == [], f"left running after SIGTERM: {_session(proc.pid)}"
    finally:
        for pid in _session(proc.pid):
            os.kill(pid, signal.SIGKILL)


def test_commands_started_together_on_a_fresh_prefect_home_migrate_its_database_once(tmp_path):
    """Three processes on one fresh PREFECT_HOME: each finds the database migrated (alembic at head), the marker is
    written, and a later command skips the migration without loading Prefect's server modules."""
    import sqlite3

    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT)}
    env.pop("PREFECT_API_URL", None)
    code = "from flows.prefect_home import ensure_database; print(ensure_database())"
    procs = [subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for _ in range(3)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    markers = list((tmp_path / "home").glob(".cleaner-db-migrated-*"))
    assert len(markers) == 1 and all(str(markers[0]) in out for out in outs), outs
    with sqlite3.connect(tmp_path / "home" / "prefect.db") as db:
        assert len(db.execute("SELECT version_num FROM alembic_version").fetchall()) == 1
    again = subprocess.run([sys.executable, "-c", code + "; import sys; print('prefect.server.database' in sys.modules)"],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert again.stdout.split()[-1] == "False", again.stdout + again.stderr


def _failed_flow_run() -> str:
    """A real flow run (on the Prefect API in effect) whose task ``update`` logs 6 lines and fails; its id."""
    from prefect import flow, get_run_logger, task
    from prefect.logging.handlers import APILogWorker

    @task(name="update")
    def update(step: int) -> None:
        for i in range(6):
            get_run_logger().info(f"micro-batch {i}: loss 0.{i}")
        raise ValueError("loss is nan")

    @flow(name="doomed")
    def doomed() -> None:
        try:
            update(3)
        except ValueError as err:
            raise RuntimeError(f"stage 'update' of step 3 failed: ValueError: {err}") from err

    flow_run_id = str(doomed(return_state=True).state_details.flow_run_id)
    APILogWorker.drain_all(timeout=30)
    return flow_run_id


def test_runs_show_prints_why_a_flow_run_failed(prefect_harness, tmp_path):
    """`cleaner runs show` of a failed flow run — by id, by the name `--watch` prints, by the training run's id —
    prints its state message, the task run that failed and that task's last log lines; exit 1. An unknown run is
    exit 2 naming where it looked."""
    import json

    from prefect.client.orchestration import get_client

    flow_run_id = _failed_flow_run()
    with get_client(sync_client=True) as client:
        name = client.read_flow_run(flow_run_id).name
        [task_run] = [t for t in client.read_task_runs() if str(t.flow_run_id) == flow_run_id]
    (tmp_path / "runs" / "tiny-x").mkdir(parents=True)
    (tmp_path / "runs" / "tiny-x" / "prefect.json").write_text(json.dumps({"flow_run_id": flow_run_id}))
    for ref in (flow_run_id, name, "tiny-x"):
        res = runner.invoke(app, ["runs", "show", ref, "--lines", "3", "--output-dir", str(tmp_path / "runs")])
        lines = res.output.splitlines()
        assert res.exit_code == 1, res.output
        assert lines[0] == f"flow run   {name}  ({flow_run_id})   deployment -"
        assert lines[1] == ("state      Failed: Flow run encountered an exception: RuntimeError: stage 'update' of "
                            "step 3 failed: ValueError: loss is nan")
        assert lines[2] == f"failed     task run {task_run.name!r} (Failed)"
        assert lines[3] == f"last 3 log lines of task run {task_run.name!r}:"
        assert lines[5].strip() == "ValueError: loss is nan"
        assert lines[6].endswith(" ERROR    Finished in state Failed('Task run encountered an exception ValueError: "
                                 "loss is nan')")
        assert len(lines) == 7
    res = runner.invoke(app, ["runs", "show", name, "--lines", "60"])
    logged = [line.split(" ", 3)[-1] for line in res.output.splitlines() if "micro-batch" in line]
    assert logged == [f"INFO     micro-batch {i}: loss 0.{i}" for i in range(6)], res.output
    res = runner.invoke(app, ["runs", "show", "no-such-run"])
    assert res.exit_code == 2 and res.output.startswith("no flow run 'no-such-run' in the Prefect API http://")


def test_resume_finds_the_stacks_api_in_its_folder_when_none_is_set(prefect_harness, tmp_path):
    """`cleaner resume` of a deployment's run with no PREFECT_API_URL: the API comes from the running stack's
    `pids.json` (here: the test's Prefect server, its `prefect` process group a live one), and the flow run is put
    back to Scheduled through it."""
    import json

    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    flow_run_id = _failed_flow_run()
    api = PREFECT_API_URL.value()
    run = tmp_path / "runs" / "nightly"
    run.mkdir(parents=True)
    (run / "config.json").write_text("{}")
    (run / "prefect.json").write_text(json.dumps({"flow_run_id": flow_run_id, "deployment_id": "dep-9"}))
    (tmp_path / "serve").mkdir()
    group = subprocess.Popen(["sleep", "300"], start_new_session=True)  # stands in for the stack's Prefect server
    try:
        (tmp_path / "serve" / "pids.json").write_text(json.dumps({"pids": {"prefect": group.pid}, "prefect_api": api}))
        with temporary_settings(restore_defaults={PREFECT_API_URL}):
            res = runner.invoke(app, ["resume", "nightly", "--output-dir", str(tmp_path / "runs"), "--dir",
                                      str(tmp_path / "serve")])
    finally:
        group.kill()
        group.wait()
    assert res.exit_code == 0, res.output
    assert f"flow run {flow_run_id} of its deployment retried (FAILED)" in " ".join(res.output.split())
    with get_client(sync_client=True) as client:
        assert client.read_flow_run(flow_run_id).state.type.value == "SCHEDULED"


def test_help_keeps_literal_brackets():
    res = runner.invoke(app, ["compare", "--help"])
    assert "--set 'compare.add_arms=[r3l]'" in _out(res), res.output


def test_output_to_a_pipe_is_not_wrapped(tmp_path):
    """Printed to a pipe or a log, a long path stays on one line (Rich's default wraps at 80 columns)."""
    store = tmp_path / ("a-folder-with-a-long-name-" * 5) / "cleaner.duckdb"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("COLUMNS", None)
    done = subprocess.run([sys.executable, "-m", "flows.cli", "query", "SELECT 1", "--set",
                           f"tracking.duckdb_path={store}"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2
    assert f"{store} does not exist yet: train first" in done.stdout.splitlines(), done.stdout


STACK_CODE = "import os, sys; sys.argv[0] = 'cleaner'; import flows.cli; print(os.environ.get('PREFECT_API_URL'))"


def test_commands_use_the_projects_running_stack_unless_an_api_is_set(tmp_path):
    """A project whose stack runs (`.serve/pids.json` ready, its Prefect group alive, its port open): `cleaner`
    talks to that API; an exported PREFECT_API_URL, a stack not ready, a stale record (port closed) or a program
    that only imports the CLI (a test) is left alone."""
    import json
    import socket

    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_HOME", "PREFECT_API_URL")}
    env["PYTHONPATH"] = str(ROOT)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    group = subprocess.Popen(["sleep", "300"], start_new_session=True)  # stands in for the Prefect server's group
    (tmp_path / ".serve").mkdir()

    def api_seen(record: dict, code: str = STACK_CODE, **extra: str) -> str:
        (tmp_path / ".serve" / "pids.json").write_text(json.dumps(record))
        return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env={**env, **extra},
                              capture_output=True, text=True, timeout=120).stdout.strip()

    try:
        stack = {"ready": True, "pids": {"prefect": group.pid}, "prefect_api": f"http://127.0.0.1:{port}/api"}
        assert api_seen(stack) == f"http://127.0.0.1:{port}/api"
        imported = STACK_CODE.replace("sys.argv[0] = 'cleaner'; ", "")  # a test importing the CLI: left alone
        assert api_seen(stack, imported) == "None"
        assert api_seen(stack, PREFECT_API_URL="http://elsewhere:1/api") == "http://elsewhere:1/api"
        assert api_seen({**stack, "ready": False}) == "None"
        listener.close()
        assert api_seen(stack) == "None"  # nothing listens: a stale record
    finally:
        listener.close()
        group.kill()
        group.wait()
