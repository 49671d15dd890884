"""A test passes exactly when the reference harness would pass it (issue 37): an independent oracle.

The reference harness runs ``check(candidate)`` once, in one process. The code reward runs it once too, in
the answer's own interpreter (``tasks.rewards.cases``, ``judge/inproc.py``), and counts the asserts passed in
order before the first failure for partial credit. ``CASES`` is a hand-written table of stateful tests (in-place mutation checked
after an asserted call, generators advanced across asserts, objects and closures with state, setup between
asserts, helpers from the prompt), each with a correct and a wrong answer and the wrong answer's reward
worked out by hand: ``(k - f) / (n - f)`` with ``n`` the tests (top-level asserts using the candidate),
``k`` those the wrong answer passes before its first failure and ``f = min(k, F)``, ``F`` the most tests a
trivial candidate (``judge/probe.py``: None, raise, the first argument, 0, 1, [], ...) passes in order.
Every correct answer scores 1.0 and ``correct``; no wrong one is ``correct``. Run on the local sandbox and,
marked ``docker``, the Docker one. ``tests/test_humaneval_exactness.py`` holds the property test (slow).
Run: ``pytest tests/test_assert_exactness.py -m "not docker"``.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass

import pytest

from tasks.rewards.code import grade_code_batch
from tasks.rewards.config import RewardConfig
from tests.grading_sandbox import fenced as _fenced
from tests.grading_sandbox import sandbox_fixture

sandbox = sandbox_fixture()

CFG = RewardConfig(code_timeout_s=3.0)


@dataclass(frozen=True)
class Case:
    """One stateful test: ``check`` (body lines, 4-space indented here), the entry point, a correct and a
    wrong answer, and the wrong answer's reward by hand (with how it was worked out)."""

    name: str
    entry: str
    check: str
    correct: str
    wrong: str
    wrong_reward: float
    why: str
    helpers: str = ""

    def spec(self) -> dict:
        return {"test_code": "def check(candidate):\n" + self.check, "entry_point": self.entry, "import_prefix": "",
                "helpers": self.helpers}


def _c(*lines: str) -> str:
    return "".join(f"    {line}\n" for line in lines)


