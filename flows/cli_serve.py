"""``cleaner serve``: a local Prefect server, a process worker and an MLflow server on 127.0.0.1.

What it simplifies: running deployments from ``prefect.yaml`` and browsing MLflow needs three
long-lived servers; this starts them with one command, each in its own process group, with
their logs in one folder and their PIDs recorded, and stops them cleanly by process group.

    cleaner serve start             # foreground; Ctrl-C stops everything
    cleaner serve start --detach    # return once all three answer; stop later with:
    cleaner serve stop
    cleaner serve status

Layout (``--dir``, default ``.serve``): ``logs/prefect.log``, ``logs/worker.log``,
``logs/mlflow.log`` and ``pids.json`` (name → process-group id, ports, URLs). The MLflow server
reads the same store the flows write by default (``sqlite:///mlflow.db``, ``./mlartifacts``), so
runs started from deployments appear in its UI.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Local Prefect server + worker + MLflow server.")

DirOpt = typer.Option(Path(".serve"), "--dir", help="Folder for logs/ and pids.json.")


class ServeError(RuntimeError):
    """A server of the stack did not come up."""


def _bin(name: str) -> str:
    """The console script next to this interpreter (the project's venv), else the one on PATH."""
    local = Path(sys.executable).parent / name
    return str(local) if local.exists() else name


def _spawn(name: str, argv: list[str], logs: Path, env: dict[str, str]) -> subprocess.Popen:
    log = open(logs / f"{name}.log", "ab")
    try:
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True)
    finally:
        log.close()


