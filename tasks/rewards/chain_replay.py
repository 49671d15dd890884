"""Whether a chain's calls computed its answer: the policy's clean calls, replayed in the sandbox on changed inputs.

The chain grader (``tasks.rewards.chain``) knows the chain a prompt asks for — its kind (``mod+digit_sum+gcd``)
and its bound inputs (``extra_info["setup"]``) — so it knows every step's right value (step 1's from the
generator, ``KINDS``, later steps' from ``tasks.data.synthetic.chains.step_value``). A call of the trajectory
**carries** step ``s`` when its code holds an integer literal equal to the value an earlier clean call printed,
and that value is step ``s``'s right value (``r = 675``). A call that printed step ``k``'s value **follows** the
chain when one of these holds, and every call it carries from follows too:

* **link**: it carries step ``s`` < ``k``; its code is run again with that literal changed to other values ``w``
  (chosen so that the steps ``s+1 … k`` give something else than step ``k``'s value, than ``w`` and than every
  bound input), on the prompt's own setup, and prints what steps ``s+1 … k`` give on each ``w``;
* **redrawn**: it is run again on redrawn chains — the first problem drawn again (same kind and names, new
  values), the later steps' bound numbers drawn again as the generator draws them, kept only when step ``k``'s
  value and every earlier step's change and step ``k``'s differs from the redrawn chain's earlier values and bound
  inputs — with every literal equal to a bound input's value changed to the redrawn one
  (``145545`` for ``p``) and every carried literal to the redrawn chain's value of that step, and prints each
  redrawn chain's step ``k`` value.

``REPLAYS`` values or chains are tried in each test. A call printing a constant (behind a docstring, ``+ 0``,
``if True:``, ``int('…')``) or ignoring what it binds prints the old value, or a wrong one, and does not follow; a
call whose code writes an earlier step's right value that no earlier call printed (a guessed intermediate, in any
literal) does not follow either. Literals are read in two ways (``MODES``): every literal whose value is a carried
or bound value, or only those a name is bound to (so that a constant of the code equal to such a value, the 10 of
``n % 10``, stays itself); a call follows in either. An answer that does not follow is probed once more
(``responds``): whether its call's output changes at all when its inputs do, which tells a constant or a guess
from a wrong computation that landed on the answer.

Limits, by construction: a value carried in another form than an integer literal (``int('675')``) is read as a
constant; a literal that happens to equal a carried or bound value is read as that value (the ``bound`` reading
softens this); a wrong program that agrees with the right one on the redrawn chains too is not told apart (the gcd
of ``c`` and ``e`` for the gcd of ``gcd(r, c)`` and ``e``: the generator draws ``e`` sharing a factor with its
input); and where no redrawn chain changes the answer within ``MAX_DRAWS`` draws (a digit count of a remainder
below 100 that the next step needs to be at least 10: always 2), an answer from the setup alone cannot be told
from a constant, so the last step must then be a call of its own (the link test).
"""

from __future__ import annotations

import ast
import functools
import random
from dataclasses import dataclass

from sandbox.result import SandboxInfraError
from tasks.data.synthetic.chains import CHAIN_STEPS, PARAM_NAMES, RESULT_NAMES, step_value
from tasks.data.synthetic.problems import KINDS, run_program
from tasks.rewards.record import Ran

REPLAYS = 2
"""Values (link test) or redrawn chains (redrawn test) every call is replayed on."""
MAX_DRAWS = 2000
"""Draws of the first problem tried to find the redrawn chains."""
LINK_TRIES = 500
"""Values tried to find the link test's values."""
MODES = ("every", "bound")
"""Which literals stand for carried or bound values: every one, or only those a name is bound to."""


@dataclass(frozen=True)
class Redrawn:
    """A chain of the prompt's kind and names: its setup, its bound inputs in order and each step's right value."""

    setup: str
    inputs: tuple[tuple[str, object], ...]
    values: tuple[int, ...]


@dataclass(frozen=True)
class Chain:
    """The prompt's chain, and per step ``k`` up to ``REPLAYS`` redrawn chains whose step ``k`` value differs."""

    kind: str
    ops: tuple[str, ...]
    own: Redrawn
    params: tuple[tuple[str, int], ...]
    redraws: tuple[tuple[Redrawn, ...], ...]

    @property
    def values(self) -> tuple[int, ...]:
        return self.own.values

    def forward(self, s: int, k: int, w: int) -> int:
        """What steps ``s+1 … k`` give on ``w`` (steps from 0), with the prompt's bound numbers."""
        params = dict(self.params)
        for t in range(s + 1, k + 1):
            w = step_value(self.ops[t], w, params.get(PARAM_NAMES[t - 1]))
        return w


