"""The tests of an assert-format code ground truth (``check(candidate)``), read and checked on the host.

The reference harness runs the prompt's helpers, the answer, the test and ``check(candidate)`` in one
interpreter: the test passes when ``check`` returns. ``assert_tests`` keeps that run whole and only
instruments ``check`` for the judge (``tasks.rewards.judge.inproc``), which runs it in the answer's own
interpreter:

- each top-level statement of ``check`` that holds an ``assert`` using a value derived from the candidate
  is one *test* (an ``assert True, '...'`` tests nothing and is not counted; it still runs, as in the
  reference); after each the marked source calls ``PASSED_MARK(MARK_EVENT, i)`` (i tests passed so far,
  in order; the judge passes ``sys.audit``, its audit hook checks the call comes from this ``check``);
- every ``a == b``, ``a in b`` / ``a not in b`` and ``a - b`` in ``check`` (comprehensions and nested
  functions included) goes through ``EQ_HOOK`` / ``IN_HOOK`` / ``SUB_HOOK``, which compute exactly what the
  operator computes and tell the judge when a value whose comparison comes from the answer's code equals
  two different values (an always-true ``__eq__``: ``fake_value``);
- those names are keyword-only parameters of ``check`` the judge passes, so they are locals of the
  running ``check``, out of the answer's reach but through its frame (which the judge's audit hook sees).

Nothing is split, so a later assert always sees what the earlier ones did (a list mutated in place, a
generator advanced, an object's state). ``check_helpers`` makes sure every name the test uses but does not
define (or bind: assignments, ``except ... as``, ``match`` captures, ``with ... as``, walrus, imports,
parameters) comes from a trusted spec field (``helpers``: the prompt's definitions; ``import_prefix``),
never from the answer. Used by ``tasks.rewards.harness`` and ``tasks.rewards.code``.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import copy
import functools
import sys
import threading
from typing import NamedTuple

from tasks.rewards.judge.wire import EQ_HOOK, IN_HOOK, MARK_EVENT, PASSED_MARK, SUB_HOOK

__all__ = ["EQ_HOOK", "IN_HOOK", "MARK_EVENT", "PASSED_MARK", "SUB_HOOK", "AssertTests", "assert_tests", "check_helpers"]


class AssertTests(NamedTuple):
    """An assert-format test code, ready for the judge."""

    source: str
    """The test module with ``check`` instrumented: ``PASSED_MARK(i)`` after the i-th test, comparisons
    through the hooks (a top-level ``check(...)`` call the file ends with is left out: the judge makes that
    call, passing the hooks by keyword)."""
    count: int
    """How many tests ``check`` holds (1 when it holds no counted assert: the whole run is the test)."""
    lookup: tuple[str, ...]
    """Names the test uses but never defines (the spec's ``helpers`` or ``import_prefix`` must)."""
    shadow: tuple[str, ...]
    """Names the test code defines at top level (an answer defining them is flagged)."""


def _names(tree: ast.AST) -> tuple[set[str], set[str]]:
    """Names a module loads, and names it binds anywhere (assignments, defs, imports, parameters,
    ``except ... as``, ``match`` captures)."""
    loaded, bound = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)):
            if node.name:
                bound.add(node.name)
        elif isinstance(node, ast.MatchMapping):
            if node.rest:
                bound.add(node.rest)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
    return loaded, bound


_DIGITS = threading.Lock()


@contextlib.contextmanager
def _any_int_length():
    """Python's limit on int/str conversion (4300 digits) lifted while the test code is parsed and written
    back: an expected answer may be a longer int literal (the judge compiles it the same way)."""
    if not hasattr(sys, "set_int_max_str_digits"):
        yield
        return
    with _DIGITS:
        old = sys.get_int_max_str_digits()
        sys.set_int_max_str_digits(0)
        try:
            yield
        finally:
            sys.set_int_max_str_digits(old)


def _mark(i: int) -> ast.stmt:
    return ast.Expr(ast.Call(ast.Name(PASSED_MARK, ast.Load()), [ast.Constant(MARK_EVENT), ast.Constant(i)], []))


