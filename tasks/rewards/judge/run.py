"""The solution runs here (stdin/stdout and functional formats): what it produced, not whether it passed.

``run_program`` feeds the test input on stdin (a memfd: ``input()``, ``sys.stdin``, ``open(0)``),
captures the solution's stdout in another memfd, runs it under its own CPU-time alarm (``ITIMER_PROF``, a
courtesy: the sandbox kills the snippet from outside at the test's CPU limit, whatever the solution does to the
alarm), then emits one
verdict line on a copy of fd 1 taken before the solution ran: its output or return value (inline,
or a sha256 of the canonical form when long), how the run ended, and tamper hints (patched builtins
or ``__eq__`` of builtin types, fd 1 closed or replaced, a verdict mark printed, harness names
redefined). The host compares; the expected answer never enters the sandbox. Functions that run
after solution code take the builtins they use as default arguments, bound before it ran.
"""

import os
import signal
import sys

if __name__ != "cleaner_judge":  # shipped into the sandbox as one program, these names are defined above
    from tasks.rewards.judge.wire import (
        CHANNEL_EXIT,
        TIMEOUT_EXIT,
        VERDICT_MARK,
        Unencodable,
        decode,
        digest,
        dump,
        encode,
        json_plain,
        loads,
        normal_lines,
    )

_HARNESS_NAMES = ("check", "candidate", "run_program", "judge_assert", "values_match", "outputs_match",
                  "same_value", "tokens_equal", "encode", "decode", "dump")
_WATCHED_TYPES = (object, type, int, float, str, bool, list, tuple, dict, set, frozenset)


def verdict_channel():
    """A private copy of fd 1 and its identity (device, inode), taken before any solution code runs."""
    fd = os.dup(1)
    st = os.fstat(fd)
    return fd, (st.st_dev, st.st_ino)


def emit(channel, payload, _fstat=os.fstat, _write=os.write, _exit=os._exit):
    """Write the verdict line; exit ``CHANNEL_EXIT`` when the channel was closed or replaced."""
    fd, ident = channel
    try:
        st = _fstat(fd)
        if (st.st_dev, st.st_ino) != ident:
            _exit(CHANNEL_EXIT)
        data = (VERDICT_MARK + dump(payload) + "\n").encode()
        while data:
            data = data[_write(fd, data):]
    except OSError:
        _exit(CHANNEL_EXIT)


def fd_identity(fd, _fstat=os.fstat):
    try:
        st = _fstat(fd)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def snapshot():
    """What the tamper check compares with: the builtins, the ``__eq__`` of the builtin types, a few
    functions the harness relies on and what fd 1 is."""
    import builtins

    watched = [(sys, "exit"), (os, "_exit"), (os, "write"), (os, "dup2")]
    if "json" in sys.modules:
        watched += [(sys.modules["json"], "dumps"), (sys.modules["json"], "loads")]
    return (builtins, dict(vars(builtins)), [(m, a, getattr(m, a)) for m, a in watched],
            [(t, vars(t).get("__eq__")) for t in _WATCHED_TYPES], fd_identity(1))


def tamper_hints(snap, _vars=vars, _getattr=getattr, _object=object, fd_identity=fd_identity):
    """What the solution replaced or deleted since ``snapshot`` (``fd:1`` first when its stdout was
    closed or replaced) - a hint, reported on failure."""
    builtins, names, watched, eqs, fd1 = snap
    now, gone = _vars(builtins), _object()
    bad = ["fd:1"] if fd_identity(1) != fd1 else []
    bad += ["builtins." + k for k, v in names.items() if now.get(k, gone) is not v]
    bad += [m.__name__ + "." + a for m, a, v in watched if _getattr(m, a, gone) is not v]
    bad += [t.__name__ + ".__eq__" for t, eq in eqs if _vars(t).get("__eq__") is not eq]
    return bad[:20]


def scan_marks(fd, start=0, _pread=os.pread, _len=len):
    """Does what was written to ``fd`` (a memfd) from ``start`` on hold a verdict mark; and where it ends."""
    mark = VERDICT_MARK.encode()
    found, pos, tail = False, start, b""
    try:
        while chunk := _pread(fd, 1 << 20, pos):
            found = found or mark in tail + chunk
            tail = chunk[1 - _len(mark):]
            pos += _len(chunk)
    except OSError:
        pass
    return found, pos


