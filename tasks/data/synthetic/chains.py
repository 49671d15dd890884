"""Chain problems: 2 or 3 dependent calls, each later call working on the previous call's printed result.

A chain's step 1 is a problem of an existing kind (``KINDS``) on bound inputs; each later step applies a
registered **chain step** (``@chain_step``) to the previous step's result, named in the question and bound
nowhere::

    Variables: a = 62384, b = 6509, c = 7.
    Step 1: What is the remainder of a divided by b? Call the result r.
    Step 2: What is the sum of the digits of r? Call the result u.
    Step 3: What is the remainder of u divided by c?
    Answer with the result of step 3.

The setup binds the inputs of every step (``a``, ``b``, ``c``) but never ``r`` or ``u``: the sandbox keeps no
state between calls, so a later call starts by binding the previous result (``r = 4334``), which the gate
measures. Later steps take any positive integer and have their confusable wrong programs, as the single-call
kinds do (digit sum ↔ digit count, remainder ↔ quotient by a bound divisor, gcd ↔ lcm with a bound number),
so a chain can go wrong at any step. Every step's right programs agree and its wrong programs print another
number on the step's right input (checked when the chain is drawn; a draw where they coincide is redrawn).

Rows are verl RL rows like the single-call task's, with ``data_source`` ``synthetic-chain/<calls>`` (graded by
``tasks.rewards.chain``) and the turn budget of the prompt in ``extra_info["max_turns"]`` = calls + 1 (read by
the rollout, ``tasks.rollout.machine.turn_budget``). Splits are the single-call task's hash of the question
(``split_of``): a chain question is ``sft``, ``rl`` or ``eval`` whatever the seeds.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from dataclasses import dataclass

from tasks.data.synthetic.arith import _quotient, _remainder
from tasks.data.synthetic.numbers import _digit_count, _digit_sum, _gcd, _lcm
from tasks.data.synthetic.problems import KINDS, SPLITS, Program, bind, run_program, split_of, task_family

RESULT_NAMES = ("r", "u")
"""The names the question gives step 1's and step 2's results (never bound by a setup)."""
PARAM_NAMES = ("c", "e")
"""The names of the bound number a later step uses (step 2's, step 3's)."""
SOURCE = "synthetic-chain"


@dataclass(frozen=True)
class ChainStep:
    """One call of a chain: its question, its programs on its input name, and what the right one prints."""

    question: str
    right: tuple[Program, ...]
    wrong: tuple[Program, ...]
    value: int
    input_name: str | None = None
    """The previous step's result name this step works on (None for step 1, which uses the setup)."""


@dataclass(frozen=True)
class Chain:
    kind: str
    question: str
    setup: str
    steps: tuple[ChainStep, ...]

    @property
    def answer(self) -> int:
        return self.steps[-1].value

    @property
    def calls(self) -> int:
        return len(self.steps)

    @property
    def source(self) -> str:
        return f"{SOURCE}/{self.calls}"


StepDraw = Callable[[str, int, str, random.Random], tuple[str, list[tuple[str, int]], list[Program], list[Program]] | None]
CHAIN_STEPS: dict[str, StepDraw] = {}


def chain_step(name: str):
    """Register a later step ``draw(input_name, input_value, param_name, rng) -> (question, bound pairs, right,
    wrong)`` (None: this input does not suit the step; the chain is redrawn)."""

    def deco(draw: StepDraw) -> StepDraw:
        CHAIN_STEPS[name] = draw
        return draw

    return deco


@chain_step("digit_sum")
def _digit_sum_step(x: str, value: int, param: str, r: random.Random):
    if value < 10:
        return None
    return f"What is the sum of the digits of {x}?", [], _digit_sum(x), _digit_count(x)


@chain_step("digit_count")
def _digit_count_step(x: str, value: int, param: str, r: random.Random):
    if value < 10:
        return None
    return f"How many digits does {x} have?", [], _digit_count(x), _digit_sum(x)


@chain_step("mod")
def _mod_step(x: str, value: int, param: str, r: random.Random):
    d = r.randint(3, 97)
    if value < 2 * d:
        return None
    return f"What is the remainder of {x} divided by {param}?", [(param, d)], _remainder(x, param), _quotient(x, param)


@chain_step("floordiv")
def _floordiv_step(x: str, value: int, param: str, r: random.Random):
    d = r.randint(3, 97)
    if value < 2 * d:
        return None
    return f"What is {x} divided by {param}, rounded down?", [(param, d)], _quotient(x, param), _remainder(x, param)


def _partner(value: int, r: random.Random) -> int:
    small = [f for f in (2, 3, 5, 7) if value % f == 0] or [1]
    return r.choice(small) * r.randint(2, 40)


@chain_step("gcd")
def _gcd_step(x: str, value: int, param: str, r: random.Random):
    if value < 2:
        return None
    return (f"What is the greatest common divisor of {x} and {param}?", [(param, _partner(value, r))],
            _gcd(x, param), _lcm(x, param))