MUTATION = [
    Case("sort-in-place", "sort_in_place", _c("xs = [3, 1, 2]", "assert candidate(xs) is None", "assert xs == [1, 2, 3]"),
         "def sort_in_place(xs):\n    xs.sort()\n", "def sort_in_place(xs):\n    pass\n", 0.0,
         "n=2, k=1 (returns None), F=1 (the None probe): 0. Split per assert it scored 1.0 (issue 37)"),
    Case("reverse-in-place", "rev",
         _c("xs = [1, 2, 3]", "candidate(xs)", "assert xs == [3, 2, 1]", "ys = [5]", "candidate(ys)", "assert ys == [5]",
            "zs = [1, 2]", "candidate(zs)", "assert zs == [2, 1]"),
         "def rev(xs):\n    xs.reverse()\n", "def rev(xs):\n    if len(xs) > 2:\n        xs.reverse()\n", 2 / 3,
         "n=3, k=2, F=0"),
    Case("dedupe-length", "dedupe",
         _c("xs = [1, 1, 2]", "n = candidate(xs)", "assert n == 2", "assert xs[:n] == [1, 2]"),
         "def dedupe(xs):\n    out = []\n    for x in xs:\n        if x not in out:\n            out.append(x)\n"
         "    xs[:len(out)] = out\n    return len(out)\n",
         "def dedupe(xs):\n    return len(set(xs))\n", 0.5, "n=2, k=1 (the length), F=0"),
    Case("accumulate", "push",
         _c("acc = []", "candidate(acc, 1)", "candidate(acc, 2)", "assert acc == [1, 2]",
            "assert candidate(acc, 3) is None and acc == [1, 2, 3]"),
         "def push(acc, x):\n    acc.append(x)\n", "def push(acc, x):\n    acc.insert(0, x)\n", 0.0, "n=2, k=0"),
    Case("tally-asserted", "tally",
         _c("c = {}", "assert candidate(c, 'a') == 1", "assert candidate(c, 'a') == 2", "assert candidate(c, 'b') == 1",
            "assert c == {'a': 2, 'b': 1}"),
         "def tally(c, w):\n    c[w] = c.get(w, 0) + 1\n    return c[w]\n",
         "def tally(c, w):\n    c[w] = c.get(w, 0) + 1\n    return c[w] if w == 'a' else 0\n", 1 / 3,
         "n=4, k=2, F=1 (returning 1 passes the first): (2-1)/(4-1). Split, the correct answer failed the 2nd"),
    Case("set-add", "add",
         _c("s = set()", "candidate(s, 3)", "candidate(s, 3)", "assert s == {3}", "assert candidate(s, 4) is None",
            "assert s == {3, 4}"),
         "def add(s, x):\n    s.add(x)\n", "def add(s, x):\n    if not s:\n        s.add(x)\n", 2 / 3, "n=3, k=2, F=0"),
    Case("alias-sees-mutation", "sort_it", _c("xs = [2, 1]", "ys = xs", "candidate(xs)", "assert xs is ys and ys == [1, 2]"),
         "def sort_it(xs):\n    xs.sort()\n", "def sort_it(xs):\n    xs = sorted(xs)\n", 0.0, "n=1, k=0"),
    Case("mutate-then-raise", "pop_positive",
         _c("xs = [1, -2]", "assert candidate(xs) == 1", "try:", "    candidate(xs)", "except ValueError:", "    pass",
            "assert xs == [-2]"),
         "def pop_positive(xs):\n    if xs[0] <= 0:\n        raise ValueError(xs[0])\n    return xs.pop(0)\n",
         "def pop_positive(xs):\n    x = xs.pop(0)\n    if x <= 0:\n        raise ValueError(x)\n    return x\n", 0.0,
         "n=2 (the try asserts nothing), k=1 (xs emptied before the error), F=1 (returning 1 passes the first). "
         "Without the arguments written back after an error it scored 1.0"),
    Case("memo-dict", "fib",
         _c("memo = {}", "assert candidate(10, memo) == 55", "assert 10 in memo", "assert candidate(20, memo) == 6765"),
         "def fib(n, memo):\n    if n < 2:\n        return n\n    if n not in memo:\n"
         "        memo[n] = fib(n - 1, memo) + fib(n - 2, memo)\n    return memo[n]\n",
         "def fib(n, memo):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n", 1 / 3,
         "n=3, k=1, F=0"),
]

