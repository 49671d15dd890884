"""The assert format (``check(candidate)``): a judge that never runs the solution.

``judge_assert`` holds the test code (it holds the expected values), makes itself non-dumpable,
starts a fresh interpreter with ``posix_spawn`` (no copy of the judge's memory, no verdict fd)
that runs ``child.child_main``: load the solution, answer calls over two pipes. ``check`` runs in the
judge, once and whole as the reference harness runs it, with ``candidate`` a proxy whose return
values are decoded into exact builtin types; the marks ``tasks.rewards.cases`` put after each test
count how many it passed in order (``passed``, for partial credit). Any end of the child before
``check`` returned is a failure of its kind; a fault the test code swallowed still fails the test;
a run that never called the candidate does not pass.

What a correct answer does the way Python would: arguments of type list, dict and set it mutates
come back mutated (in place, in the judge's objects); a returned closure or iterator (a generator)
stays in the solution's process and is called or advanced from the judge, and so does any other
returned object outside the codec but a builtin type's subclass (its attributes, methods, ``bool``,
``len``, ``str``, ``iter`` ... used from the judge; it equals only itself) (``_Handle``).
Names the test uses but does not define come from the spec's ``helpers`` (the prompt's definitions), never
from the solution; the entry point's own name means the candidate.

``probe.probe_assert`` runs a test with trivial candidates only (no solution at all) and tells whether
one passes it: such a test earns no partial credit (see ``tasks.rewards.code.finish``).
"""
import os
import signal
import sys
import time

if __name__ != "cleaner_judge":  # shipped into the sandbox as one program, these names are defined above
    from tasks.rewards.judge.run import emit, verdict_channel
    from tasks.rewards.judge.wire import (
        CHANNEL_EXIT,
        PASSED_MARK,
        Unencodable,
        decode,
        encode,
        has_nan,
        recv,
        send_trusted,
    )

_CRASH_SIGNALS = (4, 6, 7, 8, 11)  # SIGILL, SIGABRT, SIGBUS, SIGFPE, SIGSEGV
LOOK_S = 0.05  # how often the judge looks at the CPU time its limit counts

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
        self.fault, self.raised, self.hints, self.calls = None, None, set(), 0
        self.reached, self.fault_at = [0], None  # the tests passed so far; and when the first fault came
        data = len(program).to_bytes(4, "big") + program
        while data:
            data = data[os.write(self.req_w, data):]

    def fail(self, kind):
        if self.fault is None:
            self.fault, self.fault_at = kind, self.reached[0]
        return _Fault(kind)

    def passed(self):
        """Tests passed in order before the first failure (a fault the test swallowed is one)."""
        if not self.calls:
            return 0
        return self.reached[0] if self.fault_at is None else min(self.reached[0], self.fault_at)

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

    def call(self, target, args, kwargs, op="call"):
        """Call ``target`` (a name, or a handle number) in the child, or advance a handle (``op``
        ``next``); mutable arguments take back what the call did to them, also when it raised."""
        try:
            payload = {"args": encode(list(args)), "kwargs": encode(dict(kwargs)), "op": op}
        except Unencodable:
            raise self.fail("harness_limit") from None
        payload["name" if type(target) is str else "handle"] = target
        self.calls += 1
        reply = self.rpc(payload)
        try:
            for index, encoded in dict(reply.get("args") or {}).items():
                _write_back(args[int(index)], decode(encoded))
        except (ValueError, TypeError, RecursionError, IndexError, KeyError):
            raise self.fail("tampering") from None
        if "value" not in reply and "handle" not in reply:
            raise self.ended(reply)
        try:
            if "handle" in reply:
                value = _Handle(self, int(reply["handle"]), str(reply.get("hkind")), reply.get("heq") is True)
            else:
                value = decode(reply["value"])
        except (ValueError, TypeError, RecursionError, IndexError, KeyError):
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


