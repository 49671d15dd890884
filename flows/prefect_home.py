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
"""

from __future__ import annotations

import asyncio
import fcntl
import os
from pathlib import Path

PROJECT_HOME = ".prefect"
"""The project's Prefect home, relative to the folder a command runs in (``make`` exports the same)."""


def use_project_home(cwd: Path | None = None) -> Path:
    """Set ``PREFECT_HOME`` to ``<cwd>/.prefect`` unless the environment has one; returns the home in effect.
    Must run before ``prefect`` is imported (its settings are read once)."""
    if not os.environ.get("PREFECT_HOME"):
        os.environ["PREFECT_HOME"] = str((cwd or Path.cwd()).resolve() / PROJECT_HOME)
    return Path(os.environ["PREFECT_HOME"]).expanduser()


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