GENERATORS = [
    Case("counter-next", "count_up", _c("g = candidate()", "assert next(g) == 1", "assert next(g) == 2",
                                       "assert next(g) == 3"),
         "def count_up():\n    n = 1\n    while True:\n        yield n\n        n += 1\n",
         "def count_up():\n    yield 1\n    yield 2\n    yield 2\n", 2 / 3,
         "n=3, k=2, F=0. Split, the correct answer failed the 2nd and 3rd"),
    Case("exhausted-after-list", "gen", _c("g = candidate([1, 2, 3])", "assert list(g) == [1, 2, 3]", "assert list(g) == []"),
         "def gen(xs):\n    yield from xs\n", "def gen(xs):\n    return list(xs)\n", 0.0,
         "n=2, k=1, F=1 (returning the first argument passes the first)"),
    Case("islice-then-next", "fibs",
         _c("from itertools import islice", "g = candidate()", "assert list(islice(g, 5)) == [0, 1, 1, 2, 3]",
            "assert next(g) == 5"),
         "def fibs():\n    a, b = 0, 1\n    while True:\n        yield a\n        a, b = b, a + b\n",
         "def fibs():\n    yield from [0, 1, 1, 2, 3, 8]\n", 0.5, "n=2, k=1, F=0"),
    Case("iterator-object", "Countdown",
         _c("it = candidate(3)", "assert next(it) == 3", "assert next(it) == 2", "assert next(it) == 1", "try:",
            "    next(it)", "except StopIteration:", "    pass", "else:", "    assert False, 'not exhausted'"),
         "class Countdown:\n    def __init__(self, n):\n        self.n = n\n    def __iter__(self):\n        return self\n"
         "    def __next__(self):\n        if self.n <= 0:\n            raise StopIteration\n        self.n -= 1\n"
         "        return self.n + 1\n",
         "class Countdown:\n    def __init__(self, n):\n        self.n = n\n    def __iter__(self):\n        return self\n"
         "    def __next__(self):\n        self.n -= 1\n        return self.n + 1\n", 3 / 4, "n=4, k=3, F=0"),
    Case("two-generators", "naturals",
         _c("a = candidate()", "b = candidate()", "assert next(a) == 0", "assert next(b) == 0", "assert next(a) == 1"),
         "def naturals():\n    n = 0\n    while True:\n        yield n\n        n += 1\n",
         "import itertools\n_shared = itertools.count()\n\ndef naturals():\n    while True:\n        yield next(_shared)\n",
         1 / 3, "n=3, k=1 (b shares a's counter), F=0"),
    Case("generator-send", "running_total",
         _c("g = candidate()", "next(g)", "assert g.send(5) == 5", "assert g.send(3) == 8"),
         "def running_total():\n    total = 0\n    while True:\n        x = yield total\n        total += x\n",
         "def running_total():\n    total = 0\n    while True:\n        x = yield total\n        total = x\n", 0.5,
         "n=2, k=1, F=0"),
    Case("next-default", "upto", _c("g = candidate(2)", "assert next(g) == 0", "assert next(g) == 1",
                                   "assert next(g, 'done') == 'done'"),
         "def upto(n):\n    yield from range(n)\n", "def upto(n):\n    yield from range(n + 1)\n", 2 / 3, "n=3, k=2, F=0"),
]

