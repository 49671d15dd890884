"""The code harness's pure parts: the plain-data codec, assert-test marking and reading verdicts.

No sandbox: verdicts are judged from hand-built ``ExecutionResult``s, including the forged, truncated
and late-exit ones a hostile solution could produce. The same rules run for real in
``tests/test_reward_hacks.py``. Run: ``pytest tests/test_code_harness.py``.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from sandbox.result import ExecutionResult
from tasks.rewards.cases import EQ_HOOK, IN_HOOK, MARK_EVENT, PASSED_MARK, SUB_HOOK, assert_tests
from tasks.rewards.code import finish
from tasks.rewards.harness import (
    CHANNEL_EXIT,
    TIMEOUT_EXIT,
    VERDICT_MARK,
    CodeTest,
    HarnessError,
    Kind,
    judge_result,
    judge_results,
)
from tasks.rewards.judge.wire import Unencodable, decode, digest, dump, encode, has_nan, json_plain, normal_lines


@pytest.mark.parametrize("value", [None, True, 0, -3, 2 ** 53, -(2 ** 200), 1.5, math.inf, "é\udcff", [1, [2]], (1, "a"),
                                   {1, 2}, frozenset({"x"}), {1: "a", (2, 3): [None]}, {"k": {"n": -0.0}}, []])
def test_codec_round_trip_keeps_exact_types(value):
    wire = json.loads(json.dumps(encode(value)))
    got = decode(wire)
    assert got == value and type(got) is type(value)


def test_codec_nan_and_big_ints():
    assert encode(2 ** 60) == {"i": hex(2 ** 60)} and decode({"i": "-0x10"}) == -16
    got = decode(json.loads(json.dumps(encode([float("nan")]))))
    assert has_nan(got) and not has_nan([1.0, (2.0,)])


class _Eq:
    def __eq__(self, other):
        return True


@pytest.mark.parametrize("value,name", [(_Eq(), "_Eq"), (type("S", (str,), {})("x"), "S"), (True.__class__, "type"),
                                        ([1, type("I", (int,), {})(2)], "I"), ((x for x in []), "generator")])
def test_encode_refuses_anything_but_plain_data(value, name):
    with pytest.raises(Unencodable, match=name):
        encode(value)


def test_encode_refuses_deep_nesting():
    deep = []
    for _ in range(300):
        deep = [deep]
    with pytest.raises(Unencodable, match="nesting"):
        encode(deep)


@pytest.mark.parametrize("wire", [{"x": 1}, {"i": 5}, {"f": "1.0"}, {"d": [[1]]}, {"t": "ab"}, {"s": [[1]]},
                                  {"t": [1], "s": [2]}])
def test_decode_refuses_what_encode_never_writes(wire):
    with pytest.raises((ValueError, TypeError)):
        decode(wire)


def test_dump_matches_json_and_survives_patched_builtins():
    data = {"b": [1, 2.5, None, True, "q\"\n\u00e9"], "a": {"z": -1}}
    assert dump(data) == json.dumps(data, separators=(",", ":"))
    assert dump(data, sort=True) == json.dumps(data, separators=(",", ":"), sort_keys=True)
    import builtins

    saved = builtins.isinstance, builtins.type, builtins.sorted
    try:
        builtins.isinstance, builtins.type, builtins.sorted = (lambda *a: True), (lambda *a: int), None
        text = dump({"k": [1, "x"]}, sort=True)
    finally:
        builtins.isinstance, builtins.type, builtins.sorted = saved
    assert text == '{"k":[1,"x"]}'


def test_json_plain_is_a_json_round_trip():
    assert json_plain((1, {2: (3,), None: True})) == [1, {"2": [3], "null": True}]
    with pytest.raises(Unencodable):
        json_plain([{1}])
    assert normal_lines("  a   b \n\n c\n\n") == "a b\n\nc" and len(digest("x")) == 64


def _mark(i: int) -> str:
    return f"{PASSED_MARK}({MARK_EVENT!r}, {i})"


def test_assert_tests_keep_check_whole_and_mark_each_test():
    test_code = ("METADATA = {}\n\ndef helper(v):\n    return v\n\ndef check(candidate):\n    import math\n"
                 "    assert candidate(1) == 1\n    xs = [1, 2]\n    for x in xs:\n        assert candidate(x) == helper(x)\n"
                 "    assert True\n    assert poly(candidate(2)) == 4\n\ncheck(f)\n")
    tests = assert_tests(test_code)
    head = f"def check(candidate, *, {PASSED_MARK}=None, {EQ_HOOK}=None, {IN_HOOK}=None, {SUB_HOOK}=None):\n"
    body = tests.source.split(head, 1)[1].splitlines()
    assert [line.strip() for line in body] == [
        "import math", f"assert {EQ_HOOK}(candidate(1), 1)", _mark(1), "xs = [1, 2]", "for x in xs:",
        f"assert {EQ_HOOK}(candidate(x), helper(x))", _mark(2), "assert True",
        f"assert {EQ_HOOK}(poly(candidate(2)), 4)", _mark(3)]
    assert "METADATA = {}" in tests.source and "def helper" in tests.source and "check(f)" not in tests.source
    assert tests.count == 3 and tests.lookup == ("poly",) and tests.shadow == ("check", "helper")


def test_assert_tests_count_one_per_line_as_the_reference_writes_them():
    tests = assert_tests("def check(candidate):\n    assert candidate(2) == 4\n    assert candidate(3) == 9\n")
    assert tests.count == 2 and tests.source.count(f"{PASSED_MARK}(") == 2
    whole = assert_tests("def check(candidate):\n    _eq(candidate(1), 1)\n")
    assert whole.count == 1 and f"{PASSED_MARK}(" not in whole.source  # no assert: the whole run is the test


@pytest.mark.parametrize("bad", ["def check(candidate:\n", "assert True\n"])
def test_assert_tests_name_a_broken_test_code(bad):
    with pytest.raises(ValueError, match="test_code"):
        assert_tests(bad)


def _result(stdout="", *, ok=True, exit_code=0, timed_out=False, memory=False, truncated=False, kind=None):
    return ExecutionResult(ok, exit_code, stdout, "", kind, timed_out, memory, 0.01, stdout_truncated=truncated)


def _line(payload: dict) -> str:
    return VERDICT_MARK + json.dumps(payload) + "\n"


def _judged(*payloads: dict, nonce: str = "n0nce") -> str:
    """The assert judge's stdout: its hello line, then ``payloads``, each with the run's nonce."""
    return "".join(_line({**p, "n": nonce}) for p in ({"hello": True}, *payloads))


STDIN = CodeTest("", "stdin", "4\n")
FUNCTIONAL = CodeTest("", "functional", "[1, 2]")
ASSERT = CodeTest("", "assert")
OK_RUN = {"end": "ok", "tampered": [], "shadowed": [], "marked": False}


@pytest.mark.parametrize("test,result,kind", [
    (STDIN, _result(_line({**OK_RUN, "out": "4\n"})), Kind.PASS),
    (STDIN, _result(_line({**OK_RUN, "end": "exit", "code": 0, "out": " 4 \n\n"})), Kind.PASS),
    (STDIN, _result(_line({**OK_RUN, "out": "5\n"})), Kind.WRONG_ANSWER),
    (STDIN, _result(_line({**OK_RUN, "end": "exit", "code": 0, "out": ""})), Kind.SYSTEM_EXIT),
    (STDIN, _result(_line({**OK_RUN, "end": "exit", "code": 3, "out": "4\n"})), Kind.SYSTEM_EXIT),
    (STDIN, _result(_line({**OK_RUN, "sha256": digest("4")})), Kind.PASS),
    (STDIN, _result(_line({**OK_RUN, "out": "5\n", "marked": True})), Kind.FORGED_VERDICT),
    (STDIN, _result(_line({**OK_RUN, "out": "", "tampered": ["fd:1"]})), Kind.CHANNEL_CLOSED),
    (STDIN, _result(_line({**OK_RUN, "out": "4\n", "tampered": ["builtins.print"]})), Kind.PASS),
    (STDIN, _result(_line({**OK_RUN, "end": "exc", "exc": "ZeroDivisionError", "out": ""})), Kind.RUNTIME_ERROR),
    (STDIN, _result(_line({**OK_RUN, "end": "exc", "exc": "KeyboardInterrupt", "out": ""})), Kind.KEYBOARD_INTERRUPT),
    (STDIN, _result(_line({**OK_RUN, "end": "ok"})), Kind.FORGED_VERDICT),
    (STDIN, _result(_line({**OK_RUN, "out": "4\n"}) * 2), Kind.FORGED_VERDICT),
    (STDIN, _result("noise\n" + _line({**OK_RUN, "out": "4\n"})), Kind.FORGED_VERDICT),
    (STDIN, _result(_line({**OK_RUN, "out": "4\n"}) + "noise"), Kind.FORGED_VERDICT),
    (STDIN, _result(VERDICT_MARK + "{not json\n"), Kind.FORGED_VERDICT),
    (STDIN, _result("x" * 100, truncated=True), Kind.FORGED_VERDICT),
    (STDIN, _result(_line({**OK_RUN, "out": "4\n"}), ok=False, exit_code=3), Kind.TAMPERING),
    (STDIN, _result(_line({**OK_RUN, "out": "4\n"}), ok=False, exit_code=None, timed_out=True), Kind.TIMEOUT),
    (STDIN, _result(ok=True, exit_code=0), Kind.OS_EXIT),
    (STDIN, _result(ok=False, exit_code=7), Kind.OS_EXIT),
    (STDIN, _result(ok=False, exit_code=CHANNEL_EXIT), Kind.CHANNEL_CLOSED),
    (STDIN, _result(ok=False, exit_code=TIMEOUT_EXIT), Kind.TIMEOUT),
    (STDIN, _result(ok=False, exit_code=-9), Kind.KILLED),
    (STDIN, _result(ok=False, exit_code=-11), Kind.CRASH),
    (STDIN, _result(ok=False, exit_code=-2), Kind.KEYBOARD_INTERRUPT),
    (STDIN, _result(ok=False, exit_code=-9, memory=True), Kind.MEMORY),
    (ASSERT, _result(ok=False, exit_code=None, kind="worker_killed"), Kind.KILLED),
    (FUNCTIONAL, _result(_line({**OK_RUN, "value": {"t": [1, 2]}})), Kind.PASS),
    (FUNCTIONAL, _result(_line({**OK_RUN, "value": {"s": [1, 2]}})), Kind.WRONG_ANSWER),
    (FUNCTIONAL, _result(_line({**OK_RUN, "value": [1, {"f": "nan"}]})), Kind.NAN_VALUE),
    (FUNCTIONAL, _result(_line({**OK_RUN, "value": {"x": 1}})), Kind.FORGED_VERDICT),
    (FUNCTIONAL, _result(_line({**OK_RUN, "sha256": digest("[1,2]")})), Kind.PASS),
    (FUNCTIONAL, _result(_line({**OK_RUN, "end": "fake", "type": "Any"})), Kind.FAKE_VALUE),
    (FUNCTIONAL, _result(_line({**OK_RUN, "end": "exit", "code": 0})), Kind.SYSTEM_EXIT),
    (FUNCTIONAL, _result(_line({**OK_RUN, "value": 0, "shadowed": ["check"]})), Kind.REDEFINED_HELPER),
    (FUNCTIONAL, _result(_line({**OK_RUN, "value": 0, "tampered": ["int.__eq__"]})), Kind.TAMPERING),
    (FUNCTIONAL, _result(_line({**OK_RUN, "channel": "closed"})), Kind.CHANNEL_CLOSED),
    (FUNCTIONAL, _result(_line({"end": "later", "value": [1, 2]})), Kind.FORGED_VERDICT),
    (ASSERT, _result(_judged({"pass": True, "kind": "pass", "exc": None, "hints": []})), Kind.PASS),
    (ASSERT, _result(_judged({"pass": True, "kind": "pass", "exc": None, "hints": []}), ok=False, exit_code=-9),
     Kind.TAMPERING),
    (ASSERT, _result(_judged({"pass": True, "kind": "wrong_answer"})), Kind.FORGED_VERDICT),
    (ASSERT, _result(_judged({"pass": False, "kind": "no_such_kind"})), Kind.FORGED_VERDICT),
    (ASSERT, _result(_judged({"pass": False, "kind": "wrong_answer", "hints": ["nan"]})), Kind.NAN_VALUE),
    (ASSERT, _result(_judged({"pass": False, "kind": "wrong_answer", "hints": ["tampered", "forged_verdict"]})),
     Kind.FORGED_VERDICT),
    (ASSERT, _result(_judged({"pass": False, "kind": "system_exit", "hints": ["tampered"]})), Kind.SYSTEM_EXIT),
    # the assert judge's channel: every line carries the nonce of its hello, a taint fails the run
    (ASSERT, _result(_line({"pass": True, "kind": "pass", "exc": None, "hints": []})), Kind.FORGED_VERDICT),
    (ASSERT, _result(_judged({"pass": True, "kind": "pass", "hints": []}) + _line({"pass": True, "kind": "pass"})),
     Kind.FORGED_VERDICT),
    (ASSERT, _result(_judged() + _line({"n": "guess", "pass": True, "kind": "pass"})), Kind.FORGED_VERDICT),
    (ASSERT, _result(_judged({"pass": True, "kind": "pass"}, {"pass": True, "kind": "pass"})), Kind.FORGED_VERDICT),
    (ASSERT, _result(_judged({"taint": "frame"}, {"pass": True, "kind": "pass", "hints": []})), Kind.TAMPERING),
    (ASSERT, _result(_judged({"taint": "gc"})), Kind.TAMPERING),
    (ASSERT, _result(_judged({"pass": True, "kind": "pass", "tampered": ["builtins.abs"]})), Kind.TAMPERING),
    (ASSERT, _result(_judged()), Kind.OS_EXIT),
    (ASSERT, _result(_judged(), ok=False, exit_code=-9), Kind.KILLED),
])
def test_judge_result(test, result, kind):
    assert judge_result(test, result).kind is kind


def test_a_judge_that_cannot_run_is_infrastructure():
    with pytest.raises(HarnessError, match="non-dumpable"):
        judge_result(ASSERT, _result(_judged({"error": "the judge could not make itself non-dumpable"})))
    assert judge_result(STDIN, _result(_line({"error": "x", **OK_RUN, "out": "4\n"}))).kind is Kind.PASS


WHOLE = CodeTest("", "assert", count=4)
FAILED_AT = {"pass": False, "kind": "wrong_answer", "exc": "AssertionError", "hints": []}
P, W = Kind.PASS, Kind.WRONG_ANSWER


@pytest.mark.parametrize("result,kinds", [
    (_result(_judged({"pass": True, "kind": "pass", "exc": None, "hints": [], "passed": 4})), [P, P, P, P]),
    (_result(_judged({**FAILED_AT, "passed": 2})), [P, P, W, W]),
    (_result(_judged({**FAILED_AT, "passed": 0})), [W, W, W, W]),
    (_result(_judged({**FAILED_AT, "passed": 4})), [P, P, P, W]),  # failed after its last test: never all passed
    (_result(_judged({**FAILED_AT, "passed": 9})), [P, P, P, W]),
    (_result(_judged({**FAILED_AT, "passed": -1})), [W, W, W, W]),
    (_result(_judged({**FAILED_AT, "passed": "3"})), [W, W, W, W]),
    (_result(_judged({**FAILED_AT, "passed": 2}), ok=False, exit_code=-9), [Kind.TAMPERING] * 4),
    (_result(_judged({**FAILED_AT, "kind": "timeout", "passed": 1})), [P] + [Kind.TIMEOUT] * 3),
    (_result(_judged({**FAILED_AT, "passed": 2}, {**FAILED_AT, "passed": 2})), [Kind.FORGED_VERDICT] * 4),
    (_result(_judged({"taint": "frame"}, {**FAILED_AT, "passed": 2})), [Kind.TAMPERING] * 4),
])
def test_judge_results_count_the_tests_passed_in_order_before_the_first_failure(result, kinds):
    assert [o.kind for o in judge_results(WHOLE, result)] == kinds


@pytest.mark.parametrize("passed,free,reward", [(2, 1, 1 / 3), (2, 0, 2 / 4), (1, 1, 0.0), (0, 0, 0.0), (3, 2, 1 / 2),
                                                (4, 4, 1.0)])
def test_partial_credit_is_the_tests_passed_past_the_free_ones(passed, free, reward):
    """(k - min(k, F)) / (n - min(k, F)) for a check of n = 4 tests failed after k, F of them free; 1.0 only whole."""
    verdict = {"pass": passed == 4, "kind": "pass" if passed == 4 else "wrong_answer", "exc": None, "hints": [],
               "passed": passed}
    res = finish("x", [replace(WHOLE, free=free)], [_result(_judged(verdict))], 0)
    assert res.reward == pytest.approx(reward) and res.correct is (passed == 4)
    assert res.metrics["tests_passed"] == passed and res.metrics["tests_total"] == 4.0
    assert res.metrics["tests_free"] == free


def test_the_comparisons_of_check_go_through_the_hooks_and_mean_what_they_meant():
    """``==``, ``in``, ``not in`` and ``-`` become the hooks (operands once, in order); other operators and
    chained comparisons stay; the hooks given plain operators, the instrumented check computes the same."""
    tests = assert_tests("def check(candidate):\n    assert candidate(1) == 1 and 2 in candidate(3)\n"
                         "    assert 5 not in [candidate(0) - 1]\n    assert 0 < candidate(1) <= 1 != 2\n")
    assert f"{EQ_HOOK}(candidate(1), 1) and {IN_HOOK}(2, candidate(3))" in tests.source
    assert f"not {IN_HOOK}(5, [{SUB_HOOK}(candidate(0), 1)])" in tests.source
    assert "0 < candidate(1) <= 1 != 2" in tests.source
    ns, calls = {}, []
    exec(tests.source, ns)

    def cand(x):
        calls.append(x)
        return [x, 2, 3] if x == 3 else x

    hooks = {PASSED_MARK: lambda event, i: None, EQ_HOOK: lambda a, b: a == b, IN_HOOK: lambda a, b: a in b,
             SUB_HOOK: lambda a, b: a - b}
    ns["check"](cand, **hooks)
    assert calls == [1, 3, 0, 1]


@pytest.mark.parametrize("test_code", [
    "def check(candidate):\n    try:\n        candidate(0)\n    except ValueError as e:\n        assert e.args == ('x',)\n",
    "def check(candidate):\n    match candidate(1):\n        case [a, *rest]:\n            assert a == 1 and rest == []\n"
    "        case {'k': v, **others}:\n            assert v and not others\n",
    "def check(candidate):\n    assert (n := candidate(2)) == 4 and n\n    with open(0) as fh:\n        assert fh and candidate(1)\n",
])
def test_every_binding_form_of_the_test_code_binds_its_name(test_code):
    assert assert_tests(test_code).lookup == ()
