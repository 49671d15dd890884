"""Property test (issue 37): on every HumanEval problem, ``correct`` is what the reference harness says.

For each of HumanEval's 164 problems (``tests/fixtures/humaneval``), its canonical solution and mutants of
it (the first comparison flipped, the first int constant plus one, the first ``+`` / ``-`` swapped, inside
the entry point's function) are graded by the code reward (local sandbox) and run by the reference
harness: the prompt, the solution, the test and ``check(entry_point)`` in one plain interpreter, passed when
it exits 0. The two must agree on every one. A mutant the reference needs more than ``NEAR_LIMIT_S`` for
is left out of the comparison (a time limit is not the property under test; at most a few are). Marked
``slow`` (about a minute on 2 busy cores). Run: ``pytest tests/test_humaneval_exactness.py -m slow``.
"""

from __future__ import annotations

import ast
import gzip
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sandbox.base import make_sandbox
from sandbox.config import SandboxConfig
from tasks.data.formats import load_tasks
from tasks.rewards.code import grade_code_batch
from tasks.rewards.config import RewardConfig
from tasks.rewards.harness import PREFIX_MODULES
from tasks.rewards.registry import GraderError

HUMANEVAL = Path(__file__).parent / "fixtures" / "humaneval" / "HumanEval.jsonl.gz"
CFG = RewardConfig(code_timeout_s=5.0)
NEAR_LIMIT_S = 1.5
_FLIP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq}


class _First(ast.NodeTransformer):
    """Change the first node ``change`` accepts (it returns the new node, or None to pass on it)."""

    def __init__(self, change):
        self.change, self.done = change, False

    def generic_visit(self, node):
        if not self.done and (new := self.change(node)) is not None:
            self.done = True
            return new
        return super().generic_visit(node)


def _flip(node):
    if isinstance(node, ast.Compare) and type(node.ops[0]) in _FLIP:
        return ast.Compare(node.left, [_FLIP[type(node.ops[0])](), *node.ops[1:]], node.comparators)
    return None


def _plus_one(node):
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return ast.Constant(node.value + 1)
    return None


def _swap(node):
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
        return ast.BinOp(node.left, ast.Sub() if isinstance(node.op, ast.Add) else ast.Add(), node.right)
    return None


def mutants(code: str, entry: str) -> dict[str, str]:
    """Wrong solutions: ``code`` with one change inside the function ``entry`` (those that change it)."""
    out = {}
    for name, change in (("flip", _flip), ("plus-one", _plus_one), ("swap", _swap)):
        tree = ast.parse(code)
        fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == entry)
        first = _First(change)
        fn.body = [first.visit(stmt) for stmt in fn.body]
        new = ast.unparse(ast.fix_missing_locations(tree))
        if new != ast.unparse(ast.parse(code)):
            out[name] = new + "\n"
    return out


def _reference(program: str) -> tuple[bool, float]:
    """The reference harness: one plain interpreter; passed when it exits 0 (and the time it took)."""
    start = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-c", program], capture_output=True, timeout=20)
    except subprocess.TimeoutExpired:
        return False, time.perf_counter() - start
    return done.returncode == 0, time.perf_counter() - start


def test_mutants_change_only_the_entry_point():
    code = "def helper(x):\n    return x < 1\n\ndef f(x):\n    return x + 2 < 3\n"
    assert mutants(code, "f") == {
        "flip": "def helper(x):\n    return x < 1\n\ndef f(x):\n    return x + 2 <= 3\n",
        "plus-one": "def helper(x):\n    return x < 1\n\ndef f(x):\n    return x + 3 < 3\n",
        "swap": "def helper(x):\n    return x < 1\n\ndef f(x):\n    return x - 2 < 3\n"}


@pytest.mark.slow
def test_correct_is_the_reference_harness_verdict_on_every_humaneval_problem():
    raw = [json.loads(line) for line in gzip.open(HUMANEVAL, "rt")]
    truths = {r.extra_info["id"]: r.ground_truth for r in load_tasks(HUMANEVAL)}
    items, programs = [], []
    for row in raw:
        solutions = {"canonical": row["prompt"] + row["canonical_solution"]}
        solutions.update(mutants(solutions["canonical"], row["entry_point"]))
        for kind, code in solutions.items():
            items.append(("humaneval", f"```python\n{code}```", truths[row["task_id"]], {"id": f"{row['task_id']}/{kind}"}))
            programs.append(f"{code}\n\n{row['test']}\n\ncheck({row['entry_point']})\n")
    with ThreadPoolExecutor(2) as pool:
        reference = list(pool.map(_reference, programs))
    with make_sandbox(SandboxConfig(backend="local", timeout_s=8.0, workers=2, preimport=PREFIX_MODULES)) as sb:
        results = grade_code_batch(items, sandbox=sb, cfg=CFG)
    assert [r for r in results if isinstance(r, GraderError)] == []
    near = {it[3]["id"] for it, (_, took) in zip(items, reference) if took > NEAR_LIMIT_S}
    assert len(near) <= len(items) // 50, sorted(near)
    verdicts = {it[3]["id"]: (r.correct, ok) for it, r, (ok, _) in zip(items, results, reference) if it[3]["id"] not in near}
    assert {k: v for k, v in verdicts.items() if v[0] != v[1]} == {}
    canonical = [k for k, (graded, _) in verdicts.items() if k.endswith("/canonical") and graded]
    assert len(canonical) == 164
    wrong = sum(not ok for ok, _ in reference)
    assert wrong >= 250, wrong  # the mutants do break solutions (271 of them): the comparison is not all "pass"
