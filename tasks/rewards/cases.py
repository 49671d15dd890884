"""The tests of an assert-format code ground truth (``check(candidate)``), split and checked on the host.

``assert_cases`` makes one test per top-level statement of ``check`` that holds an ``assert`` using a
value derived from the candidate (an ``assert True, '...'`` tests nothing and is left out), each run
after the setup statements before it; ``check_helpers`` makes sure every name the test uses but does
not define comes from a trusted spec field (``helpers``: the prompt's definitions; ``import_prefix``),
never from the answer. Used by ``tasks.rewards.harness`` and ``tasks.rewards.code``.
"""

from __future__ import annotations

import ast
import builtins
import functools


def _names(tree: ast.AST) -> tuple[set[str], set[str]]:
    """Names a module loads, and names it binds anywhere (assignments, defs, imports, parameters)."""
    loaded, bound = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
    return loaded, bound


@functools.lru_cache(maxsize=4096)
def assert_cases(test_code: str, entry: str = "") -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """The tests of an assert-format ``test_code``: one module source per test (the preamble and a
    ``check`` holding one assert statement after the setup statements before it), the names the test
    uses but never defines (the spec's ``helpers`` or ``import_prefix`` must; ``entry``, the entry
    point's name, is the candidate too, as in HumanEval's own harness) and the names it defines at top
    level. An assert that uses no value derived from the candidate (``assert True, '...'``) is no test
    and is left out."""
    try:
        tree = ast.parse(test_code)
    except (SyntaxError, RecursionError, MemoryError) as err:
        raise ValueError(f"code ground truth: test_code does not parse ({err})") from None
    checks = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"]
    if not checks or not checks[-1].args.args:
        raise ValueError("code ground truth: test_code defines no check(candidate)")
    check = checks[-1]
    preamble = [n for n in tree.body if n is not check and not _calls_check(n)]
    tainted = {check.args.args[0].arg, entry} - {""}  # the candidate and every name bound from it
    cases, setup, asserted = [], [], False
    for stmt in check.body:
        loaded, bound = _names(stmt)
        if any(isinstance(n, ast.Assert) for n in ast.walk(stmt)):
            asserted = True
            if loaded & tainted:
                one = ast.FunctionDef(check.name, check.args, setup + [stmt], [], None, None)
                cases.append(ast.unparse(ast.fix_missing_locations(ast.Module([*preamble, one], []))))
            continue
        setup.append(stmt)
        if loaded & tainted:  # what it binds, and what it hands the candidate (mutated in place)
            tainted |= bound | loaded
    if not asserted and _names(check)[0] & tainted:
        cases = [ast.unparse(ast.Module([*preamble, check], []))]
    if not cases:
        raise ValueError("code ground truth: no assert of check(candidate) uses the candidate")
    loaded, bound = _names(ast.Module([*preamble, check], []))
    lookup = sorted(n for n in loaded - bound - {entry} if not hasattr(builtins, n))
    shadow = sorted(n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)))
    return tuple(cases), tuple(lookup), tuple(shadow)


def check_helpers(spec: dict, lookup: tuple[str, ...]) -> None:
    """``ValueError`` naming the names the test uses that neither ``helpers`` nor ``import_prefix``
    define (skipped when either has a star import: its names are unknown here)."""
    bound: set[str] = set()
    for field in ("import_prefix", "helpers"):
        try:
            tree = ast.parse(spec.get(field) or "")
        except (SyntaxError, RecursionError, MemoryError) as err:
            raise ValueError(f"code ground truth: {field} does not parse ({err})") from None
        if any(isinstance(n, ast.alias) and n.name == "*" for n in ast.walk(tree)):
            return
        bound |= {n for stmt in tree.body for n in _names(stmt)[1]}
    missing = [n for n in lookup if n not in bound]
    if missing:
        raise ValueError(f"code ground truth: test_code uses {missing}, which neither test_code, 'helpers' nor "
                         "'import_prefix' define (put the prompt's definitions in the 'helpers' field)")


def _calls_check(stmt: ast.stmt) -> bool:
    """A top-level ``check(...)`` call (some test files end with one): the harness makes that call."""
    return (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
            and isinstance(stmt.value.func, ast.Name) and stmt.value.func.id == "check")
