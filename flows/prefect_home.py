"""The project's Prefect home, and its database made once before commands that start a temporary Prefect server.

**One history per project.** ``cleaner`` sets ``PREFECT_HOME`` to ``<project>/.prefect`` when the shell has none
(``use_project_home``, called before Prefect is imported), the folder ``make`` exports too: ``make demo``,
``.venv/bin/cleaner train``, ``cleaner serve start`` (its Prefect server, its worker and the flow runs the worker
starts inherit it) and ``cleaner resume`` all read and write one Prefect database, so a flow run link printed by one
opens on the stack started by another. The project is the folder the command runs in (where ``configs/``, ``runs/``
and ``mlflow.db`` are). An exported ``PREFECT_HOME`` wins (``PREFECT_HOME=~/.prefect`` keeps Prefect's default,
with its profiles).

Without ``PREFECT_API_URL`` every ``cleaner train`` / ``eval`` / ``compare`` starts a temporary Prefect server over
``$PREFECT_HOME/prefect.db``, and the first start of a server migrates that SQLite file. Several commands started
together on a fresh home (three ``cleaner train`` runs at once, a compare's children, a CI job) migrate it
concurrently, and one of them fails in Alembic ("Online migration expected to match one row …"). Here the first
command migrates the database under a file lock while the others wait for it; a marker per Prefect version makes
later commands skip all of this (a few milliseconds). Nothing is done when a Prefect API is configured, or when the
database is not a SQLite file.

**No temporary server outlives its command.** Prefect starts the temporary server as a child process and stops it
at interpreter exit; a command killed with SIGKILL (a crash, the OOM killer, a test) skips that, and the server ran
on with parent PID 1, ~200 MB and a port, for good. ``guard_temporary_server`` has the server started with
``PR_SET_PDEATHSIG``: the kernel sends it SIGTERM when the command's main thread ends, however it ends.

**Which Prefect a command talks to**: the exported ``PREFECT_API_URL``, else the API of the project's running stack
recorded in ``.serve/pids.json`` (with its auth string; ``use_running_stack`` at every ``cleaner`` start,
``project_api`` for another ``--dir``), else the project's history itself through a temporary server.
"""

from __future__ import annotations

import asyncio
import ctypes
import fcntl
import os
import signal
import subprocess
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

PR_SET_PDEATHSIG = 1

PROJECT_HOME = ".prefect"
"""The project's Prefect home, relative to the folder a command runs in (``make`` exports the same)."""


def use_project_home(cwd: Path | None = None) -> Path:
    """Set ``PREFECT_HOME`` to ``<cwd>/.prefect`` unless the environment has one; returns the home in effect.
    Must run before ``prefect`` is imported (its settings are read once)."""
    if not os.environ.get("PREFECT_HOME"):
        os.environ["PREFECT_HOME"] = str((cwd or Path.cwd()).resolve() / PROJECT_HOME)
    return Path(os.environ["PREFECT_HOME"]).expanduser()


def _dies_with(parent: int):
    """A ``preexec_fn``: the child gets SIGTERM when ``parent``'s thread that started it ends (and exits at once if
    the parent is already gone)."""

    def arm() -> None:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return arm


def guard_temporary_server() -> bool:
    """Have Prefect's temporary server, when this process starts one, die with the process (Linux; the server
    must be started from the main thread, which lives as long as the process). Returns whether it is guarded.
    Nothing is started here; nothing changes when a Prefect API is configured."""
    from prefect.settings import PREFECT_API_URL

    if PREFECT_API_URL.value() or not sys.platform.startswith("linux"):
        return False
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer()  # the instance Prefect's clients use when no API is configured
    unguarded = type(server)._run_uvicorn_command

    class Guarded(subprocess.Popen):
        def __init__(self, *args, **kwargs):
            guard = threading.current_thread() is threading.main_thread()
            super().__init__(*args, **kwargs, **({"preexec_fn": _dies_with(os.getpid())} if guard else {}))

    def run_uvicorn() -> subprocess.Popen:
        popen, subprocess.Popen = subprocess.Popen, Guarded
        try:
            return unguarded(server)
        finally:
            subprocess.Popen = popen

    server._run_uvicorn_command = run_uvicorn
    return True