def _pairs(setup: str) -> list[tuple[str, object]]:
    out = []
    for line in setup.splitlines():
        name, sep, value = line.partition(" = ")
        if not sep:
            raise ValueError(f"chain grader: extra_info['setup'] line {line!r} is not 'name = value'")
        out.append((name, ast.literal_eval(value)))
    return out


def _redrawn(ops: tuple[str, ...], first: list, params: dict, answer: int) -> Redrawn:
    values = [answer]
    for k, op in enumerate(ops[1:], start=1):
        values.append(step_value(op, values[-1], params.get(PARAM_NAMES[k - 1])))
    inputs = (*first, *params.items())
    return Redrawn("\n".join(f"{k} = {v!r}" for k, v in inputs), tuple(inputs), tuple(values))


def _later_params(ops: tuple[str, ...], first_value: int, rng: random.Random) -> dict[str, int] | None:
    """The later steps' bound numbers drawn as the generator draws them on the redrawn values (None: a step does
    not suit its input, as in ``draw_chain``)."""
    value, params = first_value, {}
    for t, op in enumerate(ops[1:], start=1):
        drawn = CHAIN_STEPS[op](RESULT_NAMES[t - 1], value, PARAM_NAMES[t - 1], rng)
        if drawn is None:
            return None
        params.update({n: int(v) for n, v in drawn[1]})
        value = step_value(op, value, params.get(PARAM_NAMES[t - 1]))
    return params


def _tells_apart(chain: Redrawn, own: Redrawn, k: int) -> bool:
    """Whether ``chain``'s step ``k`` value differs from the prompt's, from its own earlier steps' and from its bound
    inputs: a call that prints a constant, a carried value or a bound input then prints something else."""
    v = chain.values[k]
    return v != own.values[k] and v not in chain.values[:k] and all(w != v for _, w in chain.inputs)


@functools.lru_cache(maxsize=4096)
def chain_of(kind: str, setup: str) -> Chain:
    """The prompt's chain of ``kind`` on ``setup``, with its redrawn chains; the same on every call (seeded by both).

    For step ``k`` the redrawn chains tell it apart (``_tells_apart``) and change every earlier step's value too, to
    one no bound input equals, so a guessed intermediate (or one read as a bound input) is a wrong one; only where too few such chains turn up in ``MAX_DRAWS`` draws do ones
    that tell step ``k`` apart alone stand in."""
    ops = tuple(kind.split("+"))
    if ops[0] not in KINDS or any(op not in CHAIN_STEPS for op in ops[1:]):
        raise ValueError(f"chain grader: extra_info['kind']={kind!r} is not a kind ({sorted(KINDS)}) followed by "
                         f"chain steps ({sorted(CHAIN_STEPS)})")
    pairs = _pairs(setup)
    first = [(k, v) for k, v in pairs if k not in PARAM_NAMES]
    params = {k: v for k, v in pairs if k in PARAM_NAMES}
    rng, own = random.Random(f"chain-replay:{kind}:{setup}"), None
    strict: list[list[Redrawn]] = [[] for _ in ops]
    loose: list[list[Redrawn]] = [[] for _ in ops]
    for _ in range(MAX_DRAWS):
        p = KINDS[ops[0]].draw(rng)
        drawn = _pairs(p.setup) if p is not None else []
        if [k for k, _ in drawn] != [k for k, _ in first]:
            continue
        if own is None:
            base = "\n".join(f"{k} = {v!r}" for k, v in first)
            own = _redrawn(ops, first, params, int(run_program(p.right[0].code, base)))
        new = _later_params(ops, p.answer, rng)
        if new is None or set(new) != set(params):
            continue
        chain = _redrawn(ops, drawn, {k: new[k] for k in params}, p.answer)
        for k in range(len(ops)):
            if _tells_apart(chain, own, k):
                bound = {w for _, w in chain.inputs if type(w) is int}
                every = all(a != b and a not in bound for a, b in zip(chain.values[:k], own.values))
                for found, ok in ((strict[k], every), (loose[k], True)):
                    if ok and len(found) < REPLAYS:
                        found.append(chain)
        if all(len(f) == REPLAYS for f in strict):
            break
    if own is None:
        raise ValueError(f"chain grader: no draw of kind {ops[0]!r} binds the names of setup {setup!r}")
    redraws = tuple(tuple(a if len(a) == REPLAYS else b) for a, b in zip(strict, loose))
    return Chain(kind, ops, Redrawn(setup, tuple(pairs), own.values), tuple(params.items()), redraws)


