"""The assert format (``check(candidate)``): a judge that never runs the solution, and the solution's process.

``judge_assert`` holds the test code (it holds the expected values), makes itself non-dumpable,
starts a fresh interpreter with ``posix_spawn`` (no copy of the judge's memory, no verdict fd)
that runs ``child_main``: load the solution, answer calls over two pipes. ``check`` runs in the
judge with ``candidate`` a proxy whose return values are decoded into exact builtin types. Any
end of the child before ``check`` returned is a failure of its kind; a fault the test code
swallowed still fails the test.
"""

import os
import signal
import sys

if __name__ != "cleaner_judge":  # shipped into the sandbox as one program, these names are defined above
    from tasks.rewards.judge.run import (
        emit,
        end_of,
        memfd,
        on_alarm,
        scan_marks,
        snapshot,
        tamper_hints,
        verdict_channel,
    )
    from tasks.rewards.judge.wire import (
        CHANNEL_EXIT,
        Unencodable,
        decode,
        encode,
        has_nan,
        recv,
        recv_trusted,
        send,
        send_trusted,
    )

_CRASH_SIGNALS = (4, 6, 7, 8, 11)  # SIGILL, SIGABRT, SIGBUS, SIGFPE, SIGSEGV

_CHILD_BOOT = (
    "import os, marshal\n"
    "def r(n):\n"
    "    b = b''\n"
    "    while len(b) < n:\n"
    "        c = os.read(3, n - len(b))\n"
    "        if not c:\n"
    "            raise SystemExit(0)\n"
    "        b += c\n"
    "    return b\n"
    "g = {'__name__': 'cleaner_judge'}\n"
    "exec(marshal.loads(r(int.from_bytes(r(4), 'big'))), g)\n"
    "g['child_main']()\n"
)
"""What the fresh interpreter runs: read this program (marshalled) from fd 3, then serve."""


def child_main():
    """The solution's process: load it, then answer calls on fds 3 (requests) / 4 (replies)."""
    import types

    os.closerange(5, 1 << 16)
    out = memfd(b"")
    os.dup2(out, 1)
    msg = recv_trusted(3)
    if msg is None:
        return
    sys.path[:] = msg["path"]
    import _sitebuiltins
    import builtins

    builtins.exit = _sitebuiltins.Quitter("exit", "Ctrl-D (i.e. EOF)")  # as site defines them (-S skips it)
    builtins.quit = _sitebuiltins.Quitter("quit", "Ctrl-D (i.e. EOF)")
    main = types.ModuleType("__main__")
    sys.modules["__main__"] = main
    ns = main.__dict__
    snap, reply = snapshot(), {"ok": True}
    try:
        exec(msg["prefix"], ns)
        exec(compile(msg["source"], "<solution>", "exec"), ns)
    except BaseException as exc:  # noqa: BLE001 - reported to the judge
        reply = _child_end(exc)
    found = {}
    for name in msg["lookup"]:
        if name in ns:
            try:
                found[name] = "callable" if callable(ns[name]) else {"value": encode(ns[name])}
            except Unencodable:
                pass
    reply.update(found=found, shadowed=[n for n in msg["shadow"] if n in ns])
    seen = _child_reply(reply, snap, out, 0)
    while reply.get("ok"):
        req = recv_trusted(3)
        if req is None:
            return
        try:
            fn = ns.get(req["name"])
            if not callable(fn):
                raise NameError(f"name {req['name']!r} is not defined")
            reply = {"ok": True, "value": encode(fn(*decode(req["args"]), **decode(req["kwargs"])))}
        except BaseException as exc:  # noqa: BLE001 - reported to the judge
            reply = _child_end(exc)
        seen = _child_reply(reply, snap, out, seen)


def _child_reply(reply, snap, out, seen, _exit=os._exit):
    """Send a reply with the tamper hints and whether a verdict mark was printed; exit
    ``CHANNEL_EXIT`` when the reply pipe is gone. Returns how far stdout was scanned."""
    try:
        sys.stdout.flush()
    except BaseException:  # noqa: BLE001 - a closed or replaced stream
        pass
    marked, seen = scan_marks(out, seen)
    reply["tampered"] = tamper_hints(snap)
    reply["marked"] = marked
    try:
        send(4, reply)
    except OSError:
        _exit(CHANNEL_EXIT)
    return seen


def _child_end(exc):
    end = end_of(exc)
    try:
        end["msg"] = str(exc)[:200]
    except BaseException:  # noqa: BLE001 - a hostile __str__
        end["msg"] = ""
    return end


class _Fault(BaseException):
    """The solution ended or broke the test (the message is the failure kind); ``check`` cannot catch it."""


