"""Code grading in the sandbox: hand-checked cases run on the local backend and (marked) on Docker.

Every case states the reward a careful human grader gives: the fraction of tests the final
fenced Python block passes (-1.0 for no block / a syntax error, as the reference scores it).
The Docker variants are marked ``docker`` and skipped with the reason when no engine or no
docker backend is available. Run: ``pytest tests/test_rewards_code.py -m "not docker"``.
"""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from sandbox.base import make_sandbox
from sandbox.config import SandboxConfig
from sandbox.result import ExecutionResult, SandboxInfraError
from tasks.rewards.code import extract_code, grade_code_batch, parse_tests
from tasks.rewards.config import RewardConfig
from tasks.rewards.harness import PREFIX_MODULES, VERDICT_MARK, outputs_match, values_match
from tasks.rewards.registry import GraderError, compute_reward

CFG = RewardConfig(code_timeout_s=1.0)

ADD = {"inputs": ["1 2\n", "3 4\n", "10 -5\n", "0 0\n"], "outputs": ["3\n", "7\n", "5\n", "0\n"]}
DOUBLE_LINES = {"inputs": ["3\n1\n2\n3\n", "1\n-4\n"], "outputs": ["2\n4\n6\n", "-8\n"]}
SUM_FN = {"inputs": ["[1, 2, 3]", "[]", "[-1, 1]"], "outputs": ["6", "0", "0"], "fn_name": "sumAll"}
RANGE_FN = {"inputs": ["[3, 1, 2]", "[5]"], "outputs": ["[1, 3]", "[5, 5]"], "fn_name": "minMax"}
HALF_FN = {"inputs": ["1", "3"], "outputs": ["0.5", "1.5"], "fn_name": "half"}
TWO_ARGS_FN = {"inputs": ["\"ab\"\n3", "\"x\"\n0"], "outputs": ["\"ababab\"", "\"\""], "fn_name": "rep"}
SQUARE_ASSERT = {
    "import_prefix": "import math\n",
    "test_code": "def check(candidate):\n    assert candidate(2) == 4\n    assert candidate(3) == 9\n    assert candidate(-4) == 16\n",
    "entry_point": "square",
}


def fenced(code: str) -> str:
    return f"I will test it first.\n<tool_call>...</tool_call>\nFinal code:\n```python\n{code}\n```"


