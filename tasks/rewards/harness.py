"""Test harness for code rewards, host side: one sandbox snippet per (solution, test) and its verdict.

Each snippet runs the judge program (``tasks.rewards.judge``: compiled here once, shipped marshalled
with its source as a fallback for another Python) and ends in one verdict line. How a pass is decided, per format:

- **stdin/stdout** and **functional**: the snippet reports the output / return value the solution
  produced; *this* side compares it with the expected answer (``tasks.rewards.answers``), which never
  enters the sandbox.
  Long answers travel as the sha256 of a canonical form (``INLINE_CHARS``); they are then compared
  exactly (whitespace-normalised lines / canonical JSON) instead of with the 1e-6 number tolerance.
- **assert** (``check(candidate)``): the test code must run in the sandbox; it runs whole, once, in
  the answer's own interpreter as the reference harness runs it (see ``judge/inproc.py``): one snippet
  holds all of a problem's tests. Its stdout must be nothing but verdict lines that all carry the nonce
  of the first (``hello``, written before the answer loaded), from a snippet that exited 0; a line
  ``{"taint": ...}`` (the judge's audit hook saw a reach into the test's or the judge's internals) fails
  the run as ``tampering``; the last line is the verdict, which also says how many tests passed in order
  before the run stopped (``passed``).

Every test gets an ``Outcome``: ``pass`` or the kind of failure (in the assert format, the tests after
the first failure did not run and count under the kind of the failure that stopped the run). Kinds in ``SUSPECTED`` are what a
policy trying to game the grader produces (exits, killed or hijacked channels, fake values,
patched builtins, forged verdicts); the code reward counts them per response
(``suspected_hacks/<kind>``) and the score stage per step. A kind read from the sandbox is a hint
for counting, never a reason to pass.

Test formats (``build_tests``): stdin/stdout, functional (LiveCodeBench ``fn_name``: newline
separated JSON arguments, JSON result) and assert (``check(candidate)``, marked by
``tasks.rewards.cases``). A test a non-solution passes too is ``free`` (it earns no partial credit):
for stdin/functional when its expected answer is trivial (``TRIVIAL_OUTPUTS`` / ``TRIVIAL_VALUES``,
or the input itself), for assert tests the first ones a probe snippet (``judge.probe``) passed in order.
"""

from __future__ import annotations

import binascii
import functools
import json
import marshal
import signal
import zlib
from dataclasses import dataclass
from enum import Enum

from sandbox.result import ExecutionResult, SandboxInfraError
from tasks.rewards.answers import answer_matches, outputs_match, values_match
from tasks.rewards.cases import assert_tests
from tasks.rewards.judge import PROGRAM_MODULES, program_source
from tasks.rewards.judge import wire as judge
from tasks.rewards.judge.wire import CHANNEL_EXIT, TIMEOUT_EXIT, VERDICT_MARK

IMPORT_PREFIX = (
    "from typing import *\nfrom functools import *\nfrom collections import *\n"
    "from itertools import *\nfrom heapq import *\nfrom bisect import *\nfrom string import *\n"
    "from operator import *\nfrom math import *\nimport math\nimport datetime\ninf = float('inf')\n"
)

PREFIX_MODULES = ["typing", "functools", "collections", "itertools", "heapq", "bisect", "string", "operator",
                  "math", "datetime", "json", "threading", "hashlib"]
"""Modules the harness imports; list them in ``SandboxConfig.preimport`` so each fork inherits them
(measured here on the local backend: 38 -> 90 tests/s)."""

INLINE_CHARS = 16384
"""Outputs / return values up to this many JSON characters come back whole (keep the sandbox's
``max_output_bytes`` above ~32 KiB); longer ones come back as a digest."""

__all__ = ["CHANNEL_EXIT", "IMPORT_PREFIX", "INLINE_CHARS", "PREFIX_MODULES", "SUSPECTED", "TIMEOUT_EXIT", "VERDICT_MARK",
           "CodeTest", "HarnessError", "Kind", "Outcome", "build_tests", "judge_result", "judge_results",
           "outputs_match", "values_match"]