class _Child:
    """The judge's handle on the solution's process: spawn it, call into it, tell how it died."""

    def __init__(self, program):
        import fcntl

        def high(fd):
            new = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
            os.close(fd)
            return new

        req_r, self.req_w = map(high, os.pipe())
        self.rep_r, rep_w = map(high, os.pipe())
        actions = [(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                   (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                   (os.POSIX_SPAWN_DUP2, req_r, 3), (os.POSIX_SPAWN_DUP2, rep_w, 4)]
        argv = [sys.executable, "-I", "-S", "-c", _CHILD_BOOT]
        self.pid = os.posix_spawn(sys.executable, argv, dict(os.environ), file_actions=actions)
        os.close(req_r)
        os.close(rep_w)
        self.fault, self.raised, self.hints = None, None, set()
        data = len(program).to_bytes(4, "big") + program
        while data:
            data = data[os.write(self.req_w, data):]

    def fail(self, kind):
        self.fault = self.fault or kind
        return _Fault(kind)

    def rpc(self, payload):
        try:
            send_trusted(self.req_w, payload)
            reply = recv(self.rep_r)
        except OSError:
            reply = None
        except (ValueError, RecursionError) as err:
            raise self.fail("forged_verdict" if str(err) == "forged" else "tampering") from None
        if reply is None:
            raise self.fail(self.death())
        tampered = reply.get("tampered")
        if type(tampered) is list and tampered:
            self.hints.add("channel_closed" if "fd:1" in tampered else "tampered")
        if reply.get("marked") is True:
            self.hints.add("forged_verdict")
        return reply

    def death(self):
        """Why the child stopped answering: its exit, a signal, or (still alive) a closed channel."""
        import time

        for _ in range(40):
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.pid = None
                if os.WIFSIGNALED(status):
                    sig = os.WTERMSIG(status)
                    return "crash" if sig in _CRASH_SIGNALS else "keyboard_interrupt" if sig == 2 else "killed"
                return "channel_closed" if os.WEXITSTATUS(status) == CHANNEL_EXIT else "os_exit"
            time.sleep(0.005)
        return "channel_closed"

    def ended(self, reply):
        """The failure of a reply without a value (a solution's exception is re-raised as itself)."""
        import builtins

        end = reply.get("end")
        if end in ("exit", "fake"):
            return self.fail("system_exit" if end == "exit" else "fake_value")
        name = reply.get("exc")
        if end != "exc" or name == "KeyboardInterrupt":
            return self.fail("tampering" if end != "exc" else "keyboard_interrupt")
        cls = getattr(builtins, name, None) if type(name) is str else None
        if not (isinstance(cls, type) and issubclass(cls, Exception)):
            cls = RuntimeError
        try:
            self.raised = cls(str(reply.get("msg", ""))[:200])
        except TypeError:
            self.raised = RuntimeError(f"{name}: {reply.get('msg', '')}")
        return self.raised

    def call(self, name, args, kwargs):
        try:
            payload = {"name": name, "args": encode(list(args)), "kwargs": encode(dict(kwargs))}
        except Unencodable:
            raise self.fail("harness_limit") from None
        reply = self.rpc(payload)
        if "value" not in reply:
            raise self.ended(reply)
        try:
            value = decode(reply["value"])
        except (ValueError, TypeError, RecursionError):
            raise self.fail("tampering") from None
        if has_nan(value):
            self.hints.add("nan")
        return value

    def kill(self):
        if self.pid is not None:
            try:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            except OSError:
                pass


class _Remote:
    """``candidate`` (or a helper the solution defines) in the judge: each call runs in the child."""

    def __init__(self, child, name):
        self._child, self.__name__ = child, name

    def __call__(self, *args, **kwargs):
        return self._child.call(self.__name__, args, kwargs)


def _undumpable():
    """``prctl(PR_SET_DUMPABLE, 0)``, checked with ``PR_GET_DUMPABLE``: no ptrace, no /proc/<pid>/mem."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(4, 0, 0, 0, 0) == 0 and libc.prctl(3, 0, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def judge_assert(solution, prefix, test_src, entry, lookup, shadow, timeout, program):
    """Run ``check(candidate)`` of ``test_src`` here against the solution in a fresh child and emit
    ``{"pass", "kind", "exc", "hints"}``. ``lookup``: names the test uses but does not define (the
    solution's helpers, e.g. HumanEval's ``poly``); ``shadow``: names the test defines; ``program``:
    this file, marshalled, for the child."""
    import builtins

    channel = verdict_channel()
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 1)  # the test code's own prints stay off the verdict channel
    os.close(null)
    if not _undumpable():
        emit(channel, {"error": "the judge could not make itself non-dumpable (prctl PR_SET_DUMPABLE)"})
        return
    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        child = _Child(program)
    except OSError as err:
        emit(channel, {"error": f"could not start the solution's process: {err}"})
        return
    kind, detail = "pass", None
    try:
        tns = {"__name__": "__cleaner_check__", "__builtins__": builtins}
        exec(prefix, tns)
        missing = [n for n in lookup if n not in tns and not hasattr(builtins, n)]
        load = child.rpc({"path": sys.path, "prefix": prefix, "source": solution, "lookup": missing,
                          "shadow": shadow})
        if not load.get("ok"):
            raise child.ended(load)
        if load.get("shadowed"):
            child.hints.add("redefined_helper")
        for name, how in dict(load.get("found") or {}).items():
            if name in missing:
                tns[name] = _Remote(child, name) if how == "callable" else decode(dict(how).get("value"))
        exec(test_src, tns)
        tns["check"](_Remote(child, entry))
    except _Fault as fault:
        kind = str(fault)
    except BaseException as exc:  # noqa: BLE001 - every ending is a verdict
        detail = type(exc).__name__
        kind = ("keyboard_interrupt" if isinstance(exc, KeyboardInterrupt)
                else "runtime_error" if exc is child.raised else "wrong_answer")
    signal.setitimer(signal.ITIMER_REAL, 0)
    kind = child.fault or kind  # a fault the test code swallowed still fails the test
    child.kill()
    emit(channel, {"pass": kind == "pass", "kind": kind, "exc": detail, "hints": sorted(child.hints)})