def end_of(exc, _isinstance=isinstance, _type=type, _str=str):
    """How a run ended, from the exception that ended it."""
    if _isinstance(exc, SystemExit):
        code = exc.code
        return {"end": "exit", "code": code if _type(code) is int else (0 if code is None else 1)}
    if _isinstance(exc, Unencodable):
        return {"end": "fake", "type": _str(exc.args[0] if exc.args else "?")}
    return {"end": "exc", "exc": _str(_type(exc).__name__)}


def on_alarm(signum, frame):
    os.write(2, b"TimeoutError: test exceeded its time limit\n")
    os._exit(TIMEOUT_EXIT)


def memfd(data):
    try:
        fd = os.memfd_create("cleaner-io")
    except (AttributeError, OSError):
        import tempfile

        fd = os.dup(tempfile.TemporaryFile().fileno())
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.lseek(fd, 0, 0)
    return fd


def run_program(source, prefix, stdin, fn_name, args_text, timeout, inline,
                _setitimer=signal.setitimer, _itimer=signal.ITIMER_PROF):
    """Run the solution here (stdin/stdout when ``fn_name`` is None, else call ``fn_name`` with the
    JSON lines of ``args_text``) and emit what it produced: ``out`` (its stdout) or ``value`` (the
    encoded return value), a ``sha256`` instead when longer than ``inline``; ``end`` says how the
    run ended (``ok``, ``exit`` + ``code``, ``exc`` + ``exc``, ``fake`` + ``type``)."""
    channel = verdict_channel()
    fd0 = memfd(stdin.encode())
    os.dup2(fd0, 0)
    os.close(fd0)
    sys.stdin = open(0, closefd=False)
    cap = memfd(b"")
    sys.stdout.flush()
    os.dup2(cap, 1)
    args = [loads(line) for line in args_text.split("\n") if line.strip()]
    ns = {"__name__": "__main__", "__builtins__": __builtins__}
    snap, report = snapshot(), {"end": "ok"}
    signal.signal(signal.SIGPROF, on_alarm)
    _setitimer(_itimer, timeout)
    try:
        exec(prefix, ns)
        exec(compile(source, "<solution>", "exec"), ns)
        if fn_name is not None:
            fn = getattr(ns["Solution"](), fn_name) if "Solution" in ns else ns[fn_name]
            value = fn(*args)
            if hasattr(type(value), "__next__"):  # a generator (or another iterator): what it yields, as a list
                value = list(value)
            report = _value_report(encode(value), inline)
        _join_threads()
    except BaseException as exc:  # noqa: BLE001 - every ending is reported
        report = end_of(exc)
    _setitimer(_itimer, 0)
    captured = _captured(cap, inline)
    report.update(captured if fn_name is None else {k: v for k, v in captured.items() if k in ("channel", "marked")})
    report["tampered"] = tamper_hints(snap)
    report["shadowed"] = [n for n in _HARNESS_NAMES if n in ns]
    emit(channel, report)


def _join_threads():
    import threading

    for t in threading.enumerate():
        if t is not threading.main_thread() and not t.daemon:
            t.join()


def _value_report(value, inline, _len=len):
    """The encoded return value, or for a long one the digest of its JSON form (sets have none)."""
    if _len(dump(value)) <= inline:
        return {"end": "ok", "value": value}
    try:
        return {"end": "ok", "sha256": digest(dump(json_plain(decode(value)), sort=True))}
    except Unencodable:
        return {"end": "ok", "sha256": ""}


def _captured(cap, inline, _pread=os.pread, _len=len):
    """What the solution wrote to its stdout (a memfd), inline or as the digest of its normal lines."""
    for stream in (sys.stdout, sys.__stdout__):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001 - a closed or replaced stream
            pass
    try:
        chunks, pos = [], 0
        while chunk := _pread(cap, 1 << 20, pos):
            chunks.append(chunk)
            pos += _len(chunk)
    except OSError:
        return {"channel": "closed"}
    text = b"".join(chunks).decode("utf-8", "replace")
    marked = VERDICT_MARK in text
    if _len(text) <= inline and _len(dump(text)) <= inline:  # escaping only lengthens: skip it for long text
        return {"out": text, "marked": marked}
    return {"sha256": digest(normal_lines(text)), "marked": marked}
