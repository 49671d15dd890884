"""Processes seen through ``/proc``: whether a pid or a process group is alive (zombies count as gone), the
processes below a pid, and stopping whole process groups politely, then firmly. Used by the ``cleaner serve``
supervisor (``flows.serve_stack``) and the commands that inspect its stack.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path


def group_alive(pgid: int) -> bool:
    """Whether the group has a live (non-zombie) process; reaps the leader when it is our child."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pgid, os.WNOHANG)
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return any(st[1] == pgid and st[2] != "Z" for st in proc_table().values())


def proc_table() -> dict[int, tuple[int, int, str]]:
    """pid → (ppid, pgid, state) of every process, from /proc."""
    table = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        table[int(stat.parent.name)] = (int(fields[1]), int(fields[2]), fields[0])
    return table


def pid_alive(pid: int | None) -> bool:
    """Whether ``pid`` is a live (non-zombie) process: a process the stack waits for or stops counts as gone once it
    is a zombie. (``sandbox.pids.pid_running`` counts zombies on purpose: it guards what a writer left behind.)"""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def descendants(root: int) -> dict[int, int]:
    """pid → pgid of every live process below ``root``."""
    table, found, frontier = proc_table(), {}, [root]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, pgid, state) in table.items():
            if ppid == parent and pid not in found:
                if state != "Z":
                    found[pid] = pgid
                frontier.append(pid)
    return found


STOP_SIGNALS = {"postgres": signal.SIGINT}
"""The first signal of a group that SIGTERM does not stop promptly: PostgreSQL's SIGTERM is its "smart" shutdown,
which waits for every client to disconnect (one ``psql`` left open keeps it up until SIGKILL, and its next start
is a crash recovery); SIGINT is its "fast" shutdown (clients disconnected, a checkpoint, a clean exit), the one
PostgreSQL's docs give service managers."""


def stop_groups(pids: dict[str, int], grace_s: float = 15.0) -> list[str]:
    """Stop each process group, last started first: SIGTERM (``STOP_SIGNALS``' by name), then SIGKILL after
    ``grace_s``. Returns the names that were running."""
    stopped = []
    for name, pgid in reversed(list(pids.items())):
        if not group_alive(pgid):
            continue
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, STOP_SIGNALS.get(name, signal.SIGTERM))
        stopped.append(name)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and group_alive(pgid):
            time.sleep(0.2)
        if group_alive(pgid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
    return stopped
