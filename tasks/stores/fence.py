"""One writer per run folder: the newest attempt of a run fences the ones it replaces.

A run can have two live attempts: the compare reschedules a dispatched run whose heartbeats stopped for
``compare.lost_after_s`` (``flows.dispatch``) while its process may still be alive (a network stall, a paused
machine), and ``cleaner resume`` can be started while the run still trains. Both attempts would write the same
step files, checkpoints and row-log units. So an attempt **claims** its run when it starts: it writes its token
into ``runs/<run_id>/attempt`` (``claim``; the replacement overwrites it), and every write into the run folder or
into the run's row-log units goes through ``guarded`` (or ``publish``, which writes a file under a name of its own
and renames it into place under the guard): it reads the attempt file and raises ``FencedError`` when another
attempt's token is there, so the replaced attempt stops at its next write without making it.

What is guaranteed, and why there is no check-then-write window: the attempt file is locked (``flock``) — shared
by a guarded write for the whole of its commit (the check and the rename, the marker, the unit's version), exclusive
by ``claim`` while it swaps the token. So once ``claim`` returned, no write of the replaced attempt can commit: one
that started before waits the claim out (the claim waits for it, at most ``CLAIM_WAIT_S``, then fails clearly), one
that starts after sees the new token. Bulk data (a checkpoint's weights, a Parquet file, a logged model's
upload) is written before the guard under names no other attempt uses (pid and a random tail), so a replaced
attempt's half-written files never mix with the replacement's; a guard covers the commit: a rename, or a row-log
unit's whole version (its Parquet files and marker written and flushed, ``tasks.stores.db``), or an MLflow call
(metrics, traces, registry, the run's end), so a claim waits for it — milliseconds to seconds. The locks are
advisory: only writers that go through this module are fenced (every writer of the train flow does; the list is in
docs/rerun.md, "What a replaced attempt cannot change"). On a network filesystem ``flock`` is
mapped to the server's byte-range locks (NFSv4, Linux ≥ 2.6.12); a filesystem without working locks still gets the
check, with a window of one rename.

A writer that never claimed the folder (a test calling a stage directly, a benchmark) is not checked.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from tasks.stores.locks import locked

ATTEMPT = "attempt"
"""The file in a run folder that names the attempt allowed to write it."""

CLAIM_WAIT_S = 60.0
"""How long ``claim`` waits for a write of the replaced attempt that holds the lock (a commit takes milliseconds;
a paused process holding it keeps it until it runs on)."""


class FencedError(RuntimeError):
    """This attempt of a run was replaced by a newer one: it must stop without writing."""

    def __init__(self, run_id: str, own: str, newer: dict | None):
        self.run_id, self.own, self.newer = run_id, own, newer or {}
        by = (f"attempt {self.newer.get('attempt')} (pid {self.newer.get('pid')} on {self.newer.get('host')})"
              if newer else "no attempt (the attempt file is gone: the run folder was removed or replaced)")
        super().__init__(f"run {run_id}: fenced — {by} replaced this attempt {own}; this attempt stops without "
                         "writing")

    def __reduce__(self):  # pickled as a failed task's result by Prefect: rebuilt from its parts, not its message
        return FencedError, (self.run_id, self.own, self.newer or None)

    @property
    def newer_flow_run(self) -> str | None:
        """The Prefect flow run of the attempt that replaced this one (the same flow run when it was rescheduled)."""
        return self.newer.get("flow_run_id")


@dataclass(frozen=True)
class Claim:
    run_id: str
    run_dir: str
    token: str


_CLAIMS: dict[str, Claim] = {}
"""Absolute run folder → this process's claim on it."""
_REGISTRY = threading.Lock()


def new_token(flow_run_id: str | None, run_count: int | None) -> str:
    """An attempt's token: its Prefect flow run and run count (readable), and a random tail (unique even for two
    attempts with the same ones)."""
    return f"{flow_run_id or 'local'}#{run_count if run_count is not None else 0}/{uuid.uuid4().hex[:8]}"


def _locked(path: Path, exclusive: bool, wait_s: float | None = None) -> AbstractContextManager[int]:
    """The attempt file's lock (``tasks.stores.locks``), yielding its descriptor."""
    return locked(path, exclusive, wait_s, holder="a write of the attempt being replaced",
                  advice="(a paused process holds it); start this attempt again once it ran on or ended")


def _read(fd: int) -> dict | None:
    text = os.pread(fd, 4096, 0).decode()
    return json.loads(text) if text.strip() else None