STATEFUL = [
    Case("counter-closure", "make_counter", _c("inc = candidate()", "assert inc() == 1", "assert inc() == 2",
                                              "assert inc() == 3"),
         "def make_counter():\n    n = 0\n    def inc():\n        nonlocal n\n        n += 1\n        return n\n    return inc\n",
         "def make_counter():\n    return lambda: 1\n", 1 / 3, "n=3, k=1, F=0 (1() is no call)"),
    Case("accumulator-closure", "make_acc", _c("acc = candidate(10)", "assert acc(5) == 15", "assert acc(-3) == 12"),
         "def make_acc(total):\n    def add(x):\n        nonlocal total\n        total += x\n        return total\n"
         "    return add\n", "def make_acc(start):\n    return lambda x: start + x\n", 0.5, "n=2, k=1, F=0"),
    Case("stack-object", "Stack",
         _c("s = candidate()", "s.push(1)", "s.push(2)", "assert s.pop() == 2", "assert s.size() == 1",
            "assert s.pop() == 1", "assert s.size() == 0"),
         "class Stack:\n    def __init__(self):\n        self.items = []\n    def push(self, x):\n"
         "        self.items.append(x)\n    def pop(self):\n        return self.items.pop()\n    def size(self):\n"
         "        return len(self.items)\n",
         "class Stack:\n    def __init__(self):\n        self.items = []\n    def push(self, x):\n"
         "        self.items.append(x)\n    def pop(self):\n        return self.items.pop()\n    def size(self):\n"
         "        return 1\n", 3 / 4, "n=4, k=3, F=0"),
    Case("account-object", "Account",
         _c("a = candidate(100)", "a.deposit(50)", "assert a.balance == 150", "a.withdraw(30)", "assert a.balance == 120",
            "try:", "    a.withdraw(1000)", "except ValueError:", "    pass", "else:", "    assert False, 'overdrawn'",
            "assert a.balance == 120"),
         "class Account:\n    def __init__(self, b):\n        self.balance = b\n    def deposit(self, x):\n"
         "        self.balance += x\n    def withdraw(self, x):\n        if x > self.balance:\n"
         "            raise ValueError('insufficient funds')\n        self.balance -= x\n",
         "class Account:\n    def __init__(self, b):\n        self.balance = b\n    def deposit(self, x):\n"
         "        self.balance += x\n    def withdraw(self, x):\n        self.balance -= x\n", 1 / 2,
         "n=4, k=2, F=0"),
    Case("fifo-object", "make_queue",
         _c("q = candidate()", "q.put(1)", "q.put(2)", "assert q.get() == 1", "q.put(3)", "assert q.get() == 2",
            "assert q.get() == 3", "assert q.empty()"),
         "import collections\n\nclass _Q:\n    def __init__(self):\n        self.d = collections.deque()\n"
         "    def put(self, x):\n        self.d.append(x)\n    def get(self):\n        return self.d.popleft()\n"
         "    def empty(self):\n        return not self.d\n\ndef make_queue():\n    return _Q()\n",
         "class _Q:\n    def __init__(self):\n        self.d = []\n    def put(self, x):\n        self.d.append(x)\n"
         "    def get(self):\n        return self.d.pop()\n    def empty(self):\n        return not self.d\n\n"
         "def make_queue():\n    return _Q()\n", 0.0, "n=4, k=0 (LIFO)"),
    Case("unique-set-object", "UniqueSet",
         _c("s = candidate()", "s.add(1)", "try:", "    s.add(1)", "except KeyError:", "    pass", "else:",
            "    assert False, 'duplicate accepted'", "assert s.count() == 1"),
         "class UniqueSet:\n    def __init__(self):\n        self.s = set()\n    def add(self, x):\n        if x in self.s:\n"
         "            raise KeyError(x)\n        self.s.add(x)\n    def count(self):\n        return len(self.s)\n",
         "class UniqueSet:\n    def __init__(self):\n        self.s = []\n    def add(self, x):\n        self.s.append(x)\n"
         "    def count(self):\n        return len(self.s)\n", 0.0, "n=2, k=0"),
    Case("class-candidate", "Temp",
         _c("t = candidate.from_f(212)", "assert t.c == 100", "t2 = candidate(0)", "assert t2.to_f() == 32"),
         "class Temp:\n    def __init__(self, c):\n        self.c = c\n    @classmethod\n    def from_f(cls, f):\n"
         "        return cls((f - 32) * 5 // 9)\n    def to_f(self):\n        return self.c * 9 // 5 + 32\n",
         "class Temp:\n    def __init__(self, c):\n        self.c = c\n    @classmethod\n    def from_f(cls, f):\n"
         "        return cls((f - 32) * 5 // 9)\n    def to_f(self):\n        return self.c * 9 // 5\n", 0.5,
         "n=2, k=1, F=0"),
    Case("module-state-ids", "intern",
         _c("assert candidate('a') == 1", "assert candidate('b') == 2", "assert candidate('a') == 1"),
         "_ids = {}\n\ndef intern(w):\n    return _ids.setdefault(w, len(_ids) + 1)\n",
         "_ids = {}\n\ndef intern(w):\n    return len(_ids) + 1\n", 0.0,
         "n=3, k=1, F=1 (returning 1 passes the first). Split, the correct answer failed the 2nd"),
]

