"""``cleaner serve``: a Prefect server, a process worker and an MLflow server, supervised.

What it simplifies: running deployments from ``prefect.yaml`` and browsing MLflow needs three long-lived
servers; this starts them with one command, keeps them alive (``flows/serve_stack.py``: a crashed server is
restarted with back-off, the others keep running), and stops them without leaving a flow run Running or a flow
process behind.

    cleaner serve start [--detach]      # foreground (Ctrl-C stops everything) or a background supervisor
    cleaner serve start --database postgres   # a team stack: Prefect's and MLflow's stores on PostgreSQL
    cleaner serve status                # servers, restarts, scheduler errors, the active flow runs it owns
    cleaner serve restart mlflow        # or prefect / worker
    cleaner serve stop [--force]        # refuses while its flow runs are active; --force cancels them and waits

The stack owns the flow runs of its work pool (``--pool``): stop, ``--force``, Ctrl-C and SIGTERM wait for or cancel
only those, and ``status`` lists them; a flow run of the same Prefect history started elsewhere (``cleaner train`` in
a shell, another stack's) is never touched.
    cleaner serve schedule train/train-tiny --cron '0 2 * * *' --set train.steps=2   # a schedule with its parameters

Layout (``--dir``, default ``.serve``): ``logs/{prefect,worker,mlflow,supervisor}.log`` and ``pids.json``. The MLflow
server reads the store the flows write by default (``sqlite:///mlflow.db``, ``./mlartifacts``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import typer

from flows.prefect_home import use_project_home

use_project_home()

from flows import serve_api  # noqa: E402
from flows.procs import group_alive, pid_alive  # noqa: E402
from flows.serve_stack import (  # noqa: E402
    ORDER,
    ServeError,
    StackConfig,
    Supervisor,
    read_state,
    wait_http,
)

app = typer.Typer(rich_markup_mode=None, add_completion=False, no_args_is_help=True,
                  help="Local Prefect server + worker + MLflow server.")

DirOpt = typer.Option(Path(".serve"), "--dir", help="Folder for logs/ and pids.json.")


def _running(folder: Path) -> bool:
    try:
        state = read_state(folder)
    except FileNotFoundError:
        return False
    return pid_alive(state.get("supervisor")) or any(group_alive(p) for p in state["pids"].values())


def _token(state: dict) -> str | None:
    from flows.serve_auth import prefect_auth_string

    return prefect_auth_string(state)


@app.command()
def start(folder: Path = DirOpt,
          prefect_port: int = typer.Option(4200, help="Prefect server port."),
          mlflow_port: int = typer.Option(5000, help="MLflow server port."),
          pool: str = typer.Option("cleaner-process", help="Work pool (type process) the worker polls."),
          mlflow_store: str | None = typer.Option(None, help="MLflow backend store URI (default sqlite:///mlflow.db; "
                                                  "with --database postgres: the stack's database mlflow)."),
          database: str = typer.Option("sqlite", help="Prefect's database and MLflow's backend store: sqlite (one "
                                       "user) or postgres (a team; flows/serve_db.py)."),
          postgres_port: int = typer.Option(5432, help="Port of the stack's own PostgreSQL (loopback only)."),
          database_url: str | None = typer.Option(None, help="With --database postgres: a PostgreSQL server of yours, "
                                                  "postgresql://user:password@host:port, instead of the stack's own."),
          artifacts: Path = typer.Option(Path("mlartifacts"), help="MLflow artifacts folder."),
          host: str = typer.Option("127.0.0.1", help="Address the servers listen on; other than loopback needs --auth."),
          auth: bool = typer.Option(False, help="Team stack: MLflow basic auth + Prefect API auth (see docs/team.md)."),
          detach: bool = typer.Option(False, help="Run the supervisor in the background; stop it with `cleaner serve stop`."),
          timeout: float = typer.Option(300.0, help="Seconds each server may take to answer."),
          cancel_timeout: float = typer.Option(120.0, help="At stop, seconds active flow runs get to end once cancelled.")) -> None:
    """Start a Prefect server, a process worker and an MLflow server, and keep them running."""
    from flows.serve_auth import AuthError, prepare_auth
    from flows.serve_db import Postgres

    if database not in ("sqlite", "postgres"):
        typer.echo(f"unknown --database {database!r}; one of: sqlite, postgres")
        raise typer.Exit(2)
    if database == "postgres" and mlflow_store is not None:
        typer.echo("--mlflow-store is for --database sqlite; with postgres MLflow uses the stack's database mlflow")
        raise typer.Exit(2)
    if database_url is not None and database != "postgres":
        typer.echo("--database-url needs --database postgres")
        raise typer.Exit(2)

    if _running(folder):
        typer.echo(f"a stack is already running (see {folder / 'pids.json'}); `cleaner serve stop --dir {folder}` first")
        raise typer.Exit(1)
    folder.mkdir(parents=True, exist_ok=True)
    try:
        creds = prepare_auth(folder, host, auth)
    except AuthError as err:
        typer.echo(f"serve refused: {err}")
        raise typer.Exit(2) from None
    pg = Postgres(folder.resolve() / "postgres", postgres_port, database_url) if database == "postgres" else None
    cfg = StackConfig(folder, prefect_port, mlflow_port, pool, mlflow_store or "sqlite:///mlflow.db",
                      artifacts.resolve(), host, timeout, cancel_timeout, creds, pg)
    if detach:
        _start_detached(cfg, auth)
        return
    _run_foreground(cfg)


def _run_foreground(cfg: StackConfig) -> None:
    sup = Supervisor(cfg, echo=lambda m: typer.echo(m, err=True))

    def interrupt(*_):
        raise KeyboardInterrupt

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, interrupt)
    try:
        sup.start()
    except ServeError as err:
        typer.echo(f"serve failed: {err}")
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: sup.stopping.set())
    _print_urls(cfg)
    typer.echo("Ctrl-C stops the stack (active flow runs are cancelled first).")
    sup.watch()
    stopped = sup.shutdown()
    typer.echo(f"stopped: {', '.join(stopped) or 'nothing'}")


def _start_detached(cfg: StackConfig, auth: bool) -> None:
    pg = cfg.database
    store = ["--database", "postgres", "--postgres-port", str(pg.port), *(["--database-url", pg.url] if pg.url else [])
             ] if pg is not None else ["--mlflow-store", cfg.mlflow_store]
    argv = [sys.executable, "-m", "flows.cli_serve", "start", "--dir", str(cfg.folder), "--prefect-port",
            str(cfg.prefect_port), "--mlflow-port", str(cfg.mlflow_port), "--pool", cfg.pool, *store,
            "--artifacts", str(cfg.artifacts), "--host", cfg.host, "--timeout", str(cfg.timeout_s),
            "--cancel-timeout", str(cfg.cancel_timeout_s), *(["--auth"] if auth else [])]
    (cfg.folder / "pids.json").unlink(missing_ok=True)
    logs = cfg.folder / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    with open(logs / "supervisor.log", "ab") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    deadline = time.monotonic() + 3 * cfg.timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = (logs / "supervisor.log").read_text()[-1500:]
            typer.echo(f"serve failed: the supervisor exited with code {proc.returncode}:\n{tail}")
            raise typer.Exit(1)
        try:
            if read_state(cfg.folder).get("ready"):
                _print_urls(cfg)
                return
        except (FileNotFoundError, ValueError):
            pass
        time.sleep(0.5)
    typer.echo(f"serve failed: the stack was not ready within {3 * cfg.timeout_s:.0f} s; see {logs}")
    raise typer.Exit(1)


def _print_urls(cfg: StackConfig) -> None:
    creds = f"\ncredentials     {cfg.auth['file']} (0600)" if cfg.auth else ""
    typer.echo(f"Prefect UI/API  {cfg.prefect_api[:-4]}   (export PREFECT_API_URL={cfg.prefect_api})\n"
               f"MLflow UI       {cfg.mlflow_uri}\nworker          pool {cfg.pool!r}\n"
               f"logs            {cfg.folder / 'logs'}   PIDs {cfg.folder / 'pids.json'}{creds}")


def _state_or_exit(folder: Path) -> dict:
    """The recorded stack of ``folder``, or exit 1 saying that none is recorded."""
    try:
        return read_state(folder)
    except FileNotFoundError as err:
        typer.echo(str(err))
        raise typer.Exit(1) from None


def _owned_runs(state: dict) -> list[dict]:
    """The active flow runs of the stack's work pool (none when its Prefect server does not answer)."""
    try:
        return serve_api.active_runs(state["prefect_api"], _token(state), pool=state.get("pool", "cleaner-process"))
    except httpx.HTTPError:
        return []


