"""Arithmetic kinds: quotient vs remainder, inclusive vs exclusive range sums.

Confusable pairs: ``floordiv`` ↔ ``mod`` (a wrong program computes the other one) and
``range_incl`` ↔ ``range_excl`` (an off-by-one ``range`` bound).
"""

from __future__ import annotations

import random

from tasks.data.synthetic.problems import Problem, Program, kind, make

PAIRS = [("a", "b"), ("x", "y"), ("m", "n"), ("p", "q")]
RANGES = [("m", "n"), ("lo", "hi"), ("a", "b"), ("start", "stop")]

QUOTIENT = ["What is {a} divided by {b}, rounded down?", "What is the integer quotient of {a} divided by {b}?",
            "How many whole times does {b} fit into {a}?"]
REMAINDER = ["What is the remainder of {a} divided by {b}?", "What is {a} modulo {b}?",
             "What is left over when {a} is divided by {b}?"]


def _quotient(a: str, b: str) -> list[Program]:
    return [Program(f"print({a} // {b})", f"I divide {a} by {b} and round down with //.", "operator"),
            Program(f"q, r = divmod({a}, {b})\nprint(q)", f"divmod({a}, {b}) gives the quotient first.", "divmod")]


def _remainder(a: str, b: str) -> list[Program]:
    return [Program(f"print({a} % {b})", f"I take the remainder of {a} divided by {b} with %.", "operator"),
            Program(f"q, r = divmod({a}, {b})\nprint(r)", f"divmod({a}, {b}) gives the remainder second.", "divmod")]


def _division(name: str, r: random.Random, questions: list[str], right, wrong) -> Problem | None:
    a, b = r.choice(PAIRS)
    pairs = [(a, r.randint(1000, 999_999)), (b, r.randint(3, 999))]
    q = r.choice(questions).format(a=a, b=b)
    return make(name, q, pairs, right(a, b), wrong(a, b))


@kind("floordiv", "arith")
def floordiv(r: random.Random) -> Problem | None:
    return _division("floordiv", r, QUOTIENT, _quotient, _remainder)


@kind("mod", "arith")
def mod(r: random.Random) -> Problem | None:
    return _division("mod", r, REMAINDER, _remainder, _quotient)


def _range_sum(lo: str, hi: str, end: str, words: str) -> list[Program]:
    loop = f"total = 0\nfor i in range({lo}, {end}):\n    total += i\nprint(total)"
    return [Program(f"print(sum(range({lo}, {end})))", f"I add the integers in range({lo}, {end}){words}.", "builtin"),
            Program(loop, f"I loop over range({lo}, {end}) and keep a running total{words}.", "loop")]


INCL = ["What is the sum of all integers from {lo} to {hi}, inclusive?",
        "Add up every integer from {lo} through {hi} (both ends included). What is the total?"]
EXCL = ["What is the sum of the integers from {lo} up to but not including {hi}?",
        "Add up every integer i with {lo} <= i < {hi}. What is the total?"]


def _ranges(name: str, r: random.Random, questions: list[str], inclusive: bool) -> Problem | None:
    lo, hi = r.choice(RANGES)
    start = r.randint(1, 500)
    pairs = [(lo, start), (hi, start + r.randint(5, 2000))]
    incl, excl = _range_sum(lo, hi, f"{hi} + 1", f", so {hi} is included"), _range_sum(lo, hi, hi, "")
    right, wrong = (incl, excl) if inclusive else (excl, incl)
    return make(name, r.choice(questions).format(lo=lo, hi=hi), pairs, right, wrong)


@kind("range_incl", "arith")
def range_incl(r: random.Random) -> Problem | None:
    return _ranges("range_incl", r, INCL, True)


@kind("range_excl", "arith")
def range_excl(r: random.Random) -> Problem | None:
    return _ranges("range_excl", r, EXCL, False)
