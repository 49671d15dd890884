"""The assert format (``check(candidate)``) in the answer's own interpreter, as the reference harness runs it.

``judge_assert`` runs the prompt's helpers, the answer, the test and ``check(entry)`` in this process and
one namespace (``exec(..., {})``: ``__name__`` is the builtins module's, as in HumanEval's harness), so
every value the test sees is the answer's own object: identity, aliasing, mutation through any route,
exceptions, output and every type behave as Python makes them. What it adds, all set up before the answer
loads:

- **a verdict channel the answer cannot write**: a close-on-exec copy of fd 1 (fd 1 itself becomes a memfd
  that the answer's and the test's prints go to) on which every line carries a nonce drawn here; the first
  line (``hello``) is written before the answer loads, so a line the answer writes lacks the nonce unless
  it read this process's memory, and the host refuses any such stdout (``forged_verdict``);
- **an audit hook** (``sys.addaudithook``, which nothing removes) that reports at once, on the channel,
  what reaches the judge's or the test's internals: a frame of the test, the judge or the executor
  (``sys._getframe``, ``tb_frame``, ``f_back``, ``gi_frame``), ``gc`` object walks, ``sys.settrace`` /
  ``setprofile`` / ``addaudithook`` / ``_current_frames``, ``ctypes`` memory reads, ``os.fork``, opening
  ``/proc/<pid>/{mem,fd,...}``, reading or setting ``__code__`` / ``__defaults__`` of the test's or judge's
  functions (``tampering``);
- **comparison hooks** (``tasks.rewards.cases``): ``==``, ``in`` and ``-`` in ``check`` compute what the
  operator computes; when a value whose ``__eq__`` / ``__contains__`` / ``__sub__`` is the answer's code
  (not a builtin's or the stdlib's) passes, the same comparison is asked again against a different value
  (the expected value with one leaf changed, or a fresh object): equal to both is ``fake_value``;
- **snapshots** compared after ``check``: the builtins, the modules already imported and the attributes
  of the modules the test imports, ``sys.meta_path`` (``tampering``); the names the test takes from the
  helpers are put back to the trusted ones before the test loads (``redefined_helper`` when the answer's
  differ); ``sys.exit`` / ``exit`` / ``quit`` report a call even when the test swallows the exit.

The final line is ``{"pass", "kind", "exc", "hints", "passed", "tampered"}``; then this process ends with
``os._exit(0)`` (no ``atexit`` or thread of the answer's runs after the verdict). Functions the answer can
reach (the exit wrappers, the timer's handler, the profile function) hold nothing but default arguments.
"""
import os
import sys

if __name__ != "cleaner_judge":  # shipped into the sandbox as one program, these names are defined above
    from tasks.rewards.judge.run import memfd, scan_marks
    from tasks.rewards.judge.wire import (
        CHANNEL_EXIT,
        EQ_HOOK,
        IN_HOOK,
        PASSED_MARK,
        SUB_HOOK,
        VERDICT_MARK,
        dump,
    )

_PROTECTED_FILES = ("<check>", "<helpers>", "<prefix>", "<cleaner-judge>")
_FRAME_ATTRS = frozenset({"tb_frame", "f_back", "gi_frame", "cr_frame", "ag_frame"})
_FUNC_ATTRS = frozenset({"__code__", "__defaults__", "__kwdefaults__"})
_ALWAYS = {"gc.get_objects": "gc", "gc.get_referrers": "gc", "gc.get_referents": "gc", "sys._current_frames": "frames",
           "sys.settrace": "settrace", "sys.setprofile": "setprofile", "sys.addaudithook": "audit hook",
           "os.fork": "fork", "os.forkpty": "fork", "ctypes.string_at": "ctypes", "ctypes.wstring_at": "ctypes",
           "ctypes.cdata": "ctypes", "ctypes.cdata/buffer": "ctypes", "function.__new__": "function.__new__"}
_PROC_PARTS = ("/mem", "/fd", "/maps", "/smaps", "/pagemap", "/environ", "/task", "/map_files")
_WATCHED = frozenset({*_ALWAYS, "sys._getframe", "object.__getattr__", "object.__setattr__", "object.__delattr__",
                      "open", "ctypes.dlsym"})
_PLAIN = frozenset({int, float, str, bool, type(None), bytes, complex})
_HEAP = 1 << 9  # Py_TPFLAGS_HEAPTYPE
_WALK = 2000  # values looked at per comparison at most