SETUP = [
    Case("setup-appends", "smallest",
         _c("xs = [5, 3]", "assert candidate(xs) == 3", "xs.append(1)", "assert candidate(xs) == 1", "xs.clear()",
            "assert candidate(xs) is None"),
         "def smallest(xs):\n    return min(xs) if xs else None\n", "def smallest(xs):\n    return min(xs) if xs else 0\n",
         2 / 3, "n=3, k=2, F=0"),
    Case("setup-sums-results", "sq",
         _c("total = 0", "for i in range(4):", "    total += candidate(i)", "assert total == 14",
            "assert candidate(total) == 196"),
         "def sq(x):\n    return x * x\n", "def sq(x):\n    return x * 2\n", 0.0, "n=2, k=0"),
    Case("seeded-random-setup", "sort_copy",
         _c("import random", "random.seed(0)", "xs = [random.randint(0, 100) for _ in range(10)]",
            "assert candidate(xs) == sorted(xs)", "ys = xs[:]", "random.shuffle(ys)", "assert candidate(ys) == sorted(xs)",
            "assert ys != sorted(xs)"),
         "def sort_copy(xs):\n    return sorted(xs)\n", "def sort_copy(xs):\n    xs.sort()\n    return xs\n", 0.0,
         "n=3 (ys is a copy of xs, handed to the candidate), k=2 (it sorted ys in place), F=2 (emptying xs in "
         "place makes both sides [])"),
    Case("log-between-asserts", "log_it",
         _c("log = []", "candidate(log, 'a')", "assert log == ['a']", "candidate(log, 'b')", "assert log == ['a', 'b']",
            "assert len(log) == 2"),
         "def log_it(log, x):\n    log.append(x)\n", "def log_it(log, x):\n    log[:] = [x]\n", 1 / 3, "n=3, k=1, F=0"),
    Case("raise-then-value", "isqrt",
         _c("try:", "    candidate(-1)", "except ValueError:", "    pass", "else:", "    assert False, 'no error'",
            "assert candidate(16) == 4"),
         "def isqrt(n):\n    if n < 0:\n        raise ValueError(n)\n    return int(n ** 0.5)\n",
         "def isqrt(n):\n    return int(abs(n) ** 0.5)\n", 0.0, "n=2, k=0 (no error); the raise probe passes the first: F=1"),
    Case("plain-asserts", "total", _c("assert candidate([1, 2, 3]) == 6", "assert candidate([]) == 0",
                                     "assert candidate([-1]) == -1"),
         "def total(xs):\n    return sum(xs)\n", "def total(xs):\n    return sum(xs) if xs else 1\n", 1 / 3,
         "n=3, k=1, F=0"),
]

IS_SORTED = "def is_sorted(xs):\n    return all(a <= b for a, b in zip(xs, xs[1:]))\n"
DECODE = "def decode_shift(s):\n    return ''.join(chr((ord(c) - 5 - ord('a')) % 26 + ord('a')) for c in s)\n"
GRID = "def make_grid(n):\n    return [[0] * n for _ in range(n)]\n"
HELPERS = [
    Case("helper-is-sorted", "bubble",
         _c("xs = [2, 1]", "candidate(xs)", "assert is_sorted(xs)", "ys = [3, 2, 1]", "candidate(ys)",
            "assert is_sorted(ys) and ys == [1, 2, 3]"),
         "def bubble(xs):\n    xs.sort()\n",
         "def bubble(xs):\n    for i in range(len(xs) - 1):\n        if xs[i] > xs[i + 1]:\n"
         "            xs[i], xs[i + 1] = xs[i + 1], xs[i]\n", 0.0,
         "n=2, k=1 (one pass sorts [2, 1]), F=1 (emptying the list passes is_sorted)", IS_SORTED),
    Case("helper-decode", "encode_shift",
         _c("assert decode_shift(candidate('ab')) == 'ab'", "assert decode_shift(candidate('xyz')) == 'xyz'"),
         "def encode_shift(s):\n    return ''.join(chr((ord(c) + 5 - ord('a')) % 26 + ord('a')) for c in s)\n",
         "def encode_shift(s):\n    if len(s) > 2:\n        return s\n"
         "    return ''.join(chr((ord(c) + 5 - ord('a')) % 26 + ord('a')) for c in s)\n", 0.5, "n=2, k=1, F=0", DECODE),
    Case("helper-grid-setup", "mark",
         _c("g = make_grid(2)", "candidate(g, 0, 1)", "assert g == [[0, 1], [0, 0]]", "candidate(g, 1, 0)",
            "assert g == [[0, 1], [1, 0]]"),
         "def mark(g, r, c):\n    g[r][c] = 1\n", "def mark(g, r, c):\n    if r == 0:\n        g[r][c] = 1\n", 0.5,
         "n=2, k=1, F=0", GRID),
]

