"""The Prefect database of a ``PREFECT_HOME``, made once before commands that start a temporary Prefect server.

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
from pathlib import Path


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