class _Sentinel:
    """A fresh object no honest value equals and no honest container holds."""

    __slots__ = ()


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


def _protected(code, codes):
    return code in codes or code.co_filename in _PROTECTED_FILES


def _make_hook(state, codes, line):
    """The audit hook: a reach into the judge's or the test's internals is reported on the channel at once."""
    busy, taints = state["busy"], state["taints"]

    def taint(why, _append=taints.append):
        if not taints:
            state["fault_at"] = state["reached"][0] if state["fault_at"] is None else state["fault_at"]
        _append(why)
        line({"taint": why})

    def hook(event, args, _watched=_WATCHED, _always=_ALWAYS, _type=type, _str=str, _bytes=bytes,
             _getattr=getattr, _getframe=sys._getframe):
        if busy[0] or event not in _watched:
            return
        busy[0] = True
        try:
            caller = _getframe(1)
            if caller is not None and _protected(caller.f_code, codes):
                return  # the test's (or the judge's) own doing
            if event in _always:
                taint(_always[event])
            elif event == "sys._getframe":
                if args and _protected(args[0].f_code, codes):
                    taint("frame")
            elif event == "object.__getattr__":
                obj, name = args[0], args[1]
                if name in _FRAME_ATTRS:
                    frame = _getattr(obj, name, None)
                    if frame is not None and _type(frame).__name__ == "frame" and _protected(frame.f_code, codes):
                        taint("frame")
                elif name in _FUNC_ATTRS and _type(obj).__name__ == "function" and _protected(obj.__code__, codes):
                    taint("judge function")
            elif event in ("object.__setattr__", "object.__delattr__"):
                obj = args[0]
                if _type(obj).__name__ == "function" and _protected(obj.__code__, codes):
                    taint("judge function")
            elif event == "open":
                path = args[0]
                if _type(path) is _bytes:
                    path = path.decode("latin-1")
                if (_type(path) is _str and (path.startswith("/proc/") or path.startswith("/dev/fd"))
                        and any(part in path for part in _PROC_PARTS)):
                    taint("/proc")
            elif event == "ctypes.dlsym":
                name = args[1] if len(args) > 1 else None
                if _type(name) is _str and (name.startswith("Py") or name.startswith("_Py")):
                    taint("ctypes")
        except BaseException:  # noqa: BLE001 - a hostile argument: the hook still returns
            pass
        finally:
            busy[0] = False

    return hook


def _trusted_code(code, cls, codes, writable):
    """Is a Python function's code a builtin's, the stdlib's or the test's (never the answer's)."""
    name = code.co_filename
    if code in codes:
        return True
    if name.startswith("<"):
        return name == "<string>" and "__dataclass_fields__" in type.__dict__["__dict__"].__get__(cls)
    return not any(name.startswith(d) for d in writable)


def _untrusted_type(t, names, state):
    """Does type ``t`` take one of ``names`` (``__eq__``, ``__contains__``, ``__sub__``) from the answer's code
    (asked afresh each time: the answer may change a class between two comparisons)."""
    busy, codes, writable = state["busy"], state["codes"], state["writable"]
    found = False
    was, busy[0] = busy[0], True
    try:
        for cls in type.__dict__["__mro__"].__get__(t):
            if not type.__dict__["__flags__"].__get__(cls) & _HEAP:
                continue
            own = type.__dict__["__dict__"].__get__(cls)
            for name in names:
                f = own.get(name)
                if f is None or type(f).__name__ == "wrapper_descriptor":
                    continue
                if type(f).__name__ != "function" or not _trusted_code(f.__code__, cls, codes, writable):
                    found = True
    except BaseException:  # noqa: BLE001 - a type that cannot be read is not trusted
        found = True
    finally:
        busy[0] = was
    return found


def _suspect(v, names, state, _islice=__import__("itertools").islice):
    """(an untrusted value somewhere in ``v``, a NaN somewhere in ``v``), looking at ``_WALK`` values at most."""
    stack, seen, nan = [v], 0, False
    while stack and seen < _WALK:
        o = stack.pop()
        seen += 1
        t = type(o)
        if t in _PLAIN:
            nan = nan or (t is float and o != o)
            continue
        if t is list or t is tuple or t is set or t is frozenset:
            stack.extend(_islice(o, _WALK))
            continue
        if t is dict:
            stack.extend(_islice(o.keys(), _WALK))
            stack.extend(_islice(o.values(), _WALK))
            continue
        if _untrusted_type(t, names, state):
            return True, nan
        try:
            if isinstance(o, dict):
                stack.extend(_islice(dict.keys(o), _WALK))
                stack.extend(_islice(dict.values(o), _WALK))
            elif isinstance(o, list):
                stack.extend(_islice(list.__iter__(o), _WALK))
            elif isinstance(o, tuple):
                stack.extend(_islice(tuple.__iter__(o), _WALK))
            elif isinstance(o, (set, frozenset)):
                stack.extend(_islice(set.__iter__(o) if isinstance(o, set) else frozenset.__iter__(o), _WALK))
        except BaseException:  # noqa: BLE001 - a container that lies about its class
            return True, nan
    return False, nan


