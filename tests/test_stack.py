"""A served stack as a team runs it (``cleaner serve start --detach --database postgres``, real Prefect server +
process worker + MLflow server, both on the stack's own PostgreSQL; the ``train-tiny`` deployment from
``prefect.yaml``), on free ports in a temporary folder (the SQLite stack: ``tests/test_team_stack.py``):

* an interval schedule with its own parameters (``cleaner serve schedule``) produces runs that complete, and
  ``serve status`` sees no scheduler errors;
* MLflow killed with SIGKILL is restarted by the supervisor while Prefect and the worker keep running;
* ``serve restart worker`` replaces only the worker; the run it had in flight is ended and marked Crashed (its
  slot released);
* a flow process killed with SIGKILL, then ``cleaner resume``: the deployment's flow run is retried through Prefect
  and the same training run resumes;
* a deployment run that fails on a typo'd override says why through ``cleaner runs show <flow-run-name>``;
* ``serve stop`` refuses during a run; ``--force`` cancels it through Prefect: no run of the stack stays Running, the
  deployment's concurrency slot is free, and the flow process is gone; a foreign flow run in the same Prefect
  history (a flow started from a shell against the stack's API) is neither listed nor waited for nor cancelled: it
  is still Running, its process alive, after ``serve stop --force``; PostgreSQL is stopped last, and its database
  (started again, read-only use) holds every flow run's final state.

The tests share one stack (module scope) and run in file order; the last one stops it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from flows import serve_api
from flows.procs import group_alive, pid_alive
from tests import storecheck
from tests.flowrun import tiny_overrides
from tests.test_serve import free_port

ROOT = Path(__file__).resolve().parents[1]
PY, PREFECT = sys.executable, str(Path(sys.executable).parent / "prefect")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
INTERVAL_S = 40


def cli(args: list[str], env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def serve(*args: str, env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    return cli([PY, "-m", "flows.cli_serve", *args], env, timeout)


class Stack:
    def __init__(self, tmp: Path, env: dict, folder: Path | None = None):
        self.tmp, self.env, self.folder = tmp, env, folder or tmp / "serve"

    @property
    def state(self) -> dict:
        return json.loads((self.folder / "pids.json").read_text())

    def api(self, method: str, path: str, **kw) -> httpx.Response:
        # Prefect's own client: a served Prefect on SQLite answers 503 while its database is locked and, on two busy
        # cores, now and then not within the timeout; it retries both as every Prefect CLI call and worker does
        with serve_api.client(self.state["prefect_api"], timeout_s=30) as http:
            return http.request(method, path, **kw)

    def runs(self) -> list[dict]:
        return self.api("POST", "/flow_runs/filter", json={"sort": "EXPECTED_START_TIME_ASC", "limit": 100}).json()

    def deployment(self) -> dict:
        """The `train-tiny` deployment, deployed first when a test runs without the one that deploys it."""
        from prefect.exceptions import PrefectHTTPStatusError

        try:
            return self.api("GET", "/deployments/name/train/train-tiny").json()
        except PrefectHTTPStatusError:
            params = json.dumps(self.params(steps=3))
            deployed = cli([PREFECT, "--no-prompt", "deploy", "--name", "train-tiny", "--params", params], self.env,
                           240)
            assert deployed.returncode == 0, deployed.stdout + deployed.stderr
            return self.api("GET", "/deployments/name/train/train-tiny").json()

    def params(self, steps: int, run_id: str | None = None) -> dict:
        overrides = [*tiny_overrides(self.tmp, self.warm, steps=steps), "data.prompts_per_step=2", "rollout.n_samples=2"]
        return {"config_path": "configs/tiny.yaml", "overrides": overrides, "run_id": run_id}

    def unschedule(self) -> None:
        """Switch the deployment's schedules off and delete the runs they created that have not started."""
        dep = self.deployment()
        for sched in dep["schedules"]:
            self.api("PATCH", f"/deployments/{dep['id']}/schedules/{sched['id']}", json={"active": False})
        for run in self.runs():
            if run["state_type"] == "SCHEDULED":
                self.api("DELETE", f"/flow_runs/{run['id']}")


