"""Probes (shipped in the judge program after ``inproc``): does a non-solution pass an assert-format test.

``probe_assert`` runs a problem's trusted code (prefix, helpers, the marked ``check``) whole with trivial
candidates only (``_PROBES``: return None, raise an error of every common type, return or empty the first
argument, return 0, 1, -1, '', [], (), {}, True or False; no solution runs here at all) and emits
``{"free": n}``: the most tests one of them passed in order (all of them when one passed ``check``).
Those first n tests are *free*: they earn no partial credit (``tasks.rewards.code.finish``). The probes
share a time budget; what they had not passed by then is not free.
"""

import os
import signal

if __name__ != "cleaner_judge":  # shipped into the sandbox as one program, these names are defined above
    from tasks.rewards.judge.inproc import compile_test, test_namespace
    from tasks.rewards.judge.run import emit, verdict_channel
    from tasks.rewards.judge.wire import EQ_HOOK, IN_HOOK, PASSED_MARK, SUB_HOOK


class _Late(BaseException):
    """The probes' time is up."""


def _late(signum, frame):
    raise _Late


class _AnyError(ValueError, TypeError, KeyError, IndexError, ZeroDivisionError, OverflowError, AssertionError,
                NotImplementedError):
    """What a non-solution that raises raises: caught by a test expecting any of the common errors."""


def _probe_raise(*args, **kwargs):
    raise _AnyError("not implemented")


def _probe_empty_first(*args, **kwargs):
    """Empty the first argument in place and return it (a test comparing it with itself afterwards passes)."""
    if args and type(args[0]) in (list, dict, set):
        args[0].clear()
        return args[0]
    return None


_PROBES = (lambda *a, **k: None, _probe_raise, lambda *a, **k: a[0] if a else None, _probe_empty_first,
           *[lambda *a, _v=v, **k: type(_v)(_v) for v in (0, 1, -1, "", [], (), {}, True, False)])
"""Non-solutions: return None, raise, return the first argument, empty it, or return a constant
(0, 1, -1, '', [], (), {}, True, False: a fresh copy per call)."""


def _eq(a, b):
    return a == b


def _in(a, b):
    return a in b


def _sub(a, b):
    return a - b


def probe_assert(prefix, helpers, test_src, entry, count, timeout):
    """How many of the ``count`` tests of ``test_src`` a non-solution (``_PROBES``) passes in order: emit
    ``{"free": n}``. No solution runs here: only the spec's trusted code, with ``candidate`` a trivial
    function. What a probe had not passed by ``timeout`` is not free."""
    channel = verdict_channel()
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 1)
    os.close(null)
    free = 0
    signal.signal(signal.SIGPROF, _late)
    signal.setitimer(signal.ITIMER_PROF, timeout, 0.05)  # re-fires: a bare ``except`` cannot swallow it for good
    try:
        code = compile_test(test_src)
        for probe in _PROBES:
            reached = [0]
            try:
                tns = test_namespace(prefix, helpers)
                tns.setdefault(entry, probe)
                exec(code, tns)
                tns["check"](probe, **{PASSED_MARK: lambda event, i, _r=reached: _r.__setitem__(0, i),
                                       EQ_HOOK: _eq, IN_HOOK: _in, SUB_HOOK: _sub})
            except _Late:
                free = max(free, reached[0])
                break
            except BaseException:  # noqa: BLE001 - the probe failed the test, as it should
                free = max(free, reached[0])
                continue
            free = count
            break
    except _Late:
        pass
    signal.setitimer(signal.ITIMER_PROF, 0)
    signal.signal(signal.SIGPROF, signal.SIG_IGN)
    emit(channel, {"free": free})