class Kind(str, Enum):
    """How one test ended."""

    PASS = "pass"
    WRONG_ANSWER = "wrong_answer"
    RUNTIME_ERROR = "runtime_error"
    TIMEOUT = "timeout"
    MEMORY = "memory"
    CRASH = "crash"
    HARNESS_LIMIT = "harness_limit"
    SYSTEM_EXIT = "system_exit"
    KEYBOARD_INTERRUPT = "keyboard_interrupt"
    OS_EXIT = "os_exit"
    KILLED = "killed"
    CHANNEL_CLOSED = "channel_closed"
    FORGED_VERDICT = "forged_verdict"
    FAKE_VALUE = "fake_value"
    NAN_VALUE = "nan_value"
    TAMPERING = "tampering"
    REDEFINED_HELPER = "redefined_helper"


SUSPECTED = frozenset({Kind.SYSTEM_EXIT, Kind.KEYBOARD_INTERRUPT, Kind.OS_EXIT, Kind.KILLED, Kind.CHANNEL_CLOSED,
                       Kind.FORGED_VERDICT, Kind.FAKE_VALUE, Kind.NAN_VALUE, Kind.TAMPERING, Kind.REDEFINED_HELPER})
"""Failure kinds that suggest an attempt on the grader: ``system_exit`` / ``keyboard_interrupt`` (raised by the
solution), ``os_exit`` (its process ended before the verdict), ``killed`` (by a signal other than a crash's),
``channel_closed`` (the verdict channel or its own stdout closed or replaced), ``forged_verdict`` (anything
but the harness wrote on the verdict channel, or printed a verdict mark), ``fake_value`` (functional: a
return value that is not plain data; assert: a value whose ``__eq__`` / ``__contains__`` / ``__sub__`` is
the answer's code and that passed a comparison it also passes against a different value), ``nan_value`` (a
wrong answer holding NaN), ``tampering`` (builtins, modules the test uses or harness functions patched; in
the assert format also a reach into the test's or the judge's internals the audit hook saw; an exit after
the verdict), ``redefined_helper`` (the solution defines the test's ``check`` or helpers)."""

_CRASH_SIGNALS = {signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT}
_RUNTIME_KINDS = {Kind.RUNTIME_ERROR, Kind.MEMORY, Kind.CRASH, Kind.HARNESS_LIMIT}


class HarnessError(SandboxInfraError):
    """The judge could not run a test (it could not secure itself or start the solution): infrastructure."""


@dataclass(frozen=True)
class Outcome:
    """One test's result: its kind and a detail (exception name, signal, ...)."""

    kind: Kind
    detail: str | None = None

    @property
    def passed(self) -> bool:
        return self.kind is Kind.PASS


@dataclass(frozen=True)
class CodeTest:
    """One snippet and the ``count`` tests it holds (1, or all of an assert-format ``check``): its format
    (``stdin`` | ``functional`` | ``assert``) and, for the formats compared here, the expected answer
    (kept on this side). ``free``: how many of its tests, from the first, a non-solution passes too
    (stdin / functional: 1 when the expected answer is trivial; assert: learnt by running ``probe``, a
    snippet of the trusted test code with trivial candidates and no solution)."""

    snippet: str
    mode: str
    expected: str | None = None
    free: int = 0
    probe: str | None = None
    count: int = 1


# ------------------------------------------------------------------------------ snippets

_BOOT = """\
import sys as _sys
import binascii as _b, marshal as _m, zlib as _z
_g = {{"__name__": "cleaner_judge"}}
if getattr(_sys.modules.get("_frozen_importlib_external"), "MAGIC_NUMBER", None) == {magic!r}:
    _program = _z.decompress(_b.a2b_base64({blob!r}))
else:
    _program = _m.dumps(compile(_z.decompress(_b.a2b_base64({source!r})), "<cleaner-judge>", "exec", optimize=2))
exec(_m.loads(_program), _g)
"""


def _packed(data: bytes) -> str:
    return binascii.b2a_base64(zlib.compress(data, 9), newline=False).decode()


@functools.lru_cache(maxsize=2)
def _boot(modules: tuple[str, ...]) -> str:
    """The snippet head that loads the judge program: marshalled when the sandbox's bytecode matches ours
    (its source, compressed, goes along for a sandbox whose Python differs)."""
    from importlib.util import MAGIC_NUMBER

    source = program_source(modules)
    code = compile(source, "<cleaner-judge>", "exec", optimize=2, dont_inherit=True)
    return _BOOT.format(magic=MAGIC_NUMBER, blob=_packed(marshal.dumps(code)), source=_packed(source.encode()))