@chain_step("lcm")
def _lcm_step(x: str, value: int, param: str, r: random.Random):
    if value < 2:
        return None
    return (f"What is the least common multiple of {x} and {param}?", [(param, _partner(value, r))],
            _lcm(x, param), _gcd(x, param))


@functools.cache
def _step_program(op: str) -> str:
    if op not in CHAIN_STEPS:
        raise ValueError(f"chain step {op!r} is not registered; valid: {sorted(CHAIN_STEPS)}")
    return CHAIN_STEPS[op]("x", 10**12, "p", random.Random(0))[2][0].code  # any draw: the programs never vary


def step_value(op: str, value: int, param: int | None) -> int:
    """What the right program of later step ``op`` prints on ``value`` with its bound number ``param`` (None for a
    step that binds none): trusted generator code, run in-process (the chain grader's truth on a redrawn chain)."""
    setup = f"x = {value!r}" + ("" if param is None else f"\np = {param!r}")
    return int(run_program(_step_program(op), setup))


def _outputs(programs, setup: str) -> list[str]:
    return [run_program(p.code, setup) for p in programs]


def draw_chain(r: random.Random, calls: int) -> Chain | None:
    """One checked chain of ``calls`` steps, or None when a draw does not suit (the caller draws again)."""
    first = KINDS[r.choice(sorted(KINDS))].draw(r)
    if first is None:
        return None
    pairs = [tuple(line.split(" = ", 1)) for line in first.setup.splitlines()]
    names = {n for n, _ in pairs}
    if names & {*RESULT_NAMES, *PARAM_NAMES}:
        return None
    steps = [ChainStep(first.question.split("\n", 1)[1], first.right, first.wrong, first.answer)]
    kinds, extra = [first.kind], []
    for k in range(1, calls):
        op = r.choice(sorted(CHAIN_STEPS))
        x, value = RESULT_NAMES[k - 1], steps[-1].value
        drawn = CHAIN_STEPS[op](x, value, PARAM_NAMES[k - 1], r)
        if drawn is None:
            return None
        question, bound, right, wrong = drawn
        setup = bind([*((n, int(v)) for n, v in bound), (x, value)])[0]
        outs = _outputs(right, setup)
        if len(set(outs)) != 1:
            raise AssertionError(f"chain step {op}: right programs disagree {outs} on {setup!r}")
        if any(o == outs[0] for o in _outputs(wrong, setup)):
            return None
        steps.append(ChainStep(question, tuple(right), tuple(wrong), int(outs[0]), x))
        kinds.append(op)
        extra += [(n, int(v)) for n, v in bound]
    setup_lines = [first.setup, *(f"{n} = {v!r}" for n, v in extra)]
    shown = bind([*((n, _literal(v)) for n, v in pairs), *extra])[1]
    return Chain("+".join(kinds), _question(shown, steps), "\n".join(setup_lines), tuple(steps))


def _literal(text: str):
    """A setup value as the value it binds (the ``Variables:`` line shows it as the single-call task does)."""
    import ast

    return ast.literal_eval(text)


def _question(shown: str, steps: list[ChainStep]) -> str:
    lines = [shown]
    for k, step in enumerate(steps):
        tail = f" Call the result {RESULT_NAMES[k]}." if k < len(steps) - 1 else ""
        lines.append(f"Step {k + 1}: {step.question}{tail}")
    lines.append(f"Answer with the result of step {len(steps)}.")
    return "\n".join(lines)


def make_chains(n: int, seed: int, split: str, exclude: frozenset[str] = frozenset(),
                calls: tuple[int, ...] = (2, 3)) -> list[Chain]:
    """``n`` distinct chains of ``split``, none whose question is in ``exclude``; each draw picks its number of calls
    uniformly from ``calls``, and 3-call draws are redrawn more often (a later step that does not suit its input),
    so about 5 in 8 kept chains have 2 calls (the chain files: 2 532 of 4 000, 131 of 200, 160 of 256)."""
    import tasks.data.synthetic  # noqa: F401  (registers the kinds)

    if split not in SPLITS:
        raise ValueError(f"split: {split!r} is not one of {SPLITS}")
    r = random.Random(f"chain:{seed}:{split}")
    out: list[Chain] = []
    seen: set[str] = set(exclude)
    while len(out) < n:
        c = draw_chain(r, r.choice(calls))
        if c is not None and c.question not in seen and split_of(c.question) == split:
            seen.add(c.question)
            out.append(c)
    return out


@task_family("chain")
def chain_rows(n: int, seed: int, split: str, exclude: frozenset[str] = frozenset()) -> list[dict]:
    """verl RL rows of ``n`` chains; ``extra_info`` carries the setup, the calls and the turn budget (calls + 1)."""
    return [
        {
            "prompt": [{"role": "user", "content": c.question}],
            "data_source": c.source,
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(c.answer)},
            "extra_info": {"split": split, "index": i, "kind": c.kind, "setup": c.setup, "calls": c.calls,
                           "max_turns": c.calls + 1},
        }
        for i, c in enumerate(make_chains(n, seed, split, exclude))
    ]