def migrated_marker(home: Path) -> Path:
    import prefect

    return home / f".cleaner-db-migrated-{prefect.__version__}"


def ensure_database() -> Path | None:
    """Migrate the temporary server's SQLite database once per home and Prefect version; returns the marker (None
    when there is nothing to do here: an API is configured, or the database is not SQLite)."""
    from prefect.settings import PREFECT_API_URL, get_current_settings

    if PREFECT_API_URL.value():
        return None
    settings = get_current_settings()
    url = settings.server.database.connection_url
    url = url.get_secret_value() if url is not None else ""
    if not url.startswith("sqlite"):
        return None
    home = Path(settings.home).expanduser()
    marker = migrated_marker(home)
    if marker.exists():
        return marker
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".cleaner-db.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not marker.exists():
            from prefect.server.database import provide_database_interface

            asyncio.run(provide_database_interface().create_db())
            marker.touch()
    return marker


STACK_DIR = Path(".serve")
"""Where ``cleaner serve start`` records the project's stack (``pids.json``: its API, process groups, credentials)."""


def use_running_stack(folder: Path = STACK_DIR) -> str | None:
    """When the shell sets no ``PREFECT_API_URL`` and the project's stack runs (``folder/pids.json`` ready, its
    Prefect process group alive, its port open), point this process at its API (and auth string): runs go to the
    server the stack's UI shows, live, and the links they print open there. Returns the API, or None. Must run
    before ``prefect`` is imported; reads no more than the stack's files and one TCP connect."""
    import json
    import socket
    from urllib.parse import urlsplit

    if os.environ.get("PREFECT_API_URL"):
        return None
    try:
        state = json.loads((folder / "pids.json").read_text())
        pgid, api = int(state["pids"]["prefect"]), str(state["prefect_api"])
        os.killpg(pgid, 0)
        where = urlsplit(api)
        socket.create_connection((where.hostname, where.port), timeout=1.0).close()
        token = json.loads(Path(state["auth_file"]).read_text())["prefect"] if state.get("auth_file") else None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not state.get("ready"):
        return None
    os.environ["PREFECT_API_URL"] = api
    if token:
        os.environ.setdefault("PREFECT_API_AUTH_STRING", token)
    return api


def stack_api(folder: Path = STACK_DIR) -> tuple[str, str | None] | None:
    """The Prefect API (and its auth string) of the stack recorded in ``folder`` while its Prefect server runs."""
    from flows.procs import group_alive
    from flows.serve_auth import prefect_auth_string
    from flows.serve_stack import read_state

    try:
        state = read_state(folder)
    except (FileNotFoundError, ValueError):
        return None
    pgid = state.get("pids", {}).get("prefect")
    if not pgid or not group_alive(pgid):
        return None
    return state["prefect_api"], prefect_auth_string(state)


@contextmanager
def project_api(folder: Path = STACK_DIR):
    """Prefect settings for a command that talks to the project's Prefect, and a line saying where that is: the
    exported ``PREFECT_API_URL``; else the API of the project's running stack (``folder``); else the project's
    history itself (``PREFECT_HOME``, through a temporary server)."""
    from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, get_current_settings, temporary_settings

    if PREFECT_API_URL.value():
        yield f"the Prefect API {PREFECT_API_URL.value()} (PREFECT_API_URL)"
        return
    found = stack_api(folder)
    if found is None:
        yield f"the project's Prefect history {get_current_settings().home} (no stack running in {folder})"
        return
    api, token = found
    with temporary_settings({PREFECT_API_URL: api, **({PREFECT_API_AUTH_STRING: token} if token else {})}):
        yield f"the stack's Prefect API {api} ({folder / 'pids.json'})"