# (case id, response text, test spec, expected reward)
CODE_CASES = [
    ("stdin-correct", fenced("a, b = map(int, input().split())\nprint(a + b)"), ADD, 1.0),
    ("stdin-sys-read", fenced("import sys\na, b = map(int, sys.stdin.read().split())\nprint(a + b)"), ADD, 1.0),
    ("stdin-open0", fenced("a, b = map(int, open(0).read().split())\nprint(a + b)"), ADD, 1.0),
    ("stdin-buffer", fenced("import sys\na, b = map(int, sys.stdin.buffer.readline().split())\nprint(a + b)"), ADD, 1.0),
    ("trailing-whitespace", fenced("a, b = map(int, input().split())\nprint(a + b, '   ')\nprint()\nprint()"), ADD, 1.0),
    ("leading-whitespace", fenced("a, b = map(int, input().split())\nprint('  ', a + b)"), ADD, 1.0),
    ("extra-output-line", fenced("a, b = map(int, input().split())\nprint(a + b)\nprint('done')"), ADD, 0.0),
    # ADD's last test ("0 0" -> "0") is free: printing 0 passes it, so it earns nothing unless all pass
    ("wrong-op-passes-only-the-free-one", fenced("a, b = map(int, input().split())\nprint(a - b)"), ADD, 0.0),
    ("passes-half", fenced("a, b = map(int, input().split())\nprint(3 if a == 1 else 0)"), ADD, 1 / 3),
    ("times-out", fenced("while True:\n    pass"), ADD, 0.0),
    ("times-out-on-one", fenced("a, b = map(int, input().split())\nwhile a == 10:\n    pass\nprint(a + b)"), ADD, 2 / 3),
    ("crashes", fenced("raise ValueError('nope')"), ADD, 0.0),
    ("crashes-on-one", fenced("a, b = map(int, input().split())\nx = 1 / (a - 1) if a == 1 else 0\nprint(a + b)"), ADD, 2 / 3),
    ("name-error", fenced("print(a + b)"), ADD, 0.0),
    ("exit-0-after-print", fenced("import sys\na, b = map(int, input().split())\nprint(a + b)\nsys.exit(0)"), ADD, 1.0),
    ("exit-1-after-print", fenced("import sys\na, b = map(int, input().split())\nprint(a + b)\nsys.exit(1)"), ADD, 0.0),
    ("main-guard", fenced("def main():\n    a, b = map(int, input().split())\n    print(a + b)\n\nif __name__ == '__main__':\n    main()"), ADD, 1.0),
    ("float-format", fenced("a, b = map(int, input().split())\nprint(f'{a + b:.6f}')"), ADD, 1.0),
    ("stderr-noise", fenced("import sys\na, b = map(int, input().split())\nprint('debug', file=sys.stderr)\nprint(a + b)"), ADD, 1.0),
    ("memory-hog", fenced("x = bytearray(8 * 1024 ** 3)\nprint(len(x))"), ADD, 0.0),
    ("no-code-block", "The answer is to add the two numbers: print(a + b).", ADD, -1.0),
    ("unlabelled-fence", "```\na, b = map(int, input().split())\nprint(a + b)\n```", ADD, -1.0),
    ("syntax-error", fenced("a, b = map(int, input().split()\nprint(a + b)"), ADD, -1.0),
    ("last-block-wins", fenced("print(0)") + "\nFixed:\n" + fenced("a, b = map(int, input().split())\nprint(a + b)"), ADD, 1.0),
    ("think-block-ignored", "<think>```python\nprint(0)\n```</think>" + fenced("a, b = map(int, input().split())\nprint(a + b)"), ADD, 1.0),
    ("multiline-correct", fenced("n = int(input())\nfor _ in range(n):\n    print(2 * int(input()))"), DOUBLE_LINES, 1.0),
    ("multiline-one-line-output", fenced("n = int(input())\nprint(*[2 * int(input()) for _ in range(n)])"), DOUBLE_LINES, 0.5),
    ("fn-class", fenced("class Solution:\n    def sumAll(self, nums: List[int]) -> int:\n        return sum(nums)"), SUM_FN, 1.0),
    ("fn-plain-function", fenced("def sumAll(nums):\n    return sum(nums)"), SUM_FN, 1.0),
    ("fn-partial", fenced("class Solution:\n    def sumAll(self, nums):\n        return sum(nums) if nums else 1"), SUM_FN, 1 / 2),  # the [-1, 1] -> 0 pass is free
    ("fn-prints-debug", fenced("class Solution:\n    def sumAll(self, nums):\n        print('nums', nums)\n        return sum(nums)"), SUM_FN, 1.0),
    ("fn-wrong-name", fenced("class Solution:\n    def total(self, nums):\n        return sum(nums)"), SUM_FN, 0.0),
    ("fn-timeout", fenced("class Solution:\n    def sumAll(self, nums):\n        while True:\n            pass"), SUM_FN, 0.0),
    ("fn-tuple-as-list", fenced("class Solution:\n    def minMax(self, nums):\n        return (min(nums), max(nums))"), RANGE_FN, 1.0),
    ("fn-float-tolerance", fenced("class Solution:\n    def half(self, x):\n        return x / 2 + 1e-9"), HALF_FN, 1.0),
    ("fn-two-args", fenced("class Solution:\n    def rep(self, s: str, k: int) -> str:\n        return s * k"), TWO_ARGS_FN, 1.0),
    ("assert-correct", fenced("def square(x):\n    return x * x"), SQUARE_ASSERT, 1.0),
    ("assert-partial", fenced("def square(x):\n    return x * abs(x)"), SQUARE_ASSERT, 2 / 3),
    ("assert-crash-at-import", fenced("import not_a_module_xyz\ndef square(x):\n    return x * x"), SQUARE_ASSERT, 0.0),
]


