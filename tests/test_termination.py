"""SIGTERM ends a process even when its exception is swallowed in a finaliser, and only then is it sent again
(``models.termination``).

Each case runs a small script in its own process. A lost signal is made deterministic: the script sends SIGTERM to
itself from inside a ``__del__`` (``os.kill`` of its own pid runs the Python handler before it returns, so the
handler's exception is raised there and printed as "Exception ignored") — as it happened under load when the signal
fell in SQLAlchemy's weakref callback during a flow run. The other cases are processes the watcher must leave alone:
a forked child's signal, a way out after a short ``except``, ``atexit`` functions, a long cleanup.
"""
from __future__ import annotations

import ast
import inspect
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

BOMB = """
import os, signal, sys, time
class Bomb:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)
"""
INSTALL = "from models.termination import install\ninstall()\n"
SWALLOWED = BOMB + """
{setup}
Bomb()
print("went on", flush=True)
while True:
    time.sleep(0.05)
"""


def _script(code: str, tmp_path: Path, timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=timeout)


def _started(code: str, tmp_path: Path) -> subprocess.Popen:
    """The script, once it printed "ready" (its handlers are in place)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready", proc.stderr.read() if proc.poll() is not None else ""
    return proc


def test_a_sigterm_swallowed_in_a_finaliser_is_delivered_again(tmp_path):
    done = _script(SWALLOWED.format(setup=INSTALL), tmp_path, timeout=60)
    assert "went on" in done.stdout, done.stderr
    assert "Exception ignored" in done.stderr and done.stderr.count("Terminated: signal 15") == 2, done.stderr
    assert done.returncode != 0


def test_without_the_watcher_the_swallowed_sigterm_is_lost(tmp_path):
    """The negative control: the CLI's handler alone lets the command go on (it would run for ever)."""
    setup = "from models.termination import interrupt\nsignal.signal(signal.SIGTERM, interrupt)"
    with pytest.raises(subprocess.TimeoutExpired) as lost:
        _script(SWALLOWED.format(setup=setup), tmp_path, timeout=8)
    assert b"Exception ignored" in (lost.value.stderr or b"")


def test_every_swallowed_sigterm_is_delivered_again_not_only_the_first(tmp_path):
    code = BOMB + INSTALL + """
try:
    Bomb()
    while True:
        time.sleep(0.05)
except KeyboardInterrupt:
    print("first ended", flush=True)
Bomb()
print("went on", flush=True)
while True:
    time.sleep(0.05)
"""
    done = _script(code, tmp_path, timeout=30)
    assert "first ended" in done.stdout and "went on" in done.stdout, done.stderr
    assert done.stderr.count("Exception ignored") == 2 and done.returncode != 0, done.stderr


def test_a_forked_childs_sigterm_never_reaches_the_parent(tmp_path):
    """The child shares nothing with the parent's watcher (no inherited wake-up pipe, no duty): its own SIGTERM,
    lost in a finaliser there, ends neither it (the watcher is disarmed in a child) nor, above all, the parent."""
    code = BOMB + INSTALL + """
child = os.fork()
if child == 0:
    Bomb()
    time.sleep(1.5)
    os._exit(7)
_, status = os.waitpid(child, 0)
time.sleep(1.5)
print("parent untouched, child exit", os.waitstatus_to_exitcode(status), flush=True)
"""
    done = _script(code, tmp_path, timeout=30)
    assert "parent untouched, child exit 7" in done.stdout, done.stderr
    assert done.returncode == 0 and "Exception ignored" in done.stderr, done.stderr


def test_cleanup_after_a_short_except_is_not_interrupted(tmp_path):
    proc = _started(INSTALL + """
import sys, time
try:
    print("ready", flush=True)
    while True:
        time.sleep(0.05)
except KeyboardInterrupt:
    pass
time.sleep(2.0)
print("cleaned up", flush=True)
sys.exit(3)
""", tmp_path)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert "cleaned up" in out and proc.returncode == 3, err


def test_atexit_functions_are_not_interrupted(tmp_path):
    """Where Prefect stops its temporary server: after the command's exception, at interpreter exit."""
    proc = _started(INSTALL + """
import atexit, time
def stop_server():
    time.sleep(2.0)
    print("server stopped", flush=True)
atexit.register(stop_server)
print("ready", flush=True)
while True:
    time.sleep(0.05)
""", tmp_path)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert "server stopped" in out and "Terminated: signal 15" in err and proc.returncode != 0, err


def test_a_long_way_out_is_not_interrupted(tmp_path):
    """SIGTERM honoured at once: the cleanup (3 s, in an except and a finally) runs to its end."""
    proc = _started(INSTALL + """
import sys, time
try:
    print("ready", flush=True)
    while True:
        time.sleep(0.05)
except KeyboardInterrupt:
    time.sleep(1.5)
    try:
        time.sleep(1.5)
    finally:
        print("cleaned up", flush=True)
sys.exit(3)
""", tmp_path)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert "cleaned up" in out and proc.returncode == 3, err


ENTRY_POINTS = {"flows/cli.py", "flows/cli_serve.py", "flows/cli_sandbox.py", "flows/chain_gate.py", "flows/budget_look.py",
                "flows/turn_gate.py", "flows/bench_decode.py", "flows/bench_eval.py", "models/gpu_check.py",
                "tasks/training/bench_decode.py", "tasks/training/bench_update.py",
                "tasks/data/synthetic/r3l_warm.py", "tasks/training/lane_worker.py"}
