"""The child side of the fork server: a pre-forked process that waits for its request, then runs it.

Before its request arrives the child keeps only its pipes (stdout, stderr, status on fd 3,
request on fd 4), starts a new session, drops to an unprivileged uid when asked, installs the
``Guard`` (dumpable again; the seccomp filter it inherited from the executor) and writes
``READY`` on the status pipe: the executor never hands code to
a child that did not get that far.  With the request it applies rlimits and runs the caller's
setup code (``<setup>``), then the snippet (``<string>``) like ``python -c`` would.  Kept to raw
syscalls where it can: every Python object touched after the fork copies a shared page, and
page faults dominate a snippet's cost.
"""

from __future__ import annotations

import atexit
import fcntl
import math
import os
import resource
import sys
import traceback
import types

from .protocol import RUN_HEADER

STATUS_FD = 3
REQUEST_FD = 4
READY = b"R"
"""The first status byte: the child is isolated and waits for its request."""
SETUP_OK, SETUP_FAILED = b"S", b"F"
"""The next status byte of a request with setup code, written before the snippet runs."""


def _high_devnull() -> int:
    fd = os.open(os.devnull, os.O_RDONLY)
    try:
        return fcntl.fcntl(fd, fcntl.F_DUPFD, 64)
    finally:
        os.close(fd)


_DEVNULL = _high_devnull()  # each child's stdin (opened once; out of the way of fds 1-4)


def vm_size() -> int:
    """This process's address-space size in bytes (a forked child starts with the same)."""
    try:
        fd = os.open("/proc/self/statm", os.O_RDONLY)
        try:
            return int(os.read(fd, 64).split(None, 1)[0]) * _PAGE
        finally:
            os.close(fd)
    except (OSError, ValueError):
        return 0


_PAGE = os.sysconf("SC_PAGE_SIZE")


def child_main(fds: tuple[int, int, int, int], uid: int | None, base_vm: int, guard,
               spawn: tuple[list[str], dict, str] | None = None, workdir: str = "/") -> None:
    """Runs in the pre-forked child; never returns.  ``fds``: stdout, stderr, status writers
    and the request reader.  The child keeps only those, waits for its request, then runs it.

    On a normal finish the child closes stdout/stderr and writes its exit code to the status
    pipe (fd 3) before exiting, so the parent can answer without waiting for the exit teardown.
    ``spawn`` (argv, env, prelude): instead, exec a fresh interpreter on ``prelude + code`` (the
    plain-subprocess baseline of ``sandbox/bench.py``, isolated exactly like a snippet).
    """
    code = 1
    try:
        os.dup2(_DEVNULL, 0)
        if min(fds) <= REQUEST_FD:  # move them out of the way of their targets first
            fds = tuple(fcntl.fcntl(fd, fcntl.F_DUPFD, 64) for fd in fds)
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        os.dup2(fds[2], STATUS_FD)
        os.dup2(fds[3], REQUEST_FD)
        os.closerange(REQUEST_FD + 1, 1 << 30)  # one close_range(2)
        os.chdir(workdir)
        _after_clone()
        _isolate(uid, guard)
        os.write(STATUS_FD, READY)
        try:
            limits, source, setup = _read_request()
        except EOFError:
            os._exit(0)  # the executor discarded this pre-forked child
        os.close(REQUEST_FD)
        _limits(limits, base_vm)
        if spawn is not None:
            argv, env, prelude = spawn
            os.set_inheritable(STATUS_FD, False)
            os.execve(argv[0], [*argv, prelude + source], env)
        code = run_snippet(source, setup)
        os.close(1)
        os.close(2)
        os.write(STATUS_FD, bytes([code & 0xFF]))
    except BaseException:  # noqa: BLE001 - the child must always reach _exit
        try:
            traceback.print_exc()
        except BaseException:  # noqa: BLE001
            pass
    finally:
        os._exit(code)


def _after_clone() -> None:
    """What ``os.fork``'s hooks would do in a child, for the modules a pool may pre-import: a
    fresh random seed (else every snippet would draw the same numbers)."""
    random = sys.modules.get("random")
    if random is not None:
        random.seed()


def _isolate(uid: int | None, guard) -> None:
    """New session, first in line for the OOM killer, unprivileged uid, the guard.

    The OOM mark is set before the uid drop: written with ``CAP_SYS_RESOURCE`` (an executor running
    as root) it is also a floor the snippet cannot go below; written without (the docker and bwrap
    workers), the snippet can set it back to the worker's own value (``sandbox/THREAT_MODEL.md``)."""
    os.setsid()
    try:
        fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
        os.write(fd, b"1000")  # under a cgroup limit the snippet, not the executor, is killed
        os.close(fd)
    except OSError:
        pass
    if uid is not None and os.geteuid() == 0:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    guard.apply()


def _read_request() -> tuple[tuple, str, str | None]:
    """The request the executor forwarded: ``RUN_HEADER`` + code + setup (no JSON in the child:
    every object it builds costs a copy-on-write page fault)."""
    timeout_s, _, memory_mb, _, processes, file_mb, n_code, n_setup = RUN_HEADER.unpack(_read_exact(RUN_HEADER.size))
    source = _read_exact(n_code).decode("utf-8", "surrogatepass")
    setup = _read_exact(n_setup - 1).decode("utf-8", "surrogatepass") if n_setup else None
    return (timeout_s, memory_mb, processes, file_mb), source, setup


def _read_exact(n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = os.read(REQUEST_FD, n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def _limits(req: tuple, base_vm: int) -> None:
    """Rlimits of the request (no POSIX message queues at all: they would outlive the snippet).

    ``RLIMIT_CPU`` is each process's backstop behind the executor's CPU-time check
    (``cputime``): SIGXCPU at the limit rounded up to whole seconds + 1 s of the process's own
    CPU time, SIGKILL one second later, so a process that catches SIGXCPU still ends."""
    timeout_s, memory_mb, processes, file_mb = req
    cpu = math.ceil(timeout_s) + 1
    limits = (
        (resource.RLIMIT_AS, base_vm + memory_mb * 1024 * 1024, None),
        (resource.RLIMIT_NPROC, processes, None),
        (resource.RLIMIT_FSIZE, file_mb * 1024 * 1024, None),
        (resource.RLIMIT_CORE, 0, None),
        (resource.RLIMIT_CPU, cpu, cpu + 1),
        (resource.RLIMIT_MSGQUEUE, 0, None),
    )
    for lim, soft, hard in limits:
        try:
            resource.setrlimit(lim, (soft, soft if hard is None else hard))
        except (ValueError, OSError):
            pass


def run_snippet(source: str, setup: str | None = None) -> int:
    """Run ``setup`` then ``source`` in a fresh ``__main__``; return the exit code."""
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = main
    sys.argv = ["-c"]
    if setup is not None:
        ok = _run_setup(setup, main.__dict__)
        os.write(STATUS_FD, SETUP_OK if ok else SETUP_FAILED)  # before any snippet code runs
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
        # the interpreter's own display, not ``traceback``'s: only it adds "Did you mean: 'print'?" on 3.10/3.11
        exc.__traceback__ = exc.__traceback__.tb_next or exc.__traceback__
        sys.__excepthook__(type(exc), exc, exc.__traceback__)
        code = 1
    try:
        threading = sys.modules.get("threading")  # not imported here: its at-fork hook costs ~130
        if threading is not None:                   # page faults in every child; snippets import it
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
