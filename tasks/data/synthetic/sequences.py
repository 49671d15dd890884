"""Sequence kinds with off-by-one traps: Fibonacci numbers and arithmetic-sequence terms.

Wrong programs are the classic off-by-one slips: printing ``F(n + 1)`` (or iterating one step
too few), and ``s + n * d`` for the n-th term when the first term is term 1.
"""

from __future__ import annotations

import random

from tasks.data.synthetic.problems import Problem, Program, kind, make

FIB = ["With F(0) = 0, F(1) = 1 and F(m) = F(m - 1) + F(m - 2), what is F({n})?",
       "The Fibonacci numbers start F(0) = 0, F(1) = 1. What is F({n})?"]
NAMES = ["n", "num", "idx", "t"]
"""Bound names of the index; none is a letter of the question's recurrence, so copying the name is unambiguous."""


def _fib(n: str, shift: int) -> list[Program]:
    steps = {0: n, 1: f"{n} + 1", -1: f"{n} - 1"}[shift]
    pair = f"a, b = 0, 1\nfor _ in range({steps}):\n    a, b = b, a + b\nprint(a)"
    table = (f"f = [0, 1]\nfor j in range(2, {n} + 2):\n    f.append(f[j - 1] + f[j - 2])\nprint(f[{steps}])")
    return [Program(pair, f"I step the pair (a, b) forward {steps} times and print a.", "pair"),
            Program(table, f"I build the list of Fibonacci numbers and print f[{steps}].", "table")]


@kind("fib", "sequences")
def fib(r: random.Random) -> Problem | None:
    n = r.choice(NAMES)
    pairs = [(n, r.randint(5, 40))]
    return make("fib", r.choice(FIB).format(n=n), pairs, _fib(n, 0), _fib(n, 1)[:1] + _fib(n, -1)[1:])


TERM = ["A sequence starts at s (term 1) and adds d each step. What is term {n}?",
        "Term 1 of an arithmetic sequence is s and the common difference is d. What is term {n}?"]


def _term(n: str, steps: str) -> list[Program]:
    loop = f"t = s\nfor _ in range({steps}):\n    t += d\nprint(t)"
    return [Program(f"print(s + ({steps}) * d)", f"Term {n} is s plus ({steps}) times d.", "formula"),
            Program(loop, f"I add d to s, {steps} times.", "loop")]


@kind("arith_term", "sequences")
def arith_term(r: random.Random) -> Problem | None:
    n = r.choice(["n", "k", "j", "idx"])
    pairs = [("s", r.randint(-50, 500)), ("d", r.randint(2, 99)), (n, r.randint(3, 400))]
    return make("arith_term", r.choice(TERM).format(n=n), pairs, _term(n, f"{n} - 1"), _term(n, n))
