"""Number kinds: gcd vs lcm, digit sum vs digit count.

Confusable pairs: ``gcd`` ↔ ``lcm`` and ``digit_sum`` ↔ ``digit_count``; each has a built-in
style and a loop style (Euclid, peeling digits with ``% 10``) for deep rewrites.
"""

from __future__ import annotations

import random

from tasks.data.synthetic.arith import PAIRS
from tasks.data.synthetic.problems import Problem, Program, kind, make

SINGLE = ["n", "x", "num", "v"]


def _gcd(a: str, b: str) -> list[Program]:
    euclid = f"while {b}:\n    {a}, {b} = {b}, {a} % {b}\nprint({a})"
    return [Program(f"import math\nprint(math.gcd({a}, {b}))", "math.gcd gives the greatest common divisor.", "builtin"),
            Program(euclid, f"Euclid's algorithm: replace ({a}, {b}) by ({b}, {a} % {b}) until {b} is 0.", "loop")]


def _lcm(a: str, b: str) -> list[Program]:
    return [Program(f"import math\nprint(math.lcm({a}, {b}))", "math.lcm gives the least common multiple.", "builtin"),
            Program(f"import math\nprint({a} * {b} // math.gcd({a}, {b}))",
                    f"The least common multiple is {a} * {b} divided by their gcd.", "formula")]


GCD = ["What is the greatest common divisor of {a} and {b}?", "What is the largest integer that divides both {a} and {b}?"]
LCM = ["What is the least common multiple of {a} and {b}?", "What is the smallest positive integer divisible by both {a} and {b}?"]


def _pair(name: str, r: random.Random, questions: list[str], right, wrong) -> Problem | None:
    a, b = r.choice(PAIRS)
    g = r.randint(2, 40)
    pairs = [(a, g * r.randint(2, 60)), (b, g * r.randint(2, 60))]
    return make(name, r.choice(questions).format(a=a, b=b), pairs, right(a, b), wrong(a, b))


@kind("gcd", "numbers")
def gcd(r: random.Random) -> Problem | None:
    return _pair("gcd", r, GCD, _gcd, _lcm)


@kind("lcm", "numbers")
def lcm(r: random.Random) -> Problem | None:
    return _pair("lcm", r, LCM, _lcm, _gcd)


def _digit_sum(n: str) -> list[Program]:
    loop = f"total = 0\nwhile {n} > 0:\n    total += {n} % 10\n    {n} //= 10\nprint(total)"
    return [Program(f"print(sum(int(d) for d in str({n})))", f"I add the digits of str({n}).", "builtin"),
            Program(loop, f"I peel off the last digit of {n} with % 10 and add it up.", "loop")]


def _digit_count(n: str) -> list[Program]:
    loop = f"count = 0\nwhile {n} > 0:\n    count += 1\n    {n} //= 10\nprint(count)"
    return [Program(f"print(len(str({n})))", f"I count the characters of str({n}).", "builtin"),
            Program(loop, f"I divide {n} by 10 until it is 0 and count the steps.", "loop")]


DSUM = ["What is the sum of the digits of {n}?", "Add up the decimal digits of {n}. What is the total?"]
DCOUNT = ["How many digits does {n} have?", "How many decimal digits are there in {n}?"]


def _digits(name: str, r: random.Random, questions: list[str], right, wrong) -> Problem | None:
    n = r.choice(SINGLE)
    return make(name, r.choice(questions).format(n=n), [(n, r.randint(10**3, 10**9))], right(n), wrong(n))


@kind("digit_sum", "numbers")
def digit_sum(r: random.Random) -> Problem | None:
    return _digits("digit_sum", r, DSUM, _digit_sum, _digit_count)


@kind("digit_count", "numbers")
def digit_count(r: random.Random) -> Problem | None:
    return _digits("digit_count", r, DCOUNT, _digit_count, _digit_sum)