def _write_back(arg, new):
    """Make the judge's argument equal to what the call left of it (lists, dicts, sets, in place)."""
    if type(arg) is not type(new):
        raise TypeError("mutated argument changed type")
    if type(arg) is list:
        arg[:] = new
    else:
        arg.clear()
        arg.update(new)


class _Remote:
    """``candidate`` in the judge: each call, and each attribute read (a class's ``candidate.parse``), runs
    in the child."""

    def __init__(self, child, name):
        self._child, self.__name__ = child, name

    def __call__(self, *args, **kwargs):
        return self._child.call(self.__name__, args, kwargs)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self._child.call(self.__name__, (name,), {}, op="attr")


class _Handle:
    """A closure, an iterator or an object the solution returned (``kind`` ``call``, ``iter``, ``obj``): it
    stays in the child, used from here: attributes and methods of any (a generator's ``send``); an object's ``bool``, ``len``, ``str``,
    ``repr``, ``iter``, ``[key]`` and ``in`` run there; it equals only itself (``eq``: its class has an
    ``__eq__`` of its own, which is not trusted: comparing it is hinted ``fake_value``). ``next(it)``
    advances an iterator by one item, as Python does; iterating it (``for``, ``list``, ``sum``) reads
    ahead in batches of 1, 2, 4 ... 512."""

    __hash__ = object.__hash__

    def __init__(self, child, number, kind, eq=False):
        self._child, self._number, self._kind, self._eq = child, number, kind, eq
        self._items, self._done, self._batch, self._bulk = [], False, 1, False

    def __call__(self, *args, **kwargs):
        return self._child.call(self._number, args, kwargs)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self._child.call(self._number, (name,), {}, op="attr")

    def _apply(self, name, *args):
        if self._kind != "obj":
            raise TypeError(f"returned {self._kind} object does not support {name}")
        return self._child.call(self._number, (name, *args), {}, op="apply")

    def __eq__(self, other):
        if self._eq and other is not self:
            self._child.hints.add("fake_value")
        return NotImplemented

    def __bool__(self):
        return self._apply("bool") if self._kind == "obj" else True

    def __len__(self):
        return self._apply("len")

    def __getitem__(self, key):
        return self._apply("getitem", key)

    def __contains__(self, item):
        if self._kind == "iter":
            return any(x is item or x == item for x in self)
        return self._apply("contains", item)

    def __str__(self):
        return self._apply("str") if self._kind == "obj" else object.__repr__(self)

    def __repr__(self):
        return self._apply("repr") if self._kind == "obj" else object.__repr__(self)

    def __iter__(self):
        if self._kind == "obj":
            return iter(self._apply("iter"))
        if self._kind != "iter":
            raise TypeError("returned object is not iterable")
        self._bulk = True
        return self

    def __next__(self):
        if self._kind != "iter":
            raise TypeError("returned object is not an iterator")
        if not self._items:
            if self._done:
                raise StopIteration
            batch = self._batch if self._bulk else 1
            items, self._done = self._child.call(self._number, (batch,), {}, op="next")
            self._items = list(reversed(items))
            if self._bulk:
                self._batch = min(2 * self._batch, 512)  # lazy at first, few round trips for many
            if not self._items:
                raise StopIteration
        return self._items.pop()


