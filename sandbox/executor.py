"""Fork-server executor: runs Python snippets in freshly forked, limited children.

One long-lived process imports the modules snippets commonly need (``--preimport``), then
serves requests.  It keeps one child forked ahead of time, waiting in a fresh empty work dir
for its request, so a snippet costs neither an interpreter start nor the fork itself.  On a
request the child starts a new session, drops to an unprivileged uid when asked (``--uid``),
applies rlimits (address space, processes/threads, file size, CPU), with stdin on /dev/null,
and executes the code like ``python -c`` would (filename ``<string>``).  A request may carry
``setup`` code (the caller's, trusted): it runs first in the same globals as ``<setup>``, its
stdout discarded; if it raises, the snippet does not run and the answer is ``setup_error``.  The parent reads
stdout/stderr concurrently (capped, never blocking on huge output), kills the whole process
group on timeout, answers with an ``ExecutionResult`` dict as soon as the child reports its
exit code, then sweeps every escaped descendant (it is a child subreaper) and forks the next.

The file is stdlib-only and imports nothing from the project, because the Docker backend
mounts it into containers; that is also why it is one file, longer than our usual modules.

Protocol: frames of a 4-byte big-endian length followed by UTF-8 JSON.  The executor first
sends ``{"ready": true, ...}``; each request ``{"op": "run", "code": ..., "timeout_s": ...,
"memory_mb": ..., "max_output_bytes": ..., "max_processes": ..., "file_mb": ..., "setup": ...}`` gets one
result frame; ``{"op": "ping"}`` gets ``{"pong": true}``.

Run:  ``python -m sandbox.executor [--preimport numpy,sympy] [--socket PATH] [--uid N]``
(stdio transport by default; ``--socket`` serves a unix socket, one connection at a time).
"""

from __future__ import annotations

import argparse
import atexit
import ctypes
import fcntl
import gc
import importlib
import json
import os
import re
import resource
import selectors
import shutil
import signal
import socket
import struct
import sys
import tempfile
import threading
import time
import traceback
import types

MAX_FRAME = 64 * 1024 * 1024
_HEADER = struct.Struct(">I")
_KIND_RE = re.compile(r"^([A-Za-z_][\w.]*)(?::|$)")
_PR_SET_CHILD_SUBREAPER = 36
_DRAIN_S = 0.5
_STATUS_FD = 3
_REQUEST_FD = 4
_REQUIRED = ("timeout_s", "memory_mb", "max_output_bytes", "max_processes")
_EXC_SUFFIXES = ("Error", "Exception", "Exit", "Interrupt", "Warning", "Iteration")
SETUP_OK, SETUP_FAILED = b"S", b"F"
"""The first status byte of a request with setup code, written before the snippet runs."""


class ProtocolError(Exception):
    """A frame could not be read or decoded (peer gone, short read or garbage)."""


def encode_frame(obj: dict) -> bytes:
    data = json.dumps(obj, ensure_ascii=False).encode("utf-8", "surrogatepass")
    return _HEADER.pack(len(data)) + data


def decode_payload(data: bytes) -> dict:
    try:
        obj = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProtocolError(f"undecodable frame: {exc}") from None
    if not isinstance(obj, dict):
        raise ProtocolError("frame is not a JSON object")
    return obj


def read_exact(read, n: int) -> bytes:
    """Read exactly ``n`` bytes with ``read(k)``; ``ProtocolError`` on EOF."""
    chunks, got = [], 0
    while got < n:
        chunk = read(n - got)
        if not chunk:
            raise ProtocolError("peer closed the connection")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def read_frame(read) -> dict:
    (size,) = _HEADER.unpack(read_exact(read, _HEADER.size))
    if size > MAX_FRAME:
        raise ProtocolError(f"frame of {size} bytes exceeds {MAX_FRAME}")
    return decode_payload(read_exact(read, size))


# ----------------------------------------------------------------------------- child side


