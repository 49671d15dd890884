"""Advisory file locks (``flock``) of the stores, in one helper: the attempt fence's attempt file
(``tasks.stores.fence``), the lock beside a sqlite registry under which ``@best`` is read and moved
(``tasks.stores.registry``) and the one under which a new sqlite MLflow store is created (``tasks.stores.tracking``).

A lock is held on an open descriptor of the file for the block and dropped when the block ends (the descriptor is
closed), also when the process dies. Only processes that take the same lock are held off: it guards nothing against
a writer that does not ask for it.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

POLL_S = 0.05
"""How often a lock with a deadline is tried again while another process holds it."""


@contextmanager
def locked(path: str | Path, exclusive: bool = True, wait_s: float | None = None,
           holder: str = "another process", advice: str = "") -> Iterator[int]:
    """Hold ``flock`` on ``path`` for the block; yields the descriptor (opened read-write and created when missing
    for an exclusive lock, read-only for a shared one: ``FileNotFoundError`` when the file is missing).

    ``wait_s``: give up after that many seconds with a ``TimeoutError`` naming the path, ``holder`` (who is
    waited for) and ``advice`` (what to do); None waits as long as it takes."""
    mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
    fd = os.open(path, (os.O_RDWR | os.O_CREAT) if exclusive else os.O_RDONLY, 0o644)
    try:
        if not _acquired(fd, mode, wait_s):
            raise TimeoutError(f"{path}: still locked by {holder} after {wait_s:g} s" + (f" {advice}" if advice else ""))
        yield fd
    finally:
        os.close(fd)  # closing drops the lock


def _acquired(fd: int, mode: int, wait_s: float | None) -> bool:
    """Whether the lock was taken (False: still held by another process when ``wait_s`` ran out)."""
    if wait_s is None:
        fcntl.flock(fd, mode)
        return True
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(POLL_S)
