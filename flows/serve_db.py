"""The team stack's PostgreSQL: Prefect's database and MLflow's backend store (``cleaner serve start --database postgres``).

Prefect documents SQLite for one user and PostgreSQL for a server many workers talk to; MLflow's backend store is
the same. With ``--database postgres`` the stack

1. initialises a cluster in ``<stack folder>/postgres/data`` the first time (``initdb``, one role ``cleaner`` with a
   random password kept in ``postgres/password``, mode 0600; as the ``postgres`` user when the stack runs as root,
   since PostgreSQL refuses to run as root),
2. runs ``postgres`` on 127.0.0.1 as a server of the stack like the others (its own process group, restarted with
   back-off when it exits, stopped by PID — last, after the servers that use it),
3. creates the databases ``prefect`` and ``mlflow`` when missing, and points Prefect
   (``PREFECT_SERVER_DATABASE_CONNECTION_URL``, asyncpg) and MLflow (``--backend-store-uri``, psycopg2) at them.

Only the stack's own servers connect to it, so it listens on loopback whatever ``--host`` says; workers and users
reach Prefect and MLflow as before. ``--database-url postgresql://user:password@host:port`` uses a server you run
instead: nothing is started, the two databases are created there when missing. SQLite stays the default.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlsplit

ROLE = "cleaner"
DATABASES = ("prefect", "mlflow")
PG_BIN = Path("/usr/lib/postgresql")
"""Where Debian's ``postgresql`` package puts each major version's server programs (``<version>/bin``)."""


class DatabaseError(RuntimeError):
    """PostgreSQL could not be found, initialised, reached or given its databases."""


def pg_bin(name: str) -> str:
    """A PostgreSQL program (``initdb``, ``postgres``) from Debian's newest installed version, else from PATH."""
    found = sorted(PG_BIN.glob(f"*/bin/{name}"), key=lambda p: int(p.parts[-3]) if p.parts[-3].isdigit() else 0)
    if found:
        return str(found[-1])
    on_path = shutil.which(name)
    if on_path is None:
        raise DatabaseError(f"{name} not found (install Debian's postgresql: apt-get install postgresql)")
    return on_path


def _run_as() -> dict:
    """``subprocess`` arguments that run a PostgreSQL program as the ``postgres`` user when we are root."""
    if os.geteuid() != 0:
        return {}
    try:
        user = pwd.getpwnam("postgres")
    except KeyError:
        raise DatabaseError("running as root, and there is no postgres user to run PostgreSQL as "
                            "(Debian's postgresql package creates it)") from None
    return {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}


def _check_reachable(folder: Path, uid: int, gid: int) -> None:
    """Raise ``DatabaseError`` naming the first folder above ``folder`` that user ``uid`` cannot enter."""
    for parent in reversed(folder.resolve().parents):
        st = parent.stat()
        bit = 0o100 if st.st_uid == uid else 0o010 if st.st_gid == gid else 0o001
        if not st.st_mode & bit:
            raise DatabaseError(f"the postgres user cannot reach {folder}: {parent} is mode {st.st_mode & 0o777:o} "
                                f"(owner uid {st.st_uid}); give the stack a folder it can reach (--dir), or "
                                f"chmod o+x {parent}")


@dataclass
class Postgres:
    """A PostgreSQL server of the stack (``folder`` = ``<stack folder>/postgres``) or, with ``url``, one of yours."""

    folder: Path
    port: int = 5432
    url: str | None = None

    @property
    def data(self) -> Path:
        return self.folder / "data"

    @property
    def managed(self) -> bool:
        """Whether the stack starts this server (no ``--database-url``)."""
        return self.url is None

    def base_url(self) -> str:
        """``postgresql://user:password@host:port`` of the server (no database)."""
        if self.url is not None:
            return self.url.rstrip("/")
        password = quote((self.folder / "password").read_text().strip(), safe="")
        return f"postgresql://{ROLE}:{password}@127.0.0.1:{self.port}"

    def database_url(self, database: str, driver: str) -> str:
        """The URL of ``database`` for a SQLAlchemy ``driver`` (``asyncpg`` for Prefect, ``psycopg2`` for MLflow)."""
        parts = urlsplit(self.base_url())
        return f"postgresql+{driver}://{parts.netloc}/{database}"

    def init(self) -> None:
        """Make the cluster the first time (``initdb`` with a random password); later starts reuse it."""
        if not self.managed or (self.data / "PG_VERSION").exists():
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        secret = self.folder / "password"
        if not secret.exists():
            secret.touch(mode=0o600)
            secret.write_text(secrets.token_urlsafe(24))
        pwfile = self.folder / ".pwfile"
        shutil.copyfile(secret, pwfile)
        run_as = _run_as()
        if run_as:
            _check_reachable(self.folder, run_as["user"], run_as["group"])
            for path in (self.folder, pwfile):
                os.chown(path, run_as["user"], run_as["group"])
        argv = [pg_bin("initdb"), "-D", str(self.data), "-U", ROLE, f"--pwfile={pwfile}", "--auth=scram-sha-256",
                "-E", "UTF8", "--locale=C.UTF-8"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False, **run_as)
        pwfile.unlink(missing_ok=True)
        if done.returncode != 0:
            raise DatabaseError(f"initdb {self.data} failed (exit {done.returncode}): {done.stderr.strip()[-600:]}")

    def argv(self) -> list[str]:
        """The server's command line: loopback only, its socket in the cluster's folder, a small footprint."""
        return [pg_bin("postgres"), "-D", str(self.data), "-p", str(self.port), "-h", "127.0.0.1",
                "-k", str(self.folder), "-c", "max_connections=100", "-c", "shared_buffers=64MB"]

    def popen_kwargs(self) -> dict:
        return _run_as()

    def wait_ready(self, alive, log: Path, timeout_s: float) -> None:
        """Until the server accepts a login (``alive()`` false: it died first), then create the databases."""
        import psycopg2

        deadline = time.monotonic() + timeout_s
        while True:
            if not alive():
                raise DatabaseError(f"postgres exited before accepting connections; see {log}")
            try:
                con = psycopg2.connect(self.base_url() + "/postgres", connect_timeout=2)
                break
            except psycopg2.OperationalError as err:
                if time.monotonic() >= deadline:
                    raise DatabaseError(f"postgres at {urlsplit(self.base_url()).hostname}:"
                                        f"{urlsplit(self.base_url()).port} did not accept a login within "
                                        f"{timeout_s:.0f} s ({str(err).strip()[:200]}); see {log}") from None
                time.sleep(0.3)
        try:
            con.autocommit = True
            with con.cursor() as cur:
                cur.execute("SELECT datname FROM pg_database")
                have = {row[0] for row in cur.fetchall()}
                for name in DATABASES:
                    if name not in have:
                        cur.execute(f'CREATE DATABASE "{name}"')
        finally:
            con.close()
