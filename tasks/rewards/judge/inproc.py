"""The assert format (``check(candidate)``) in the answer's own interpreter, as the reference harness runs it.

``judge_assert`` runs the prompt's helpers, the answer, the test and ``check(entry)`` in this process and
one namespace (``exec(..., {})``: ``__name__`` is the builtins module's, as in HumanEval's harness), so
every value the test sees is the answer's own object: identity, aliasing, mutation through any route,
exceptions, output and every type behave as Python makes them. What it adds, all before the answer loads:

- **a verdict channel the answer cannot write**: a close-on-exec copy of fd 1 (fd 1 itself becomes a memfd
  that the answer's and the test's prints go to) on which every line carries a nonce drawn here; the first
  line (``hello``) is written before the answer loads; the host refuses any other line (``forged_verdict``);
- **an audit hook** (``sys.addaudithook``: nothing removes one) that alone holds the nonce and every
  piece of the verdict (tests passed, faults, hints): no frame, global or module the answer can reach
  refers to them. Everything else reports to it with ``sys.audit("cleaner.<what>")`` and the hook checks
  who called (the instrumented ``check`` called by the judge's own frame for a mark; the judge's frame for
  the final verdict; the comparison hooks, the exit wrappers, the timer, the profile function for theirs).
  It writes a ``taint`` line at once (``tampering``) when code that is not the test's, the judge's or a
  library's that keeps frames to itself gets a frame (``sys._getframe``, ``tb_frame``, ``gi_frame``: once
  an answer holds one, ``f_back`` reaches every frame above unaudited), walks ``gc``, sets a trace or
  profile function or another audit hook, reads memory through ``ctypes``, forks, opens
  ``/proc/<pid>/{mem,fd,maps,environ,...}``, installs a Python signal handler (its frame argument is
  another route to frames) or reads or sets ``__code__`` / ``__defaults__`` of the test's or judge's
  functions;
- **comparison hooks** (``compare``): ``==``, ``in`` and ``-`` in ``check`` ask a value whose comparison
  is the answer's code a second time (``fake_value``);
- **snapshots** compared at each test's mark and after ``check``: the builtins, the modules already
  imported, the attributes of the modules the test imports, ``sys.meta_path`` (``tampering``); the names
  the test takes from the helpers are put back to the trusted ones before the test loads
  (``redefined_helper`` when the answer's differ); ``sys.exit`` / ``exit`` / ``quit`` report a call even
  when the test swallows the exit (``system_exit``).

The final line is ``{"pass", "kind", "exc", "hints", "passed", "tampered"}``, written by the hook, which
then ends the process with ``os._exit(0)`` (no ``atexit`` handler of the answer's runs after the verdict).
"""
import os
import sys

if __name__ != "cleaner_judge":  # shipped into the sandbox as one program, these names are defined above
    from tasks.rewards.judge.compare import make_compare
    from tasks.rewards.judge.run import memfd, scan_marks
    from tasks.rewards.judge.watch import arm, code_objects, reachable, same_function, snapshot, tampered, test_imports
    from tasks.rewards.judge.wire import CHANNEL_EXIT, EQ_HOOK, IN_HOOK, PASSED_MARK, SUB_HOOK, VERDICT_MARK, dump

_ALWAYS = {"gc.get_objects": "gc", "gc.get_referrers": "gc", "gc.get_referents": "gc", "sys._current_frames": "frames",
           "sys.settrace": "settrace", "sys.setprofile": "setprofile", "sys.addaudithook": "audit hook",
           "os.fork": "fork", "os.forkpty": "fork", "ctypes.string_at": "ctypes", "ctypes.wstring_at": "ctypes",
           "ctypes.cdata": "ctypes", "ctypes.cdata/buffer": "ctypes", "function.__new__": "function.__new__"}
_FRAME_ATTRS = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame"})
_FUNC_ATTRS = frozenset({"__code__", "__defaults__", "__kwdefaults__"})
_LEAKY = ("/inspect.py", "/traceback.py", "/logging/__init__.py", "/bdb.py", "/pdb.py", "/asyncio/")
"""Library files that hand frames to their caller: a frame they take counts as the answer's."""
_PROC_PARTS = ("/mem", "/fd", "/maps", "/smaps", "/pagemap", "/environ", "/task", "/map_files")
_WATCHED = frozenset({*_ALWAYS, "sys._getframe", "object.__getattr__", "object.__setattr__", "object.__delattr__",
                      "open", "ctypes.dlsym"})

