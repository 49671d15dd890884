"""The stack's PostgreSQL stops cleanly with a client still connected (``flows.procs.stop_groups``, the way
``cleaner serve stop`` and ``serve restart postgres`` stop it): its fast shutdown disconnects the client, writes a
checkpoint and exits 0, well inside the grace; SIGTERM alone (its smart shutdown) would wait for the client until
the SIGKILL, and the next start would be a crash recovery."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from flows.procs import group_alive, stop_groups
from flows.serve_db import DatabaseError, Postgres, pg_bin
from tests.test_serve import free_port


def _installed() -> bool:
    try:
        pg_bin("initdb")
    except DatabaseError:
        return False
    return True


pytestmark = pytest.mark.skipif(not _installed(), reason="PostgreSQL is not installed (apt-get install postgresql)")


@pytest.fixture
def folder():
    root = Path(tempfile.mkdtemp(prefix="cleaner-pg-"))  # reachable by the postgres user (pytest's are root's 0700)
    root.chmod(0o755)
    yield root / "postgres"
    shutil.rmtree(root, ignore_errors=True)


def test_postgres_with_a_client_connected_stops_by_itself_before_the_grace_ends(folder):
    import psycopg2

    pg = Postgres(folder, free_port())
    pg.init()
    log = folder.parent / "postgres.log"
    with open(log, "wb") as out:
        server = subprocess.Popen(pg.argv(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                  **pg.popen_kwargs())
    try:
        pg.wait_ready(lambda: server.poll() is None, log, 120)
        client = psycopg2.connect(pg.base_url() + "/prefect")
        t0 = time.monotonic()
        assert stop_groups({"postgres": server.pid}, grace_s=60) == ["postgres"]
        took = time.monotonic() - t0
        assert server.wait(timeout=10) == 0, log.read_text()[-2000:]  # -9: it was killed
        assert took < 60 and not group_alive(server.pid)
        assert not (pg.data / "postmaster.pid").exists(), "postgres left its lock file: it did not shut down"
        text = log.read_text()
        assert "fast shutdown request" in text and "database system is shut down" in text, text[-2000:]
        client.close()
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
