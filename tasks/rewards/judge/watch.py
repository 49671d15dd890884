"""What the assert judge watches in the answer's process (stdlib only, shipped after ``compare``).

``snapshot`` / ``tampered``: the builtins, the imported modules, the attributes of the modules the test
imports and the import machinery, and what the answer replaced since. ``arm``: the reporting wrappers
put in the answer's reach (``exit``, ``quit``, ``sys.exit``, ``signal.signal``, the CPU timer's handler,
the profile function that sees the first call of the candidate), compiled from ``REACHABLE`` in a
namespace of their own with no builtins: they hold nothing but default arguments and report to the
judge's audit hook with ``sys.audit`` (``inproc``). ``code_objects``, ``same_function``, ``test_imports``:
what the judge reads of the test and the helpers.
"""
import sys

REACHABLE = '''
def make_exit(raiser, audit):
    def exit(*args, _raiser=raiser, _audit=audit):
        _audit("cleaner.exit")
        raise _raiser(*args)
    return exit


def make_timer(audit):
    def on_timer(signum, frame, _audit=audit):
        _audit("cleaner.timeout")
    return on_timer


def make_profile(entry, solution_file, audit, is_class=False):
    def profile(frame, event, arg, _entry=entry, _file=solution_file, _audit=audit, _any=is_class):
        if (_any or (event == "call" and frame.f_code.co_filename == _file)
                or (event == "c_call" and arg is _entry)):
            _audit("cleaner.called")
    return profile


def make_signal(original, audit, plain):
    def signal(signalnum, handler, _original=original, _audit=audit, _plain=plain):
        if handler not in _plain:
            _audit("cleaner.signal")
        return _original(signalnum, handler)
    return signal
'''
"""Functions the answer can reach (``sys.exit``, ``signal.getsignal``, ``sys.getprofile``, ``signal.signal``):
compiled in a namespace of their own with no builtins, they hold nothing but default arguments."""


def reachable():
    ns = {"__builtins__": {}}
    exec(compile(REACHABLE, "<cleaner-judge>", "exec"), ns)
    return ns


def arm(reach, audit, exits=True):
    """Put the reporting wrappers in place (exit, quit, sys.exit unless the test itself names ``SystemExit``:
    then an exit is what it expects; signal.signal); their code objects."""
    import _signal
    import builtins
    import signal

    if exits:
        for name in ("exit", "quit"):
            setattr(builtins, name, reach["make_exit"](SystemExit, audit))
        sys.exit = reach["make_exit"](SystemExit, audit)
    plain = (signal.SIG_DFL, signal.SIG_IGN, None)
    timer = reach["make_timer"](audit)
    signal.signal(signal.SIGPROF, timer)
    for module in (signal, _signal):  # each keeps its own: signal's converts enums, _signal's takes ints
        module.signal = reach["make_signal"](module.signal, audit, plain)
    return {"exit": reach["make_exit"](SystemExit, audit).__code__, "timer": timer.__code__, "signal": signal.signal.__code__,
            "profile": reach["make_profile"](None, "", audit).__code__}


def snapshot(modules):
    """What the tamper check compares with: the builtins, the imported modules, the attributes of
    ``modules`` (those the test imports but ``sys``) and the import machinery."""
    import builtins

    watched = [m for m in (sys.modules.get(name) for name in modules if name != "sys") if m is not None]
    return (dict(vars(builtins)), dict(sys.modules), [(m, dict(vars(m))) for m in watched],
            list(sys.meta_path), list(sys.path_hooks))


def tampered(snap, _vars=vars, _list=list, _gone=object(), _str=str, _modules=sys.modules, _sys=sys,
              _builtins=__import__("builtins")):
    """What the answer replaced since ``_snapshot`` (the builtins it uses bound before the answer ran)."""
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


def code_objects(code, out):
    out.add(code)
    for c in code.co_consts:
        if type(c) is type(code):
            code_objects(c, out)
    return out


def same_function(a, b):
    fa, fb = getattr(a, "__code__", None), getattr(b, "__code__", None)
    if fa is None or fb is None:
        return a is b
    return (fa.co_code, fa.co_names, fa.co_varnames) == (fb.co_code, fb.co_names, fb.co_varnames)


def test_imports(test_src):
    """The top-level modules the test code imports (imported here before the answer loads)."""
    import ast

    old = sys.get_int_max_str_digits() if hasattr(sys, "set_int_max_str_digits") else None
    if old is not None:
        sys.set_int_max_str_digits(0)  # an expected answer may be a longer int literal
    try:
        tree = ast.parse(test_src)
    finally:
        if old is not None:
            sys.set_int_max_str_digits(old)
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return sorted(names)
