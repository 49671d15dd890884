"""Lanes: persistent worker processes that run stage functions beside the flow process.

A stage of ``tasks.training.stages`` is a pure function over files, so it can run in another process: a **lane**
is one such worker (``python -m tasks.training.lane_worker``), started on first use and kept for the run, so two
stages run at once without the GIL and without loading two models in one process (transformers' model loading is
not thread-safe: two threads fail with "Cannot copy out of meta tensor"; threads also overlapped only ×1.35). The
worker keeps its live caches (``tasks.training.live``: the engine stays loaded, a new checkpoint is a weight sync;
the sandbox pool stays warm) across calls.

    lane = get_lane("rollout", threads=1)
    lane.call("tasks.training.stages", "score_stage", step_dir, setup)   # the value, or the worker's error

A request is (module, function, args, kwargs), pickled over ``multiprocessing.connection`` (a Unix socket; the
authkey is handed over in the worker's environment, never argv); with it go this process's fence claims
(``tasks.stores.fence``), so the worker writes the run folder exactly when the flow process may. The reply is the
value, or the worker's exception raised here with the worker's traceback in its message. The worker writes
row-log units only (``tasks.stores.db.ROWS_ONLY_ENV``; the flow process ingests them), uses ``threads`` torch
threads, flushes its trace writer before it answers, and dies with this process (``PR_SET_PDEATHSIG``, and on
EOF). A worker that dies mid-call raises ``LaneDied`` (an infrastructure failure, never a stage result); the next
call starts a fresh one. A fault point reached in a lane (``tasks.training.faults``) signals this process too.

Lanes are kept per process (``get_lane``) and closed by ``close_lanes`` (``live.close_live`` calls it; ``atexit``
covers the rest). Tested in tests/test_lanes.py.
"""

from __future__ import annotations

import atexit
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from multiprocessing.connection import Connection, Listener
from pathlib import Path

from tasks.stores import fence
from tasks.training.faults import PARENT_ENV

ADDRESS_ENV = "CLEANER_LANE_ADDRESS"
AUTHKEY_ENV = "CLEANER_LANE_AUTHKEY"
THREADS_ENV = "CLEANER_LANE_THREADS"
NAME_ENV = "CLEANER_LANE_NAME"
START_WAIT_S = 120.0
"""How long a new worker may take to connect (it imports torch first)."""
STOP = "stop"
"""The request that makes a worker close its sandboxes and exit."""
ROOT = Path(__file__).resolve().parents[2]


class LaneDied(RuntimeError):
    """A lane's worker process ended during a call (killed, out of memory, a crash in native code)."""


class LaneError(RuntimeError):
    """A worker's exception that could not be sent back as itself (it does not pickle); the message carries it."""


def with_traceback(err: BaseException, text: str) -> BaseException:
    """``err`` with the worker's traceback ``text`` in its message (an exception of one message argument) and as
    a note either way."""
    if len(err.args) <= 1 and (not err.args or isinstance(err.args[0], str)):
        err.args = (f"{err.args[0] if err.args else ''}\n{text}".lstrip("\n"),)
    else:
        err.add_note(text)
    return err


class Lane:
    """One worker process, one call at a time (callers from several threads queue on its lock)."""

    def __init__(self, name: str, threads: int, env: dict[str, str] | None = None):
        self.name, self.threads, self.env = name, threads, dict(env or {})
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._conn: Connection | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def call(self, module: str, function: str, *args, **kwargs):
        """``module.function(*args, **kwargs)`` in the worker; its value, or its exception raised here."""
        what = f"{module}.{function}"
        with self._lock:
            if self.pid is None:
                self._start()
            try:
                self._conn.send((module, function, args, kwargs, fence.claims()))
                kind, value, text = self._conn.recv()
            except (EOFError, OSError) as err:
                raise self._died(what) from err
        if kind == "ok":
            return value
        raise with_traceback(value, f"(in lane {self.name!r}, pid {self.pid}, {what}):\n{text}")

    def _died(self, what: str) -> LaneDied:
        proc, self._proc, self._conn = self._proc, None, None
        try:
            status = proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            status = proc.wait()
        return LaneDied(f"lane {self.name!r}: its worker (pid {proc.pid}) died during {what}: exit status {status}"
                        + (f" (signal {-status})" if status < 0 else ""))

    def _start(self) -> None:
        key = secrets.token_bytes(32)
        folder = tempfile.mkdtemp(prefix=f"cleaner-lane-{self.name}-")
        address = os.path.join(folder, "socket")
        env = {**os.environ, **self.env, ADDRESS_ENV: address, AUTHKEY_ENV: key.hex(), PARENT_ENV: str(os.getpid()),
               THREADS_ENV: str(self.threads), NAME_ENV: self.name,
               "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
        try:
            with Listener(address, family="AF_UNIX", authkey=key) as listener:
                proc = subprocess.Popen([sys.executable, "-m", "tasks.training.lane_worker"], env=env, cwd=os.getcwd())
                got: dict[str, Connection | BaseException] = {}

                def accept() -> None:
                    try:
                        got["conn"] = listener.accept()
                    except BaseException as err:  # noqa: BLE001 — reported below as the start's failure
                        got["error"] = err

                waiter = threading.Thread(target=accept, daemon=True, name=f"lane-{self.name}-accept")
                waiter.start()
                deadline = time.monotonic() + START_WAIT_S
                while waiter.is_alive() and proc.poll() is None and time.monotonic() < deadline:
                    waiter.join(0.2)
                if "conn" not in got:
                    ended = proc.poll() is not None
                    proc.kill()
                    status = proc.wait()
                    why = "ended before it connected" if ended else f"did not connect within {START_WAIT_S:.0f} s"
                    raise LaneDied(f"lane {self.name!r}: its worker (pid {proc.pid}) {why}: exit status {status}")
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        self._proc, self._conn = proc, got["conn"]

    def close(self) -> None:
        """Tell the worker to close its sandboxes and exit; kill it when it does not within 30 s."""
        with self._lock:
            proc, conn, self._proc, self._conn = self._proc, self._conn, None, None
            if proc is None or proc.poll() is not None:
                return
            try:
                conn.send(STOP)
                conn.recv()
            except (EOFError, OSError):
                pass
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


_LANES: dict[str, Lane] = {}
_REGISTRY = threading.Lock()


def get_lane(name: str, threads: int) -> Lane:
    """This process's lane ``name`` with ``threads`` torch threads (one per name and thread count)."""
    key = f"{name}:{threads}"
    with _REGISTRY:
        if key not in _LANES:
            _LANES[key] = Lane(name, threads)
        return _LANES[key]


def close_lanes() -> None:
    """Stop every lane of this process (their workers close their sandbox pools)."""
    with _REGISTRY:
        lanes = list(_LANES.values())
        _LANES.clear()
    for lane in lanes:
        lane.close()


atexit.register(close_lanes)