def _channel():
    """A close-on-exec copy of fd 1 above fd 2, and its identity (device, inode)."""
    import fcntl

    fd = fcntl.fcntl(1, fcntl.F_DUPFD_CLOEXEC, 3)
    st = os.fstat(fd)
    return fd, (st.st_dev, st.st_ino)


def _make_line(fd, ident, nonce, _fstat=os.fstat, _write=os.write, _exit=os._exit, _dump=dump, _mark=VERDICT_MARK):
    """The writer of the channel's lines (the nonce in each); exits ``CHANNEL_EXIT`` when the channel is gone."""

    def line(obj, _fd=fd, _ident=ident, _nonce=nonce):
        try:
            st = _fstat(_fd)
            if (st.st_dev, st.st_ino) != _ident:
                _exit(CHANNEL_EXIT)
            obj["n"] = _nonce
            data = (_mark + _dump(obj) + "\n").encode()
            while data:
                data = data[_write(_fd, data):]
        except OSError:
            _exit(CHANNEL_EXIT)

    return line


def _install_hook(line, codes, libs, check_code, snap, out, reporters,
                  _addaudithook=sys.addaudithook, _getframe=sys._getframe, _setprofile=sys.setprofile,
                  _type=type, _str=str, _bytes=bytes, _getattr=getattr, _min=min, _sorted=sorted, _any=any,
                  _fstat=os.fstat, _exit=os._exit, _stdout=sys.__stdout__, _tampered=tampered, _scan=scan_marks):
    """Install the audit hook that holds the verdict; nothing keeps a reference to it but the interpreter."""
    import signal

    _setitimer, _itimer = signal.setitimer, signal.ITIMER_PROF
    fd1 = _fstat(1)
    v = {"busy": False, "reached": 0, "fault_at": None, "called": False, "judge": None, "tampered": []}
    taints, hints = [], set()

    def trusted(code):
        return code in codes or code.co_filename == "<cleaner-judge>"

    def in_libs(code):
        name = code.co_filename
        return name.startswith("<frozen ") or _any(name.startswith(d) for d in libs)

    def library(frame):
        """Does a library take this frame for itself: a library's code that hands frames to its caller
        (``_LEAKY``) only when a library or the test called it (``logging``'s ``findCaller``,
        ``traceback.format_exc``)."""
        code = frame.f_code
        if not in_libs(code):
            return False
        if not _any(part in code.co_filename for part in _LEAKY):
            return True
        back = frame.f_back
        return back is not None and (in_libs(back.f_code) or trusted(back.f_code))

    def fault():
        if v["fault_at"] is None:
            v["fault_at"] = v["reached"]

    def taint(why):
        fault()
        taints.append(why)
        line({"taint": why})

    def final(kind, exc):
        _setitimer(_itimer, 0)
        try:
            _stdout.flush()
        except BaseException:  # noqa: BLE001 - a closed stream
            pass
        passed = v["reached"] if v["fault_at"] is None else _min(v["reached"], v["fault_at"])
        tampered = v["tampered"] or _tampered(snap)
        try:
            st = _fstat(1)
            moved = (st.st_dev, st.st_ino) != (fd1.st_dev, fd1.st_ino)
        except OSError:
            moved = True
        if moved:
            hints.add("channel_closed")
        if _scan(out)[0]:
            hints.add("forged_verdict")
        if not v["called"]:
            passed = 0
            if kind == "pass":
                kind, exc = "wrong_answer", "candidate never called"
        for bad in ("system_exit", "fake_value"):
            if bad in hints and kind in ("pass", "wrong_answer", "runtime_error"):
                kind = bad
        if tampered or taints:
            kind, passed = "tampering", 0
        line({"pass": kind == "pass", "kind": kind, "exc": exc, "hints": _sorted(hints), "passed": passed,
              "tampered": tampered + taints})
        _exit(0)

    def own(event, args, caller):
        """An event of the judge's: who may send it, and what it does."""
        code = caller.f_code
        if event == "cleaner.start" and v["judge"] is None:
            v["judge"] = caller
        elif event == "cleaner.final" and caller is v["judge"]:
            final(args[0], args[1])
        elif event == "cleaner.hint" and caller is v["judge"]:
            hints.add(args[0])
        elif event == "cleaner.mark" and code is check_code and caller.f_back is v["judge"]:
            v["reached"] = args[0]
            if not v["tampered"]:  # builtins patched for a while and put back are seen here too
                v["tampered"] = _tampered(snap)
        elif event in ("cleaner.fake", "cleaner.nan") and code in reporters["compare"]:
            if event == "cleaner.fake":
                hints.add("fake_value")
                fault()
            else:
                hints.add("nan")
        elif event == "cleaner.exit" and code is reporters["exit"]:
            hints.add("system_exit")
            fault()
        elif event == "cleaner.called" and code is reporters["profile"]:
            v["called"] = True
            _setprofile(None)
        elif event == "cleaner.timeout" and code is reporters["timer"]:
            final("timeout", None)
        elif event == "cleaner.signal" and code is reporters["signal"]:
            taint("signal handler")
        else:
            taint("forged " + event)

    def reach(event, args, caller):
        """A reach into the test's or the judge's internals, or None."""
        if event in _ALWAYS:
            return _ALWAYS[event]
        if event == "sys._getframe":
            return None if library(caller) else "frame"
        if event == "object.__getattr__":
            obj, name = args[0], args[1]
            if name in _FRAME_ATTRS:
                return None if library(caller) else "frame"
            if name in _FUNC_ATTRS and _type(obj).__name__ == "function" and trusted(obj.__code__):
                return "judge function"
            return None
        if event in ("object.__setattr__", "object.__delattr__"):
            obj = args[0]
            return "judge function" if _type(obj).__name__ == "function" and trusted(obj.__code__) else None
        if event == "open":
            path = args[0].decode("latin-1") if _type(args[0]) is _bytes else args[0]
            if (_type(path) is _str and (path.startswith("/proc/") or path.startswith("/dev/fd"))
                    and _any(part in path for part in _PROC_PARTS)):
                return "/proc"
            return None
        name = args[1] if event == "ctypes.dlsym" and len(args) > 1 else None
        return "ctypes" if _type(name) is _str and (name.startswith("Py") or name.startswith("_Py")) else None

    def hook(event, args, _watched=_WATCHED):
        if v["busy"] or not (event in _watched or event.startswith("cleaner.")):
            return
        v["busy"] = True
        try:
            caller = _getframe(1)
            if event.startswith("cleaner."):
                own(event, args, caller)
            elif not trusted(caller.f_code):
                why = reach(event, args, caller)
                if why is not None:
                    taint(why)
        except BaseException:  # noqa: BLE001 - a hostile argument: the hook still returns
            pass
        finally:
            v["busy"] = False

    _addaudithook(hook)