"""``python -m`` entry points that run a flow or a long job: each installs the SIGTERM handler and its watcher."""
LEFT_ALONE = {"flows/reference.py": "prints one reference page (a second)",
              "models/sglang_test_server.py": "a test server its tests stop with SIGTERM and expect to die at once",
              "tasks/reports/results_figure.py": "draws one figure from committed JSON (seconds)"}


def _main_block(path: Path) -> str:
    tree = ast.parse(path.read_text())
    blocks = [n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)]
    return "\n".join(ast.unparse(b) for b in blocks)


def test_every_long_running_entry_point_installs_the_watcher():
    found = {str(p.relative_to(ROOT)) for top in ("flows", "tasks", "models", "sandbox")
             for p in (ROOT / top).rglob("*.py") if _main_block(p)}
    assert found == ENTRY_POINTS | set(LEFT_ALONE), "a new entry point: list it in ENTRY_POINTS or LEFT_ALONE"
    for path in ENTRY_POINTS - {"flows/cli.py"}:
        assert "install()" in _main_block(ROOT / path), f"{path}: its __main__ block does not install the watcher"
    from flows import cli

    assert cli.app.registered_callback.callback is cli._before_any_command
    assert "install()" in inspect.getsource(cli._before_any_command)


def test_every_flow_arms_the_watcher_when_it_runs():
    """A flow run a Prefect worker starts never passes the command line: the flow's ``on_running`` hook arms it."""
    from flows.compare import compare_flow
    from flows.evaluate import evaluate_flow
    from flows.train import train
    from flows.warmup import warmup_flow
    from models.termination import arm

    for flow in (train, evaluate_flow, compare_flow, warmup_flow):
        assert arm in (flow.on_running_hooks or []), flow.name


@pytest.mark.slow
def test_a_sigterm_swallowed_during_a_flow_run_ends_it(tmp_path):
    """Inside a flow Prefect's handler (``TerminationSignal``) is the one swallowed; the flow run still ends,
    marked crashed, and the process exits."""
    code = BOMB + """
from prefect import flow
from models.termination import install
install()

@flow
def loops():
    Bomb()
    print("went on", flush=True)
    while True:
        time.sleep(0.05)

loops()
"""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PREFECT_HOME": str(tmp_path / "prefect"),
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=300)
    finally:  # the flow's temporary Prefect server dies with the script's group, even on a timeout
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    assert "went on" in done.stdout, done.stderr[-3000:]
    assert "TerminationSignal" in done.stderr and "Exception ignored" in done.stderr, done.stderr[-3000:]
    assert "Crashed" in done.stdout + done.stderr, done.stderr[-3000:]
    assert done.returncode != 0 and time.monotonic() - started < 300


SERVED = """
import os, sys, time
from pathlib import Path
from prefect import flow
from models.termination import arm

MARKS = Path(os.environ["MARKS"])


class Slow:
    def __del__(self):  # where the runner's SIGTERM lands: Prefect's TerminationSignal is swallowed here
        (MARKS / "in_finaliser").touch()
        end = time.monotonic() + 120
        while time.monotonic() < end:
            time.sleep(0.05)


@flow(on_running=[arm])
def cancel_me():
    try:
        Slow()
        (MARKS / "went_on").touch()
        while True:
            time.sleep(0.05)
    finally:
        (MARKS / "left").touch()


if __name__ == "__main__":
    cancel_me.serve(name="served")
"""


def _wait(what: str, ready, timeout: float, proc: subprocess.Popen):
    deadline = time.monotonic() + timeout
    while not (found := ready()):
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"{what} never came (the serving process: rc {proc.poll()})")
        time.sleep(0.5)
    return found


@pytest.mark.slow
def test_a_served_flow_run_cancelled_through_prefect_ends_though_the_signal_was_swallowed(prefect_harness, tmp_path):
    """The runner of a served deployment (a worker's way of starting flow runs) cancels a flow run with SIGTERM;
    it lands in a finaliser. The flow run process still leaves through its ``finally`` and is Cancelled (without
    the watcher it would loop until the runner's SIGKILL, 30 s on, skipping the ``finally``)."""
    from prefect import get_client
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL
    from prefect.states import Cancelling

    (tmp_path / "served.py").write_text(SERVED)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PREFECT_API_URL": PREFECT_API_URL.value(),
           "MARKS": str(tmp_path), "PREFECT_RUNNER_POLL_FREQUENCY": "2"}
    proc = subprocess.Popen([sys.executable, "served.py"], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        with get_client(sync_client=True) as client:
            def deployed():
                try:
                    return client.read_deployment_by_name("cancel-me/served")
                except Exception:  # noqa: BLE001 - not there yet
                    return None

            _wait("the served deployment", deployed, 120, proc)
            run = run_deployment("cancel-me/served", timeout=0)
            _wait("the flow run's finaliser", (tmp_path / "in_finaliser").exists, 120, proc)
            client.set_flow_run_state(run.id, Cancelling(message="cancelled by the test"), force=True)
            state = _wait("the flow run's end", lambda: (s := client.read_flow_run(run.id).state).is_final() and s,
                          120, proc)
        assert state.type.value == "CANCELLED", state
        assert (tmp_path / "went_on").exists(), "the signal was not swallowed in the finaliser: nothing was tested"
        assert (tmp_path / "left").exists(), "the flow run never left through its finally (killed, not ended)"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