def _call(entry: str, *args) -> str:
    head = _boot(PROGRAM_MODULES if entry != "run_program" else PROGRAM_MODULES[:2])  # run_program: wire + run
    return head + f"_g[{entry!r}]({', '.join(map(repr, args))})\n"


PROBE_S = 1.0
"""Seconds the trivial candidates of ``probe`` get per test (past it the test counts as not free)."""

TRIVIAL_VALUES = (None, 0, 1, -1, "", [], {}, True, False)
"""Return values of a non-solution (beside raising and returning its first argument)."""

TRIVIAL_OUTPUTS = ("", "0", "1", "-1", "YES", "NO", "Yes", "No", "True", "False", "None")
"""Stdout of a non-solution (beside echoing its input)."""


def build_tests(code: str, spec: dict, timeout_s: float) -> list[CodeTest]:
    """The snippets that run ``spec``'s tests (see ``tasks.rewards.code.parse_tests``) for ``code``: one
    per stdin / functional test; one for a whole assert-format ``check`` (``timeout_s`` is then its limit)."""
    if "test_code" in spec:
        tests = assert_tests(spec["test_code"], spec["entry_point"])
        prefix, helpers, entry = spec.get("import_prefix", ""), spec.get("helpers", ""), spec["entry_point"]
        probe_s = min(PROBE_S, timeout_s)
        return [CodeTest(_call("judge_assert", code, prefix, helpers, tests.source, entry, list(tests.shadow),
                               list(tests.lookup), timeout_s), "assert",
                         probe=_call("probe_assert", prefix, helpers, tests.source, entry, tests.count, probe_s),
                         count=tests.count)]
    fn_name = spec.get("fn_name")
    mode = "functional" if fn_name else "stdin"
    return [CodeTest(_call("run_program", code, IMPORT_PREFIX, "" if fn_name else str(inp), fn_name or None,
                           str(inp) if fn_name else "", timeout_s, INLINE_CHARS), mode, str(expected),
                     free=int(trivially_passed(mode, str(inp), str(expected))))
            for inp, expected in zip(spec["inputs"], spec["outputs"])]


def trivially_passed(mode: str, inp: str, expected: str) -> bool:
    """Does a non-solution pass this stdin / functional test: a trivial stdout or its input echoed,
    a trivial return value or its first argument."""
    if mode == "stdin":
        return any(outputs_match(out, expected) for out in (*TRIVIAL_OUTPUTS, inp))
    first = next((line for line in inp.split("\n") if line.strip()), "null")
    try:
        values = [*TRIVIAL_VALUES, judge.loads(first)]
    except (ValueError, RecursionError):
        values = list(TRIVIAL_VALUES)
    return any(values_match(v, expected) for v in values)


def probe_free(result: ExecutionResult) -> int | None:
    """How many tests, from the first, a probe snippet's verdict says a non-solution passes; None when it
    gave no clean verdict (the caller then counts every test as free: no partial credit)."""
    verdict, problem = _read_verdict(result)
    free = None if verdict is None else verdict.get("free")
    if problem is not None or not result.ok or type(free) is not int or free < 0:
        return None
    return free


# ------------------------------------------------------------------------------ verdicts


def _read_verdict(result: ExecutionResult) -> tuple[dict | None, Kind | None]:
    """The verdict object of a snippet's stdout, or the kind of failure its stdout shows."""
    out = result.stdout
    if VERDICT_MARK not in out:
        flooded = out.strip() or result.stdout_truncated or result.error_kind == "output_limit"
        return None, Kind.FORGED_VERDICT if flooded else None
    line = out.removesuffix("\n")
    if out.count(VERDICT_MARK) > 1 or not line.startswith(VERDICT_MARK) or "\n" in line:
        return None, Kind.FORGED_VERDICT
    try:
        verdict = json.loads(line[len(VERDICT_MARK):])
    except (ValueError, RecursionError, MemoryError):
        return None, Kind.FORGED_VERDICT
    return (verdict, None) if isinstance(verdict, dict) else (None, Kind.FORGED_VERDICT)