def _names(runs: list[dict]) -> str:
    return ", ".join(f"{r['name']} ({r['state'].lower()})" for r in runs)


@app.command()
def stop(folder: Path = DirOpt,
         force: bool = typer.Option(False, help="Cancel active flow runs (through Prefect) and wait for them."),
         timeout: float = typer.Option(300.0, help="Seconds to wait for the stack to stop.")) -> None:
    """Stop the stack; refuses while flow runs are active unless ``--force``."""
    state = _state_or_exit(folder)
    alive = [n for n, pgid in state["pids"].items() if group_alive(pgid)]
    if not force and "prefect" in alive:
        runs = _owned_runs(state)
        if runs:
            typer.echo(f"{len(runs)} flow run(s) active: {_names(runs)}. `cleaner serve stop --force` cancels them "
                       "through Prefect, waits for them, then stops the stack.")
            raise typer.Exit(1)
    sup = state.get("supervisor")
    if pid_alive(sup):
        os.kill(sup, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while pid_alive(sup) and time.monotonic() < deadline:
            time.sleep(0.5)
    if pid_alive(sup) or any(group_alive(p) for p in state["pids"].values()):
        from flows.procs import stop_groups

        stop_groups(state["pids"])
    (folder / "pids.json").unlink(missing_ok=True)
    typer.echo(f"stopped: {', '.join(reversed(alive)) or 'nothing (already gone)'}")


@app.command()
def restart(name: str = typer.Argument(..., help=f"One of: {', '.join(ORDER)} (and postgres on a stack with its "
                                          "own)."), folder: Path = DirOpt,
            timeout: float = typer.Option(300.0, help="Seconds the server may take to answer again.")) -> None:
    """Restart one server of a running stack (the others keep running)."""
    state = _state_or_exit(folder)
    if name not in state["pids"]:
        typer.echo(f"unknown server {name!r}; one of: {', '.join(state['pids'])}")
        raise typer.Exit(2)
    if not pid_alive(state.get("supervisor")):
        typer.echo(f"no supervisor is running for {folder} (start the stack with `cleaner serve start`)")
        raise typer.Exit(1)
    old = state["pids"].get(name)
    (folder / f"restart-{name}").touch()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        new = read_state(folder)["pids"].get(name)
        if new != old and group_alive(new):
            break
        time.sleep(0.3)
    else:
        typer.echo(f"{name} was not restarted within {timeout:.0f} s; see {folder / 'logs'}")
        raise typer.Exit(1)
    url = {"prefect": f"{state['prefect_api']}/health", "mlflow": f"{state['mlflow_uri']}/health"}.get(name)
    if url:
        try:
            wait_http(name, url, lambda: group_alive(new), folder / "logs" / f"{name}.log",
                      max(1.0, deadline - time.monotonic()), _token(state))
        except ServeError as err:
            typer.echo(str(err))
            raise typer.Exit(1) from None
    typer.echo(f"{name} restarted: pgid {old} -> {new}")


@app.command()
def status(folder: Path = DirOpt) -> None:
    """Which servers are alive, how often each was restarted, and scheduler errors in the Prefect log.
    Exit 1 when a server is down or the scheduler is failing."""
    state = _state_or_exit(folder)
    healthy = pid_alive(state.get("supervisor"))
    typer.echo(f"{'supervisor':10s} pid  {state.get('supervisor', 0):<8d} {'running' if healthy else 'stopped'}")
    for name, pgid in state["pids"].items():
        up = group_alive(pgid)
        healthy &= up
        typer.echo(f"{name:10s} pgid {pgid:<8d} {'running' if up else 'stopped'}"
                   f"   restarts {state.get('restarts', {}).get(name, 0)}")
    log = folder / "logs" / "prefect.log"
    errors = serve_api.scheduler_errors(log, state.get("log_offsets", {}).get("prefect", 0))
    if errors:
        healthy = False
        last = errors[-1]
        typer.echo(f"scheduler  {len(errors)} error(s) since the Prefect server started, last at {last.time}: "
                   f"{last.exception or last.message}\n           schedules are not producing runs; see {log}")
    else:
        typer.echo(f"scheduler  no errors in {log}")
    pool = state.get("pool", "cleaner-process")
    if group_alive(state["pids"].get("prefect", 0)):
        runs = _owned_runs(state)
        typer.echo(f"flow runs  {len(runs)} active on pool {pool!r}{': ' + _names(runs) if runs else ''}")
    typer.echo(f"PREFECT_API_URL={state['prefect_api']}  MLflow {state['mlflow_uri']}  "
               f"PREFECT_HOME={state.get('prefect_home', '?')}  database {state.get('database', 'sqlite')}")
    if not healthy:
        raise typer.Exit(1)


@app.command()
def schedule(deployment: str = typer.Argument(..., help="FLOW/DEPLOYMENT, e.g. train/train-tiny."),
             cron: str | None = typer.Option(None, help="Cron expression (UTC), e.g. '0 2 * * *'."),
             interval: float | None = typer.Option(None, help="Or: seconds between runs."),
             overrides: list[str] | None = typer.Option(None, "--set", "-s", help="Override for the scheduled runs: "
                                                        "key.path=value (repeatable), after the deployment's own."),
             slug: str | None = typer.Option(None, help="Name of the schedule (default: derived from the overrides)."),
             folder: Path = DirOpt) -> None:
    """Add a schedule with its own parameters to a deployment of the served stack (``prefect deployment schedule
    create`` takes none): its runs train with the deployment's overrides followed by ``--set``'s."""
    from flows.config import ConfigError, load_config

    if (cron is None) == (interval is None):
        typer.echo("give exactly one of --cron and --interval")
        raise typer.Exit(2)
    api, token = _api(folder)
    with serve_api.client(api, token, 30.0) as http:
        found = http.get(f"/deployments/name/{deployment}") if deployment.count("/") == 1 else None
        if found is None or found.status_code == 404:
            typer.echo(f"no deployment {deployment!r} on {api} (FLOW/DEPLOYMENT, see `prefect deployment ls`)")
            raise typer.Exit(2)
        dep = found.json()
        params = dep.get("parameters") or {}
        sets = [*(params.get("overrides") or []), *(overrides or [])]
        try:
            load_config(params.get("config_path", "configs/tiny.yaml"), sets)
        except ConfigError as err:
            typer.echo(f"config error: {err}")
            raise typer.Exit(2) from None
        when = {"cron": cron, "timezone": "UTC"} if cron else {"interval": interval}
        body = [{"schedule": when, "active": True, "parameters": {"overrides": sets},
                 "slug": slug or ("-".join(overrides or []) or "default")[:100]}]
        made = http.post(f"/deployments/{dep['id']}/schedules", json=body).json()
    typer.echo(f"schedule {made[0]['slug']!r} of {deployment}: {cron or f'every {interval:g} s'} with overrides "
               f"{sets}")


def _api(folder: Path) -> tuple[str, str | None]:
    """The Prefect API to talk to: the recorded stack of ``folder``, else ``PREFECT_API_URL``."""
    try:
        state = read_state(folder)
        return state["prefect_api"], _token(state)
    except FileNotFoundError:
        pass
    api = os.environ.get("PREFECT_API_URL")
    if not api:
        typer.echo(f"no stack recorded in {folder} and no PREFECT_API_URL set")
        raise typer.Exit(1)
    return api, os.environ.get("PREFECT_API_AUTH_STRING")


if __name__ == "__main__":
    from models.termination import install

    install()  # SIGTERM ends it as Ctrl-C does, also when swallowed in a finaliser
    app()
