"""``prefect.yaml`` is a valid deployment file for our flows; the parts of ``cleaner serve`` that need no running
stack: stopping process groups, back-off restarts, adopting orphaned flow processes, scheduler errors in a real
Prefect log, the auth guard and credentials. Served stacks are tested in test_stack.py and test_team_stack.py.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SPEC = yaml.safe_load((ROOT / "prefect.yaml").read_text())
DEPLOYMENTS = {d["name"]: d for d in SPEC["deployments"]}


def test_prefect_yaml_validates_with_prefect_models():
    from prefect.cli.deploy._models import PrefectYamlModel, RawScheduleConfig

    model = PrefectYamlModel.model_validate(SPEC)
    assert {d.name for d in model.deployments} == {"train-tiny", "train-tiny-fanout", "warmup-tiny", "evaluate-tiny",
                                                  "compare-tiny"}
    for d in SPEC["deployments"]:
        assert d["work_pool"]["name"] == "cleaner-process", d["name"]
        for sched in d.get("schedules", []):
            RawScheduleConfig.model_validate(sched)
            assert sched["active"] is False, f"{d['name']}: example schedules must be inactive"
    assert any(s.get("cron") for d in SPEC["deployments"] for s in d.get("schedules", []))


@pytest.mark.parametrize("name", sorted(DEPLOYMENTS))
def test_deployment_entrypoint_accepts_its_parameters(name):
    from prefect.flows import load_flow_from_entrypoint

    dep = DEPLOYMENTS[name]
    path, func = dep["entrypoint"].split(":")
    if not (ROOT / path).exists():
        pytest.skip(f"{path} is not written yet (entrypoint of {name})")
    flow = load_flow_from_entrypoint(str(ROOT / dep["entrypoint"]))
    accepted = set(flow.parameters.properties)
    assert set(dep["parameters"]) <= accepted, f"{name}: {sorted(set(dep['parameters']) - accepted)} not in {func}"
    assert Path(ROOT / dep["parameters"]["config_path"]).exists()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cli(args: list[str], env: dict, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def _groups_alive(pgids) -> list[int]:
    from flows.procs import group_alive

    return [p for p in pgids if group_alive(p)]


def test_stop_groups_ends_whole_groups_and_escalates(tmp_path):
    from flows.procs import group_alive as _group_alive
    from flows.procs import stop_groups

    polite = subprocess.Popen(["sh", "-c", "sleep 300 & sleep 300 & wait"], start_new_session=True)
    stubborn = subprocess.Popen(["sh", "-c", "trap '' TERM; sleep 300 & wait; sleep 300"], start_new_session=True)
    pids = {"polite": polite.pid, "stubborn": stubborn.pid}
    try:
        assert _group_alive(polite.pid) and _group_alive(stubborn.pid)
        assert stop_groups(pids, grace_s=1.0) == ["stubborn", "polite"]
        assert not _group_alive(polite.pid) and not _group_alive(stubborn.pid)
        assert stop_groups(pids, grace_s=1.0) == []
    finally:
        for proc in (polite, stubborn):
            proc.wait(timeout=10)


LOG = ROOT / "tests" / "data" / "prefect-sqlalchemy21-scheduler.log"


def test_scheduler_errors_are_read_from_a_real_server_log():
    """The log of a Prefect 3.8.8 server under SQLAlchemy 2.1.9 (captured here): its scheduler failed every loop."""
    from flows.serve_api import log_errors, scheduler_errors

    errors = scheduler_errors(LOG)
    assert [e.time for e in errors] == ["12:50:56.348", "12:51:00.902", "12:52:01.084"]
    assert {e.exception for e in errors} == {
        "sqlalchemy.exc.InvalidRequestError: Can't evaluate bulk DML statement; please supply a bulk_dml decorated function"}
    assert "schedule_deployments" in errors[1].message
    assert log_errors(LOG, offset=LOG.stat().st_size) == []


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_status_reports_scheduler_errors_and_stopped_servers(tmp_path):
    folder = tmp_path / "serve"
    (folder / "logs").mkdir(parents=True)
    (folder / "logs" / "prefect.log").write_bytes(LOG.read_bytes())
    dead = _dead_pid()
    (folder / "pids.json").write_text(json.dumps({
        "supervisor": dead, "pids": {"prefect": dead, "mlflow": dead, "worker": dead}, "restarts": {"mlflow": 2},
        "log_offsets": {"prefect": 0}, "prefect_api": "http://127.0.0.1:1/api", "mlflow_uri": "http://127.0.0.1:2"}))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = _cli([sys.executable, "-m", "flows.cli_serve", "status", "--dir", str(folder)], env, 60)
    assert done.returncode == 1, done.stdout
    assert "mlflow     pgid" in done.stdout and "stopped   restarts 2" in done.stdout
    assert ("scheduler  3 error(s) since the Prefect server started, last at 12:52:01.084: "
            "sqlalchemy.exc.InvalidRequestError: Can't evaluate bulk DML statement") in done.stdout
    assert "schedules are not producing runs" in done.stdout
    state = json.loads((folder / "pids.json").read_text())
    state["log_offsets"]["prefect"] = LOG.stat().st_size
    (folder / "pids.json").write_text(json.dumps(state))
    again = _cli([sys.executable, "-m", "flows.cli_serve", "status", "--dir", str(folder)], env, 60)
    assert "scheduler  no errors" in again.stdout, "errors before the server's last start were reported"


def test_a_host_beyond_loopback_needs_auth(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = _cli([sys.executable, "-m", "flows.cli_serve", "start", "--dir", str(tmp_path / "s"), "--host", "0.0.0.0"],
                env, 60)
    assert done.returncode == 2, done.stdout
    assert "serve refused: --host 0.0.0.0 would let anyone" in done.stdout and "add --auth" in done.stdout
    assert not (tmp_path / "s" / "pids.json").exists() and not (tmp_path / "s" / "logs").exists()


def test_credentials_are_private_and_kept(tmp_path):
    from flows.serve_auth import AuthError, prepare_auth

    first = prepare_auth(tmp_path, "0.0.0.0", auth=True)
    path = Path(first["file"])
    assert path.stat().st_mode & 0o777 == 0o600
    assert first["prefect"].startswith("admin:") and len(first["prefect"]) > 30
    assert prepare_auth(tmp_path, "0.0.0.0", auth=True) == first
    ini = (tmp_path / "mlflow-auth.ini").read_text()
    assert first["mlflow_admin"][1] not in ini and "admin_username = admin" in ini
    modes = {p.name: p.stat().st_mode & 0o777 for p in [tmp_path, *tmp_path.iterdir()]}
    assert modes == {tmp_path.name: 0o700, "credentials.json": 0o600, "mlflow-auth.ini": 0o600,
                     "mlflow-auth.db": 0o600}, modes
    path.chmod(0o644)
    with pytest.raises(AuthError, match="readable by other users"):
        prepare_auth(tmp_path, "0.0.0.0", auth=True)


class _Crashing:
    """A stack whose every server exits after 0.2 s with code 3 (no health URL)."""

    def __init__(self, folder):
        from flows.serve_stack import StackConfig

        self.base = StackConfig(folder)

    def __getattr__(self, name):
        return getattr(self.base, name)

    def argv(self, name):
        return ["sh", "-c", "sleep 0.2; exit 3"]

    def env(self, name):
        return dict(os.environ)

    def health_url(self, name):
        return None


def test_a_crashing_server_is_restarted_with_backoff(tmp_path):
    import threading

    from flows.serve_stack import Supervisor

    said: list[tuple[float, str]] = []
    sup = Supervisor(_Crashing(tmp_path), echo=lambda m: said.append((time.monotonic(), m)))
    sup.spawn("worker")
    watcher = threading.Thread(target=sup.watch, kwargs={"poll_s": 0.1})
    watcher.start()
    time.sleep(9.0)
    sup.stopping.set()
    watcher.join(timeout=10)
    sup.stop_servers(grace_s=1.0)
    worker = [m for _, m in said if m.startswith("worker exited")]
    assert [m.split(";")[1].split("(")[0].strip() for m in worker[:3]] == [
        "restarting in 1 s", "restarting in 2 s", "restarting in 4 s"], said
    assert all("(code 3)" in m for m in worker)
    assert sup.state["restarts"]["worker"] == len([m for _, m in said if m.startswith("worker restarted")]) >= 3


class _WorkerWithAFlow(_Crashing):
    """A 'worker' that starts a 'flow process' in a session of its own (as Prefect's process worker does)."""

    def argv(self, name):
        return ["sh", "-c", f"setsid sleep 300 & echo $! > {self.base.folder}/flow.pid; sleep 300"]


def test_a_worker_restart_ends_the_flow_processes_it_left(tmp_path):
    import threading

    from flows.procs import pid_alive
    from flows.serve_stack import Supervisor

    said: list[str] = []
    # bystanders below this process, in its own group and in a session of their own: never the supervisor's to stop
    bystanders = [subprocess.Popen(["sleep", "60"]), subprocess.Popen(["sleep", "60"], start_new_session=True)]
    sup = Supervisor(_WorkerWithAFlow(tmp_path), echo=said.append)
    sup.spawn("worker")
    while not (tmp_path / "flow.pid").exists() or not (tmp_path / "flow.pid").read_text().strip():
        time.sleep(0.05)
    flow, old = int((tmp_path / "flow.pid").read_text()), sup.procs["worker"].pid
    deadline = time.monotonic() + 10  # `$!` is written before the child has called setsid(): wait for it
    while time.monotonic() < deadline and os.getsid(flow) != flow:
        time.sleep(0.01)
    assert os.getsid(flow) == flow != old and pid_alive(flow)
    (tmp_path / "restart-worker").touch()
    watcher = threading.Thread(target=sup.watch, kwargs={"poll_s": 0.1})
    watcher.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not any(m.startswith("worker restarted") for m in said):
        time.sleep(0.1)
    sup.stopping.set()
    watcher.join(timeout=10)
    sup.stop_servers(grace_s=1.0)
    assert f"stopping 1 flow process group(s) the worker left: [{flow}]" in said, said
    assert not pid_alive(flow) and sup.procs["worker"].pid != old and flow in sup.seen
    assert [b.poll() for b in bystanders] == [None, None]
    for b in bystanders:
        b.kill()
        b.wait()


ORPHAN = """
import os, subprocess, sys, time
sys.path.insert(0, sys.argv[1])
from flows.procs import descendants
from flows.serve_stack import _become_subreaper
_become_subreaper()
# a 'worker' that starts a 'flow process' in its own session and dies: the flow process must stay below us
subprocess.run(["sh", "-c", "setsid sleep 60 & echo $!"], stdout=open(sys.argv[2], "w"))
time.sleep(0.5)
orphan = int(open(sys.argv[2]).read())
print(orphan in descendants(os.getpid()), os.getsid(orphan) == orphan, flush=True)
os.kill(orphan, 9)
"""


def test_a_flow_process_whose_worker_died_stays_below_the_supervisor(tmp_path):
    done = subprocess.run([sys.executable, "-c", ORPHAN, str(ROOT), str(tmp_path / "pid")], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.stdout.split() == ["True", "True"], done.stdout + done.stderr
