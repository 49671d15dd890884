"""Test harness for code rewards: one self-contained sandbox snippet per (solution, test).

A snippet feeds the test input on stdin (a memfd dup'ed onto fd 0, so ``input()``,
``sys.stdin`` and ``open(0)`` all work), captures everything the program writes to fd 1
in a second memfd (so large outputs neither flood nor get truncated by the sandbox's
output cap), runs the solution under its own alarm (``code_timeout_s``; exit 124), waits
for the program's non-daemon threads, then compares *inside the sandbox* and prints one
verdict line ``RESULT_MARK {"pass": ..., "exit": ...}``. The comparison functions below
are pure and shipped into the snippet by source, so host tests and sandbox agree.

Test formats (``build_tests``): stdin/stdout, functional (LiveCodeBench ``fn_name``:
newline-separated JSON arguments, JSON result) and assert (``check(candidate)`` lines).
"""

from __future__ import annotations

import inspect
import json
import math
from dataclasses import dataclass

RESULT_MARK = "\x1e__CLEANER_RESULT__"
TIMEOUT_EXIT = 124

IMPORT_PREFIX = (
    "from typing import *\nfrom functools import *\nfrom collections import *\n"
    "from itertools import *\nfrom heapq import *\nfrom bisect import *\nfrom string import *\n"
    "from operator import *\nfrom math import *\nimport math\nimport datetime\ninf = float('inf')\n"
)

PREFIX_MODULES = ["typing", "functools", "collections", "itertools", "heapq", "bisect", "string", "operator",
                  "math", "datetime", "json", "threading"]
"""Modules the harness imports; list them in ``SandboxConfig.preimport`` so each fork inherits them
(measured here on the local backend: 38 -> 90 tests/s)."""


def tokens_equal(got: str, want: str) -> bool:
    """Two whitespace-free tokens are equal as text, or as numbers within 1e-6."""
    if got == want:
        return True
    try:
        return math.isclose(float(got), float(want), rel_tol=1e-6, abs_tol=1e-6)
    except ValueError:
        return False


def outputs_match(got: str, want: str) -> bool:
    """Stdout vs expected: same lines once each is stripped and trailing blank lines dropped; numbers within 1e-6."""
    got_lines = [ln.strip() for ln in got.strip().splitlines()]
    want_lines = [ln.strip() for ln in want.strip().splitlines()]
    if got_lines == want_lines:
        return True
    if len(got_lines) != len(want_lines):
        return False
    for g, w in zip(got_lines, want_lines):
        gt, wt = g.split(), w.split()
        if len(gt) != len(wt) or not all(tokens_equal(x, y) for x, y in zip(gt, wt)):
            return False
    return True


def same_value(got, want) -> bool:
    """JSON values equal, floats within 1e-6 (recursively through lists and dicts)."""
    if isinstance(got, bool) or isinstance(want, bool):
        return got is want
    if isinstance(got, (int, float)) and isinstance(want, (int, float)):
        return got == want or math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-6)
    if isinstance(got, list) and isinstance(want, list):
        return len(got) == len(want) and all(same_value(a, b) for a, b in zip(got, want))
    if isinstance(got, dict) and isinstance(want, dict):
        return got.keys() == want.keys() and all(same_value(got[k], want[k]) for k in got)
    return got == want


def values_match(value, want_text: str) -> bool:
    """A function's return value vs the expected JSON text (tuples count as lists, as in LiveCodeBench)."""
    try:
        got = json.loads(json.dumps(value))
    except (TypeError, ValueError):
        return False
    try:
        want = json.loads(want_text)
    except ValueError:
        want = want_text
    return same_value(got, want)


_JUDGES = "".join(inspect.getsource(f) + "\n" for f in (tokens_equal, outputs_match, same_value, values_match))

