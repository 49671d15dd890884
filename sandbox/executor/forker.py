"""The forker: a second process that only forks, so that the executor itself never does.

Each fork write-protects every page of the forking process, and each page it writes afterwards
costs a copy-on-write fault: the executor's per-snippet work (protocol, supervision, the answer)
touched ~200 pages a snippet, about half of all the faults a trivial snippet cost.  So the
executor clones, once, a forker that shares its descriptor table (``CLONE_FILES``).  Per
snippet the executor creates the child's pipes, puts the child's ends on ``CHILD_FDS`` and
writes one byte on the control pipe; the forker clones the child with ``CLONE_PARENT`` (the
child is the executor's own: ``waitpid``, pidfd, ``killpg`` and the subreaper work as before;
its memory is a copy of the forker's untouched image, its descriptor table a copy of the shared
one) and answers with its pid.  The forker's loop writes a handful of pages a snippet.

The forker installs a seccomp layer on itself (``guard.protect_pid_program``) that its
children inherit, so no snippet can stop or kill it; should it die anyway, the executor starts
another.  ``os.fork``'s after-fork hooks do not run in a cloned child: the state they would
reset is the forker's, which is single-threaded and holds no lock, and the one that matters for
snippets (``random``'s reseeding) is done by the child itself.  Stdlib only.
"""

from __future__ import annotations

import ctypes
import gc
import os
import platform
import select
import signal

CHILD_FDS = (1000, 1001, 1002, 1003)
"""Where the executor puts a child's stdout, stderr, status and request ends for the forker."""
_SYS_CLONE = {"x86_64": 56, "aarch64": 220}.get(platform.machine())
_CLONE_FILES, _CLONE_PARENT = 0x400, 0x8000
_PR_SET_PDEATHSIG, _PR_SET_NAME = 1, 15
NAME = b"cleaner-forker"
"""The forker's process name (``comm``), for ``ps`` and tests."""
_libc = ctypes.PyDLL(None, use_errno=True)  # PyDLL: the GIL stays held across clone
_libc.syscall.restype = ctypes.c_long


def raw_clone(flags: int) -> int:
    """``clone(flags)`` like ``fork`` (same stack, copy of memory); the child gets 0."""
    pid = _libc.syscall(ctypes.c_long(_SYS_CLONE), ctypes.c_long(flags), ctypes.c_long(0),
                        ctypes.c_long(0), ctypes.c_long(0), ctypes.c_long(0))
    if pid < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"clone: {os.strerror(err)}")
    return pid


class Forker:
    """Clones children for the executor.  ``child_entry()`` runs in each child, never returns;
    ``protect``: the seccomp layer (bytes, built for the forker's pid) or None."""

    def __init__(self, child_entry, protect):
        self.child_entry, self.protect = child_entry, protect
        self.pid: int | None = None
        self.supported = _SYS_CLONE is not None

    def start(self) -> None:
        ctl_r, ctl_w = os.pipe()
        rep_r, rep_w = os.pipe()
        pid = raw_clone(_CLONE_FILES | signal.SIGCHLD)
        if pid == 0:
            self._serve(ctl_r, rep_w)
        self.pid, self._ctl_w, self._rep_r = pid, ctl_w, rep_r
        self._spare = (ctl_r, rep_w)  # the forker's ends, in the shared table: closed on stop()
        self._pidfd = os.pidfd_open(pid)

    def fork(self, timeout: float = 10.0) -> int:
        """A new child's pid (its descriptors are on ``CHILD_FDS``); a dead or stuck forker is
        replaced and asked again."""
        if not self.supported:  # no clone number for this machine: fork here (slower, same result)
            pid = os.fork()
            if pid == 0:
                self.child_entry()
            return pid
        for _ in range(2):
            if self.pid is None:
                self.start()
            try:
                os.write(self._ctl_w, b"F")
                ready, _, _ = select.select([self._rep_r, self._pidfd], [], [], timeout)
                if self._rep_r in ready:
                    return int.from_bytes(os.read(self._rep_r, 4), "little")
            except OSError:
                pass
            self.stop()
        raise OSError("the forker does not answer")

    def stop(self) -> None:
        if self.pid is None:
            return
        try:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        for fd in (self._ctl_w, self._rep_r, self._pidfd, *self._spare):
            os.close(fd)
        self.pid = None

    def _serve(self, ctl_r: int, rep_w: int) -> None:
        """The forker's loop (never returns): a byte in, a clone, the pid out."""
        try:
            os.setsid()
            prctl = ctypes.CDLL(None).prctl
            prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            prctl(_PR_SET_NAME, ctypes.c_char_p(NAME), 0, 0, 0)
            gc.disable()  # its loop makes no cycles; a collection would touch every page
            if self.protect is not None:
                self.protect(os.getpid())
            while os.read(ctl_r, 1) == b"F":
                pid = raw_clone(_CLONE_PARENT | signal.SIGCHLD)
                if pid == 0:
                    gc.enable()
                    self.child_entry()
                os.write(rep_w, pid.to_bytes(4, "little"))
        finally:
            os._exit(0)