def _other(v):
    """A plain value different from ``v`` (an honest value equals at most one of them)."""
    t = type(v)
    if t is bool:
        return not v
    if t is int or t is float or t is complex:
        return v + 1 if v == v and v + 1 != v else _Sentinel()
    if t is str:
        return v + "\x00"
    if t is bytes:
        return v + b"\x00"
    if t is list or t is tuple:
        return t([_other(v[0]), *v[1:]]) if v else t([_Sentinel()])
    if t is dict and v:
        k = next(iter(v))
        return {**v, k: _other(v[k])}
    return _Sentinel()


def _aligned(fake, honest, names, state):
    """``honest`` with the leaf facing ``fake``'s untrusted value changed (lists, tuples and dicts followed)."""
    tf, th = type(fake), type(honest)
    if (tf is list or tf is tuple) and tf is th and len(fake) == len(honest):
        for i, x in enumerate(fake):
            if _suspect(x, names, state)[0]:
                return th([*honest[:i], _aligned(x, honest[i], names, state), *honest[i + 1:]])
    if tf is dict and th is dict and fake.keys() == honest.keys():
        for k, x in fake.items():
            if _suspect(x, names, state)[0]:
                return {**honest, k: _aligned(x, honest[k], names, state)}
    return _other(honest)


def _make_compare(state):
    """The ``==``, ``in`` and ``-`` of the instrumented ``check`` (``tasks.rewards.cases``)."""
    hints = state["hints"]
    plain = _PLAIN
    eq_names, in_names, sub_names = ("__eq__",), ("__contains__", "__eq__"), ("__sub__", "__rsub__")

    def fake():
        if "fake_value" not in hints:
            hints.add("fake_value")
            if state["fault_at"] is None:
                state["fault_at"] = state["reached"][0]

    def truth(r):
        if type(r) is bool:
            return r
        return not _untrusted_type(type(r), ("__bool__", "__len__"), state) or fake() or False

    def eq(a, b, _type=type):
        r = a == b
        if _type(a) in plain and _type(b) in plain:
            if r is False and (a != a or b != b):
                hints.add("nan")
            return r
        sa, na = _suspect(a, eq_names, state)
        sb, nb = _suspect(b, eq_names, state)
        if (na or nb) and r is False:
            hints.add("nan")
        if (sa or sb) and truth(r):
            try:
                if sa and not sb:
                    again = a == _aligned(a, b, eq_names, state)
                elif sb and not sa:
                    again = _aligned(b, a, eq_names, state) == b
                else:
                    again = a == _Sentinel()
                if type(again) is not bool or again:
                    fake()
            except Exception:  # noqa: BLE001 - an honest __eq__ may refuse a foreign value
                pass
        return r

    def contains(a, b, _type=type):
        r = a in b
        if r and (_type(b) not in plain or _type(a) not in plain):
            if _suspect(b, in_names, state)[0] or _suspect(a, eq_names, state)[0]:
                try:
                    if _Sentinel() in b:
                        fake()
                except Exception:  # noqa: BLE001
                    pass
        return r

    def sub(a, b, _type=type):
        r = a - b
        if _type(a) in plain and _type(b) in plain:
            return r
        if _suspect(a, sub_names, state)[0] or _suspect(b, sub_names, state)[0]:
            try:
                again = a - _other(b) if _type(b) in plain else _other(a) - b
                if _type(r) not in plain or _type(again) not in plain or again == r:
                    fake()
            except Exception:  # noqa: BLE001
                pass
        return r

    return eq, contains, sub


