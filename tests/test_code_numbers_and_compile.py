"""Big numbers and compile errors in the code reward (issue 37).

- An expected answer that is an int of more than 4300 digits (Python's int/str limit) is read whole in
  every format: functional (inline and, past ``INLINE_CHARS``, through the digest), stdin (inline and
  digest) and assert (a literal in ``check``, or an expression). A correct 5000-digit answer scores 1.0,
  the same answer off by one scores 0, on the local sandbox and (marked ``docker``) the Docker one.
- A block ``ast.parse`` accepts but ``compile`` refuses (``return`` or ``nonlocal`` at module level, a name
  used before its ``global``, ``break`` outside a loop) scores ``code_format_error_reward`` without running.
Run: ``pytest tests/test_code_numbers_and_compile.py -m "not docker"``.
"""

from __future__ import annotations

import ast
import decimal

import pytest

from tasks.rewards.code import grade_code_batch
from tasks.rewards.config import RewardConfig
from tasks.rewards.harness import INLINE_CHARS, outputs_match, values_match
from tasks.rewards.registry import RewardResult
from tests.grading_sandbox import fenced as _fenced
from tests.grading_sandbox import sandbox_fixture

sandbox = sandbox_fixture()

CFG = RewardConfig(code_timeout_s=3.0)
EXP = 5916
N = 7 ** EXP
TEXT = str(decimal.Decimal(N))  # str(N) refuses: more than 4300 digits
TEXT_PLUS = str(decimal.Decimal(N + 1))
LIFT = "import sys\nsys.set_int_max_str_digits(0)\n"  # the answer prints its own big int (its own business)


# (name, spec, correct answer, the answer off by one)
BIG = [
    ("functional", {"fn_name": "big", "inputs": [str(EXP)], "outputs": [TEXT]},
     "def big(n):\n    return 7 ** n\n", "def big(n):\n    return 7 ** n + 1\n"),
    ("functional-big-input", {"fn_name": "succ", "inputs": [TEXT], "outputs": [TEXT_PLUS]},
     "def succ(n):\n    return n + 1\n", "def succ(n):\n    return n + 2\n"),
    ("functional-digest", {"fn_name": "bigs", "inputs": [str(EXP)], "outputs": [f"[{TEXT}, {TEXT}, {TEXT}, {TEXT}]"]},
     "def bigs(n):\n    return [7 ** n] * 4\n", "def bigs(n):\n    return [7 ** n] * 3 + [7 ** n + 1]\n"),
    ("stdin", {"inputs": [f"{EXP}\n"], "outputs": [TEXT + "\n"]},
     LIFT + "print(7 ** int(input()))\n", LIFT + "print(7 ** int(input()) + 1)\n"),
    ("stdin-digest", {"inputs": [f"{EXP}\n"], "outputs": [f"{TEXT}\n" * 4]},
     LIFT + "n = int(input())\nfor _ in range(4):\n    print(7 ** n)\n",
     LIFT + "n = int(input())\nfor i in range(4):\n    print(7 ** n + i // 3)\n"),
    ("assert-literal", {"test_code": f"def check(candidate):\n    assert candidate({EXP}) == {TEXT}\n", "entry_point": "big",
                        "import_prefix": ""},
     "def big(n):\n    return 7 ** n\n", "def big(n):\n    return 7 ** n + 1\n"),
    ("assert-expression", {"test_code": f"def check(candidate):\n    assert candidate({EXP}) == 7 ** {EXP}\n",
                           "entry_point": "big", "import_prefix": ""},
     "def big(n):\n    return 7 ** n\n", "def big(n):\n    return 7 ** n + 1\n"),
]


def test_the_answers_are_past_the_limits():
    assert len(TEXT) == 5000 and len(TEXT_PLUS) == 5000
    assert len(f"[{TEXT}, {TEXT}, {TEXT}, {TEXT}]") > INLINE_CHARS and len(f"{TEXT}\n" * 4) > INLINE_CHARS
    with pytest.raises(ValueError, match="4300"):
        int(TEXT)


def test_a_5000_digit_answer_passes_in_every_format_and_one_off_fails(sandbox):
    items = [("code", _fenced(answer), spec, {"id": f"{name}/{kind}"})
             for name, spec, good, bad in BIG for kind, answer in (("correct", good), ("wrong", bad))]
    results = grade_code_batch(items, sandbox=sandbox, cfg=CFG)
    got = {it[3]["id"]: (r.reward, r.correct) for it, r in zip(items, results)}
    assert got == {f"{name}/{kind}": (1.0, True) if kind == "correct" else (0.0, False)
                   for name, *_ in BIG for kind in ("correct", "wrong")}


def test_numbers_past_the_float_range_compare_exactly():
    assert outputs_match(TEXT, TEXT) and not outputs_match(TEXT_PLUS, TEXT)
    assert not outputs_match("1e400", "2e400") and not outputs_match("9" * 400, "9" * 399 + "8")
    assert outputs_match("1.0000001", "1") and outputs_match("0.3333333", "0.33333333")  # the 1e-6 tolerance stays
    assert values_match(N, TEXT) and not values_match(N + 1, TEXT) and not values_match(N, TEXT_PLUS)
    assert values_match([N, 1], f"[{TEXT}, 1]")


NOT_COMPILED = {
    "return-at-module-level": "def f(x):\n    return x\nreturn f(1)\n",
    "nonlocal-at-top-level": "nonlocal x\nx = 1\n",
    "used-before-global": "x = 0\ndef f():\n    print(x)\n    global x\n    x = 1\n",
    "break-outside-loop": "x = 1\nbreak\n",
    "yield-outside-function": "yield 1\n",
}
SPECS = {
    "stdin": {"inputs": ["1\n"], "outputs": ["1\n"]},
    "functional": {"fn_name": "f", "inputs": ["1"], "outputs": ["1"]},
    "assert": {"test_code": "def check(candidate):\n    assert candidate(1) == 1\n", "entry_point": "f", "import_prefix": ""},
}


def test_blocks_python_parses_but_will_not_compile_score_the_format_error_without_running():
    for code in NOT_COMPILED.values():
        ast.parse(code)  # the premise: ast.parse alone let these run
    items = [("code", _fenced(code), spec, {"id": f"{name}/{fmt}"})
             for name, code in NOT_COMPILED.items() for fmt, spec in SPECS.items()]
    cfg = RewardConfig(code_format_error_reward=-0.75)
    results = grade_code_batch(items, sandbox=None, cfg=cfg)  # nothing may run: there is no sandbox
    assert all(isinstance(r, RewardResult) for r in results), results
    assert {it[3]["id"]: (r.reward, r.metrics["syntax_error"]) for it, r in zip(items, results)} == {
        it[3]["id"]: (-0.75, 1.0) for it in items}