CROSSING = [  # objects of the answer's own classes, used by the test as Python uses them
    Case("falsy-object", "is_odd", _c("assert candidate(3)", "assert not candidate(4)"),
         "def is_odd(n):\n    return n % 2 == 1\n",
         "class _No:\n    def __bool__(self):\n        return False\n\ndef is_odd(n):\n    return _No()\n", 0.0,
         "n=2, k=0 (the object is false, as Python finds it), F=1 (True)"),
    Case("dataclass-object", "make_point",
         _c("p = candidate(1, 2)", "p.move(2, 3)", "assert (p.x, p.y) == (3, 5)", "p.move(-3, 0)", "assert p.x == 0",
            "assert p != (0, 5)"),
         "from dataclasses import dataclass\n\n@dataclass\nclass Point:\n    x: int\n    y: int\n"
         "    def move(self, dx, dy):\n        self.x += dx\n        self.y += dy\n\n"
         "def make_point(x, y):\n    return Point(x, y)\n",
         "from dataclasses import dataclass\n\n@dataclass\nclass Point:\n    x: int\n    y: int\n"
         "    def move(self, dx, dy):\n        self.x += dx\n        self.y = dy\n\n"
         "def make_point(x, y):\n    return Point(x, y)\n", 0.0, "n=3, k=0 (y set, not moved), F=0"),
    Case("sized-container", "Bag",
         _c("b = candidate()", "assert not b and len(b) == 0", "b.add('x')", "b.add('x')",
            "assert b and len(b) == 2 and 'x' in b and b[0] == 'x'", "assert 'y' not in b"),
         "class Bag:\n    def __init__(self):\n        self.items = []\n    def add(self, x):\n        self.items.append(x)\n"
         "    def __len__(self):\n        return len(self.items)\n    def __getitem__(self, i):\n"
         "        return self.items[i]\n    def __contains__(self, x):\n        return x in self.items\n",
         "class Bag:\n    def __init__(self):\n        self.items = set()\n    def add(self, x):\n        self.items.add(x)\n"
         "    def __len__(self):\n        return len(self.items)\n    def __getitem__(self, i):\n"
         "        return sorted(self.items)[i]\n    def __contains__(self, x):\n        return x in self.items\n",
         0.0, "n=3, k=1 (a set keeps one 'x'), F=1 (returning [] passes the first)"),
    Case("str-of-object", "point",
         _c("p = candidate(1, 2)", "assert p.x == 1 and p.y == 2", "assert str(p) == '(1, 2)'"),
         "class _P:\n    def __init__(self, x, y):\n        self.x, self.y = x, y\n    def __str__(self):\n"
         "        return f'({self.x}, {self.y})'\n\ndef point(x, y):\n    return _P(x, y)\n",
         "class _P:\n    def __init__(self, x, y):\n        self.x, self.y = x, y\n\ndef point(x, y):\n    return _P(x, y)\n",
         0.5, "n=2, k=1, F=0"),
    Case("iterable-object", "span",
         _c("r = candidate(3)", "assert list(r) == [0, 1, 2]", "assert list(r) == [0, 1, 2]", "assert sum(r) == 3"),
         "class _Span:\n    def __init__(self, n):\n        self.n = n\n    def __iter__(self):\n"
         "        return iter(range(self.n))\n\ndef span(n):\n    return _Span(n)\n",
         "def span(n):\n    return iter(range(n))\n", 1 / 3, "n=3, k=1 (a one-shot iterator), F=0"),
]