def _ended(exc, _isinstance=isinstance, _exit=SystemExit, _interrupt=KeyboardInterrupt, _type=type,
           _tb=BaseException.__dict__["__traceback__"]):
    """The kind of an exception that ended ``check`` (the answer's, the test's failure, an exit) and its name."""
    name = _type(exc).__name__
    if _isinstance(exc, _exit):
        return "system_exit", name
    if _isinstance(exc, _interrupt):
        return "keyboard_interrupt", name
    tb = _tb.__get__(exc)
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<solution>":
            return "runtime_error", name
        tb = tb.tb_next
    return "wrong_answer", name


def judge_assert(solution, prefix, helpers, test_src, entry, shadow, lookup, timeout):
    """Run helpers, ``solution``, the instrumented ``test_src`` and ``check(entry)`` here, once, whole; the
    audit hook writes the verdict (see the module docstring): ``pass`` when ``check`` returned and nothing
    was tampered with; ``passed``, the tests passed in order before the first failure or fault."""
    import signal
    import types

    depth, f, outer = 0, sys._getframe(), set()
    while f is not None:
        outer.add(f.f_code)
        depth, f = depth + 1, f.f_back
    fd, ident = _channel()
    line = _make_line(fd, ident, os.urandom(16).hex())
    line({"hello": True})
    out = memfd(b"")
    sys.stdout.flush()
    os.dup2(out, 1)
    if not _undumpable():
        line({"error": "the judge could not make itself non-dumpable (prctl PR_SET_DUMPABLE)"})
        os._exit(0)
    try:  # the judge's own setup: a failure here is the grader's (infrastructure), never the answer's
        test_code = compile_test(test_src)
        check_code = next(c for c in test_code.co_consts if type(c) is type(test_code) and c.co_name == "check")
        test_codes = code_objects(test_code, set())
        codes = test_codes | outer
        ns = {}
        for src, name in ((prefix, "<prefix>"), (helpers, "<helpers>")):
            compiled = compile(src, name, "exec")
            codes |= code_objects(compiled, set())
            exec(compiled, ns)
        for name in test_imports(test_src):
            try:
                __import__(name)
            except BaseException:  # noqa: BLE001 - the test will meet the same error itself
                pass
        trusted = {k: ns[k] for k in lookup if k in ns}
        writable = tuple({os.getcwd(), "/tmp", "/dev/shm", "/work", "/var/tmp"})
        libs = tuple(p for p in sys.path if p.startswith("/") and not any(p.startswith(w) for w in writable))
        audit = sys.audit
        eq, contains, sub = make_compare(frozenset(codes), writable)
        reach = reachable()
        reporters = arm(reach, audit, not any("SystemExit" in c.co_names for c in test_codes))
        reporters["compare"] = frozenset(fn.__code__ for fn in (eq, contains, sub))
        snap = snapshot(test_imports(test_src))
        _install_hook(line, frozenset(codes), libs, check_code, snap, out, reporters)
    except Exception as err:  # noqa: BLE001 - reported as an error line, read as HarnessError
        line({"error": f"the judge could not set up the test: {type(err).__name__}: {err}"})
        os._exit(0)
    del line, snap
    sys.modules["__main__"] = types.ModuleType("__main__")  # the executor's: it holds the judge program
    sys.setrecursionlimit(sys.getrecursionlimit() + depth + 8)
    audit("cleaner.start")
    signal.setitimer(signal.ITIMER_PROF, timeout, 0.05)  # re-fires: a handler run inside the hook is not lost
    try:
        exec(compile(solution, "<solution>", "exec"), ns)
        if any(n in ns for n in shadow) or "check" in ns:
            audit("cleaner.hint", "redefined_helper")
        for k, trusted_value in trusted.items():
            if ns.get(k) is not trusted_value:
                if not same_function(ns.get(k), trusted_value):
                    audit("cleaner.hint", "redefined_helper")
                ns[k] = trusted_value
        exec(test_code, ns)
        check, candidate = ns["check"], ns[entry]
        sys.setprofile(reach["make_profile"](candidate, "<solution>", audit, isinstance(candidate, type)))
        check(candidate, **{PASSED_MARK: audit, EQ_HOOK: eq, IN_HOOK: contains, SUB_HOOK: sub})
        kind, detail = "pass", None
    except BaseException as exc:  # noqa: BLE001 - every ending is a verdict
        kind, detail = _ended(exc)
    sys.setprofile(None)
    audit("cleaner.final", kind, detail)
    os._exit(CHANNEL_EXIT)  # the hook ends the process with the verdict; reaching here means it could not


def _undumpable():
    """``prctl(PR_SET_DUMPABLE, 0)``, checked with ``PR_GET_DUMPABLE``: no ptrace, no /proc/<pid>/mem."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(4, 0, 0, 0, 0) == 0 and libc.prctl(3, 0, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def compile_test(test_src):
    """The test code compiled (filename ``<check>``) with int literals of any length (an expected answer may
    have more than the 4300 digits Python reads by default); the limit stays on for what the test does."""
    if not hasattr(sys, "set_int_max_str_digits"):
        return compile(test_src, "<check>", "exec")
    old = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        return compile(test_src, "<check>", "exec")
    finally:
        sys.set_int_max_str_digits(old)


def test_namespace(prefix, helpers):
    """The probe's globals: the import prefix and the prompt's definitions (trusted spec fields)."""
    ns = {}
    exec(compile(prefix, "<prefix>", "exec"), ns)
    exec(compile(helpers, "<helpers>", "exec"), ns)
    return ns