def _child_limits(req: dict, uid: int | None, base_vm: int) -> None:
    """New session, unprivileged uid, rlimits.  Kept to raw syscalls: every Python object
    touched after the fork copies a shared page, and page faults dominate a snippet's cost."""
    os.setsid()
    if uid is not None and os.geteuid() == 0:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    try:
        fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
        os.write(fd, b"1000")  # under a cgroup limit the snippet, not the executor, is killed
        os.close(fd)
    except OSError:
        pass
    limits = (
        (resource.RLIMIT_AS, base_vm + int(req["memory_mb"]) * 1024 * 1024),
        (resource.RLIMIT_NPROC, int(req["max_processes"])),
        (resource.RLIMIT_FSIZE, int(req.get("file_mb", 64)) * 1024 * 1024),
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_CPU, int(float(req["timeout_s"])) + 2),
    )
    for lim, val in limits:
        try:
            resource.setrlimit(lim, (val, val))
        except (ValueError, OSError):
            pass


def _vm_size() -> int:
    """This process's address-space size in bytes (a forked child starts with the same)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0


def _child_main(fds: tuple[int, int, int, int], uid: int | None, base_vm: int) -> None:
    """Runs in the pre-forked child; never returns.  ``fds``: stdout, stderr, status writers
    and the request reader.  The child keeps only those, waits for its request, then runs it.

    On a normal finish the child closes stdout/stderr and writes its exit code to the status
    pipe (fd 3) before exiting, so the parent can answer without waiting for the exit teardown.
    """
    code = 1
    try:
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 64) for fd in fds]
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        for target, fd in zip((1, 2, _STATUS_FD, _REQUEST_FD), high):
            os.dup2(fd, target)
        os.closerange(_REQUEST_FD + 1, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        try:
            req = read_frame(lambda n: os.read(_REQUEST_FD, n))
        except ProtocolError:
            os._exit(0)  # the executor discarded this pre-forked child
        os.close(_REQUEST_FD)
        _child_limits(req, uid, base_vm)
        code = _run_snippet(req["code"], req.get("setup"))
        os.close(1)
        os.close(2)
        os.write(_STATUS_FD, bytes([code & 0xFF]))
    except BaseException:  # noqa: BLE001 - the child must always reach _exit
        try:
            traceback.print_exc()
        except BaseException:  # noqa: BLE001
            pass
    finally:
        os._exit(code)


def _run_snippet(source: str, setup: str | None = None) -> int:
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = main
    sys.argv = ["-c"]
    if setup is not None:
        ok = _run_setup(setup, main.__dict__)
        os.write(_STATUS_FD, SETUP_OK if ok else SETUP_FAILED)  # before any snippet code runs
        if not ok:
            return 1
    code = 0
    try:
        compiled = compile(source, "<string>", "exec")
    except (SyntaxError, ValueError) as exc:
        traceback.print_exception(type(exc), exc, None)
        return 1
    try:
        exec(compiled, main.__dict__)
    except SystemExit as exc:
        code = _exit_code(exc)
    except BaseException as exc:  # noqa: BLE001 - report like the interpreter would
        traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next or exc.__traceback__)
        code = 1
    try:
        threading._shutdown()  # wait for non-daemon threads, as the interpreter does
        atexit._run_exitfuncs()
    except SystemExit as exc:
        code = _exit_code(exc)
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001
            pass
    return code


def _run_setup(setup: str, namespace: dict) -> bool:
    """Run the caller's setup code in the snippet's globals (filename ``<setup>``), its stdout
    discarded; on any exception (``SystemExit`` included) print the traceback, return False."""
    saved = os.dup(1)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.close(null)
    try:
        exec(compile(setup, "<setup>", "exec"), namespace)
        return True
    except BaseException as exc:  # noqa: BLE001 - a setup failure is reported, never raised
        tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
        traceback.print_exception(type(exc), exc, tb or exc.__traceback__)
        return False
    finally:
        try:
            sys.stdout.flush()
        except BaseException:  # noqa: BLE001
            pass
        os.dup2(saved, 1)
        os.close(saved)


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    print(exc.code, file=sys.stderr)
    return 1


# ---------------------------------------------------------------------------- parent side


class _Capture:
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

    def text(self) -> str:
        data = bytes(self.head)
        if self.tail:
            data += (b"\n...(truncated)...\n" if self.truncated else b"") + bytes(self.tail)
        return data.decode("utf-8", "replace")


class Executor:
    """The fork server proper: ``handle(request) -> response``."""

    def __init__(self, uid: int | None = None, workdir_base: str | None = None):
        self.uid = uid
        base = workdir_base or tempfile.gettempdir()
        self.workdir = os.path.join(base, f"cleaner-run-{os.getpid()}")
        self.runs = 0
        self._pending: int | None = None
        self._next: tuple[int, int, int, int, int] | None = None

    def handle(self, req: dict) -> dict:
        op = req.get("op", "run")
        if op == "ping":
            return {"pong": True, "runs": self.runs}
        if op != "run" or not isinstance(req.get("code"), str):
            return {"error": f"bad request: op={op!r}, code must be a string"}
        if not isinstance(req.get("setup"), (str, type(None))):
            return {"error": "bad request: setup must be a string or null"}
        missing = [k for k in _REQUIRED if not isinstance(req.get(k), (int, float))]
        if missing:
            return {"error": f"bad request: numeric fields missing: {missing}"}
        self.runs += 1
        return self.run(req)

    def run(self, req: dict) -> dict:
        self.cleanup()
        pid, out_r, err_r, st_r, req_w = self._next or self._prefork()
        self._next = None
        self._pending = pid
        oom_before = _oom_kills()
        start = time.monotonic()
        try:
            try:
                _write_all(req_w, encode_frame(req))
            except OSError:
                pass  # the child is gone; _supervise sees its exit status
            os.close(req_w)
            status, timed_out, flooded, report, out, err = self._supervise(
                pid, req, (out_r, err_r, st_r), start)
        finally:
            for fd in (out_r, err_r, st_r):
                os.close(fd)
        duration = time.monotonic() - start
        result = _result(status, timed_out, flooded, out, err, duration, _oom_kills() > oom_before)
        if report.setup is not True:
            result = _setup_failed(result)
        return result

    def _prefork(self) -> tuple[int, int, int, int, int]:
        """Fork the next child in a fresh, empty work dir; it waits for its request."""
        try:
            os.rmdir(self.workdir)  # usually empty: one syscall instead of a tree walk
        except FileNotFoundError:
            pass
        except OSError:
            shutil.rmtree(self.workdir, ignore_errors=True)
        os.mkdir(self.workdir, 0o700)
        if self.uid is not None and os.geteuid() == 0:
            os.chown(self.workdir, self.uid, self.uid)
        os.chdir(self.workdir)  # inherited by the child
        base_vm = _vm_size()
        (out_r, out_w), (err_r, err_w), (st_r, st_w), (req_r, req_w) = (os.pipe() for _ in range(4))
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        pid = os.fork()
        if pid == 0:
            _child_main((out_w, err_w, st_w, req_r), self.uid, base_vm)
        for fd in (out_w, err_w, st_w, req_r):
            os.close(fd)
        return pid, out_r, err_r, st_r, req_w

    def cleanup(self) -> None:
        """Kill what is left of the last snippet, reap it, and pre-fork the next child."""
        if self._pending is not None:
            pid, self._pending = self._pending, None
            _killpg(pid)
            self._sweep()
            os.chdir("/")
        if self._next is None:
            self._next = self._prefork()

    def _supervise(self, pid: int, req: dict, fds: tuple[int, int, int], start: float):
        out_r, err_r, st_r = fds
        cap = int(req["max_output_bytes"])
        hard_cap = max(16 * cap, 1 << 20)
        caps = {out_r: _Capture(cap, keep_tail=False), err_r: _Capture(cap, keep_tail=True)}
        deadline = start + float(req["timeout_s"])
        sel = selectors.DefaultSelector()
        for fd in (out_r, err_r, st_r):
            os.set_blocking(fd, False)
            sel.register(fd, selectors.EVENT_READ)
        pidfd = _pidfd(pid)
        if pidfd is not None:
            sel.register(pidfd, selectors.EVENT_READ)
        report = _StatusPipe(st_r, expect_setup=req.get("setup") is not None)
        status, timed_out, flooded = None, False, False
        try:
            while status is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    timed_out = True
                    break
                wait = remaining if pidfd is not None else min(remaining, 0.01)
                for key, _ in sel.select(wait):
                    if key.fd in caps:
                        _read_into(key.fd, caps[key.fd], sel)
                    elif key.fd == st_r:
                        report.read(sel)
                if sum(c.total for c in caps.values()) > hard_cap:
                    flooded = True
                    break
                if report.code is not None and not any(fd in caps for fd in sel.get_map()):
                    return report.code << 8, False, False, report, caps[out_r], caps[err_r]
                status = _poll_exit(pid)
            _killpg(pid)
            if status is None:
                status = os.waitpid(pid, 0)[1]
            self._drain(sel, caps)
            report.read(sel)
        finally:
            sel.close()
            if pidfd is not None:
                os.close(pidfd)
        return status, timed_out, flooded, report, caps[out_r], caps[err_r]

    def _drain(self, sel, caps) -> None:
        """Read what is left; escaped writers are swept so EOF normally comes at once."""
        self._sweep()
        end = time.monotonic() + _DRAIN_S
        while any(fd in caps for fd in sel.get_map()) and time.monotonic() < end:
            for key, _ in sel.select(max(0.0, end - time.monotonic())):
                if key.fd in caps:
                    _read_into(key.fd, caps[key.fd], sel)

    def _sweep(self) -> None:
        """Kill and reap every remaining child (orphans are re-parented to this subreaper)."""
        for _ in range(100):
            kids = _children()
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


def _read_into(fd: int, cap: _Capture, sel) -> None:
    try:
        data = os.read(fd, 1 << 16)
    except BlockingIOError:
        return
    if data:
        cap.add(data)
    else:
        sel.unregister(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class _StatusPipe:
    """What the child reported on its status pipe (fd 3).  With setup code, the first byte is
    the setup verdict (``SETUP_OK``/``SETUP_FAILED``), written before any snippet code runs, so
    the snippet cannot forge it; the last byte after it is the exit code the child reported."""

    def __init__(self, fd: int, expect_setup: bool):
        self.fd = fd
        self.setup: bool | None = None if expect_setup else True
        self.code: int | None = None

    def read(self, sel) -> None:
        try:
            data = os.read(self.fd, 64)
        except (BlockingIOError, OSError):
            return
        if not data:
            if self.fd in sel.get_map():
                sel.unregister(self.fd)
            return
        if self.setup is None:
            self.setup, data = data[:1] == SETUP_OK, data[1:]
        if data:
            self.code = data[-1]


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
    return _status_of(info)


def _status_of(info) -> int:
    if info.si_code == os.CLD_EXITED:
        return (info.si_status & 0xFF) << 8
    return info.si_status & 0x7F


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _children() -> list[int]:
    me = os.getpid()
    try:
        with open(f"/proc/{me}/task/{me}/children") as fh:
            return [int(p) for p in fh.read().split()]
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


_OOM_EVENTS = ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control")
_oom_fd: list[int | None] = []  # the open counter file, found on first use ([None]: there is none)


def _oom_kills() -> int:
    """OOM kills in this cgroup so far (v2 ``memory.events`` or v1 ``memory.oom_control``).
    The file is opened once and re-read with ``pread`` (twice per snippet, so opens add up)."""
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
        for line in os.pread(_oom_fd[0], 4096, 0).decode().splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
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


def _setup_failed(result: dict) -> dict:
    """The answer for a request whose setup code raised or never finished (a caller's bug)."""
    stderr = result["stderr"]
    if "<setup>" not in stderr:
        stderr = f"{stderr.rstrip()}\nsetup did not finish: {result['error_kind'] or 'no verdict'}".lstrip()
    return dict(result, ok=False, error_kind="setup_error", stdout="", stdout_truncated=False,
                stderr=stderr)


def _result(status, timed_out, flooded, out, err, duration, oom) -> dict:
    stderr = err.text()
    exit_code = os.waitstatus_to_exitcode(status)
    kind = None
    memory = False
    if timed_out:
        kind = "timeout"
    elif flooded:
        kind = "output_limit"
    elif exit_code < 0:
        name = signal.Signals(-exit_code).name if -exit_code in signal.valid_signals() else str(-exit_code)
        memory = oom and -exit_code == signal.SIGKILL
        kind = "memory" if memory else f"signal:{name}"
    elif exit_code != 0:
        kind = error_kind_of(stderr) or f"exit:{exit_code}"
        if kind.endswith("MemoryError") or "Cannot allocate memory" in stderr[-2000:]:
            kind, memory = "memory", True
    return {
        "ok": kind is None,
        "exit_code": None if timed_out else exit_code,
        "stdout": out.text(),
        "stderr": stderr,
        "error_kind": kind,
        "timed_out": timed_out,
        "memory_exceeded": memory,
        "duration_s": round(duration, 6),
        "stdout_truncated": out.truncated,
        "stderr_truncated": err.truncated,
    }


# ----------------------------------------------------------------------------- serving


def preimport(modules: list[str]) -> tuple[list[str], dict[str, str]]:
    done, failed = [], {}
    for name in modules:
        try:
            importlib.import_module(name)
            done.append(name)
        except Exception as exc:  # noqa: BLE001 - reported in the hello frame
            failed[name] = f"{type(exc).__name__}: {exc}"
    return done, failed


def serve_stream(executor: Executor, rfd: int, wfd: int, hello: dict) -> None:
    rfile = os.fdopen(rfd, "rb", buffering=0)
    wfile = os.fdopen(wfd, "wb", buffering=0)
    wfile.write(encode_frame(hello))
    executor.cleanup()  # pre-fork the first child
    while True:
        try:
            req = read_frame(rfile.read)
        except ProtocolError:
            return
        wfile.write(encode_frame(executor.handle(req)))
        executor.cleanup()


def serve_socket(executor: Executor, path: str, hello: dict) -> None:
    if os.path.exists(path):
        os.unlink(path)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    os.chmod(path, 0o666)
    srv.listen(4)
    while True:
        conn, _ = srv.accept()
        with conn:
            try:
                serve_stream(executor, os.dup(conn.fileno()), os.dup(conn.fileno()), hello)
            except OSError:
                continue


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="CLEANER sandbox fork-server executor")
    ap.add_argument("--preimport", default="", help="comma-separated modules to import once")
    ap.add_argument("--socket", default=None, help="serve a unix socket instead of stdio")
    ap.add_argument("--uid", type=int, default=None, help="uid snippets run as (when root)")
    ap.add_argument("--workdir-base", default=None, help="where per-run work dirs are made")
    args = ap.parse_args(argv)
    proto_in, proto_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(2, 1)  # stray prints of imported modules must not corrupt the protocol
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    done, failed = preimport([m for m in args.preimport.split(",") if m.strip()])
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # children inherit default dispositions
    gc.freeze()  # keep the collector of forked children off the shared pages (fewer copies)
    executor = Executor(uid=args.uid, workdir_base=args.workdir_base)
    # set once here and inherited, rather than in every child (fewer copied pages per snippet)
    os.environ.update(HOME=executor.workdir, TMPDIR=executor.workdir, PWD=executor.workdir)
    tempfile.tempdir = None  # forget a cached default so snippets' tempfile uses the work dir
    hello = {"ready": True, "pid": os.getpid(), "python": sys.version.split()[0],
             "preimported": done, "failed_imports": failed}
    if args.socket:
        serve_socket(executor, args.socket, hello)
    else:
        serve_stream(executor, proto_in, proto_out, hello)


if __name__ == "__main__":
    main()
