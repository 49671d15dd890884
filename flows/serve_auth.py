"""Credentials of a team stack (``cleaner serve start --auth``); see docs/team.md.

* Without ``--auth`` the servers listen on loopback only: any other ``--host`` is refused.
* With ``--auth``: ``<stack folder>/credentials.json`` (mode 0600, created once, reused at every start) holds the
  Prefect API auth string (``admin:<random>``; the server checks it, the worker and flows send it as
  ``PREFECT_API_AUTH_STRING``) and the MLflow admin user and password. MLflow runs its ``basic-auth`` app with
  ``<stack folder>/mlflow-auth.ini`` (its user database next to it, default permission READ; the folder is 0700,
  the ini and the user database 0600) and the Flask secret
  key its CSRF protection needs (``MLFLOW_FLASK_SERVER_SECRET_KEY``, also in the file); the admin password
  reaches it through ``MLFLOW_AUTH_ADMIN_PASSWORD`` on its first start only, never through the ini. Further users
  and permissions go through MLflow's auth API (``mlflow.server.get_app_client("basic-auth", ...)``).

``env_for_clients`` gives the variables a flow, a worker or a shell needs to use the stack.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

LOOPBACK = ("127.", "localhost", "::1")
MLFLOW_ADMIN = "admin"


class AuthError(RuntimeError):
    """A stack that would be reachable by others without credentials."""


def is_loopback(host: str) -> bool:
    return host.startswith(LOOPBACK)


def prepare_auth(folder: Path, host: str, auth: bool) -> dict:
    """``{}`` for a loopback stack without auth; else the credentials (created on first use)."""
    if not auth:
        if not is_loopback(host):
            raise AuthError(f"--host {host} would let anyone who reaches this machine run code as the worker's "
                            "user and read or delete experiments; add --auth (see docs/team.md)")
        return {}
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    path = folder / "credentials.json"
    if not path.exists():
        creds = {"prefect": f"admin:{secrets.token_urlsafe(24)}",
                 "mlflow_admin": [MLFLOW_ADMIN, secrets.token_urlsafe(24)], "mlflow_secret": secrets.token_hex(32)}
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(creds, f, indent=1)
    if path.stat().st_mode & 0o077:
        raise AuthError(f"{path} is readable by other users (mode {oct(path.stat().st_mode & 0o777)}); chmod 600 it")
    creds = json.loads(path.read_text())
    ini, users = folder / "mlflow-auth.ini", folder / "mlflow-auth.db"
    _owner_only(ini).write_text("[mlflow]\ndefault_permission = READ\n"
                                f"database_uri = sqlite:///{users.resolve()}\n"
                                f"admin_username = {creds['mlflow_admin'][0]}\n"
                                "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n")
    _owner_only(users)  # MLflow creates its user database with the umask's 0644; SQLite keeps an existing mode
    return {"file": str(path.resolve()), "prefect": creds["prefect"], "mlflow_admin": tuple(creds["mlflow_admin"]),
            "mlflow_secret": creds["mlflow_secret"], "mlflow_config": str(ini.resolve())}


def _owner_only(path: Path) -> Path:
    """Create ``path`` (empty) if missing, readable and writable by its owner only."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
    path.chmod(0o600)
    return path


def prefect_auth_string(state: dict) -> str | None:
    """The Prefect API auth string of a recorded stack (``pids.json``), if it has one."""
    path = state.get("auth_file")
    return json.loads(Path(path).read_text())["prefect"] if path else None


def env_for_clients(creds: dict) -> dict[str, str]:
    """Variables that let a flow, a worker or a shell use an auth-enabled stack as the admin."""
    if not creds:
        return {}
    user, password = creds["mlflow_admin"]
    return {"PREFECT_API_AUTH_STRING": creds["prefect"], "MLFLOW_TRACKING_USERNAME": user,
            "MLFLOW_TRACKING_PASSWORD": password}