def _wait_http(name: str, url: str, proc: subprocess.Popen, log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServeError(f"{name} exited with code {proc.returncode} before answering {url}; see {log}")
        try:
            if httpx.get(url, timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise ServeError(f"{name} did not answer {url} within {timeout_s:.0f} s; see {log}")


def stop_groups(pids: dict[str, int], grace_s: float = 15.0) -> list[str]:
    """Stop each process group, last started first (the worker before the servers it talks to):
    SIGTERM, then SIGKILL after ``grace_s``. Returns the names that were running."""
    stopped = []
    for name, pgid in reversed(list(pids.items())):
        if not _group_alive(pgid):
            continue
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            continue
        stopped.append(name)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and _group_alive(pgid):
            time.sleep(0.2)
        if _group_alive(pgid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
    return stopped


def _group_alive(pgid: int) -> bool:
    """Whether the group has a live (non-zombie) process; reaps the leader when it is our child."""
    try:
        os.waitpid(pgid, os.WNOHANG)
    except ChildProcessError:
        pass
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    proc = Path("/proc")
    if not proc.is_dir():
        return True
    for stat in proc.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def start_stack(folder: Path, prefect_port: int, mlflow_port: int, pool: str, mlflow_store: str,
                artifacts: Path, timeout_s: float = 180.0) -> dict:
    """Start the three servers and create the work pool; returns what ``pids.json`` records."""
    logs = folder / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    api = f"http://127.0.0.1:{prefect_port}/api"
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_API_URL": api,
           "PREFECT_UI_API_URL": api, "PREFECT_SERVER_API_HOST": "127.0.0.1"}
    state: dict = {"pids": {}, "prefect_api": api, "mlflow_uri": f"http://127.0.0.1:{mlflow_port}", "pool": pool}
    procs: dict[str, subprocess.Popen] = {}
    try:
        procs["prefect"] = _spawn("prefect", [_bin("prefect"), "server", "start", "--host", "127.0.0.1",
                                              "--port", str(prefect_port)], logs, env)
        procs["mlflow"] = _spawn("mlflow", [_bin("mlflow"), "server", "--backend-store-uri", mlflow_store,
                                            "--artifacts-destination", str(artifacts), "--host", "127.0.0.1",
                                            "--port", str(mlflow_port), "--workers", "1"], logs, env)
        state["pids"] = {k: p.pid for k, p in procs.items()}
        _write_state(folder, state)
        _wait_http("prefect server", f"{api}/health", procs["prefect"], logs / "prefect.log", timeout_s)
        _create_pool(pool, env, logs / "worker.log")
        procs["worker"] = _spawn("worker", [_bin("prefect"), "worker", "start", "--pool", pool, "--type", "process"],
                                 logs, env)
        state["pids"]["worker"] = procs["worker"].pid
        _write_state(folder, state)
        _wait_http("mlflow server", f"{state['mlflow_uri']}/health", procs["mlflow"], logs / "mlflow.log", timeout_s)
    except BaseException:
        stop_groups({k: p.pid for k, p in procs.items()}, grace_s=5.0)
        (folder / "pids.json").unlink(missing_ok=True)
        raise
    return state


def _create_pool(pool: str, env: dict[str, str], log: Path) -> None:
    argv = [_bin("prefect"), "work-pool", "create", pool, "--type", "process", "--overwrite"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    with open(log, "a") as f:
        f.write(done.stdout + done.stderr)
    if done.returncode != 0:
        raise ServeError(f"creating work pool {pool!r} failed (exit {done.returncode}): {done.stderr.strip()[-400:]}")


def _write_state(folder: Path, state: dict) -> None:
    tmp = folder / ".pids.json.tmp"
    tmp.write_text(json.dumps(state, indent=1))
    tmp.replace(folder / "pids.json")


def _interrupt(*_) -> None:
    raise KeyboardInterrupt


def read_state(folder: Path) -> dict:
    path = folder / "pids.json"
    if not path.exists():
        raise FileNotFoundError(f"{path}: no stack recorded here (start one with `cleaner serve start`)")
    return json.loads(path.read_text())


@app.command()
def start(folder: Path = DirOpt,
          prefect_port: int = typer.Option(4200, help="Prefect server port (127.0.0.1)."),
          mlflow_port: int = typer.Option(5000, help="MLflow server port (127.0.0.1)."),
          pool: str = typer.Option("cleaner-process", help="Work pool (type process) the worker polls."),
          mlflow_store: str = typer.Option("sqlite:///mlflow.db", help="MLflow backend store URI."),
          artifacts: Path = typer.Option(Path("mlartifacts"), help="MLflow artifacts folder."),
          detach: bool = typer.Option(False, help="Return once the stack answers; stop it with `cleaner serve stop`."),
          timeout: float = typer.Option(300.0, help="Seconds each server may take to answer.")) -> None:
    """Start a Prefect server, a process worker and an MLflow server on 127.0.0.1."""
    if (folder / "pids.json").exists() and any(_group_alive(p) for p in read_state(folder)["pids"].values()):
        typer.echo(f"a stack is already running (see {folder / 'pids.json'}); `cleaner serve stop --dir {folder}` first")
        raise typer.Exit(1)
    try:
        state = start_stack(folder, prefect_port, mlflow_port, pool, mlflow_store, artifacts.resolve(), timeout)
    except ServeError as err:
        typer.echo(f"serve failed: {err}")
        raise typer.Exit(1) from None
    typer.echo(f"Prefect UI/API  {state['prefect_api'][:-4]}   (export PREFECT_API_URL={state['prefect_api']})\n"
               f"MLflow UI       {state['mlflow_uri']}\nworker          pool {pool!r}\n"
               f"logs            {folder / 'logs'}   PIDs {folder / 'pids.json'}")
    if detach:
        return
    typer.echo("Ctrl-C stops the stack.")
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _interrupt)
    try:
        while all(_group_alive(p) for p in state["pids"].values()):
            time.sleep(1.0)
        typer.echo(f"a server exited; stopping the rest (logs in {folder / 'logs'})")
    except KeyboardInterrupt:
        pass
    finally:
        stopped = stop_groups(state["pids"])
        (folder / "pids.json").unlink(missing_ok=True)
        typer.echo(f"stopped: {', '.join(stopped) or 'nothing'}")


def _state_or_exit(folder: Path) -> dict:
    """The recorded stack of ``folder``, or exit 1 saying that none is recorded."""
    try:
        return read_state(folder)
    except FileNotFoundError as err:
        typer.echo(str(err))
        raise typer.Exit(1) from None


@app.command()
def stop(folder: Path = DirOpt) -> None:
    """Stop a stack started with ``--detach`` (each process group: SIGTERM, then SIGKILL)."""
    state = _state_or_exit(folder)
    stopped = stop_groups(state["pids"])
    (folder / "pids.json").unlink(missing_ok=True)
    typer.echo(f"stopped: {', '.join(stopped) or 'nothing (already gone)'}")


@app.command()
def status(folder: Path = DirOpt) -> None:
    """Which servers of the recorded stack are alive."""
    state = _state_or_exit(folder)
    for name, pgid in state["pids"].items():
        typer.echo(f"{name:8s} pgid {pgid:<8d} {'running' if _group_alive(pgid) else 'stopped'}")
    typer.echo(f"PREFECT_API_URL={state['prefect_api']}  MLflow {state['mlflow_uri']}")


if __name__ == "__main__":
    app()
