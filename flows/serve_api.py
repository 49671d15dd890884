"""What ``cleaner serve`` asks its servers: its active flow runs (to cancel them at stop) and errors in the logs.

* A stack owns the flow runs of its work pool (``pool``): stop, ``--force``, Ctrl-C and SIGTERM wait for or cancel
  only those; a flow run of the same Prefect history started elsewhere (a shell's ``cleaner train``, another
  checkout's compare) is left alone.
* ``active_runs`` / ``cancel_runs`` / ``wait_terminal`` / ``force_cancel`` talk to the Prefect REST API
  (``POST /flow_runs/filter``, ``POST /flow_runs/{id}/set_state``), with the API auth string when the stack has one,
  through ``client``: Prefect's own httpx client, which retries what a busy server on SQLite answers now and then
  (429/502/503/408, a read timeout, a dropped connection) the way every Prefect worker and CLI call does.
  Cancelling goes through Prefect's orchestration, so the worker kills the flow process, the flow's
  ``on_cancellation`` hooks run and the deployment's concurrency slot is released.
* ``log_errors`` reads a Prefect server log (``HH:MM:SS.mmm | LEVEL | logger - message`` lines, a traceback after an
  ERROR) from a byte offset, so ``serve status`` reports only what happened since the server last started;
  ``scheduler_errors`` keeps those of the scheduler services (a scheduler that fails every loop is silent otherwise:
  the schedule looks active and no run is ever created).
"""

from __future__ import annotations

import base64
import re
import time
from dataclasses import dataclass
from pathlib import Path

from prefect.client.base import PrefectHttpxSyncClient

ACTIVE = ("PENDING", "RUNNING", "CANCELLING")
TERMINAL = ("COMPLETED", "FAILED", "CANCELLED", "CRASHED")
HEADER = re.compile(r"^(\d\d:\d\d:\d\d(?:\.\d+)?) \| ([A-Z]+)\s*\| (\S+) - (.*)$")
SCHEDULER_TASKS = ("schedule_deployments", "schedule_recent_deployments")


def headers(auth_string: str | None) -> dict[str, str]:
    """Prefect's API auth (``user:password``) as the Basic header its clients send."""
    if not auth_string:
        return {}
    return {"Authorization": "Basic " + base64.b64encode(auth_string.encode()).decode()}


def client(api: str, auth_string: str | None = None, timeout_s: float = 10.0) -> PrefectHttpxSyncClient:
    """An API client for ``api`` with Prefect's retries (``PREFECT_CLIENT_MAX_RETRIES``); errors raise."""
    return PrefectHttpxSyncClient(base_url=api, headers=headers(auth_string), timeout=timeout_s)


def active_runs(api: str, auth_string: str | None = None, timeout_s: float = 10.0, pool: str | None = None
                ) -> list[dict]:
    """Flow runs that hold a process or a slot: ``{id, name, state, deployment_id, pid}``; with ``pool`` only those
    of that work pool (a stack's own: what its worker started or will start), never a run started elsewhere (a
    ``cleaner train`` in a shell, another stack's) that shares the Prefect history."""
    body = {"flow_runs": {"state": {"type": {"any_": list(ACTIVE)}}}, "limit": 200}
    if pool is not None:
        body["work_pools"] = {"name": {"any_": [pool]}}
    with client(api, auth_string, timeout_s) as http:
        resp = http.post("/flow_runs/filter", json=body)
    return [{"id": r["id"], "name": r["name"], "state": r["state_type"], "deployment_id": r.get("deployment_id"),
             "pid": _pid(r.get("infrastructure_pid"))} for r in resp.json()]


def _pid(infrastructure_pid: str | None) -> int | None:
    """The process id in Prefect's ``infrastructure_pid`` (``pid`` or ``host:pid``)."""
    tail = str(infrastructure_pid or "").rsplit(":", 1)[-1]
    return int(tail) if tail.isdigit() else None


def set_state(api: str, run_id: str, state: str, message: str, force: bool, auth_string: str | None = None) -> str:
    """Propose a state; returns Prefect's answer (``ACCEPT``, ``REJECT``, ``ABORT``, ``WAIT``)."""
    body = {"state": {"type": state, "message": message}, "force": force}
    with client(api, auth_string) as http:
        resp = http.post(f"/flow_runs/{run_id}/set_state", json=body)
    return resp.json()["status"]


def cancel_runs(api: str, runs: list[dict], auth_string: str | None = None) -> None:
    for run in runs:
        if run["state"] != "CANCELLING":
            set_state(api, run["id"], "CANCELLING", "cleaner serve stop: the stack is stopping", False, auth_string)


def wait_terminal(api: str, ids: set[str], timeout_s: float, auth_string: str | None = None,
                  pool: str | None = None) -> set[str]:
    """Wait until none of ``ids`` is active; returns those still active at the deadline."""
    deadline = time.monotonic() + timeout_s
    left = set(ids)
    while left:
        left = {r["id"] for r in active_runs(api, auth_string, pool=pool)} & left
        if not left or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    return left


def force_cancel(api: str, ids: set[str], auth_string: str | None = None) -> None:
    """Mark runs whose process is gone as Cancelled, so no run stays Running and no slot stays held."""
    for run_id in ids:
        set_state(api, run_id, "CANCELLED", "cleaner serve stop: the flow process was stopped with the stack",
                  True, auth_string)


@dataclass(frozen=True)
class LogError:
    time: str
    source: str
    message: str
    exception: str


def log_errors(log: Path, offset: int = 0) -> list[LogError]:
    """ERROR records of a Prefect server log from byte ``offset``, each with the last line of its traceback."""
    if not log.exists():
        return []
    with open(log, "rb") as f:
        f.seek(offset)
        lines = f.read().decode("utf-8", "replace").splitlines()
    errors: list[LogError] = []
    current: list[str] | None = None
    for line in [*lines, "00:00:00 | END | eof - "]:
        head = HEADER.match(line)
        if head is None:
            if current is not None and line.strip():
                current.append(line.strip())
            continue
        if current is not None:
            tail = current[4:]
            errors.append(LogError(current[0], current[2], current[3], tail[-1] if tail else ""))
        current = list(head.groups()) if head.group(2) in ("ERROR", "CRITICAL") else None
    return errors


def scheduler_errors(log: Path, offset: int = 0) -> list[LogError]:
    return [e for e in log_errors(log, offset)
            if "scheduler" in e.source or any(t in e.message for t in SCHEDULER_TASKS)]
