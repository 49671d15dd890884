"""What a finished snippet produced: captured streams, the child's status report, and the answer.

``Capture`` keeps the head of a stream (and for stderr the tail) up to a byte cap,
``StatusPipe`` reads the child's status pipe, ``answer`` turns an exit status and the
captures into the binary result frame sent to the host (``protocol``), with ``error_kind``
parsed from the traceback (``error_kind_of``).  Stdlib only (this package runs inside containers).
"""

from __future__ import annotations

import os
import re
import signal

from .child import SETUP_OK
from .protocol import encode_result

_KIND_RE = re.compile(r"^([A-Za-z_][\w.]*)(?::|$)")
_EXC_SUFFIXES = ("Error", "Exception", "Exit", "Interrupt", "Warning", "Iteration")
_OOM_EVENTS = ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control")
_oom_fd: list[int | None] = []  # the open counter file, found on first use ([None]: there is none)


class Capture:
    """Keeps the head of a stream (and for stderr the tail) up to ``cap`` bytes."""

    def __init__(self, cap: int, keep_tail: bool):
        self.cap, self.keep_tail = cap, keep_tail
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        room = self.cap - len(self.head) if not self.keep_tail else self.cap // 2 - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if self.keep_tail and data:
            self.tail += data
            if len(self.tail) > self.cap // 2:
                del self.tail[: len(self.tail) - self.cap // 2]

    @property
    def truncated(self) -> bool:
        return self.total > len(self.head) + len(self.tail)

    def raw(self) -> bytes:
        data = bytes(self.head)
        if self.tail:
            data += (b"\n...(truncated)...\n" if self.truncated else b"") + bytes(self.tail)
        return data


class StatusPipe:
    """What the child reported on its status pipe (fd 3).  With setup code, the first byte is
    the setup verdict (``SETUP_OK``/``SETUP_FAILED``), written before any snippet code runs, so
    the snippet cannot forge it; the last byte after it is the exit code the child reported."""

    def __init__(self, fd: int, expect_setup: bool):
        self.fd = fd
        self.setup: bool | None = None if expect_setup else True
        self.code: int | None = None

    def read(self, watch) -> None:
        """Read what is there; at EOF tell ``watch`` (a ``supervise._Watch``) the pipe closed."""
        try:
            data = os.read(self.fd, 64)
        except OSError:
            return
        if not data:
            watch.close(self.fd)
            return
        if self.setup is None:
            self.setup, data = data[:1] == SETUP_OK, data[1:]
        if data:
            self.code = data[-1]


def oom_kills() -> int:
    """OOM kills in this cgroup so far (v2 ``memory.events`` or v1 ``memory.oom_control``).
    The file is opened once and re-read with ``pread``, parsed as bytes (few objects: see
    ``protocol`` on why that matters)."""
    if not _oom_fd:
        fd = None
        for path in _OOM_EVENTS:
            try:
                fd = os.open(path, os.O_RDONLY)
                break
            except OSError:
                continue
        _oom_fd.append(fd)
    if _oom_fd[0] is None:
        return 0
    try:
        data = os.pread(_oom_fd[0], 4096, 0)
        at = data.find(b"oom_kill ")
        return int(data[at + 9:data.index(b"\n", at)]) if at >= 0 else 0
    except (OSError, ValueError):
        return 0


def error_kind_of(stderr: str) -> str | None:
    """The exception type on the last line of a traceback (``NameError``), dotted paths cut.

    When the last line is no exception (e.g. tracebacks of several processes interleaved),
    the last line that names an ``...Error``/``...Exception``-like type is used instead.
    """
    lines = [ln.strip() for ln in stderr.strip().splitlines() if ln.strip()]
    if not lines:
        return None
    match = _KIND_RE.match(lines[-1])
    if match:
        name = match.group(1).rsplit(".", 1)[-1]
        if "Traceback (most recent call last)" in stderr or name.endswith(_EXC_SUFFIXES):
            return name
    for line in reversed(lines[:-1]):
        match = _KIND_RE.match(line)
        if match and match.group(1).rsplit(".", 1)[-1].endswith(_EXC_SUFFIXES):
            return match.group(1).rsplit(".", 1)[-1]
    return None


def answer(status, limit: str | None, flooded: bool, out: Capture, err: Capture, duration: float,
           oom_before: int, setup_ok: bool) -> bytes:
    """The binary result frame for a child that ended with wait ``status`` (``protocol``);
    ``limit``: the time limit that ended it (``timeout``: CPU, ``wall_timeout``) or None;
    ``oom_before``: the cgroup's OOM kills before the snippet (re-read only for a SIGKILL)."""
    stderr = err.raw()
    exit_code = os.waitstatus_to_exitcode(status)
    if limit is None and exit_code == -signal.SIGXCPU:  # its RLIMIT_CPU, past the measured limit
        limit = "timeout"
    timed_out = limit is not None
    kind = None
    memory = False
    if timed_out:
        kind = limit
    elif flooded:
        kind = "output_limit"
    elif exit_code < 0:
        name = signal.Signals(-exit_code).name if -exit_code in signal.valid_signals() else str(-exit_code)
        memory = -exit_code == signal.SIGKILL and oom_kills() > oom_before
        kind = "memory" if memory else f"signal:{name}"
    elif exit_code != 0:
        text = stderr.decode("utf-8", "replace")
        kind = error_kind_of(text) or f"exit:{exit_code}"
        if kind.endswith("MemoryError") or "Cannot allocate memory" in text[-2000:]:
            kind, memory = "memory", True
    stdout, out_trunc = out.raw(), out.truncated
    if not setup_ok:  # the caller's setup raised or never finished: the snippet did not run
        if b"<setup>" not in stderr:
            stderr = (stderr.rstrip() + f"\nsetup did not finish: {kind or 'no verdict'}".encode()).lstrip()
        kind, stdout, out_trunc = "setup_error", b"", False
    flags = (kind is None, timed_out, memory, out_trunc, err.truncated)
    return encode_result(flags, None if timed_out else exit_code, round(duration, 6), kind, stdout, stderr)
