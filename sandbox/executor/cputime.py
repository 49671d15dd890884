"""The CPU time a snippet has used, and when to look again: the executor's time limit.

A snippet's limit is CPU seconds (user + system), so its verdict does not depend on how loaded
the machine is.  ``used`` sums ``utime + stime + cutime + cstime`` (``/proc/<pid>/stat``:
every thread, and the children it reaped) of the snippet and of every process below the executor
but the forker: the executor is a child subreaper (or PID 1), so children the snippet left or
orphaned (``setsid``, double fork) are counted as long as they live.  Not counted: a child forked
by a thread other than a process's main thread (not in its ``children`` list), and children that
exited and were reaped by the executor (their time is gone with them); each of those is still
held by its own ``RLIMIT_CPU`` (``child._limits``) and the wall-clock backstop.

Looking costs a few ``/proc`` reads, so the clock is read only when the snippet could have
reached its limit: at first after ``limit / cpus`` seconds of wall time (``cpus``: the CPUs this
process may run on), then after the remaining budget over ``cpus`` (at least ``MIN_POLL_S``, at
most ``MAX_POLL_S``).  A snippet that ends is read once more if it could have passed the limit
meanwhile (``over_at_end``), so the verdict is a function of the CPU time used, not of when the
clock was read.  That function is not exact: ``utime``/``stime`` come in clock ticks (10 ms), and
the same work's CPU time varies with cache and frequency contention (about +-12 % measured on a
shared 2-core machine), so a snippet that needs about its limit may fall either side.
Stdlib only (this package runs inside containers).
"""

from __future__ import annotations

import os

MIN_POLL_S = 0.02
"""Shortest wall-clock interval between two reads of a snippet's CPU time."""
MAX_POLL_S = 0.5
"""Longest wall-clock interval between two reads of a snippet's CPU time."""
_TICK = float(os.sysconf("SC_CLK_TCK"))
try:
    _CPUS = max(1, len(os.sched_getaffinity(0)))
except (AttributeError, OSError):
    _CPUS = max(1, os.cpu_count() or 1)


class CpuClock:
    """The CPU time of the snippet (everything below this executor but ``keep``, the forker)
    against its ``limit_s``; ``start``: the wall-clock (monotonic) time it started."""

    def __init__(self, keep: int | None, limit_s: float, start: float):
        self.keep, self.limit_s = keep, limit_s
        self.reach_at = start + limit_s / _CPUS - MIN_POLL_S  # slack for its CPU time before the request
        self.next_at = self.reach_at + MIN_POLL_S

    def over(self, now: float) -> bool:
        """Read the clock: whether the limit is used up; else schedule the next read."""
        left = self.limit_s - used(self.keep)
        if left <= 0:
            return True
        self.reach_at = now + left / _CPUS
        self.next_at = now + min(MAX_POLL_S, max(MIN_POLL_S, left / _CPUS))
        return False

    def over_at_end(self, now: float) -> bool:
        """Whether a snippet that just ended (not yet reaped) had used up its limit; read only
        when it could have since the last read."""
        return now >= self.reach_at and used(self.keep) >= self.limit_s


def used(keep: int | None) -> float:
    """CPU seconds used by every process below this one but ``keep`` (and its descendants)."""
    total, seen = 0, set()
    todo = [kid for kid in _children(os.getpid()) if kid != keep]
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        total += _ticks(pid)
        todo.extend(_children(pid))
    return total / _TICK


def _ticks(pid: int) -> int:
    """utime + stime + cutime + cstime of ``pid`` (0 when it is gone)."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
        try:
            data = os.read(fd, 1024)
        finally:
            os.close(fd)
        fields = data[data.rindex(b")") + 2:].split()
        return int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])
    except (OSError, ValueError, IndexError):
        return 0


def _children(pid: int) -> list[int]:
    try:
        fd = os.open(f"/proc/{pid}/task/{pid}/children", os.O_RDONLY)
        try:
            return [int(p) for p in os.read(fd, 65536).split()]
        finally:
            os.close(fd)
    except (OSError, ValueError):
        return []
