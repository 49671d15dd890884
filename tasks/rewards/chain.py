"""The chain grader (``synthetic-chain/*``, the multi-call regime): a right answer must come out of the chain's calls.

A chain prompt (``tasks.data.synthetic.chains``) asks for the result of its last step. The grader reads the
trajectory's record (``tasks.rewards.record``: its structured turns and the executions that really ran), never
the decoded text. The answer is the last ``\\boxed{}`` of the response's **last assistant turn**, and it is correct
only when all three hold:

1. it equals the ground truth (an integer, compared as text once stripped);
2. **grounded**: it is what the call of the turn before it printed (the last line of that execution's stdout, a
   clean run). A boxed guess with no call before it, after a call that failed or printed something else, or in a
   turn whose own call ran after it was written, earns nothing even when it is right;
3. **followed**: the calls computed it from the chain's inputs. The grader redraws the chain's first problem
   (same kind, same names, new values; its truth from the generator) ``REPLAYS`` times, each time changing every
   step's right value, and **replays the policy's own clean calls** on each redrawn chain in the sandbox, in
   order: a bound input's value written as a literal (``145545`` for ``p``) becomes its new value, and a literal
   equal to what an earlier clean call printed (``r = 675``) becomes what that call printed in the replay — the
   carried value. The answer's call must print the redrawn chain's answer every time. A call that prints a
   constant (``print(1)``, ``print(1 + 0)``, behind a docstring or ``if True:``, ``int('1')``), ignores what it
   binds, or computes the last step on an intermediate no call printed prints the old answer, or a wrong one,
   and earns nothing.

Merging steps into fewer calls is allowed (a call computing steps 1 to 3 from ``p``, ``q``, ``c``, ``e`` follows
the chain): fewer calls is a legitimate way to fail less. What the replay cannot see: a value carried in another
form than an integer literal (``int('675')``, a string, arithmetic on digits) is read as a constant, and a
literal that happens to equal a carried or bound value is read as that value. ``suspected_hacks/…`` counts a
right answer that was not grounded (``answer_not_from_a_call``) or not followed (``answer_not_from_the_chain``);
``calls`` is the number of calls that ran in the final trajectory (a call the turn budget cut never ran).
"""

from __future__ import annotations

import ast
import functools
import random
from dataclasses import dataclass

from sandbox.result import SandboxInfraError
from tasks.data.synthetic.chains import PARAM_NAMES, step_value
from tasks.data.synthetic.problems import KINDS, run_program
from tasks.rewards.config import RewardConfig
from tasks.rewards.record import Ran, read_record
from tasks.rewards.registry import RewardResult, last_boxed, register_reward, unbox

REPLAYS = 2
"""Redrawn chains every answer's calls are replayed on."""
MAX_DRAWS = 5000
"""Draws of the first problem tried to find ``REPLAYS`` redrawn chains."""


def bound_values(code: str) -> set[int]:
    """The integers ``code`` binds to a name by a literal assignment on a line of its own (``r = 4334``): how a
    later call carries the previous call's result (the sandbox keeps no state between calls). Read line by line,
    so a call whose binding is right but whose code has a mistake elsewhere (a syntax error) still binds."""
    out = set()
    for line in code.splitlines():
        try:
            tree = ast.parse(line)
        except SyntaxError:
            continue
        for stmt in tree.body:
            if isinstance(stmt, ast.Assign) and _literal(stmt.value):
                value = ast.literal_eval(stmt.value)
                if isinstance(value, int) and not isinstance(value, bool):
                    out.add(value)
    return out


