"""tasks.training.lanes: a stage function run in a lane worker returns its value, raises its error with the
worker's traceback, a dead worker is ``LaneDied`` and the next call a fresh one; the worker writes row-log units
only, uses its thread count, holds no secret in argv or its environment, writes under the flow process's fence
claims, dies with its parent, and a fault point reached in it kills or stops the parent too."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tasks.stores import fence
from tasks.training.lanes import AUTHKEY_ENV, Lane, LaneDied, LaneError, close_lanes, get_lane

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def lane():
    lane = Lane("test", threads=2)
    yield lane
    lane.close()


def test_value_and_state(lane):
    assert lane.call("tests.lane_fakes", "add", 2, b=3) == 5
    got = lane.call("tests.lane_fakes", "state")
    assert got["pid"] != os.getpid() and got["ppid"] == os.getpid()
    assert got["rows_only"] == "1" and got["threads"] == 2
    assert AUTHKEY_ENV not in got["env"]
    assert not any(len(a) >= 32 and all(c in "0123456789abcdef" for c in a) for a in got["argv"])
    assert lane.call("tests.lane_fakes", "state")["pid"] == got["pid"]  # one persistent worker


def test_error_is_the_workers_with_its_traceback(lane):
    with pytest.raises(ValueError) as err:
        lane.call("tests.lane_fakes", "fail", "no sandbox")
    text = str(err.value)
    assert text.startswith("no sandbox\n(in lane 'test'") and "tests/lane_fakes.py" in text and "in fail" in text
    with pytest.raises(LaneError, match="not picklable"):
        lane.call("tests.lane_fakes", "unpicklable")
    assert lane.call("tests.lane_fakes", "add", 1) == 1  # the worker lives on


def test_a_dead_worker_is_lane_died_and_the_next_call_a_fresh_one(lane):
    before = lane.call("tests.lane_fakes", "state")["pid"]
    with pytest.raises(LaneDied, match=r"lane 'test': its worker \(pid \d+\) died during "
                                       r"tests.lane_fakes.exit_with: exit status 7"):
        lane.call("tests.lane_fakes", "exit_with", 7)
    assert lane.call("tests.lane_fakes", "state")["pid"] != before


def test_writes_are_fenced_by_the_flow_process_claims(lane, tmp_path):
    run = tmp_path / "run"
    held = {c.run_dir for c in fence.claims()}  # claims earlier tests of this process still hold (a flow run's)
    fence.claim(run, "r1", "tok-a")
    try:
        assert set(lane.call("tests.lane_fakes", "state")["claims"]) == held | {str(run.resolve())}
        assert Path(lane.call("tests.lane_fakes", "publish", str(run / "a.json"), "1")).read_text() == "1"
        (run / "attempt").write_text('{"attempt": "someone else"}')  # another attempt replaced this one
        with pytest.raises(fence.FencedError):
            lane.call("tests.lane_fakes", "publish", str(run / "b.json"), "2")
        assert not (run / "b.json").exists()
    finally:
        fence.release(run)


def test_lanes_per_process_are_closed(tmp_path):
    one = get_lane("x", 1)
    assert get_lane("x", 1) is one and get_lane("x", 2) is not one
    pid = one.call("tests.lane_fakes", "state")["pid"]
    close_lanes()
    assert one.pid is None
    with pytest.raises(ProcessLookupError):
        for _ in range(50):
            os.kill(pid, 0)
            time.sleep(0.1)


PARENT = textwrap.dedent("""
    import sys, threading, time
    from tasks.training.lanes import get_lane
    lane = get_lane("p", 1)
    print(lane.call("tests.lane_fakes", "state")["pid"], flush=True)
    if sys.argv[1] == "crash":
        lane.call("tests.lane_fakes", "crash_at", "after_rollout", 1)
    if sys.argv[1] == "busy":
        threading.Thread(target=lane.call, args=("tests.lane_fakes", "nap", 60), daemon=True).start()
    time.sleep(60)
""")


def _parent(mode: str, env: dict | None = None) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([sys.executable, "-c", PARENT, mode], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
    return proc, int(proc.stdout.readline())


def _gone(pid: int) -> bool:
    for _ in range(100):
        try:
            os.kill(pid, 0)
            if Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
                return True
        except (ProcessLookupError, FileNotFoundError):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("mode", ["idle", "busy"])
def test_the_worker_dies_with_its_parent(mode):
    """Idle, it reads the end of its connection; busy in a 60 s call, its parent watch kills it."""
    proc, worker = _parent(mode)
    time.sleep(1)
    proc.kill()
    proc.wait()
    assert _gone(worker)


def test_a_lane_outlives_the_thread_that_started_it():
    """The worker watches its parent process, not the thread that started it (Linux's ``PR_SET_PDEATHSIG`` would
    kill it when that thread ends: a task runner's or an executor's thread)."""
    import threading

    lane, seen = Lane("from-a-thread", 1), []
    started = threading.Thread(target=lambda: seen.append(lane.call("tests.lane_fakes", "state")["pid"]))
    started.start()
    started.join()
    pid = seen[0]
    time.sleep(1.0)  # five parent watches after the starting thread ended
    try:
        assert lane.call("tests.lane_fakes", "state")["pid"] == pid
    finally:
        lane.close()


@pytest.mark.parametrize("env, sig", [("CLEANER_CRASH_AT", signal.SIGKILL), ("CLEANER_PAUSE_AT", signal.SIGSTOP)])
def test_a_fault_point_in_a_lane_signals_the_flow_process(env, sig):
    proc, worker = _parent("crash", {env: "after_rollout@1"})
    try:
        if sig == signal.SIGKILL:
            assert proc.wait(timeout=60) == -signal.SIGKILL
            assert _gone(worker)
        else:
            for _ in range(100):
                if Path(f"/proc/{proc.pid}/stat").read_text().split()[2] == "T":
                    break
                time.sleep(0.1)
            assert Path(f"/proc/{proc.pid}/stat").read_text().split()[2] == "T"
            assert Path(f"/proc/{worker}/stat").read_text().split()[2] == "T"
    finally:
        proc.kill()
        proc.wait()
        if not _gone(worker):
            os.kill(worker, signal.SIGKILL)


def test_a_worker_that_never_connects_is_lane_died(monkeypatch):
    import tasks.training.lanes as lanes

    monkeypatch.setattr(lanes.sys, "executable", "/bin/false")
    with pytest.raises(LaneDied, match=r"lane 'broken': its worker \(pid \d+\) ended before it connected: exit "
                                       r"status 1"):
        Lane("broken", 1).call("tests.lane_fakes", "add", 1)