def _hook(name: str, left: ast.expr, right: ast.expr) -> ast.Call:
    return ast.Call(ast.Name(name, ast.Load()), [left, right], [])


class _Hooked(ast.NodeTransformer):
    """``a == b`` -> ``EQ_HOOK(a, b)``, ``a in b`` -> ``IN_HOOK(a, b)``, ``a not in b`` -> ``not IN_HOOK(a, b)``
    (Python defines it so), ``a - b`` -> ``SUB_HOOK(a, b)``; operands evaluated once, in the same order.
    Chained comparisons and other operators are left as written."""

    def visit_Compare(self, node: ast.Compare) -> ast.expr:
        self.generic_visit(node)
        if len(node.ops) != 1:
            return node
        op, left, right = node.ops[0], node.left, node.comparators[0]
        if isinstance(op, ast.Eq):
            return ast.copy_location(_hook(EQ_HOOK, left, right), node)
        if isinstance(op, ast.In):
            return ast.copy_location(_hook(IN_HOOK, left, right), node)
        if isinstance(op, ast.NotIn):
            return ast.copy_location(ast.UnaryOp(ast.Not(), _hook(IN_HOOK, left, right)), node)
        return node

    def visit_BinOp(self, node: ast.BinOp) -> ast.expr:
        self.generic_visit(node)
        if isinstance(node.op, ast.Sub):
            return ast.copy_location(_hook(SUB_HOOK, node.left, node.right), node)
        return node


_HOOKS = (PASSED_MARK, EQ_HOOK, IN_HOOK, SUB_HOOK)


@functools.lru_cache(maxsize=4096)
def assert_tests(test_code: str, entry: str = "") -> AssertTests:
    """The marked test module of an assert-format ``test_code`` (see ``AssertTests``); ``entry``, the
    entry point's name, is the candidate too, as in HumanEval's own harness. A statement that uses the
    candidate taints the names it loads (a list handed to it, mutated in place) and, when it is no assert,
    those it binds, so a later assert on those names counts as a test."""
    try:
        with _any_int_length():
            tree = ast.parse(test_code)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as err:
        raise ValueError(f"code ground truth: test_code does not parse ({err})") from None
    checks = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"]
    if not checks or not checks[-1].args.args:
        raise ValueError("code ground truth: test_code defines no check(candidate)")
    check = checks[-1]
    tainted = {check.args.args[0].arg, entry} - {""}  # the candidate and every name bound from it
    body, count, asserted = [], 0, False
    for stmt in check.body:
        loaded, bound = _names(stmt)
        body.append(stmt)
        if any(isinstance(n, ast.Assert) for n in ast.walk(stmt)):
            asserted = True
            if loaded & tainted:
                count += 1
                body.append(_mark(count))
                tainted |= {n for n in loaded if not hasattr(builtins, n)}  # what it handed the candidate
        elif loaded & tainted:
            tainted |= bound | loaded
    if not asserted and _names(check)[0] & tainted:
        count = 1  # no assert: the whole run is the one test, passed when check returns
    if not count:
        raise ValueError("code ground truth: no assert of check(candidate) uses the candidate")
    module = [n for n in tree.body if not _calls_check(n)]
    loaded, bound = _names(ast.Module(module, []))
    lookup = tuple(sorted(n for n in loaded - bound - {entry} if not hasattr(builtins, n)))
    shadow = tuple(sorted(n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))))
    marked = copy.copy(check)
    marked.body = [_Hooked().visit(stmt) for stmt in body]
    marked.args = copy.copy(check.args)
    marked.args.kwonlyargs = [*check.args.kwonlyargs, *(ast.arg(name) for name in _HOOKS)]
    marked.args.kw_defaults = [*check.args.kw_defaults, *(ast.Constant(None) for _ in _HOOKS)]
    module = [marked if n is check else n for n in module]
    try:
        with _any_int_length():
            source = ast.unparse(ast.fix_missing_locations(ast.Module(module, [])))
    except (ValueError, RecursionError) as err:
        raise ValueError(f"code ground truth: test_code cannot be rewritten ({err})") from None
    return AssertTests(source, count, lookup, shadow)


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
