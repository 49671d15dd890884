"""SIGTERM ends a command even when its exception is swallowed in a finaliser (``flows.termination``).

Each case runs a small script in its own process: the signal is sent by the script itself from inside a ``__del__``
(``os.kill`` of its own pid runs the Python handler before it returns, so the handler's exception is raised there
and printed as "Exception ignored"): the lost-signal case made deterministic, as it happened under load when the
signal fell in SQLAlchemy's weakref callback during a flow run.
"""
from __future__ import annotations

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


def test_a_sigterm_swallowed_in_a_finaliser_is_delivered_again(tmp_path):
    setup = "from flows.termination import install\ninstall(grace_s=1.0)"
    done = _script(SWALLOWED.format(setup=setup), tmp_path, timeout=60)
    assert "went on" in done.stdout, done.stderr
    assert "Exception ignored" in done.stderr and done.stderr.count("KeyboardInterrupt") >= 2, done.stderr
    assert done.returncode != 0


def test_without_the_watcher_the_swallowed_sigterm_is_lost(tmp_path):
    """The negative control: the CLI's handler alone lets the command go on (it would run for ever)."""
    setup = "from flows.termination import interrupt\nsignal.signal(signal.SIGTERM, interrupt)"
    with pytest.raises(subprocess.TimeoutExpired) as lost:
        _script(SWALLOWED.format(setup=setup), tmp_path, timeout=8)
    assert b"Exception ignored" in (lost.value.stderr or b"")


def test_a_way_out_longer_than_the_grace_is_not_interrupted(tmp_path):
    """SIGTERM honoured at once: the cleanup (3 s, three graces) runs to its end; nothing is delivered again."""
    code = """
import sys, time
from flows.termination import install
install(grace_s=1.0)
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
"""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert "cleaned up" in out and proc.returncode == 3, err


@pytest.mark.slow
def test_a_sigterm_swallowed_during_a_flow_run_ends_it(tmp_path):
    """Inside a flow Prefect's handler (``TerminationSignal``) is the one swallowed; the flow run still ends,
    marked crashed, and the process exits."""
    code = BOMB + """
from prefect import flow
from flows.termination import install
install(grace_s=1.0)

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