_REACHABLE = '''
def make_exit(record, raiser):
    def exit(*args, _record=record, _raiser=raiser):
        _record()
        raise _raiser(*args)
    return exit


def make_timer(finish):
    def on_timer(signum, frame, _finish=finish):
        _finish("timeout")
    return on_timer


def make_profile(mark, entry, solution_file):
    def profile(frame, event, arg, _mark=mark, _entry=entry, _file=solution_file):
        if (event == "call" and frame.f_code.co_filename == _file) or (event == "c_call" and arg is _entry):
            _mark()
    return profile
'''
"""Functions the answer can reach (``sys.exit``, ``signal.getsignal``, ``sys.getprofile``): compiled in a
namespace of their own with no builtins, they use nothing but their default arguments."""


def _reachable():
    ns = {"__builtins__": {}}
    exec(compile(_REACHABLE, "<cleaner-judge>", "exec"), ns)
    return ns


def _snapshot(modules):
    """What the tamper check compares with after ``check``: the builtins, the imported modules, the
    attributes of ``modules`` (those the test imports) and the import machinery."""
    import builtins

    watched = [m for m in (sys.modules.get(name) for name in modules if name != "sys") if m is not None]
    return (dict(vars(builtins)), dict(sys.modules), [(m, dict(vars(m))) for m in watched],
            list(sys.meta_path), list(sys.path_hooks))


def _tampered(snap, _vars=vars, _list=list, _gone=object(), _str=str, _modules=sys.modules, _sys=sys,
              _builtins=__import__("builtins")):
    """What the answer replaced since ``_snapshot`` (builtins it uses bound before the answer ran)."""
    names, mods, watched, meta, hooks = snap
    now = _vars(_builtins)
    bad = ["builtins." + k for k, v in names.items() if now.get(k, _gone) is not v and k != "_"]
    bad += ["sys.modules[" + k + "]" for k, v in mods.items() if _modules.get(k, _gone) is not v and k != "__main__"]
    for m, attrs in watched:
        now = _vars(m)
        bad += [_str(m.__name__) + "." + k for k, v in attrs.items() if now.get(k, _gone) is not v]
    if _list(_sys.meta_path) != meta or _list(_sys.path_hooks) != hooks:
        bad.append("import machinery")
    return bad[:20]


def _codes(code, out):
    out.add(code)
    for c in code.co_consts:
        if type(c) is type(code):
            _codes(c, out)
    return out


def _same_function(a, b):
    fa, fb = getattr(a, "__code__", None), getattr(b, "__code__", None)
    if fa is None or fb is None:
        return a is b
    return (fa.co_code, fa.co_names, fa.co_varnames) == (fb.co_code, fb.co_names, fb.co_varnames)


def _test_imports(test_src):
    """The top-level modules the test code imports (imported here before the answer loads)."""
    import ast

    names = set()
    for node in ast.walk(ast.parse(test_src)):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return sorted(names)


def _ended(exc, _isinstance=isinstance, _exit=SystemExit, _interrupt=KeyboardInterrupt,
           _tb=BaseException.__dict__["__traceback__"]):
    """The kind of an exception that ended ``check``: the answer's, the test's failure, or an exit."""
    if _isinstance(exc, _exit):
        return "system_exit"
    if _isinstance(exc, _interrupt):
        return "keyboard_interrupt"
    tb = _tb.__get__(exc)
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<solution>":
            return "runtime_error"
        tb = tb.tb_next
    return "wrong_answer"


