"""The ``cleaner serve`` supervisor: a Prefect server, an MLflow server and a process worker, kept alive.

Each server runs in its own process group; the supervisor (the foreground ``cleaner serve start``, or its
detached copy) restarts one that exits, after a back-off (1, 2, 4 … 60 s; reset once it stayed up a minute),
without touching the others; ``restart-<name>`` files in the stack folder ask it to restart one now. It is a
Linux child subreaper, so a flow process whose worker died is re-parented to it, not to init: at stop it
cancels the active flow runs of its work pool (its own; runs of the same Prefect history started elsewhere are left
alone) through the Prefect API (the worker kills their processes, hooks run, slots are
released), waits, kills what is left below it, marks runs whose process is gone Cancelled, then stops the
worker, MLflow and Prefect. State (process groups, ports, restarts, log offsets) is in ``pids.json``.

With ``--database postgres`` (``flows/serve_db.py``) a PostgreSQL server of its own — or one you run — holds
Prefect's database and MLflow's backend store; it starts first and stops last. SQLite is the default.

MLflow is sized for a small machine: one uvicorn worker and no job-execution consumers
(``MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false``: 2 processes / ~0.5 GB instead of 10 / ~2 GB here); telemetry is
off for both servers.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from flows import serve_api
from flows.procs import descendants, group_alive, pid_alive, proc_table, stop_groups
from flows.serve_auth import env_for_clients
from flows.serve_db import DatabaseError, Postgres

ORDER = ("prefect", "mlflow", "worker")
BACKOFF_S = (1, 2, 4, 8, 16, 30, 60)
STABLE_S = 60.0
RECONCILE_S = 10.0
PR_SET_CHILD_SUBREAPER = 36
QUIET = {"PREFECT_SERVER_ANALYTICS_ENABLED": "false", "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true"}


class ServeError(RuntimeError):
    """A server of the stack did not come up."""


@dataclass
class StackConfig:
    """What the stack serves and where; ``auth`` holds the credentials of a team stack (see ``flows/serve_auth``)."""

    folder: Path
    prefect_port: int = 4200
    mlflow_port: int = 5000
    pool: str = "cleaner-process"
    mlflow_store: str = "sqlite:///mlflow.db"
    artifacts: Path = Path("mlartifacts")
    host: str = "127.0.0.1"
    timeout_s: float = 300.0
    cancel_timeout_s: float = 120.0
    auth: dict = field(default_factory=dict)
    database: Postgres | None = None

    @property
    def names(self) -> tuple[str, ...]:
        """The servers this stack starts, in start order (a PostgreSQL server of its own first)."""
        return (("postgres",) if self.database is not None and self.database.managed else ()) + ORDER

    @property
    def prefect_api(self) -> str:
        return f"http://{_client_host(self.host)}:{self.prefect_port}/api"

    @property
    def mlflow_uri(self) -> str:
        return f"http://{_client_host(self.host)}:{self.mlflow_port}"

    def env(self, name: str) -> dict[str, str]:
        env = {**os.environ, **QUIET, "PREFECT_API_URL": self.prefect_api, "PREFECT_UI_API_URL": self.prefect_api,
               "PREFECT_SERVER_API_HOST": self.host}
        if name == "mlflow":
            env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"
            env["MLFLOW_BACKEND_STORE_URI"] = self.backend_store  # in the environment: no password on a command line
        if name == "prefect" and self.database is not None:
            env["PREFECT_SERVER_DATABASE_CONNECTION_URL"] = self.database.database_url("prefect", "asyncpg")
        env.update(env_for_clients(self.auth))
        if self.auth and name == "prefect":
            env["PREFECT_SERVER_API_AUTH_STRING"] = self.auth["prefect"]
        if self.auth and name == "mlflow":
            env["MLFLOW_AUTH_CONFIG_PATH"] = self.auth["mlflow_config"]
            env["MLFLOW_AUTH_ADMIN_PASSWORD"] = self.auth["mlflow_admin"][1]
            env["MLFLOW_FLASK_SERVER_SECRET_KEY"] = self.auth["mlflow_secret"]
        return env

    @property
    def backend_store(self) -> str:
        """MLflow's backend store: the stack's PostgreSQL database ``mlflow``, else ``mlflow_store``."""
        return self.database.database_url("mlflow", "psycopg2") if self.database is not None else self.mlflow_store

    def argv(self, name: str) -> list[str]:
        if name == "postgres":
            return self.database.argv()
        if name == "prefect":
            return [_bin("prefect"), "server", "start", "--host", self.host, "--port", str(self.prefect_port)]
        if name == "mlflow":
            argv = [_bin("mlflow"), "server", "--artifacts-destination", str(self.artifacts), "--host", self.host, "--port", str(self.mlflow_port), "--workers", "1"]
            return argv + (["--app-name", "basic-auth"] if self.auth else [])
        return [_bin("prefect"), "worker", "start", "--pool", self.pool, "--type", "process"]

    def health_url(self, name: str) -> str | None:
        return {"prefect": f"{self.prefect_api}/health", "mlflow": f"{self.mlflow_uri}/health"}.get(name)


def _client_host(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "::", "") else host


def _bin(name: str) -> str:
    """The console script next to this interpreter (the project's venv), else the one on PATH."""
    local = Path(sys.executable).parent / name
    return str(local) if local.exists() else name


def wait_http(name: str, url: str, alive, log: Path, timeout_s: float, auth_string: str | None = None) -> None:
    """Until ``url`` answers 200; ``alive()`` false means the server died first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not alive():
            raise ServeError(f"{name} exited before answering {url}; see {log}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2.0, headers=serve_api.headers(auth_string)).status_code == 200:
                return
        time.sleep(0.5)
    raise ServeError(f"{name} did not answer {url} within {timeout_s:.0f} s; see {log}")


def read_state(folder: Path) -> dict:
    path = folder / "pids.json"
    if not path.exists():
        raise FileNotFoundError(f"{path}: no stack recorded here (start one with `cleaner serve start`)")
    return json.loads(path.read_text())


class Supervisor:
    """Starts the stack, keeps every server alive, stops everything it started (and what they started)."""

    def __init__(self, cfg: StackConfig, echo=print):
        self.cfg, self.echo = cfg, echo
        self.logs = cfg.folder / "logs"
        self.procs: dict[str, subprocess.Popen] = {}
        self.started: dict[str, float] = {}
        self.crashes: dict[str, int] = {}
        self.due: dict[str, float] = {}
        self.stopping = threading.Event()
        self.seen: set[int] = set()
        self.next_reconcile = 0.0
        self.subreaper = False
        self.state = {"supervisor": os.getpid(), "pids": {}, "prefect_api": cfg.prefect_api,
                      "database": "postgres" if cfg.database is not None else "sqlite",
                      "postgres_port": cfg.database.port if cfg.database is not None else None,
                      "mlflow_uri": cfg.mlflow_uri, "pool": cfg.pool, "host": cfg.host, "ready": False,
                      "restarts": {}, "log_offsets": {}, "auth_file": cfg.auth.get("file"),
                      "prefect_home": os.environ.get("PREFECT_HOME")}

    # -- processes -------------------------------------------------------------------------------
    def spawn(self, name: str) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        log_path = self.logs / f"{name}.log"
        with open(log_path, "ab") as log:
            self.state["log_offsets"][name] = log.tell()
            extra = self.cfg.database.popen_kwargs() if name == "postgres" else {}
            self.procs[name] = subprocess.Popen(self.cfg.argv(name), stdout=log, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL, env=self.cfg.env(name),
                                                start_new_session=True, **extra)
        self.started[name] = time.monotonic()
        self.state["pids"][name] = self.procs[name].pid
        self.write_state()

    def alive(self, name: str) -> bool:
        proc = self.procs.get(name)
        return proc is not None and proc.poll() is None

    def wait_ready(self, name: str) -> None:
        if name == "postgres":
            alive = (lambda: self.alive(name)) if self.cfg.database.managed else (lambda: True)
            try:
                self.cfg.database.wait_ready(alive, self.logs / "postgres.log", self.cfg.timeout_s)
            except DatabaseError as err:
                raise ServeError(str(err)) from None
            return
        url = self.cfg.health_url(name)
        if url:
            wait_http(name, url, lambda: self.alive(name), self.logs / f"{name}.log", self.cfg.timeout_s,
                      self.cfg.auth.get("prefect"))

    def write_state(self) -> None:
        tmp = self.cfg.folder / ".pids.json.tmp"
        tmp.write_text(json.dumps(self.state, indent=1))
        tmp.replace(self.cfg.folder / "pids.json")

    def start(self) -> None:
        """Start Prefect, create the work pool, start MLflow and the worker; raise ServeError if one fails."""
        self.subreaper = _become_subreaper()
        try:
            if self.cfg.database is not None:
                self._start_database()
            self.spawn("prefect")
            self.spawn("mlflow")
            self.wait_ready("prefect")
            self._create_pool()
            self.spawn("worker")
            self.wait_ready("mlflow")
        except BaseException:
            self.stop_servers(grace_s=5.0)
            (self.cfg.folder / "pids.json").unlink(missing_ok=True)
            raise
        self.state["ready"] = True
        self.write_state()

    def _start_database(self) -> None:
        """Initialise and start the stack's PostgreSQL (or reach yours), then make Prefect's and MLflow's databases."""
        try:
            self.cfg.database.init()
        except DatabaseError as err:
            raise ServeError(str(err)) from None
        if self.cfg.database.managed:
            self.spawn("postgres")
        self.wait_ready("postgres")

    def _create_pool(self) -> None:
        argv = [_bin("prefect"), "work-pool", "create", self.cfg.pool, "--type", "process", "--overwrite"]
        done = subprocess.run(argv, env=self.cfg.env("worker"), capture_output=True, text=True, timeout=120, check=False)
        with open(self.logs / "worker.log", "a") as f:
            f.write(done.stdout + done.stderr)
        if done.returncode != 0:
            raise ServeError(f"creating work pool {self.cfg.pool!r} failed (exit {done.returncode}): "
                             f"{done.stderr.strip()[-400:]}")

    # -- supervision -----------------------------------------------------------------------------
    def watch(self, poll_s: float = 0.5) -> None:
        """Until asked to stop: restart requested servers now and crashed ones after their back-off."""
        while not self.stopping.is_set():
            now = time.monotonic()
            for name in [n for n in self.cfg.names if n in self.procs]:
                request = self.cfg.folder / f"restart-{name}"
                if request.exists():
                    request.unlink(missing_ok=True)
                    self.echo(f"{name}: restart requested")
                    flows = self._flow_groups(name)
                    self._stop_one(name)
                    self._end_orphaned_flows(name, flows)
                    self._respawn(name, crashed=False)
                elif not self.alive(name):
                    self._end_orphaned_flows(name)
                    self._after_exit(name, now)
                elif now - self.started[name] > STABLE_S:
                    self.crashes[name] = 0
            self._reap_orphans()
            if now >= self.next_reconcile:
                self.next_reconcile = now + RECONCILE_S
                self._reconcile()
            self.stopping.wait(poll_s)

    def _reconcile(self) -> None:
        """Flow runs Prefect shows Running whose process, once below us, is gone (the worker that started them
        died or was restarted, and we ended what it left). Mark them Crashed: their slot is released and a
        Retry resumes them."""
        self.seen |= set(descendants(os.getpid()))
        if not self.alive("prefect"):
            return
        token = self.cfg.auth.get("prefect")
        try:
            for run in serve_api.active_runs(self.cfg.prefect_api, token, pool=self.cfg.pool):
                pid = run["pid"]
                if run["state"] == "RUNNING" and pid in self.seen and not pid_alive(pid):
                    serve_api.set_state(self.cfg.prefect_api, run["id"], "CRASHED",
                                        f"its flow process {pid} ended without reporting (worker restarted or died)",
                                        False, token)
                    self.echo(f"flow run {run['name']}: process {pid} is gone; marked Crashed (a retry resumes it)")
        except httpx.HTTPError as err:
            self.echo(f"could not check flow runs: {err}")

    def _flow_groups(self, name: str) -> set[int]:
        """Process groups of the flow runs below the worker (each run is a session of its own)."""
        if name != "worker" or name not in self.procs:
            return set()
        below = descendants(self.procs[name].pid)
        self.seen |= set(below)
        return {pgid for pgid in below.values() if pgid != self.procs[name].pid}

    def _end_orphaned_flows(self, name: str, flows: set[int] = frozenset()) -> None:
        """Flow processes whose worker is gone (``flows``, or re-parented to us). Prefect starts each in a session
        of its own, so they outlive the worker's group, cut off from the worker that streamed their output (a
        later print fails at a random point). End them, and have their runs marked Crashed at once."""
        if name != "worker":
            return
        servers, ours = {p.pid for p in self.procs.values()}, os.getpgrp()
        if self.subreaper:  # re-parented group leaders below us that are not our servers
            flows = set(flows) | {pid for pid, (ppid, pgid, state) in proc_table().items()
                                  if ppid == os.getpid() and pid == pgid and state != "Z" and pid not in servers}
        orphans = {pg for pg in flows if pg != ours and pg not in servers and group_alive(pg)}
        if orphans:
            self.seen |= set(descendants(os.getpid()))
            self.echo(f"stopping {len(orphans)} flow process group(s) the worker left: {sorted(orphans)}")
            stop_groups({f"flow-{pg}": pg for pg in orphans}, grace_s=10.0)
            self.next_reconcile = 0.0

    def _after_exit(self, name: str, now: float) -> None:
        if name not in self.due:
            code = self.procs[name].returncode
            n = self.crashes[name] = self.crashes.get(name, 0) + 1
            delay = BACKOFF_S[min(n, len(BACKOFF_S)) - 1]
            self.due[name] = now + delay
            self.echo(f"{name} exited (code {code}); restarting in {delay} s (crash {n}, see {self.logs / name}.log)")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.procs[name].pid, signal.SIGKILL)
        elif now >= self.due[name]:
            self._respawn(name, crashed=True)

    def _respawn(self, name: str, crashed: bool) -> None:
        self.due.pop(name, None)
        if not crashed:
            self.crashes[name] = 0
        self.state["restarts"][name] = self.state["restarts"].get(name, 0) + 1
        self.spawn(name)
        self.echo(f"{name} restarted (pgid {self.procs[name].pid})")

    def _stop_one(self, name: str) -> None:
        if name in self.procs:
            stop_groups({name: self.procs[name].pid})
            self.procs[name].poll()

    def _reap_orphans(self) -> None:
        """As a subreaper, collect re-parented processes that exited (not our servers: Popen reaps those)."""
        mine = {p.pid for p in self.procs.values()}
        for pid, (ppid, _, state) in proc_table().items():
            if ppid == os.getpid() and state == "Z" and pid not in mine:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)

    # -- stopping --------------------------------------------------------------------------------
    def shutdown(self) -> list[str]:
        """Cancel active flow runs, stop the servers and every process below us; returns what was stopped."""
        self.state["ready"] = False
        self.write_state()
        token = self.cfg.auth.get("prefect")
        gone: set[str] = set()
        if self.alive("prefect"):
            try:
                runs = serve_api.active_runs(self.cfg.prefect_api, token, pool=self.cfg.pool)
                if runs:
                    self.echo(f"cancelling {len(runs)} active flow run(s) of pool {self.cfg.pool!r}: "
                              f"{', '.join(r['name'] for r in runs)}")
                    serve_api.cancel_runs(self.cfg.prefect_api, runs, token)
                    gone = serve_api.wait_terminal(self.cfg.prefect_api, {r["id"] for r in runs},
                                                   self.cfg.cancel_timeout_s, token, self.cfg.pool)
            except httpx.HTTPError as err:
                self.echo(f"could not cancel flow runs through {self.cfg.prefect_api}: {err}")
        stopped = stop_groups({"worker": self.procs["worker"].pid} if "worker" in self.procs else {})
        self._kill_descendants()
        if gone and self.alive("prefect"):
            with contextlib.suppress(httpx.HTTPError):
                serve_api.force_cancel(self.cfg.prefect_api, gone, token)
        stopped += self.stop_servers()
        (self.cfg.folder / "pids.json").unlink(missing_ok=True)
        return stopped

    def stop_servers(self, grace_s: float = 15.0) -> list[str]:
        return stop_groups({n: self.procs[n].pid for n in self.cfg.names if n in self.procs}, grace_s)

    def _kill_descendants(self, grace_s: float = 10.0) -> None:
        """Flow processes (and what they started) left below us: SIGTERM their groups, then SIGKILL."""
        servers = {p.pid for p in self.procs.values()}
        left = {pg for pg in descendants(os.getpid()).values() if pg not in servers}
        if left:
            self.echo(f"stopping {len(left)} leftover process group(s) of flow runs")
            stop_groups({f"flow-{pg}": pg for pg in left}, grace_s)


def _become_subreaper() -> bool:
    """Orphans below us are re-parented to us (Linux); whether that worked."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    return False