CASES = MUTATION + GENERATORS + STATEFUL + SETUP + HELPERS + CROSSING


def test_the_table_covers_every_kind_of_state():
    assert len(CASES) >= 30 and len({c.name for c in CASES}) == len(CASES)
    assert min(len(MUTATION), len(GENERATORS), len(STATEFUL), len(SETUP), len(HELPERS)) >= 3


def _reference(case: Case, answer: str) -> bool:
    """The reference harness: the prompt's helpers, the answer and the test in one plain interpreter."""
    program = f"{case.helpers}\n{answer}\n{case.spec()['test_code']}\ncheck({case.entry})\n"
    return subprocess.run([sys.executable, "-c", program], capture_output=True, timeout=30).returncode == 0


def test_the_hand_written_verdicts_are_the_reference_harness_verdicts():
    """The table's premise: every correct answer passes the whole check in a plain interpreter, no wrong one does."""
    assert [c.name for c in CASES if not _reference(c, c.correct)] == []
    assert [c.name for c in CASES if _reference(c, c.wrong)] == []


def test_stateful_asserts_score_as_the_whole_check(sandbox):
    items = [("code", _fenced(answer), c.spec(), {"id": f"{c.name}/{kind}"})
             for c in CASES for kind, answer in (("correct", c.correct), ("wrong", c.wrong))]
    results = grade_code_batch(items, sandbox=sandbox, cfg=CFG)
    got = {it[3]["id"]: (round(r.reward, 4), r.correct) for it, r in zip(items, results)}
    want = {}
    for c in CASES:
        want[f"{c.name}/correct"] = (1.0, True)
        want[f"{c.name}/wrong"] = (round(c.wrong_reward, 4), False)
    assert got == want
    flagged = {it[3]["id"]: r.metrics for it, r in zip(items, results) if r.metrics["suspected_hacks"]}
    assert flagged == {}


def test_a_run_that_times_out_keeps_the_tests_it_passed(sandbox):
    """The judge's own limit ends ``check`` with a ``timeout`` verdict that still counts the tests before it."""
    spec = {"test_code": "def check(candidate):\n    assert candidate(2) == 4\n    assert candidate(3) == 9\n"
                         "    assert candidate(-4) == 16\n", "entry_point": "square", "import_prefix": ""}
    loops = "def square(x):\n    while x < 0:\n        pass\n    return x * x\n"
    (res,) = grade_code_batch([("code", _fenced(loops), spec, None)], sandbox=sandbox,
                              cfg=RewardConfig(code_timeout_s=1.0))
    assert res.reward == pytest.approx(2 / 3) and not res.correct
    assert (res.metrics["tests_passed"], res.metrics["timeouts"]) == (2.0, 1.0)


def test_a_fault_the_test_swallowed_ends_the_credit_where_it_came(sandbox):
    """An answer that exits on the first call, under a test that catches everything: the exit fails the run
    (a failure of its kind) and no test after it earns credit, though the test went on and passed them."""
    spec = {"test_code": "def check(candidate):\n    try:\n        assert candidate(2) == 4\n    except BaseException:\n"
                         "        pass\n    assert candidate(3) == 9\n    assert candidate(-4) == 16\n",
            "entry_point": "square", "import_prefix": ""}
    exits = "import sys\n\ndef square(x):\n    if x == 2:\n        sys.exit(0)\n    return x * x\n"
    (res,) = grade_code_batch([("code", _fenced(exits), spec, None)], sandbox=sandbox, cfg=CFG)
    assert (res.reward, res.correct, res.metrics["tests_passed"]) == (0.0, False, 0.0)
    assert res.metrics["suspected_hacks/system_exit"] == 3.0