def claim(run_dir: str | Path, run_id: str, token: str, flow_run_id: str | None = None,
          wait_s: float = CLAIM_WAIT_S) -> dict | None:
    """Make this process's attempt ``token`` the only one allowed to write ``run_dir``; returns the attempt it
    replaced (None for the first). Written in place under the exclusive lock, flushed to disk."""
    path = Path(run_dir) / ATTEMPT
    path.parent.mkdir(parents=True, exist_ok=True)
    with _locked(path, True, wait_s) as fd:
        before = _read(fd)
        record = {"attempt": token, "flow_run_id": flow_run_id or None, "pid": os.getpid(),
                  "host": socket.gethostname(), "claimed_at": time.time()}
        data = json.dumps(record).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
        os.fsync(fd)
    with _REGISTRY:  # one claim per run id in a process: its latest (a run id trained again elsewhere before)
        for folder in [f for f, c in _CLAIMS.items() if c.run_id == run_id]:
            del _CLAIMS[folder]
        _CLAIMS[os.path.abspath(run_dir)] = Claim(run_id, os.path.abspath(run_dir), token)
    return before


def release(run_dir: str | Path) -> None:
    """Forget this process's claim on ``run_dir`` (its writes there are no longer checked)."""
    with _REGISTRY:
        _CLAIMS.pop(os.path.abspath(run_dir), None)


def claims() -> list[Claim]:
    """This process's claims (a lane worker is handed them with every call: ``adopt``)."""
    with _REGISTRY:
        return list(_CLAIMS.values())


def adopt(found: list[Claim]) -> None:
    """Make ``found`` — another process's claims (``claims``) — this process's, replacing its own: a lane worker
    writes the run folders its flow process may write, fenced exactly as the flow process is."""
    with _REGISTRY:
        _CLAIMS.clear()
        _CLAIMS.update({c.run_dir: c for c in found})


def claim_of(path: str | Path) -> Claim | None:
    """This process's claim on the run folder holding ``path`` (None when it claimed none)."""
    target = os.path.abspath(path)
    with _REGISTRY:
        for folder, found in _CLAIMS.items():
            if target == folder or target.startswith(folder + os.sep):
                return found
    return None


def claim_of_run(run_id: str) -> Claim | None:
    """This process's claim on run ``run_id`` (its row-log units are keyed by run id, not by folder)."""
    with _REGISTRY:
        return next((c for c in _CLAIMS.values() if c.run_id == run_id), None)


@contextmanager
def _holding(found: Claim | None) -> Iterator[None]:
    if found is None:
        yield
        return
    with ExitStack() as held:
        try:
            fd = held.enter_context(_locked(Path(found.run_dir) / ATTEMPT, False))
        except FileNotFoundError:
            raise FencedError(found.run_id, found.token, None) from None
        current = _read(fd)
        if current is None or current.get("attempt") != found.token:
            raise FencedError(found.run_id, found.token, current)
        yield


@contextmanager
def guarded(path: str | Path) -> Iterator[None]:
    """Commit a write to ``path`` inside the block: raises ``FencedError`` first when a newer attempt claimed the run
    folder holding it; holds the attempt file's shared lock for the block (so no claim lands in between)."""
    with _holding(claim_of(path)):
        yield


@contextmanager
def guarded_run(run_id: str) -> Iterator[None]:
    """``guarded`` for a write keyed by run id (a row-log unit of the run)."""
    with _holding(claim_of_run(run_id)):
        yield


def check(path: str | Path) -> None:
    """Raise ``FencedError`` when a newer attempt claimed the run folder holding ``path`` (before costly work)."""
    with guarded(path):
        pass


def superseded(run_dir: str | Path) -> FencedError | None:
    """The ``FencedError`` this process's attempt on ``run_dir`` would get now, or None (not replaced, or none)."""
    try:
        check(run_dir)
    except FencedError as err:
        return err
    return None


@contextmanager
def held(run_dir: str | Path) -> Iterator[dict | None]:
    """The attempt that holds ``run_dir`` (its record; None when none claimed it), kept holding it for the block:
    the attempt file's shared lock is held, so no claim lands before the block ends (a writer that never claimed
    the folder, such as a worker running a killed attempt's hooks, commits its writes here)."""
    with ExitStack() as stack:
        try:
            fd = stack.enter_context(_locked(Path(run_dir) / ATTEMPT, False))
        except FileNotFoundError:
            fd = None
        yield None if fd is None else _read(fd)


def holder(run_dir: str | Path) -> dict | None:
    """The attempt that holds ``run_dir`` now (its record), or None when none claimed it."""
    with held(run_dir) as now:
        return now


def publish(path: str | Path, write: Callable[[Path], object]) -> Path:
    """Write ``path`` whole: ``write`` fills a file of this process's own beside it, which is renamed into place
    under ``guarded`` (removed instead when the attempt was fenced)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")
    try:
        write(tmp)
        with guarded(path):
            tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def publish_text(path: str | Path, text: str) -> Path:
    return publish(path, lambda tmp: tmp.write_text(text))