def _docker_skip_reason() -> str | None:
    if shutil.which("docker") is None:
        return "no docker CLI on this machine"
    try:
        info = subprocess.run(["docker", "info"], capture_output=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"docker engine not reachable ({err})"
    if info.returncode != 0:
        return "docker engine not running (`docker info` failed)"
    return None


@pytest.fixture(scope="module", params=["local", pytest.param("docker", marks=pytest.mark.docker)])
def sandbox(request):
    if request.param == "docker" and (reason := _docker_skip_reason()):
        pytest.skip(reason)
    try:
        sb = make_sandbox(SandboxConfig(backend=request.param, timeout_s=3.0, workers=2, preimport=PREFIX_MODULES))
    except ValueError as err:
        pytest.skip(f"{request.param} sandbox backend unavailable: {err}")
    with sb:
        yield sb


def test_code_case_count():
    assert len(CODE_CASES) >= 30


@pytest.mark.parametrize("case_id,response,spec,expected", CODE_CASES, ids=[c[0] for c in CODE_CASES])
def test_code_cases(sandbox, case_id, response, spec, expected):
    result = compute_reward("livecodebench_v6", response, json.dumps(spec), {"id": case_id}, sandbox=sandbox, cfg=CFG)
    assert result.reward == pytest.approx(expected), (case_id, result.metrics)
    assert result.correct is (expected == 1.0)


def test_timeout_and_crash_metrics(sandbox):
    slow = compute_reward("livecodebench", CODE_CASES[10][1], ADD, sandbox=sandbox, cfg=CFG)
    assert slow.metrics["timeouts"] == 1.0 and slow.metrics["tests_passed"] == 3.0
    crash = compute_reward("livecodebench", CODE_CASES[12][1], ADD, sandbox=sandbox, cfg=CFG)
    assert crash.metrics["runtime_errors"] == 1.0 and crash.metrics["timeouts"] == 0.0


def test_batch_matches_single(sandbox):
    picked = [CODE_CASES[i] for i in (0, 7, 20, 27, 37)]
    items = [("livecodebench", c[1], c[2], {"id": c[0]}) for c in picked] + [("livecodebench", "x", "not json", {"id": 9})]
    *graded, broken = grade_code_batch(items, sandbox=sandbox, cfg=CFG)
    assert [r.reward for r in graded] == pytest.approx([c[3] for c in picked])
    assert isinstance(broken, GraderError) and broken.row_id == "9" and not broken.infra


def test_batch_infra_failure_marks_every_runnable_item():
    items = [("lcb", CODE_CASES[0][1], ADD, {"id": 1}), ("lcb", "no block", ADD, {"id": 2})]
    first, second = grade_code_batch(items, sandbox=FlakySandbox(failures=10), cfg=CFG)
    assert isinstance(first, GraderError) and first.infra and first.row_id == "1"
    assert second.reward == -1.0, "a format error needs no sandbox and is still scored"


def test_format_error_metrics_without_sandbox():
    no_block = compute_reward("livecodebench", "no code here", ADD, cfg=CFG)
    assert no_block.metrics["no_code_block"] == 1.0 and no_block.reward == -1.0
    bad = compute_reward("livecodebench", fenced("def f(:"), ADD, cfg=RewardConfig(code_format_error_reward=0.0))
    assert bad.metrics["syntax_error"] == 1.0 and bad.reward == 0.0


def test_missing_sandbox_is_a_grader_error():
    with pytest.raises(GraderError, match="needs a sandbox"):
        compute_reward("livecodebench", CODE_CASES[0][1], ADD, {"id": "x"}, cfg=CFG)


class FlakySandbox:
    """Raises ``SandboxInfraError`` for the first ``failures`` batches, then answers every snippet with a pass."""

    def __init__(self, failures: int):
        self.failures, self.calls = failures, 0

    def run_many(self, codes, timeout_s=None):
        self.calls += 1
        if self.calls <= self.failures:
            raise SandboxInfraError("executor died")
        verdict = VERDICT_MARK + '{"end": "ok", "out": "3\\n", "tampered": []}\n'
        return [ExecutionResult(True, 0, verdict, "", None, False, False, 0.01) for _ in codes]


def test_infra_failure_is_retried_then_graded():
    sb = FlakySandbox(failures=2)
    res = compute_reward("livecodebench", CODE_CASES[0][1], {"inputs": ["1 2"], "outputs": ["3"]}, sandbox=sb, cfg=CFG)
    assert res.reward == 1.0 and res.metrics["infra_retries"] == 2.0 and sb.calls == 3


def test_persistent_infra_failure_is_never_scored():
    sb = FlakySandbox(failures=10)
    with pytest.raises(GraderError) as info:
        compute_reward("livecodebench", CODE_CASES[0][1], ADD, {"id": 5}, sandbox=sb, cfg=CFG)
    assert info.value.infra and info.value.row_id == "5" and sb.calls == CFG.infra_retries + 1


@pytest.mark.parametrize(
    "got,want,same",
    [("3\n", "3", True), ("3  \n\n", "3\n", True), (" 1 2 \n3", "1 2\n3\n", True), ("1  2", "1 2", True),
     ("0.3333333", "0.33333333", True), ("1 2", "1\n2", False), ("yes", "Yes", False), ("", "0", False)],
)
def test_outputs_match(got, want, same):
    assert outputs_match(got, want) is same


def test_extract_code_and_parse_tests():
    assert extract_code("```py\nx = 1\n```") == "x = 1\n"
    assert extract_code("```Python3\nx = 2\n```") == "x = 2\n"
    assert parse_tests(str(ADD)) == ADD
    with pytest.raises(ValueError, match="2 inputs but 1 outputs"):
        parse_tests({"inputs": ["1", "2"], "outputs": ["1"]})
    with pytest.raises(ValueError, match="lacks"):
        parse_tests({"inputs": ["1"]})


def test_livecodebench_fixture_rows_grade_end_to_end(sandbox, tmp_path):
    from tasks.data.formats import load_tasks
    from tests.fixtures.formats import write_all

    stdin_task, fn_task = load_tasks(write_all(tmp_path)["livecodebench"])
    answers = {
        stdin_task.id: fenced("print(2 * int(input()))"),
        fn_task.id: fenced("class Solution:\n    def maxElement(self, nums: List[int]) -> int:\n        return max(nums)"),
    }
    for task in (stdin_task, fn_task):
        res = compute_reward(task.data_source, answers[task.id], task.ground_truth, task.extra_info, sandbox=sandbox, cfg=CFG)
        assert res.correct and res.metrics["tests_total"] == 2.0, task.id
    wrong = compute_reward(fn_task.data_source, fenced("def maxElement(nums):\n    return nums[0]"), fn_task.ground_truth,
                           sandbox=sandbox, cfg=CFG)
    assert wrong.reward == 0.5


def test_bench_code_smoke():
    from typer.testing import CliRunner

    from flows.cli_data import app
    from tasks.rewards.bench import bench_code

    result = bench_code(pairs=20, workers=2)
    assert result.pairs == 20 and result.batch_tests_per_s > 0 and result.single_tests_per_s > 0
    out = CliRunner().invoke(app, ["bench-code", "--pairs", "10", "--workers", "2"])
    assert out.exit_code == 0 and "10 snippet x test pairs on local" in out.output and "tests/s" in out.output


@pytest.mark.parametrize(
    "value,want,same",
    [((1, 3), "[1, 3]", True), ([1, 2], "[1, 2, 3]", False), (0.1 + 0.2, "0.3", True), (True, "1", False),
     ({"a": [1.0]}, '{"a": [1]}', True), ("ab", '"ab"', True), ({1, 2}, "[1, 2]", False), (None, "null", True)],
)
def test_values_match(value, want, same):
    assert values_match(value, want) is same


def test_large_output_is_compared_inside_the_sandbox(sandbox):
    n = 200_000
    spec = {"inputs": [f"{n}\n"], "outputs": ["\n".join(map(str, range(n))) + "\n"]}
    code = "import sys\nn = int(input())\nsys.stdout.write('\\n'.join(map(str, range(n))) + '\\n')"
    res = compute_reward("livecodebench", fenced(code), spec, sandbox=sandbox, cfg=CFG)
    assert res.correct, res.metrics


def test_thread_started_solution_is_awaited(sandbox):
    code = ("import threading, time\ndef main():\n    time.sleep(0.2)\n    a, b = map(int, input().split())\n"
            "    print(a + b)\nthreading.Thread(target=main).start()")
    res = compute_reward("livecodebench", fenced(code), ADD, sandbox=sandbox, cfg=CFG)
    assert res.reward == 1.0, res.metrics


def test_prefix_modules_cover_the_harness_imports():
    assert {"typing", "collections", "math", "json", "threading"} <= set(PREFIX_MODULES)