def _literal(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        return _literal(node.operand)
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return all(_literal(e) for e in node.elts)
    return False


def printed(text: str | None) -> str:
    """The last non-empty line of a call's stdout, stripped: the value it printed."""
    lines = [ln.strip() for ln in (text or "").strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def _int(text: str) -> int | None:
    try:
        return int(text) if text.lstrip("-").isdigit() else None
    except ValueError:  # more digits than int() reads
        return None


# ---------------------------------------------------------------- the redrawn chains


@dataclass(frozen=True)
class Redrawn:
    """A chain with the same kind, names and bound numbers as the prompt's, and a new first problem."""

    setup: str
    inputs: tuple[tuple[str, object], ...]
    """The first problem's bound inputs (name, value), in the setup's order."""
    values: tuple[int, ...]
    """Each step's right value."""


def _pairs(setup: str) -> list[tuple[str, object]]:
    out = []
    for line in setup.splitlines():
        name, sep, value = line.partition(" = ")
        if not sep:
            raise ValueError(f"chain grader: extra_info['setup'] line {line!r} is not 'name = value'")
        out.append((name, ast.literal_eval(value)))
    return out


def _values(ops: list[str], first: int, params: dict[str, object]) -> tuple[int, ...]:
    values = [first]
    for k, op in enumerate(ops[1:], start=1):
        values.append(step_value(op, values[-1], params.get(PARAM_NAMES[k - 1])))
    return tuple(values)


@functools.lru_cache(maxsize=4096)
def redrawn(kind: str, setup: str, n: int = REPLAYS) -> tuple[Redrawn, tuple[Redrawn, ...]]:
    """``(the prompt's chain, n redrawn chains whose every step value differs from it)``, the same on every call
    (seeded by kind and setup). The first problem's truth comes from the generator (``KINDS``)."""
    ops = kind.split("+")
    if ops[0] not in KINDS:
        raise ValueError(f"chain grader: extra_info['kind']={kind!r}: first step {ops[0]!r} is not a kind "
                         f"({sorted(KINDS)})")
    pairs = _pairs(setup)
    inputs = tuple((k, v) for k, v in pairs if k not in PARAM_NAMES)
    params = {k: v for k, v in pairs if k in PARAM_NAMES}
    param_lines = "".join(f"\n{k} = {v!r}" for k, v in params.items())
    names = tuple(k for k, _ in inputs)
    rng, original, found = random.Random(f"chain-replay:{kind}:{setup}"), None, []
    for _ in range(MAX_DRAWS):
        p = KINDS[ops[0]].draw(rng)
        drawn = _pairs(p.setup) if p is not None else []
        if tuple(k for k, _ in drawn) != names:
            continue
        if original is None:
            base = "\n".join(f"{k} = {v!r}" for k, v in inputs)
            original = Redrawn(setup, inputs, _values(ops, int(run_program(p.right[0].code, base)), params))
        values = _values(ops, p.answer, params)
        if all(a != b for a, b in zip(values, original.values)):
            found.append(Redrawn(p.setup + param_lines, tuple(drawn), values))
            if len(found) == n:
                return original, tuple(found)
    raise ValueError(f"chain grader: {n} redrawn chains of kind {kind!r} with other step values not found in "
                     f"{MAX_DRAWS} draws")


# ---------------------------------------------------------------- the replay


class _Broken(Exception):
    """A call refers to a carried value whose call broke in the replay."""


class _Carry(ast.NodeTransformer):
    """Replace literals by the value they stand for in the replay (``mapping``: repr of the old value → the new
    value's repr, or None when that value's call broke)."""

    def __init__(self, mapping: dict[str, str | None]):
        self.mapping, self.changed = mapping, False

    def visit(self, node: ast.AST) -> ast.AST:
        if isinstance(node, ast.expr) and _literal(node):
            key = _key(ast.literal_eval(node))
            if key is not None and key in self.mapping:
                if self.mapping[key] is None:
                    raise _Broken
                self.changed = True
                return ast.copy_location(ast.parse(self.mapping[key], mode="eval").body, node)
        return self.generic_visit(node)


def _key(value) -> str | None:
    """The key of a value a literal can carry: an int (never a bool) or a list / tuple of ints."""
    ints = type(value) is int or (isinstance(value, (list, tuple)) and value and all(type(v) is int for v in value))
    try:
        return repr(value) if ints else None
    except ValueError:  # more digits than repr() writes
        return None


def _replayed(code: str, mapping: dict[str, str | None]) -> str | None:
    """``code`` with its carried literals replaced (None: it needs a value that broke)."""
    try:
        tree = ast.parse(code)
        carry = _Carry(mapping)
        tree = carry.visit(tree)
    except SyntaxError:
        return code
    except _Broken:
        return None
    return ast.unparse(tree) if carry.changed else code


def follows(calls: list[Ran], chain: Redrawn, replays: tuple[Redrawn, ...], sandbox) -> bool:
    """Whether the last of ``calls`` (clean calls in turn order) prints every redrawn chain's answer when they are
    replayed on it (see the module docstring)."""
    if sandbox is None:
        raise ValueError("chain grader: replaying the calls needs a sandbox (pass sandbox=)")
    values = [_int(printed(c.stdout)) for c in calls]
    out: list[list[int | None]] = [[] for _ in replays]
    for i, c in enumerate(calls):
        codes = []
        for j, r in enumerate(replays):
            mapping: dict[str, str | None] = {_key(v): repr(w) for (_, v), (_, w) in zip(chain.inputs, r.inputs)
                                              if _key(v) is not None}
            for h in range(i):
                if values[h] is not None:
                    mapping[repr(values[h])] = None if out[j][h] is None else repr(out[j][h])
            codes.append(_replayed(c.code, mapping))
        runnable = [(code, r.setup) for code, r in zip(codes, replays) if code is not None]
        results = iter(sandbox.run_many([k for k, _ in runnable], setups=[s for _, s in runnable]) if runnable else [])
        for j, code in enumerate(codes):
            res = next(results) if code is not None else None
            if res is not None and res.error_kind == "setup_error":
                raise SandboxInfraError(f"chain grader: a redrawn chain's setup failed: {res.stderr[-300:]}")
            out[j].append(_int(printed(res.stdout)) if res is not None and res.ok else None)
    return all(o[-1] == r.values[-1] for o, r in zip(out, replays))


# ---------------------------------------------------------------- the grader


def _chain_of(extra_info: dict) -> tuple[str, str]:
    kind, setup = extra_info.get("kind"), extra_info.get("setup")
    if not isinstance(kind, str) or not isinstance(setup, str):
        raise ValueError("chain grader: extra_info needs the chain's 'kind' and 'setup' (the prompt row's extra_info; "
                         f"got kind={kind!r}, setup={setup!r})")
    return kind, setup


def final_calls(runs: list[Ran]) -> list[Ran]:
    """The executions that stand in the final trajectory: the last one at each position (SAAR's earlier attempts
    at a position were cut out), in turn order."""
    last: dict[int, Ran] = {}
    for r in runs:
        last[r.position] = r
    return [last[p] for p in sorted(last)]


@register_reward("synthetic-chain/*")
def chain_reward(solution_str: str, ground_truth, extra_info: dict, *, sandbox=None, cfg: RewardConfig) -> RewardResult:
    """Chain: the last turn's boxed answer equals the ground truth, the call before it printed it, and the calls
    compute it from the chain's inputs (replayed on redrawn chains). ``solution_str`` is not read."""
    gold = str(ground_truth).strip()
    if not gold.lstrip("-").isdigit():
        raise ValueError(f"chain ground truth {ground_truth!r} is not an integer")
    kind, setup = _chain_of(extra_info)
    turns, runs = read_record(extra_info, "chain grader")
    assistant = [t for t in turns if t.get("role") == "assistant"]
    answer = unbox(last_boxed(assistant[-1]["content"])) if assistant else None
    answer = answer.strip() if answer is not None else None
    ran = final_calls(runs)
    src = ran[-1] if ran and ran[-1].position == len(assistant) - 2 else None
    grounded = src is not None and src.ok and answer is not None and printed(src.stdout) == answer
    right = answer == gold
    followed = False
    if right and grounded:
        chain, replays = redrawn(kind, setup)
        if chain.values[-1] != int(gold):
            raise ValueError(f"chain grader: ground truth {gold} is not the answer {chain.values[-1]} of the chain "
                             f"its kind {kind!r} and setup describe")
        followed = follows([r for r in ran if r.ok and r.code is not None], chain, replays, sandbox)
    metrics = {"acc": float(followed), "has_answer": float(answer is not None),
               "calls": float(sum(r.code is not None for r in ran)), "grounded": float(grounded),
               "followed": float(followed)}
    if right and not grounded:
        metrics["suspected_hacks/answer_not_from_a_call"] = 1.0
    elif right and not followed:
        metrics["suspected_hacks/answer_not_from_the_chain"] = 1.0
    return RewardResult(cfg.correct_reward if followed else cfg.incorrect_reward, followed, metrics, answer)
