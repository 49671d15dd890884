"""List kinds: k-th smallest vs k-th largest, and two composite kinds.

Confusable: ``kth_smallest`` ↔ ``kth_largest`` (wrong programs take the other end, or index
``[k]`` instead of ``[k - 1]``); composite ``sum_mod`` (remainder of a sum; wrong: the
quotient) and ``max_digitsum`` (the element with the largest digit sum; wrong: the largest
element).
"""

from __future__ import annotations

import random

from tasks.data.synthetic.problems import Problem, Program, kind, make

LISTS = ["xs", "nums", "values", "data"]


def _kth(xs: str, largest: bool, off_by_one: bool = False) -> list[Program]:
    rev, end = (", reverse=True", "largest") if largest else ("", "smallest")
    idx = "k" if off_by_one else "k - 1"
    heap = "nlargest" if largest else "nsmallest"
    plan_sort = f"I sort {xs}{' in decreasing order' if largest else ''} and take index {idx}."
    progs = [Program(f"print(sorted({xs}{rev})[{idx}])", plan_sort, "sorted")]
    if not off_by_one:
        progs.append(Program(f"import heapq\nprint(heapq.{heap}(k, {xs})[-1])",
                             f"heapq.{heap}(k, {xs}) lists the k {end} numbers; the last one is the answer.", "heapq"))
    return progs


SMALLEST = ["What is the k-th smallest number in {xs} (counting from 1)?",
            "Sort {xs} in increasing order. Which number is in position k (the first position is 1)?"]
LARGEST = ["What is the k-th largest number in {xs} (counting from 1)?",
           "Sort {xs} in decreasing order. Which number is in position k (the first position is 1)?"]


def _kth_problem(name: str, r: random.Random, questions: list[str], largest: bool) -> Problem | None:
    xs = r.choice(LISTS)
    values = r.sample(range(1, 1000), r.randint(5, 8))
    pairs = [(xs, values), ("k", r.randint(1, len(values) - 1))]
    right = _kth(xs, largest)
    wrong = _kth(xs, not largest)[:1] + _kth(xs, largest, off_by_one=True)
    return make(name, r.choice(questions).format(xs=xs), pairs, right, wrong)


@kind("kth_smallest", "lists")
def kth_smallest(r: random.Random) -> Problem | None:
    return _kth_problem("kth_smallest", r, SMALLEST, largest=False)


@kind("kth_largest", "lists")
def kth_largest(r: random.Random) -> Problem | None:
    return _kth_problem("kth_largest", r, LARGEST, largest=True)


SUM_MOD = ["What is the remainder when the sum of {xs} is divided by m?",
           "Add up {xs}, then divide by m. What is the remainder?"]


@kind("sum_mod", "lists")
def sum_mod(r: random.Random) -> Problem | None:
    xs = r.choice(LISTS)
    pairs = [(xs, [r.randint(10, 9999) for _ in range(r.randint(4, 7))]), ("m", r.randint(7, 97))]
    loop = f"total = 0\nfor v in {xs}:\n    total += v\nprint(total % m)"
    right = [Program(f"print(sum({xs}) % m)", f"I take sum({xs}) modulo m.", "builtin"),
             Program(loop, f"I add up {xs} in a loop, then take the total modulo m.", "loop")]
    wrong = [Program(f"print(sum({xs}) // m)", f"I divide sum({xs}) by m, rounding down.", "builtin")]
    return make("sum_mod", r.choice(SUM_MOD).format(xs=xs), pairs, right, wrong)


MAX_DS = ["Which number in {xs} has the largest digit sum?",
          "Among {xs}, which number has the biggest sum of digits?"]


@kind("max_digitsum", "lists")
def max_digitsum(r: random.Random) -> Problem | None:
    xs = r.choice(LISTS)
    values = r.sample(range(10, 10000), r.randint(4, 7))
    sums = sorted((sum(map(int, str(v))) for v in values), reverse=True)
    if sums[0] == sums[1]:
        return None
    loop = (f"best = {xs}[0]\nfor v in {xs}:\n    if sum(int(d) for d in str(v)) > sum(int(d) for d in str(best)):\n"
            f"        best = v\nprint(best)")
    right = [Program(f"print(max({xs}, key=lambda v: sum(int(d) for d in str(v))))",
                     f"I take the max of {xs} keyed by the digit sum.", "builtin"),
             Program(loop, "I keep the number with the largest digit sum seen so far.", "loop")]
    wrong = [Program(f"print(max({xs}))", f"I take the largest number in {xs}.", "builtin")]
    return make("max_digitsum", r.choice(MAX_DS).format(xs=xs), [(xs, values)], right, wrong)
