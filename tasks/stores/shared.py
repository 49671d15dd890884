"""The storage contract of a dispatched compare (docs/team.md): every worker sees the dispatcher's files.

A run dispatched to a Prefect worker on another machine must read and write the same files as the compare that
dispatched it: the run folders (``output_dir``), the data files, the DuckDB file's row log and the MLflow store.
Nothing tells a forgotten ``--set`` apart from a shared path, so the contract is checked twice:

* ``local_storage`` (by the compare, before any run starts): a relative path means "wherever the worker's process
  runs", a ``sqlite:`` / ``file:`` / plain-path MLflow URI is a file on one machine — each is a problem unless the
  compare is told its storage is shared (``compare.local_storage``, for workers on the dispatcher's own machine);
* ``write_token`` / ``verify_token`` (the compare writes a token file into the shared run folder and beside the
  DuckDB file; each dispatched run reads both before it trains): a worker that does not see the dispatcher's store
  stops with an error naming the path and both hosts, whatever the paths look like (an absolute path on a local
  disk, a mount missing on one machine).

Run the check yourself: ``python -c "from tasks.stores.shared import local_storage; print(local_storage(...))"``.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
from pathlib import Path

from tasks.stores import rowlog

TOKEN_FILE = "dispatch-token.json"
"""Name of the token file in the compare's run folder and in the DuckDB file's row-log folder."""

LOCAL_URI = ("sqlite:", "file:")
"""MLflow tracking URIs that name a file on one machine (a plain path is one too)."""


class StorageError(RuntimeError):
    """Storage a dispatched run cannot share with its compare: a relative or machine-local path, or a worker that
    does not see the dispatcher's store."""


def local_storage(paths: dict[str, str | None], mlflow_uri: str) -> list[str]:
    """One line per field of ``paths`` (config field → path; None skipped) that is relative, and one for an MLflow
    URI that is a file on this machine."""
    problems = [f"{field}: {path!r} is a relative path (each worker would resolve it in its own folder)"
                for field, path in paths.items() if path is not None and not Path(path).is_absolute()]
    if mlflow_uri.startswith(LOCAL_URI) or "://" not in mlflow_uri:
        problems.append(f"tracking.mlflow_uri: {mlflow_uri!r} is a file on this machine (use a tracking server "
                        "every worker reaches, e.g. the stack's http://host:5000)")
    return problems


def token_paths(run_folder: str | Path, duckdb_path: str | Path) -> list[Path]:
    """Where a compare's token files go: its run folder (under ``output_dir``) and the DuckDB file's row log."""
    return [Path(run_folder) / TOKEN_FILE, rowlog.rows_dir(duckdb_path) / f"{Path(run_folder).name}-{TOKEN_FILE}"]


def write_token(paths: list[Path], files: dict[str, str | None]) -> dict[str, str]:
    """Write (or keep: a rerun of the same compare reuses it) one token into every path of ``paths``, with this
    host's name and the size of every existing file of ``files`` (config field → path); returns path → token, the
    dispatched runs' ``store_token`` parameter. The same token on a rerun keeps the runs' idempotency keys."""
    old = _read(paths[0])
    body = old or {"token": secrets.token_hex(16), "host": socket.gethostname(),
                   "files": {f: {"path": str(Path(p).resolve()), "size": Path(p).stat().st_size}
                             for f, p in files.items() if p is not None and Path(p).is_file()}}
    for path in paths:
        if _read(path) != body:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}")
            tmp.write_text(json.dumps(body, indent=1))
            tmp.replace(path)
    return {str(p): body["token"] for p in paths}


def verify_token(run_id: str, expected: dict[str, str]) -> None:
    """Raise ``StorageError`` unless this process sees every token file of ``expected`` (path → token) with its token
    and every data file the dispatcher recorded, at the same path and size."""
    host = socket.gethostname()
    body = None
    for path, token in expected.items():
        found = _read(Path(path))
        if found is None or found.get("token") != token:
            what = "is missing" if found is None else f"holds another token (written by {found.get('host')})"
            raise StorageError(f"dispatched run {run_id} on host {host}: {path} {what}: this worker does not see "
                               "the dispatcher's store; output_dir and tracking.duckdb_path must be on a folder every "
                               "worker mounts at the same path (docs/team.md)")
        body = found
    for field, want in (body or {}).get("files", {}).items():
        path = Path(want["path"])
        size = path.stat().st_size if path.is_file() else None
        if size != want["size"]:
            seen = "is missing" if size is None else f"has {size} bytes, not {want['size']}"
            raise StorageError(f"dispatched run {run_id} on host {host}: {field} {path} {seen} (the dispatcher "
                               f"{body['host']} saw it): data files must be on a folder every worker shares")


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