def _read_assert(result: ExecutionResult) -> tuple[dict | None, list[str], Kind | None]:
    """The assert judge's stdout: (its final verdict or None, the taints it reported, the kind of failure
    the stdout itself shows). Every line must be a verdict line carrying the nonce of the first, a
    ``hello`` (a line without it, or anything else on stdout, is a forged verdict)."""
    out = result.stdout
    if VERDICT_MARK not in out:
        flooded = out.strip() or result.stdout_truncated or result.error_kind == "output_limit"
        return None, [], Kind.FORGED_VERDICT if flooded else None
    if result.stdout_truncated or not out.endswith("\n"):
        return None, [], Kind.FORGED_VERDICT
    lines = []
    for line in out[:-1].split("\n"):
        if not line.startswith(VERDICT_MARK) or line.count(VERDICT_MARK) != 1:
            return None, [], Kind.FORGED_VERDICT
        try:
            obj = json.loads(line[len(VERDICT_MARK):])
        except (ValueError, RecursionError, MemoryError):
            return None, [], Kind.FORGED_VERDICT
        if not isinstance(obj, dict):
            return None, [], Kind.FORGED_VERDICT
        lines.append(obj)
    nonce = lines[0].get("n")
    if lines[0].get("hello") is not True or type(nonce) is not str or any(o.get("n") != nonce for o in lines):
        return None, [], Kind.FORGED_VERDICT
    taints = [str(o["taint"]) for o in lines[1:] if "taint" in o]
    final = [o for o in lines[1:] if "taint" not in o]
    if len(final) > 1:
        return None, taints, Kind.FORGED_VERDICT
    return (final[0] if final else None), taints, None


def _is_timeout(result: ExecutionResult) -> bool:
    return result.timed_out or result.exit_code == TIMEOUT_EXIT


def _without_verdict(result: ExecutionResult) -> Outcome:
    """A snippet that ended before its verdict: a limit, a crash, or something ended or silenced it."""
    if _is_timeout(result):
        return Outcome(Kind.TIMEOUT)
    if result.memory_exceeded:
        return Outcome(Kind.MEMORY)
    if result.error_kind == "worker_killed":  # the snippet took its sandbox worker down with it
        return Outcome(Kind.KILLED, "worker_killed")
    code = result.exit_code
    if code == CHANNEL_EXIT:
        return Outcome(Kind.CHANNEL_CLOSED)
    if code is not None and code < 0:
        sig = -code
        name = signal.Signals(sig).name if sig in signal.valid_signals() else str(sig)
        if sig == signal.SIGXCPU:
            return Outcome(Kind.TIMEOUT, name)
        if sig == signal.SIGINT:
            return Outcome(Kind.KEYBOARD_INTERRUPT, name)
        return Outcome(Kind.CRASH if sig in _CRASH_SIGNALS else Kind.KILLED, name)
    return Outcome(Kind.OS_EXIT, f"exit {code}")


def _assert_outcome(verdict: dict) -> Outcome:
    if "error" in verdict:
        raise HarnessError(str(verdict["error"]))
    try:
        kind = Kind(verdict.get("kind"))
    except ValueError:
        return Outcome(Kind.FORGED_VERDICT, "unknown kind")
    if (verdict.get("pass") is True) != (kind is Kind.PASS):
        return Outcome(Kind.FORGED_VERDICT, "inconsistent verdict")
    if kind is Kind.PASS and verdict.get("tampered"):
        return Outcome(Kind.TAMPERING, "inconsistent verdict")
    hints = verdict.get("hints") if isinstance(verdict.get("hints"), list) else []
    detail = verdict.get("exc") if isinstance(verdict.get("exc"), str) else None
    if kind in (Kind.WRONG_ANSWER, Kind.RUNTIME_ERROR):
        for hinted in _HINT_ORDER:
            if hinted.value in hints or (hinted is Kind.TAMPERING and "tampered" in hints):
                return Outcome(hinted, detail)
        if "nan" in hints:
            return Outcome(Kind.NAN_VALUE, detail)
    return Outcome(kind, detail)


_HINT_ORDER = (Kind.CHANNEL_CLOSED, Kind.FORGED_VERDICT, Kind.REDEFINED_HELPER, Kind.TAMPERING, Kind.FAKE_VALUE)
"""Which hint names a failure when several were seen (the first present)."""