@functools.lru_cache(maxsize=4096)
def link_values(kind: str, setup: str, s: int, k: int) -> tuple[int, ...]:
    """Up to ``REPLAYS`` values for step ``s`` of the chain on which steps ``s+1 … k`` give something else than step
    ``k``'s value (seeded by the chain and the steps)."""
    chain = chain_of(kind, setup)
    v, rng, out = chain.values[s], random.Random(f"chain-link:{kind}:{setup}:{s}:{k}"), []
    for _ in range(LINK_TRIES):
        w = rng.randint(max(1, v // 4), 4 * v + 40)
        f = chain.forward(s, k, w)
        if w != v and w not in out and f != chain.values[k] and f != w and all(f != b for _, b in chain.own.inputs):
            out.append(w)
            if len(out) == REPLAYS:
                break
    return tuple(out)


# ---------------------------------------------------------------- literals


class _Carry(ast.NodeTransformer):
    """Replace literals by the value they stand for (``mapping``: repr of the old value → repr of the new one);
    ``bound``: only in the values of assignments."""

    def __init__(self, mapping: dict[str, str], bound: bool):
        self.mapping, self.bound, self.changed = mapping, bound, False

    def visit(self, node: ast.AST) -> ast.AST:
        if self.bound and isinstance(node, ast.Assign) and is_literal(node.value):
            every = _Carry(self.mapping, bound=False)
            node.value = every.visit(node.value)
            self.changed = self.changed or every.changed
            return node
        if not self.bound and isinstance(node, ast.expr) and is_literal(node):
            key = _key(ast.literal_eval(node))
            if key is not None and key in self.mapping:
                self.changed = True
                return ast.copy_location(ast.parse(self.mapping[key], mode="eval").body, node)
        return self.generic_visit(node)


def is_literal(node: ast.AST) -> bool:
    """Whether ``node`` is a literal: a constant, a signed one, or a list / tuple / set of literals."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        return is_literal(node.operand)
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return all(is_literal(e) for e in node.elts)
    return False


def _key(value) -> str | None:
    """The key of a value a literal can stand for: an int (never a bool) or a list / tuple of ints."""
    ints = type(value) is int or (isinstance(value, (list, tuple)) and value and all(type(v) is int for v in value))
    try:
        return repr(value) if ints else None
    except ValueError:  # more digits than repr() writes
        return None


def literal_keys(code: str, mode: str) -> set[str]:
    """The keys of the literals of ``code`` that a mode reads (empty for code that does not parse)."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return set()
    keys: set[str] = set()
    nodes = ([a.value for a in ast.walk(tree) if isinstance(a, ast.Assign) and is_literal(a.value)] if mode == "bound"
             else [tree])
    for root in nodes:
        for node in ast.walk(root):
            if isinstance(node, ast.expr) and is_literal(node):
                key = _key(ast.literal_eval(node))
                if key is not None:
                    keys.add(key)
    return keys


def replaced(code: str, mapping: dict[str, str], mode: str) -> str:
    """``code`` with the literals a mode reads replaced by ``mapping``; unchanged code is returned as it is."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return code
    carry = _Carry(mapping, bound=mode == "bound")
    tree = carry.visit(tree)
    return ast.unparse(tree) if carry.changed else code


# ---------------------------------------------------------------- the replay


def printed(text: str | None) -> str:
    """The last non-empty line of a call's stdout, stripped: the value it printed."""
    lines = [ln.strip() for ln in (text or "").strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def printed_int(text: str | None) -> int | None:
    line = printed(text)
    try:
        return int(line) if line.lstrip("-").isdigit() else None
    except ValueError:  # more digits than int() reads
        return None


def _run(sandbox, codes: list[str], setups: list[str]) -> list[int | None]:
    """What each code, run after its setup in the sandbox, printed (None: it failed)."""
    results = sandbox.run_many(codes, setups=setups)
    for res in results:
        if res.error_kind == "setup_error":
            raise SandboxInfraError(f"chain grader: a replay's setup failed: {res.stderr[-300:]}")
    return [printed_int(res.stdout) if res.ok else None for res in results]


class _Replay:
    """One reading (``mode``) of a trajectory's clean calls against a chain."""

    def __init__(self, calls: list[Ran], chain: Chain, sandbox, mode: str):
        self.calls, self.chain, self.sandbox, self.mode = calls, chain, sandbox, mode
        self.values = [printed_int(c.stdout) for c in calls]
        self.memo: dict[tuple[int, int], bool] = {}

    def prints(self, codes: list[str], setups: list[str], expected: list[int]) -> bool:
        """Whether every replay cleanly prints its expected value."""
        return bool(codes) and _run(self.sandbox, codes, setups) == expected

    def carried(self, i: int, k: int) -> list[tuple[int, int]]:
        """``(call, step)`` of every value call ``i`` carries towards step ``k`` (the latest call printing it)."""
        keys, seen, out = literal_keys(self.calls[i].code or "", self.mode), set(), []
        for h in range(i - 1, -1, -1):
            v = self.values[h]
            steps = [s for s in range(k) if self.chain.values[s] == v]
            if v is not None and steps and repr(v) in keys and v not in seen:
                seen.add(v)
                out.append((h, max(steps)))
        return out

    def follows(self, i: int, k: int) -> bool:
        """Whether call ``i``, which printed step ``k``'s value, follows the chain (see the module docstring)."""
        if (i, k) not in self.memo:
            self.memo[(i, k)] = False  # a cycle never follows
            if self.guesses(i, k):
                return False
            carried = self.carried(i, k)
            ok = (bool(carried) and self.link(i, k, max(carried, key=lambda c: c[1])[1])) or self.redrawn(i, k, carried)
            self.memo[(i, k)] = ok and all(self.follows(h, s) for h, s in carried)
        return self.memo[(i, k)]

    def guesses(self, i: int, k: int) -> bool:
        """Whether call ``i`` writes an earlier step's value that no earlier call printed, in any literal: an
        intermediate it cannot have but by guessing (or by copying a bound input's digits that happen to equal one).
        Intermediates are at least 2, as every later step needs; the generator's programs hold no such constant but
        the 10 of ``n % 10``."""
        keys = literal_keys(self.calls[i].code or "", "every")
        seen = {v for v in self.values[:i] if v is not None}
        return any(repr(v) in keys and v not in seen for v in self.chain.values[:k])

    def link(self, i: int, k: int, s: int) -> bool:
        """The link test of call ``i`` (step ``k``) carrying step ``s``."""
        ws = link_values(self.chain.kind, self.chain.own.setup, s, k)
        if len(ws) < REPLAYS:
            return False
        code, old = self.calls[i].code, repr(self.chain.values[s])
        return self.prints([replaced(code, {old: repr(w)}, self.mode) for w in ws], [self.chain.own.setup] * len(ws),
                           [self.chain.forward(s, k, w) for w in ws])

    def redrawn(self, i: int, k: int, carried: list[tuple[int, int]]) -> bool:
        """The redrawn test of call ``i`` (step ``k``), its carried literals set to the redrawn chains' values."""
        chains = self.chain.redraws[k]
        if len(chains) < REPLAYS:
            return False
        codes = []
        for r in chains:
            mapping = {_key(v): repr(w) for (_, v), (_, w) in zip(self.chain.own.inputs, r.inputs)
                       if _key(v) is not None}
            mapping.update({repr(self.chain.values[s]): repr(r.values[s]) for _, s in carried})
            codes.append(replaced(self.calls[i].code, mapping, self.mode))
        return self.prints(codes, [r.setup for r in chains], [r.values[k] for r in chains])


@dataclass(frozen=True)
class Verdict:
    followed: bool
    """The answer's call follows the chain (in one of the ``MODES``)."""
    responds: bool
    """Its output changes when its inputs do (``responds``) and it writes no guessed intermediate: it computes on
    its inputs, if wrongly."""


def responds(call: Ran, earlier: list[Ran], chain: Chain, sandbox) -> bool:
    """Whether ``call``'s output changes when every literal standing for a bound input or for what an ``earlier``
    clean call printed (right or not) changes: the bound inputs redrawn, each printed value ``v`` made ``2v + 1``,
    ``10v + 7`` and ``100v + 3`` in turn (a digit count changes on one of them). A constant, a guess or a call
    ignoring what it binds prints the same."""
    printed_before = {v for v in (printed_int(e.stdout) for e in earlier) if v is not None}
    redrawn_ = next((r for r in reversed(chain.redraws) if r), ()) or (chain.own,)
    probes = [(redrawn_[j % len(redrawn_)], scale) for j, scale in enumerate(((2, 1), (10, 7), (100, 3)))]
    codes = []
    for r, (times, plus) in probes:
        mapping = {_key(v): repr(w) for (_, v), (_, w) in zip(chain.own.inputs, r.inputs) if _key(v) is not None}
        mapping.update({repr(v): repr(times * v + plus) for v in printed_before})
        codes.append(replaced(call.code, mapping, "every"))
    return any(o != printed_int(call.stdout) for o in _run(sandbox, codes, [r.setup for r, _ in probes]))


def follows(calls: list[Ran], chain: Chain, sandbox) -> Verdict:
    """Whether the last of ``calls`` (the clean calls of the final trajectory, in turn order), which printed the
    chain's answer, follows the chain in one of the ``MODES``; when it does not, whether it ``responds``."""
    if sandbox is None:
        raise ValueError("chain grader: replaying the calls needs a sandbox (pass sandbox=)")
    last, replays = len(chain.values) - 1, [_Replay(calls, chain, sandbox, mode) for mode in MODES]
    if any(r.follows(len(calls) - 1, last) for r in replays):
        return Verdict(True, True)
    guessed = replays[0].guesses(len(calls) - 1, last)
    return Verdict(False, not guessed and responds(calls[-1], calls[:-1], chain, sandbox))