def _undumpable():
    """``prctl(PR_SET_DUMPABLE, 0)``, checked with ``PR_GET_DUMPABLE``: no ptrace, no /proc/<pid>/mem."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(4, 0, 0, 0, 0) == 0 and libc.prctl(3, 0, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def compile_test(test_src):
    """The test code compiled with int literals of any length (an expected answer may have more than the
    4300 digits Python reads by default); the limit stays on for what the test does when it runs."""
    if not hasattr(sys, "set_int_max_str_digits"):
        return compile(test_src, "<check>", "exec")
    old = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        return compile(test_src, "<check>", "exec")
    finally:
        sys.set_int_max_str_digits(old)


def test_namespace(prefix, helpers, reached):
    """The test's globals: the import prefix, the prompt's definitions (trusted spec fields) and the
    mark the marked ``check`` calls after each test, which keeps in ``reached[0]`` how many passed."""
    import builtins

    def passed(count):
        reached[0] = count

    tns = {"__name__": "__cleaner_check__", "__builtins__": builtins}
    exec(prefix, tns)
    exec(helpers, tns)
    tns[PASSED_MARK] = passed
    return tns


def _cpu_seconds(started) -> float:
    """CPU time used so far by the judge and the solution's process (the limit counts both, as the sandbox does)."""
    used = time.process_time()
    if started:
        try:
            with open(f"/proc/{started[0].pid}/stat") as fh:
                utime, stime = fh.read().rsplit(")", 1)[1].split()[11:13]
            used += (int(utime) + int(stime)) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError):
            pass
    return used


def _time_up(channel, started):
    """The time limit, hit while ``check`` ran: a ``timeout`` verdict keeping the tests passed so far."""
    child = started[0] if started else None
    emit(channel, {"pass": False, "kind": (child.fault if child else None) or "timeout", "exc": None,
                   "hints": sorted(child.hints) if child else [], "passed": child.passed() if child else 0})
    if child:
        child.kill()
    os._exit(0)


def judge_assert(solution, prefix, helpers, test_src, entry, shadow, timeout, program):
    """Run ``check(candidate)`` of ``test_src`` (marked by ``tasks.rewards.cases``) once, whole, here
    against the solution in a fresh child and emit ``{"pass", "kind", "exc", "hints", "passed"}``:
    ``pass`` when ``check`` returned, ``passed`` the tests passed in order before it stopped.
    ``helpers``: the prompt's definitions the test uses (HumanEval's ``poly``), from the spec, never
    from the solution; ``shadow``: names the test defines; ``program``: this file, marshalled, for the
    child. A run that never called the candidate does not pass and passed no test."""
    channel = verdict_channel()
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 1)  # the test code's own prints stay off the verdict channel
    os.close(null)
    if not _undumpable():
        emit(channel, {"error": "the judge could not make itself non-dumpable (prctl PR_SET_DUMPABLE)"})
        return
    started = []
    signal.signal(signal.SIGALRM, lambda signum, frame: _cpu_seconds(started) >= timeout and _time_up(channel, started))
    signal.setitimer(signal.ITIMER_REAL, LOOK_S, LOOK_S)  # the limit is CPU time: the judge's and the solution's
    try:
        child = _Child(program)
    except OSError as err:
        emit(channel, {"error": f"could not start the solution's process: {err}"})
        return
    started.append(child)
    kind, detail = "pass", None
    try:
        tns = test_namespace(prefix, helpers, child.reached)
        load = child.rpc({"path": sys.path, "prefix": prefix, "source": solution, "shadow": shadow})
        if not load.get("ok"):
            raise child.ended(load)
        if load.get("shadowed"):
            child.hints.add("redefined_helper")
        candidate = _Remote(child, entry)
        tns.setdefault(entry, candidate)  # a test naming the entry point means the candidate (HumanEval/33)
        exec(compile_test(test_src), tns)
        tns["check"](candidate)
        if not child.calls:
            kind, detail = "wrong_answer", "candidate never called"
    except _Fault as fault:
        kind = str(fault)
    except BaseException as exc:  # noqa: BLE001 - every ending is a verdict
        detail = type(exc).__name__
        kind = ("keyboard_interrupt" if isinstance(exc, KeyboardInterrupt)
                else "runtime_error" if exc is child.raised else "wrong_answer")
    signal.setitimer(signal.ITIMER_REAL, 0)
    kind = child.fault or kind  # a fault the test code swallowed still fails the test
    child.kill()
    emit(channel, {"pass": kind == "pass", "kind": kind, "exc": detail, "hints": sorted(child.hints),
                   "passed": child.passed()})
