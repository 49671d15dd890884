"""The parent side of one snippet: read its output, enforce its limits, reap what it left.

``supervise`` reads stdout/stderr concurrently (capped, never blocking on huge output), kills
the snippet's process group when it has used its CPU time (``cputime``: ``timeout``), at the
wall-clock backstop (``wall_timeout``: a snippet that blocks, e.g. sleeps) or past 16x the
output cap, and returns as soon as the child has reported its exit code and closed its streams
(without waiting for the exit teardown); a snippet that ended past its CPU limit is a
``timeout`` too, however it ended.  ``sweep`` kills and reaps every remaining descendant: the executor is a child
subreaper (or PID 1), so escaped ``setsid``/double-fork processes are re-parented to it.
Stdlib only (this package runs inside containers).
"""

from __future__ import annotations

import os
import select
import signal
import time

from .cputime import CpuClock
from .outcome import Capture, StatusPipe

DRAIN_S = 0.5


def supervise(pid: int, limits: tuple[float, float], cap: int, setup: bool, fds: tuple[int, int, int],
              start: float, keep: int | None = None):
    """Watch child ``pid`` until it ends, runs out of time or floods (past 16x the output
    ``cap``); returns ``(wait status, limit, flooded, StatusPipe, stdout Capture, stderr
    Capture)``, ``limit`` the one that ended it (``"timeout"``: CPU, ``"wall_timeout"``) or None.
    ``limits``: CPU seconds and the wall-clock backstop.  ``setup``: the request has setup code.
    ``fds`` (stdout, stderr, status read ends) are non-blocking.  ``keep``: a child of ours
    that is not the snippet's (the forker)."""
    out_r, err_r, st_r = fds
    hard_cap = max(16 * cap, 1 << 20)
    caps = {out_r: Capture(cap, keep_tail=False), err_r: Capture(cap, keep_tail=True)}
    clock = CpuClock(keep, limits[0], start)
    deadline = start + limits[1]
    watch = _Watch(fds)
    pidfd = _pidfd(pid)
    if pidfd is not None:
        watch.poller.register(pidfd, select.POLLIN)
    report = StatusPipe(st_r, expect_setup=setup)
    status, limit, flooded = None, None, False
    try:
        while status is None:
            now = time.monotonic()
            limit = _limit_reached(clock, deadline, now)
            if limit:
                break
            wait = min(deadline, clock.next_at) - now
            for fd, _ in watch.poller.poll((wait if pidfd is not None else min(wait, 0.01)) * 1000):
                if fd in caps:
                    _read_into(fd, caps[fd], watch)
                elif fd == st_r:
                    report.read(watch)
            if caps[out_r].total + caps[err_r].total > hard_cap:
                flooded = True
                break
            if report.code is not None and out_r not in watch.open and err_r not in watch.open:
                limit = "timeout" if clock.over_at_end(time.monotonic()) else None
                return report.code << 8, limit, False, report, caps[out_r], caps[err_r]
            status = _poll_exit(pid)
        if status is not None and clock.over_at_end(time.monotonic()):
            limit = "timeout"  # it ended (SIGXCPU, or on its own) past its CPU limit
        killpg(pid)
        if status is None:
            status = os.waitpid(pid, 0)[1]
        _drain(watch, caps, keep)
        report.read(watch)
    finally:
        if pidfd is not None:
            os.close(pidfd)
    return status, limit, flooded, report, caps[out_r], caps[err_r]


def _limit_reached(clock: CpuClock, deadline: float, now: float) -> str | None:
    if now >= clock.next_at and clock.over(now):
        return "timeout"
    return "wall_timeout" if now >= deadline else None


class _Watch:
    """A ``poll`` set of the child's pipes and which of them are still open (no epoll instance
    per snippet: ``poll`` keeps its set in user space)."""

    def __init__(self, fds):
        self.poller = select.poll()
        self.open = set(fds)
        for fd in fds:
            self.poller.register(fd, select.POLLIN)

    def close(self, fd: int) -> None:
        if fd in self.open:
            self.open.discard(fd)
            self.poller.unregister(fd)


def _drain(watch: _Watch, caps, keep: int | None = None) -> None:
    """Read what is left; escaped writers are swept so EOF normally comes at once."""
    sweep(keep)
    end = time.monotonic() + DRAIN_S
    while any(fd in watch.open for fd in caps) and time.monotonic() < end:
        for fd, _ in watch.poller.poll(max(0.0, end - time.monotonic()) * 1000):
            if fd in caps:
                _read_into(fd, caps[fd], watch)


def sweep(keep: int | None = None) -> None:
    """Kill and reap every remaining child but ``keep`` (the forker); orphans are re-parented
    to this subreaper."""
    for _ in range(100):
        kids = [kid for kid in _children() if kid != keep]
        if not kids:
            break
        for kid in kids:
            try:
                os.kill(kid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for kid in kids:
            try:
                os.waitpid(kid, 0)
            except ChildProcessError:
                pass


def killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _read_into(fd: int, cap: Capture, watch: _Watch) -> None:
    try:
        data = os.read(fd, 1 << 16)
    except BlockingIOError:
        return
    if data:
        cap.add(data)
    else:
        watch.close(fd)


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _poll_exit(pid: int) -> int | None:
    """Exit status of ``pid`` if it has ended, leaving it unreaped (``waitid`` + WNOWAIT)."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return 0
    if info is None:
        return None
    if info.si_code == os.CLD_EXITED:
        return (info.si_status & 0xFF) << 8
    return info.si_status & 0x7F


def _children() -> list[int]:
    me = os.getpid()
    try:
        fd = os.open(f"/proc/{me}/task/{me}/children", os.O_RDONLY)
        try:
            return [int(p) for p in os.read(fd, 65536).split()]
        finally:
            os.close(fd)
    except OSError:
        pass
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    if int(fh.read().rsplit(")", 1)[1].split()[1]) == me:
                        kids.append(int(entry))
            except (OSError, ValueError, IndexError):
                continue
    return kids