def reachable_folder(request) -> Path:
    """A stack folder the ``postgres`` user can reach (pytest's own temporary folders are 0700 root's; PostgreSQL
    runs as ``postgres`` when the tests run as root), removed after the module."""
    folder = Path(tempfile.mkdtemp(prefix="cleaner-stack-"))
    folder.chmod(0o755)
    request.addfinalizer(lambda: shutil.rmtree(folder, ignore_errors=True))
    return folder / "serve"


@pytest.fixture(scope="module")
def stack(warm_model_dir, tmp_path_factory, request):
    tmp = tmp_path_factory.mktemp("stack")
    env = {**os.environ, "PREFECT_HOME": str(tmp / "prefect-home"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           # the scheduler looks for due schedules every 10 s instead of 60 s: the test waits less
           "PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "10", "PYTHONPATH": str(ROOT)}
    env.pop("PREFECT_API_URL", None)
    s = Stack(tmp, env, reachable_folder(request))
    s.warm = warm_model_dir
    started = serve("start", "--detach", "--dir", str(s.folder), "--prefect-port", str(free_port()), "--mlflow-port",
                    str(free_port()), "--database", "postgres", "--postgres-port", str(free_port()), "--artifacts",
                    str(tmp / "ui-artifacts"), "--cancel-timeout", "90", env=env, timeout=600)
    assert started.returncode == 0, started.stdout + started.stderr
    assert s.state["database"] == "postgres" and list(s.state["pids"]) == ["postgres", "prefect", "mlflow", "worker"]
    env["PREFECT_API_URL"] = s.state["prefect_api"]
    yield s
    if (s.folder / "pids.json").exists():
        serve("stop", "--force", "--dir", str(s.folder), env=env)


def _alive(pgid: int) -> bool:
    return group_alive(pgid)


def _wait_state(stack: Stack, run_id: str, want: str, timeout_s: float = 420) -> dict:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        cur = stack.api("GET", f"/flow_runs/{run_id}").json()
        if cur["state_type"] == want:
            return cur
        time.sleep(1)
    pytest.fail(f"flow run {run_id} never reached {want} in {timeout_s:.0f} s: {cur['state']}\n{_why(stack, cur)}")


def _why(stack: Stack, run: dict) -> str:
    """What a wait that timed out needs to be read: the load, the flow process (if the worker recorded one) and
    the worker's log, where a flow process's own output lands."""
    lines = [f"load average {os.getloadavg()}; infrastructure_pid {run.get('infrastructure_pid')}"]
    if run.get("infrastructure_pid"):
        ps = subprocess.run(["ps", "-o", "pid,stat,etime,time,args", "-p", str(_flow_pid(run))], capture_output=True,
                            text=True, check=False)
        lines.append(ps.stdout)
    log = stack.folder / "logs" / "worker.log"
    return "\n".join([*lines, "worker.log (tail):", log.read_text()[-4000:] if log.exists() else "(none)"])


def test_interval_schedule_fires_and_runs_complete(stack):
    """A schedule with its own parameters (`cleaner serve schedule … --set`) fires; its runs train with the
    deployment's overrides followed by the schedule's, and — evaluating nothing — register no model version."""
    params = json.dumps(stack.params(steps=3))
    t0 = time.time()
    deployed = cli([PREFECT, "--no-prompt", "deploy", "--name", "train-tiny", "--params", params], stack.env, 240)
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr
    bad = serve("schedule", "train/train-tiny", "--interval", str(INTERVAL_S), "--set", "train.stepz=1", "--dir",
                str(stack.folder), env=stack.env)
    assert bad.returncode == 2 and "train.stepz: unknown key" in bad.stdout, bad.stdout
    made = serve("schedule", "train/train-tiny", "--interval", str(INTERVAL_S), "--set", "train.steps=1", "--dir",
                 str(stack.folder), env=stack.env)
    assert made.returncode == 0 and "schedule 'train.steps=1' of train/train-tiny: every 40 s" in made.stdout, \
        made.stdout + made.stderr
    done: list[dict] = []
    deadline = time.time() + 600
    while len(done) < 2 and time.time() < deadline:
        time.sleep(5)
        runs = [r for r in stack.runs() if r["auto_scheduled"]]
        assert not [r for r in runs if r["state_type"] in ("FAILED", "CRASHED")], runs
        done = [r for r in runs if r["state_type"] == "COMPLETED"]
    stack.unschedule()
    deadline = time.time() + 300
    while [r for r in stack.runs() if r["state_type"] in ("PENDING", "RUNNING")] and time.time() < deadline:
        time.sleep(2)
    log = (stack.folder / "logs" / "worker.log").read_text()[-3000:]
    assert len(done) >= 2, f"scheduled runs completed: {len(done)} within 600 s\n{log}"
    for r in done[:2]:
        print(f"scheduled {r['expected_start_time']} started {r['start_time']} ran {r['total_run_time']:.0f} s")
        assert r["parameters"]["overrides"] == [*stack.params(steps=3)["overrides"], "train.steps=1"]
    from mlflow.tracking import MlflowClient

    assert MlflowClient(tracking_uri=f"sqlite:///{stack.tmp / 'mlflow.db'}").search_model_versions("name = 'tiny'") \
        == [], "a run that evaluated nothing registered a model version"
    print(f"2 scheduled runs completed {time.time() - t0:.0f} s after `prefect deploy`")
    status = serve("status", "--dir", str(stack.folder), env=stack.env)
    assert status.returncode == 0, status.stdout
    assert "scheduler  no errors" in status.stdout


def test_killed_mlflow_is_restarted_and_the_rest_stays_up(stack):
    before = stack.state["pids"]
    os.killpg(before["mlflow"], signal.SIGKILL)
    deadline = time.time() + 120
    while time.time() < deadline:
        now = stack.state["pids"]
        if now["mlflow"] != before["mlflow"] and _alive(now["mlflow"]):
            try:
                if httpx.get(f"{stack.state['mlflow_uri']}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
        time.sleep(0.5)
    else:
        pytest.fail(f"mlflow was not restarted: {stack.state}")
    assert now["prefect"] == before["prefect"] and now["worker"] == before["worker"]
    assert _alive(now["prefect"]) and _alive(now["worker"])
    assert stack.state["restarts"] == {"mlflow": 1}
    status = serve("status", "--dir", str(stack.folder), env=stack.env)
    assert status.returncode == 0 and "mlflow" in status.stdout and "restarts 1" in status.stdout, status.stdout
    sup = (stack.folder / "logs" / "supervisor.log").read_text()
    assert "mlflow exited (code -9); restarting in 1 s" in sup, sup[-2000:]


def test_restart_replaces_only_the_named_server(stack):
    before = stack.state["pids"]
    bad = serve("restart", "nginx", "--dir", str(stack.folder), env=stack.env)
    assert bad.returncode == 2 and "unknown server 'nginx'; one of: postgres, prefect, mlflow, worker" in bad.stdout
    dep = stack.deployment()
    run = stack.api("POST", f"/deployments/{dep['id']}/create_flow_run",
                    json={"parameters": stack.params(steps=5, run_id="cut-short")}).json()
    _wait_state(stack, run["id"], "RUNNING")
    done = serve("restart", "worker", "--dir", str(stack.folder), env=stack.env)
    assert done.returncode == 0, done.stdout + done.stderr
    # the flow process runs in a session of its own: it ends with the worker, or the supervisor ends it
    # (tests/test_serve.py pins that); either way the run is marked Crashed
    crashed = _wait_state(stack, run["id"], "CRASHED", 120)
    assert "ended without reporting" in crashed["state"]["message"], crashed["state"]
    assert not pid_alive(_flow_pid(crashed)), crashed["infrastructure_pid"]
    slots = stack.api("POST", "/v2/concurrency_limits/filter", json={}).json()
    assert all(s["active_slots"] == 0 for s in slots), slots
    after = stack.state["pids"]
    assert after["worker"] != before["worker"] and not _alive(before["worker"]) and _alive(after["worker"])
    assert {k: after[k] for k in ("postgres", "prefect", "mlflow")} == {k: before[k] for k in ("postgres", "prefect", "mlflow")}
    assert f"worker restarted: pgid {before['worker']} -> {after['worker']}" in done.stdout


def _flow_pid(run: dict) -> int:
    return int(str(run["infrastructure_pid"]).rsplit(":", 1)[-1])


def test_resume_of_a_killed_deployment_run_retries_it_through_prefect(stack):
    """kill -9 of the flow process, then `cleaner resume <run id>`: the deployment's flow run is retried through
    Prefect (as `prefect flow-run retry` does) and resumes the same run folder and MLflow run, step 0 not recomputed,
    no duplicate metrics or rows; the crashed attempt was marked in both stores meanwhile, and the deployment's
    history ends with that one flow run Completed (no second flow run, no Crashed one left)."""
    from mlflow.tracking import MlflowClient

    from flows.train import default_run_id
    from tasks.stores import db
    from tasks.stores.tracking import RUN_TAG, STEP_SENTINEL

    dep = stack.deployment()
    run = stack.api("POST", f"/deployments/{dep['id']}/create_flow_run",
                    json={"parameters": stack.params(steps=2)}).json()
    ours = default_run_id("tiny", run["id"], run["name"])
    step0 = stack.tmp / "runs" / ours / "steps" / "000000"
    deadline = time.time() + 420
    while not (step0 / "logged.json").exists():
        assert time.time() < deadline, "step 0 was never logged"
        time.sleep(0.5)
    before = {p.name: p.stat().st_mtime_ns for p in step0.iterdir()}
    os.kill(_flow_pid(_wait_state(stack, run["id"], "RUNNING")), signal.SIGKILL)
    _wait_state(stack, run["id"], "CRASHED", 120)
    client = MlflowClient(tracking_uri=f"sqlite:///{stack.tmp / 'mlflow.db'}")
    exp = client.get_experiment_by_name("tiny").experiment_id

    def mlruns():
        return client.search_runs([exp], filter_string=f"tags.`{RUN_TAG}` = '{ours}'")

    def db_status():  # db.query loads what runs wrote to the store's row log first (docs/store.md)
        return db.query(stack.tmp / "cleaner.duckdb", "SELECT status FROM runs WHERE run_id = ?", [ours]).item()

    deadline = time.time() + 60  # the hook marks MLflow, then the store: wait for both (a loaded machine parts them)
    while (mlruns()[0].info.status != "FAILED" or db_status() != "crashed") and time.time() < deadline:
        time.sleep(1)
    assert mlruns()[0].info.status == "FAILED" and db_status() == "crashed", "on_crashed did not mark the stores"
    # the worker may report the crash a second time once it reaps the process (~30 s later here), overwriting a
    # Retry made before: retry as a user would, again if the run fell back to Crashed (at most 3 times)
    for _ in range(3):
        retried = cli([PY, "-m", "flows.cli", "resume", ours, "--output-dir", str(stack.tmp / "runs")], stack.env, 120)
        assert retried.returncode == 0, retried.stdout + retried.stderr
        assert f"flow run {run['id']} of its deployment retried (CRASHED)" in " ".join(retried.stdout.split())
        deadline = time.time() + 90
        while time.time() < deadline:
            cur = stack.api("GET", f"/flow_runs/{run['id']}").json()
            if cur["run_count"] >= 2 or cur["state_type"] == "CRASHED":
                break
            time.sleep(1)
        if cur["run_count"] >= 2:
            break
    done = _wait_state(stack, run["id"], "COMPLETED")
    assert done["run_count"] >= 2
    history = stack.api("POST", "/flow_runs/filter", json={"flow_runs": {"deployment_id": {"any_": [dep["id"]]}},
                                                           "limit": 100}).json()
    ours_runs = [r for r in history if r["parameters"].get("overrides") == stack.params(steps=2)["overrides"]]
    assert [(r["id"], r["state_type"]) for r in ours_runs] == [(run["id"], "COMPLETED")], ours_runs
    assert sorted(p.name for p in (stack.tmp / "runs").iterdir() if ours.rsplit("-", 1)[-1] in p.name) == [ours]
    assert {p.name: p.stat().st_mtime_ns for p in step0.iterdir() if p.name in before} == before, \
        "a finished stage of step 0 was recomputed"
    [mlrun] = mlruns()
    assert mlrun.info.status == "FINISHED" and db_status() == "finished"
    for key in (STEP_SENTINEL, "rollout/accuracy"):
        assert sorted(m.step for m in client.get_metric_history(mlrun.info.run_id, key)) == [0, 1], key
    store = stack.tmp / "cleaner.duckdb"
    rows = dict(db.query(store, "SELECT step, count(*) FROM trajectories WHERE run_id = ? GROUP BY step", [ours]).rows())
    assert rows == {0: 4, 1: 4} and storecheck.differences(store, [ours]) == {}


def test_a_failed_deployment_run_says_why_with_cleaner_runs_show(stack):
    """A deployment run with a typo'd override fails before any stage; `cleaner runs show <flow-run-name>` (what
    docs/schedule.md tells a `--watch` user to run) prints the deployment, the ConfigError and the flow run's last
    log lines, exit 1."""
    dep = stack.deployment()
    params = {**stack.params(steps=1), "overrides": [*stack.params(steps=1)["overrides"], "train.stepz=1"]}
    run = stack.api("POST", f"/deployments/{dep['id']}/create_flow_run", json={"parameters": params}).json()
    _wait_state(stack, run["id"], "FAILED", 300)
    time.sleep(3)  # the flow process sends its last log lines in batches (every 2 s)
    shown = cli([PY, "-m", "flows.cli", "runs", "show", run["name"], "--lines", "5"], stack.env, 120)
    lines = shown.stdout.splitlines()
    assert shown.returncode == 1, shown.stdout + shown.stderr
    assert lines[0] == f"flow run   {run['name']}  ({run['id']})   deployment train-tiny"
    assert lines[1].startswith("state      Failed: Flow run encountered an exception: ConfigError: ") and \
        "train.stepz: unknown key" in lines[1], lines[1]
    assert lines[2] == "last 5 log lines of the flow run:" and len(lines) == 8, shown.stdout
    assert any(line.endswith("ConfigError: configs/tiny.yaml: train.stepz: unknown key") for line in lines[3:]), \
        shown.stdout


FOREIGN = ("import time\nfrom prefect import flow\n\n@flow(name='foreign')\ndef foreign():\n    time.sleep(1800)\n\n"
           "foreign()\n")
"""A flow run that is not the stack's: started from a shell against its API, in the same Prefect history."""


def _foreign_run(stack: Stack) -> tuple[subprocess.Popen, dict]:
    with open(stack.tmp / "foreign.log", "w") as log:
        proc = subprocess.Popen([PY, "-c", FOREIGN], cwd=stack.tmp, env=stack.env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + 300
    while time.time() < deadline:
        found = stack.api("POST", "/flow_runs/filter", json={"flows": {"name": {"any_": ["foreign"]}}}).json()
        if found and found[0]["state_type"] == "RUNNING":
            return proc, found[0]
        assert proc.poll() is None, (stack.tmp / "foreign.log").read_text()[-2000:]
        time.sleep(1)
    pytest.fail("the foreign flow run never ran")


def test_stop_refuses_during_a_run_and_force_cancels_it(stack):
    foreign, other = _foreign_run(stack)
    try:
        _stop_only_the_stacks_runs(stack, foreign, other)
    finally:
        os.killpg(foreign.pid, signal.SIGKILL)
        foreign.wait(timeout=60)


def _stop_only_the_stacks_runs(stack: Stack, foreign: subprocess.Popen, other: dict) -> None:
    dep = stack.deployment()
    run = stack.api("POST", f"/deployments/{dep['id']}/create_flow_run",
                    json={"parameters": stack.params(steps=40, run_id="long")}).json()
    deadline = time.time() + 300
    while time.time() < deadline:
        cur = stack.api("GET", f"/flow_runs/{run['id']}").json()
        if cur["state_type"] == "RUNNING" and cur["infrastructure_pid"] and \
                (stack.tmp / "runs" / "long" / "steps" / "000000").exists():
            break
        assert cur["state_type"] not in ("FAILED", "CRASHED", "COMPLETED"), cur["state"]
        time.sleep(1)
    else:
        pytest.fail(f"the run never got to training: {cur['state']}")
    pid = _flow_pid(cur)
    assert Path(f"/proc/{pid}").exists()

    status = serve("status", "--dir", str(stack.folder), env=stack.env)
    assert f"flow runs  1 active on pool 'cleaner-process': {cur['name']} (running)\n" in status.stdout, status.stdout
    refused = serve("stop", "--dir", str(stack.folder), env=stack.env)
    assert refused.returncode == 1, refused.stdout
    assert f"1 flow run(s) active: {cur['name']} (running)." in refused.stdout  # not the foreign one
    assert "--force" in refused.stdout and _alive(stack.state["pids"]["prefect"])

    pids = stack.state["pids"]
    t0 = time.time()
    stopped = serve("stop", "--force", "--dir", str(stack.folder), env=stack.env, timeout=400)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    print(f"serve stop --force took {time.time() - t0:.0f} s")
    assert stopped.stdout.strip() == "stopped: worker, mlflow, prefect, postgres"
    assert not (stack.folder / "pids.json").exists()
    assert {p.name for p in (stack.folder / "logs").iterdir()} == {"prefect.log", "worker.log", "mlflow.log",
                                                                    "postgres.log", "supervisor.log"}
    assert not [n for n, p in pids.items() if _alive(p)]
    assert not _pid_alive(pid), f"flow process {pid} survived the stack"
    assert not (stack.tmp / "prefect-home" / "prefect.db").exists()  # Prefect never fell back to SQLite
    with _prefect_database(stack) as db:
        db.execute("SELECT id::text, state_type::text FROM flow_run")
        states = dict(db.fetchall())
        assert states[run["id"]] == "CANCELLED", states
        assert states.pop(other["id"]) == "RUNNING" and foreign.poll() is None and _pid_alive(foreign.pid)
        assert "RUNNING" not in states.values() and "PENDING" not in states.values()
        db.execute("SELECT name, active_slots FROM concurrency_limit_v2")
        slots = db.fetchall()
    assert slots and all(n == 0 for _, n in slots), slots
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{stack.tmp / 'mlflow.db'}")
    [long_run] = client.search_runs([client.get_experiment_by_name("tiny").experiment_id],
                                    filter_string="tags.`cleaner.run_id` = 'long'")
    assert long_run.info.status == "KILLED", "on_cancellation did not end the MLflow run"
    from tasks.stores import db as store_db

    assert store_db.query(stack.tmp / "cleaner.duckdb", "SELECT status FROM runs WHERE run_id = 'long'").item() == \
        "cancelled"


@contextlib.contextmanager
def _prefect_database(stack: Stack):
    """A cursor on the stopped stack's Prefect database: its PostgreSQL started again on a free port, then stopped."""
    import psycopg2

    from flows.procs import stop_groups
    from flows.serve_db import Postgres

    pg, log = Postgres(stack.folder / "postgres", free_port()), stack.tmp / "postgres-readback.log"
    with open(log, "wb") as out:
        server = subprocess.Popen(pg.argv(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                  **pg.popen_kwargs())
    try:
        try:
            pg.wait_ready(lambda: server.poll() is None, log, 60)
        except Exception as err:
            pytest.fail(f"{err}\n{log.read_text()[-3000:]}")
        con = psycopg2.connect(pg.base_url() + "/prefect")
        try:
            with con.cursor() as cur:
                yield cur
        finally:
            con.close()
    finally:
        stop_groups({"postgres": server.pid})
        server.wait(timeout=30)


def _pid_alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