_TEMPLATE = """\
import json, math, os as _os, signal as _signal, sys as _sys, threading as _threading
def _cleaner_timeout(_s, _f):
    _os.write(2, b"TimeoutError: test exceeded {timeout}s\\n")
    _os._exit({timeout_exit})
def _cleaner_fd(data):
    try:
        fd = _os.memfd_create("cleaner-io")
    except (AttributeError, OSError):
        import tempfile
        fd = _os.dup(tempfile.TemporaryFile().fileno())
    view = memoryview(data.encode())
    while view:
        view = view[_os.write(fd, view):]
    _os.lseek(fd, 0, 0)
    return fd
def _cleaner_join():
    for _t in _threading.enumerate():
        if _t is not _threading.main_thread() and not _t.daemon:
            _t.join()
_signal.signal(_signal.SIGALRM, _cleaner_timeout)
_in = _cleaner_fd({stdin!r})
_os.dup2(_in, 0)
_os.close(_in)
_sys.stdin = open(0, "r", closefd=False)
_real_out = _os.dup(1)
_cap = _cleaner_fd("")
_sys.stdout.flush()
_os.dup2(_cap, 1)
_ns = {{"__name__": "__main__", "__builtins__": __builtins__}}
exec({prefix!r}, _ns)
_code = compile({source!r}, "<solution>", "exec")
_status, _value = 0, None
_signal.setitimer(_signal.ITIMER_REAL, {timeout})
try:
    exec(_code, _ns)
{call}    _cleaner_join()
except SystemExit as _exit:
    _status = _exit.code if isinstance(_exit.code, int) else (0 if _exit.code is None else 1)
_signal.setitimer(_signal.ITIMER_REAL, 0)
_sys.stdout.flush()
_os.dup2(_real_out, 1)
_os.lseek(_cap, 0, 0)
_chunks = []
while _chunk := _os.read(_cap, 1 << 20):
    _chunks.append(_chunk)
_got = b"".join(_chunks).decode("utf-8", "replace")
{judges}
_ok = _status == 0 and bool({verdict})
print({mark!r} + json.dumps({{"pass": _ok, "exit": _status}}), flush=True)
"""

_CALL = """\
    _fn = getattr(_ns["Solution"](), {fn_name!r}) if "Solution" in _ns else _ns[{fn_name!r}]
    _value = _fn(*[json.loads(_line) for _line in {args!r}.split("\\n") if _line.strip()])
"""


@dataclass(frozen=True)
class CodeTest:
    """One test: the snippet to run and its format (``stdin`` | ``functional`` | ``assert``)."""

    snippet: str
    mode: str


def _snippet(source: str, *, stdin: str, call: str, verdict: str, prefix: str, timeout: float) -> str:
    return _TEMPLATE.format(
        timeout=timeout, timeout_exit=TIMEOUT_EXIT, stdin=stdin, prefix=prefix, source=source,
        call=call, judges=_JUDGES, verdict=verdict, mark=RESULT_MARK,
    )


def build_tests(code: str, spec: dict, timeout_s: float) -> list[CodeTest]:
    """One snippet per test of ``spec`` (see ``tasks.rewards.code.parse_tests``) for ``code``."""
    if "test_code" in spec:
        lines = [ln for ln in spec["test_code"].split("\n") if ln.strip()]
        prefix = spec.get("import_prefix", "")
        out = []
        for line in lines[1:]:
            source = f"{code}\n{lines[0]}\n{line}\ncheck({spec['entry_point']})\n"
            out.append(CodeTest(_snippet(source, stdin="", call="", verdict="True", prefix=prefix, timeout=timeout_s), "assert"))
        return out
    fn_name = spec.get("fn_name")
    out = []
    for inp, expected in zip(spec["inputs"], spec["outputs"]):
        if fn_name:
            call = _CALL.format(fn_name=fn_name, args=str(inp))
            verdict = f"values_match(_value, {str(expected)!r})"
            out.append(CodeTest(_snippet(code, stdin="", call=call, verdict=verdict, prefix=IMPORT_PREFIX, timeout=timeout_s), "functional"))
        else:
            verdict = f"outputs_match(_got, {str(expected)!r})"
            out.append(CodeTest(_snippet(code, stdin=str(inp), call="", verdict=verdict, prefix=IMPORT_PREFIX, timeout=timeout_s), "stdin"))
    return out


def verdict_of(stdout: str) -> dict | None:
    """The harness's verdict from a snippet's stdout, or None when the snippet never got to print one."""
    marked = [ln for ln in stdout.split("\n") if ln.startswith(RESULT_MARK)]
    if not marked:
        return None
    try:
        verdict = json.loads(marked[-1][len(RESULT_MARK) :])
    except ValueError:
        return None
    return verdict if isinstance(verdict, dict) else None