def judge_assert(solution, prefix, helpers, test_src, entry, shadow, lookup, timeout):
    """Run helpers, ``solution``, the instrumented ``test_src`` and ``check(entry)`` here, once, whole, and
    write the verdict on the channel (see the module docstring): ``pass`` when ``check`` returned and
    nothing was tampered with; ``passed``, the tests passed in order before the first failure or fault."""
    import builtins
    import signal

    from_depth = 0
    f = sys._getframe()
    outer = set()
    while f is not None:
        outer.add(f.f_code)
        from_depth += 1
        f = f.f_back
    fd, ident = _channel()
    nonce = os.urandom(16).hex()
    line = _make_line(fd, ident, nonce)
    line({"hello": True})
    out = memfd(b"")
    sys.stdout.flush()
    os.dup2(out, 1)
    fd1 = os.fstat(1)
    if not _undumpable():
        line({"error": "the judge could not make itself non-dumpable (prctl PR_SET_DUMPABLE)"})
        os._exit(0)
    state = {"busy": [False], "taints": [], "hints": set(), "reached": [0], "fault_at": None, "called": [False],
             "tampered": [], "writable": tuple({os.getcwd(), "/tmp", "/dev/shm", "/work", "/var/tmp"})}
    reached, hints = state["reached"], state["hints"]
    test_code = compile_test(test_src)
    codes = _codes(test_code, set(outer))
    for src, name in ((prefix, "<prefix>"), (helpers, "<helpers>")):
        codes |= _codes(compile(src, name, "exec"), set())
    state["codes"] = codes
    for name in _test_imports(test_src):
        try:
            __import__(name)
        except BaseException:  # noqa: BLE001 - the test will meet the same error itself
            pass
    reach = _reachable()

    def finish(kind, exc=None, _line=line, _exit=os._exit, _setitimer=signal.setitimer, _itimer=signal.ITIMER_PROF,
               _min=min, _sorted=sorted, _stdout=sys.__stdout__):
        _setitimer(_itimer, 0)
        state["busy"][0] = True
        try:
            _stdout.flush()
        except BaseException:  # noqa: BLE001 - a closed stream
            pass
        passed = reached[0] if state["fault_at"] is None else _min(reached[0], state["fault_at"])
        tampered = state["tampered"] or _tampered(snap)
        if fd_changed():
            hints.add("channel_closed")
        if scan_marks(out)[0]:
            hints.add("forged_verdict")
        if not state["called"][0]:
            passed = 0
            if kind == "pass":
                kind, exc = "wrong_answer", "candidate never called"
        for bad in ("system_exit", "fake_value"):
            if bad in hints and kind in ("pass", "wrong_answer", "runtime_error"):
                kind = bad
        if tampered or state["taints"]:
            kind, passed = "tampering", 0
        _line({"pass": kind == "pass", "kind": kind, "exc": exc, "hints": _sorted(hints), "passed": passed,
               "tampered": tampered + state["taints"]})
        _exit(0)

    def fd_changed(_fstat=os.fstat):
        try:
            st = _fstat(1)
        except OSError:
            return True
        return (st.st_dev, st.st_ino) != (fd1.st_dev, fd1.st_ino)

    def mark(count, _tampered=_tampered):
        reached[0] = count
        if not state["tampered"]:  # builtins patched for a while and put back are seen here too
            was, state["busy"][0] = state["busy"][0], True
            state["tampered"] = _tampered(snap)
            state["busy"][0] = was

    def exit_called():
        hints.add("system_exit")
        if state["fault_at"] is None:
            state["fault_at"] = reached[0]

    def called(_setprofile=sys.setprofile):
        state["called"][0] = True
        was, state["busy"][0] = state["busy"][0], True
        _setprofile(None)
        state["busy"][0] = was

    wrapped = reach["make_exit"](exit_called, SystemExit)
    sys.exit = wrapped
    for name in ("exit", "quit"):
        setattr(builtins, name, reach["make_exit"](exit_called, SystemExit))
    ns = {}
    exec(compile(prefix, "<prefix>", "exec"), ns)
    exec(compile(helpers, "<helpers>", "exec"), ns)
    trusted = {k: ns[k] for k in lookup if k in ns}
    snap = _snapshot(_test_imports(test_src))
    eq, contains, sub = _make_compare(state)
    hook = _make_hook(state, codes, line)
    sys.setrecursionlimit(sys.getrecursionlimit() + from_depth + 8)
    signal.signal(signal.SIGPROF, reach["make_timer"](finish))
    signal.setitimer(signal.ITIMER_PROF, timeout)
    sys.addaudithook(hook)
    kind, detail = "pass", None
    try:
        exec(compile(solution, "<solution>", "exec"), ns)
        if any(n in ns for n in shadow) or "check" in ns:
            hints.add("redefined_helper")
        for k, v in trusted.items():
            if ns.get(k) is not v:
                state["busy"][0] = True
                if not _same_function(ns.get(k), v):
                    hints.add("redefined_helper")
                state["busy"][0] = False
                ns[k] = v
        exec(test_code, ns)
        check = ns["check"]
        candidate = ns[entry]
        state["busy"][0] = True
        sys.setprofile(reach["make_profile"](called, candidate, "<solution>"))
        state["busy"][0] = False
        check(candidate, **{PASSED_MARK: mark, EQ_HOOK: eq, IN_HOOK: contains, SUB_HOOK: sub})
    except BaseException as exc:  # noqa: BLE001 - every ending is a verdict
        state["busy"][0] = True
        kind, detail = _ended(exc), type(exc).__name__
        if kind in ("system_exit", "keyboard_interrupt") and state["fault_at"] is None:
            state["fault_at"] = reached[0]
    state["busy"][0] = True
    sys.setprofile(None)
    finish(kind, detail)


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
