"""The fork server proper: pre-imports, pre-forks one child, serves requests one at a time.

``Executor.run(payload)`` validates a binary run request and runs it in the pre-forked child
(``child.py``), supervised by ``supervise.py``; after answering, ``cleanup`` kills what is
left of the snippet, empties every writable directory (``scratch.wipe``) and has the forker
(``forker.py``) clone the next child, so that work is off the next request's path.  ``main`` is the entry point: the
executor makes itself non-dumpable, then talks over stdio, or connects to a unix socket the
host listens on (``--connect``; nothing in the sandbox needs a writable host directory).
Stdlib only (this package runs inside containers).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import importlib
import io
import os
import select
import signal
import socket
import sys
import time
import types

from .child import READY, child_main, vm_size
from .forker import CHILD_FDS, Forker
from .guard import Guard, protect_pid_program
from .outcome import answer, oom_kills
from .protocol import (
    HEADER,
    RUN,
    ProtocolError,
    decode_payload,
    decode_result,
    encode_frame,
    encode_run,
    read_payload,
    run_fields,
    write_all,
)
from .scratch import wipe
from .supervise import killpg, supervise, sweep

_PR_SET_CHILD_SUBREAPER = 36
_REQUIRED = ("timeout_s", "memory_mb", "max_output_bytes", "max_processes")
READY_TIMEOUT_S = 10.0
"""Seconds a pre-forked child may take to isolate itself before the request counts as refused."""


class Executor:
    """Runs requests in pre-forked children: ``handle(request) -> response``.

    ``scratch``: the writable directories emptied before every child (the work dir always is).
    """

    def __init__(self, uid: int | None = None, workdir_base: str | None = None,
                 scratch: list[str] | None = None, guard: Guard | None = None,
                 spawn: tuple[list[str], dict, str] | None = None):
        self.uid = uid
        self.spawn = spawn
        base = workdir_base or os.environ.get("TMPDIR", "/tmp")
        scratch = list(scratch or [])
        # a scratch dir (the sandboxes' /work) is the work dir itself; elsewhere one of our own
        self._own_dir = base not in scratch
        self.workdir = os.path.join(base, f"cleaner-run-{os.getpid()}") if self._own_dir else base
        self.scratch = [*scratch, self.workdir] if self._own_dir else scratch
        self.guard = guard or Guard(enabled=False)
        self.runs = 0
        self._pending: int | None = None
        self._next: tuple[int, int, int, int, int] | None = None
        self._base_vm = vm_size()  # the forker's size: it is a snapshot of this process now
        self._forker = Forker(self._child, self._protect_forker)

    def _protect_forker(self, pid: int) -> None:
        program = protect_pid_program(pid) if self.guard.seccomp else None
        if program is not None:
            self.guard.install(program)

    def handle(self, req: dict) -> dict:
        """A JSON request: ``ping``, or a run request as a dict (tests, simple clients)."""
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
        reply = self.run(encode_run(req)[HEADER.size:])[HEADER.size:]
        return decode_result(reply) if reply[:1] == RUN else decode_payload(reply)

    def run(self, payload: bytes) -> bytes:
        """A binary run payload (``protocol``) in, the result frame out."""
        try:
            cpu_s, wall_s, _, cap, _, _, _, n_setup = run_fields(payload)
        except ProtocolError as exc:
            return encode_frame({"error": f"bad request: {exc}"})
        if self.spawn and n_setup:
            return encode_frame({"error": "bad request: setup code is not served by --spawn"})
        self.runs += 1
        self.cleanup()
        pid, out_r, err_r, st_r, req_w = self._next or self._prefork()
        self._next = None
        self._pending = pid
        try:
            refused = _await_ready(st_r, err_r)
            if refused:
                os.close(req_w)
                return encode_frame({"error": f"sandbox child could not isolate itself: {refused}"})
            oom_before = oom_kills()
            start = time.monotonic()
            try:
                write_all(req_w, payload[1:])
            except OSError:
                pass  # the child is gone; supervise sees its exit status
            os.close(req_w)
            status, limit, flooded, report, out, err = supervise(
                pid, (cpu_s, wall_s), cap, n_setup > 0, (out_r, err_r, st_r), start, self._forker.pid)
        finally:
            for fd in (out_r, err_r, st_r):
                os.close(fd)
        return answer(status, limit, flooded, out, err, time.monotonic() - start, oom_before,
                      report.setup is True)

    def _prefork(self) -> tuple[int, int, int, int, int]:
        """Have the forker clone the next child (in the work dir, emptied); it waits for its
        request.  Returns (pid, stdout, stderr, status read ends, request write end)."""
        left = wipe(self.scratch)
        if left:  # a worker that cannot forget must not run another snippet
            raise SystemExit(f"executor: could not empty {left}")
        if self._own_dir:
            try:
                os.mkdir(self.workdir, 0o700)
            except FileExistsError:
                pass
            if self.uid is not None and os.geteuid() == 0:
                os.chown(self.workdir, self.uid, self.uid)
        (out_r, out_w), (err_r, err_w), (st_r, st_w), (req_r, req_w) = os.pipe(), os.pipe(), os.pipe(), os.pipe()
        for end, fixed in zip((out_w, err_w, st_w, req_r), CHILD_FDS):
            os.dup2(end, fixed)
            os.close(end)
        pid = self._forker.fork()
        for fd in CHILD_FDS:
            os.close(fd)
        for fd in (out_r, err_r, st_r):
            os.set_blocking(fd, False)  # only our ends: the child's stay blocking
        return pid, out_r, err_r, st_r, req_w

    def _child(self) -> None:
        """What a cloned child runs (in the forker's image)."""
        child_main(CHILD_FDS, self.uid, self._base_vm, self.guard, self.spawn, self.workdir)

    def cleanup(self) -> None:
        """Kill what is left of the last snippet, reap it, and pre-fork the next child."""
        if self._pending is not None:
            pid, self._pending = self._pending, None
            killpg(pid)
            sweep(self._forker.pid)
        if self._next is None:
            self._next = self._prefork()


def _await_ready(st_r: int, err_r: int) -> str | None:
    """Wait for the child's ``READY`` byte; None when it came, else why not (its stderr)."""
    ready, _, _ = select.select([st_r], [], [], READY_TIMEOUT_S)
    first = os.read(st_r, 1) if ready else b""
    if first == READY:
        return None
    why = "no answer" if not ready else "it exited"
    try:
        detail = os.read(err_r, 4096).decode("utf-8", "replace").strip()
    except OSError:
        detail = ""
    return f"{why}: {detail[-1000:]}" if detail else why


def warm_up() -> None:
    """Run what every child runs (compile, exec, print, an error's traceback) once here, so the
    lazy first-use state it creates (the compiler's above all) sits in pages the children share
    instead of being built again in each child at the price of copy-on-write faults (measured:
    a trivial snippet's child took half the page faults and CPU time after this)."""
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        for source in ("print(6 * 7)", "x = [i * i for i in range(10)]\nprint(sum(x), len('ab'))", "1 / 0"):
            try:
                exec(compile(source, "<string>", "exec"), {"__builtins__": __builtins__})
            except ZeroDivisionError as exc:
                sys.__excepthook__(type(exc), exc, exc.__traceback__)
    types.ModuleType("__main__")


def spawn_command(preimported: list[str]) -> tuple[list[str], dict, str]:
    """How ``--spawn`` runs a snippet: this interpreter started afresh, as plain as it gets
    (``-S``: no ``site``, no ``.pth`` files; site-packages on ``PYTHONPATH``), importing the
    same modules the pool pre-imports before the code, so a ratio compares equal work."""
    site_dirs = [p for p in sys.path if p.endswith(("site-packages", "dist-packages")) and os.path.isdir(p)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(site_dirs), PYTHONNOUSERSITE="1")
    prelude = "".join(f"import {name}\n" for name in preimported)
    return [sys.executable, "-S", "-c"], env, prelude


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
            payload = read_payload(rfile.read)
            if payload[:1] == RUN:
                reply = executor.run(payload)
            else:
                reply = encode_frame(executor.handle(decode_payload(payload)))
        except ProtocolError:
            return
        wfile.write(reply)
        executor.cleanup()


def connect(path: str) -> socket.socket:
    """Connect to the host's listening socket (retried briefly while it appears)."""
    deadline = time.monotonic() + 30
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
            return sock
        except OSError:
            sock.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="CLEANER sandbox fork-server executor")
    ap.add_argument("--preimport", default="", help="comma-separated modules to import once")
    ap.add_argument("--connect", default=None, help="talk over this unix socket instead of stdio")
    ap.add_argument("--uid", type=int, default=None, help="uid snippets run as (when root)")
    ap.add_argument("--workdir-base", default=None, help="where per-run work dirs are made")
    ap.add_argument("--scratch", default="", help="comma-separated writable dirs emptied before each snippet")
    ap.add_argument("--spawn", action="store_true", help="run each snippet in a fresh interpreter (a baseline)")
    args = ap.parse_args(argv)
    proto_in, proto_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(2, 1)  # stray prints of imported modules must not corrupt the protocol
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    guard = Guard()
    dumpable = not guard.protect_executor()
    start = time.monotonic()
    done, failed = preimport([m for m in args.preimport.split(",") if m.strip()])
    import_s = time.monotonic() - start
    warm_up()
    guard.install()  # after the imports: the executor and every child it forks are filtered
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # children inherit default dispositions
    gc.freeze()  # keep the collector of forked children off the shared pages (fewer copies)
    executor = Executor(uid=args.uid, workdir_base=args.workdir_base, guard=guard,
                        scratch=[d for d in args.scratch.split(",") if d])
    # set once here and inherited, rather than in every child (fewer copied pages per snippet)
    os.environ.update(HOME=executor.workdir, TMPDIR=executor.workdir, PWD=executor.workdir)
    executor.spawn = spawn_command(done) if args.spawn else None
    if "tempfile" in sys.modules:  # a preimport cached its default: make snippets use the work dir
        sys.modules["tempfile"].tempdir = None
    hello = {"ready": True, "pid": os.getpid(), "python": sys.version.split()[0],
             "executable": sys.executable, "preimported": done, "failed_imports": failed,
             "version": sys.version, "preimport_s": round(import_s, 4), "seccomp": guard.seccomp,
             "dumpable": dumpable, "spawn": args.spawn}
    if args.connect:
        sock = connect(args.connect)
        serve_stream(executor, os.dup(sock.fileno()), os.dup(sock.fileno()), hello)
    else:
        serve_stream(executor, proto_in, proto_out, hello)