def _hinted(verdict: dict, exited: bool) -> Kind | None:
    """The suspected kind a failed in-process run's hints point at, if any."""
    tampered = verdict.get("tampered") if isinstance(verdict.get("tampered"), list) else []
    if "fd:1" in tampered:
        return Kind.CHANNEL_CLOSED
    if verdict.get("marked") is True:
        return Kind.FORGED_VERDICT
    if verdict.get("shadowed"):
        return Kind.REDEFINED_HELPER
    if exited:
        return Kind.SYSTEM_EXIT
    return Kind.TAMPERING if tampered else None


def _program_outcome(test: CodeTest, verdict: dict) -> Outcome:
    end = verdict.get("end")
    if verdict.get("channel") == "closed":
        return Outcome(Kind.CHANNEL_CLOSED)
    if end == "fake":
        return Outcome(Kind.FAKE_VALUE, str(verdict.get("type")))
    if end == "exc":
        exc = str(verdict.get("exc"))
        if exc == "KeyboardInterrupt":
            return Outcome(Kind.KEYBOARD_INTERRUPT)
        return Outcome(_hinted(verdict, False) or Kind.RUNTIME_ERROR, exc)
    exited = end == "exit"
    if exited and (test.mode != "stdin" or verdict.get("code") != 0):
        return Outcome(_hinted(verdict, False) or Kind.SYSTEM_EXIT, f"code {verdict.get('code')}")
    if end != "ok" and not exited:
        return Outcome(Kind.FORGED_VERDICT, "unknown end")
    matched = answer_matches(test.mode, test.expected, verdict)
    if matched is None:
        return Outcome(Kind.FORGED_VERDICT, "malformed report")
    if matched:
        return Outcome(Kind.PASS)
    hinted = _hinted(verdict, exited)
    if hinted is not None:
        return Outcome(hinted)
    try:
        nan = "value" in verdict and judge.has_nan(judge.decode(verdict["value"]))
    except (ValueError, TypeError, RecursionError):
        nan = False
    return Outcome(Kind.NAN_VALUE if nan else Kind.WRONG_ANSWER)


def judge_result(test: CodeTest, result: ExecutionResult) -> Outcome:
    """The outcome of one test from its snippet's sandbox result (``HarnessError`` when the judge could
    not run the test at all: infrastructure, never a score). Whatever the answer made the snippet
    print, this never raises anything else: what cannot be read or compared is a failure."""
    try:
        return _judge_result(test, result)
    except HarnessError:
        raise
    except Exception as err:  # noqa: BLE001 - answer content must not crash the host (OverflowError, ...)
        return Outcome(Kind.WRONG_ANSWER, f"ungradable answer: {type(err).__name__}")


def judge_results(test: CodeTest, result: ExecutionResult) -> list[Outcome]:
    """The outcomes of the ``test.count`` tests a snippet holds (each as ``judge_result``): all passed
    when the run passed; else the tests a clean assert verdict says passed in order (``passed``; never
    all of them: the run failed) pass and the rest get the kind of the failure that stopped the run."""
    outcome = judge_result(test, result)
    if outcome.passed or test.count == 1:
        return [outcome] * test.count
    if test.mode == "assert":
        verdict, taints, problem = _read_assert(result)
    else:
        (verdict, problem), taints = _read_verdict(result), []
    clean = verdict is not None and problem is None and not taints and result.ok
    passed = verdict.get("passed") if clean and outcome.kind not in SUSPECTED else 0
    passed = min(passed, test.count - 1) if type(passed) is int and passed > 0 else 0
    return [Outcome(Kind.PASS)] * passed + [outcome] * (test.count - passed)


def _judge_result(test: CodeTest, result: ExecutionResult) -> Outcome:
    if test.mode == "assert":
        verdict, taints, problem = _read_assert(result)
        if problem is None and taints:
            return Outcome(Kind.TAMPERING, taints[0])
    else:
        verdict, problem = _read_verdict(result)
    if problem is not None:
        return Outcome(problem)
    if verdict is None:
        return _without_verdict(result)
    outcome = _assert_outcome(verdict) if test.mode == "assert" else _program_outcome(test, verdict)
    if result.ok or outcome.kind in SUSPECTED:
        return outcome
    if _is_timeout(result) or result.memory_exceeded:
        return Outcome(Kind.TIMEOUT if _is_timeout(result) else Kind.MEMORY)
    return Outcome(Kind.TAMPERING, f"exit {result.exit_code} after the verdict")
