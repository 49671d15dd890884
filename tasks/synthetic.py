"""The synthetic tool-use task: RL prompts (verl parquet) and the tiny model's warm-up SFT corpus.

Problems need the Python tool and have an exact integer answer. Kinds (``data_source``):

- ``synthetic/arith``: ``mul`` (5×4-digit products), ``sum`` (3–5 numbers of 4–7 digits),
  ``floordiv`` and ``mod`` (8-digit by 3-digit), ``pow`` (answer < 10^15);
- ``synthetic/algo``: ``digitsum`` (of a 7–12 digit number), ``primes`` (count below N ≤ 10000),
  ``gcd``, ``lcm``, ``kth`` (k-th smallest of a list), ``factdigits`` (digit sum of n!, n ≤ 1400),
  ``fib`` (F(n) mod m, n ≤ 500). Every kind has thousands of distinct questions, so kinds stay
  balanced (questions are unique within a set).

Each problem carries two correct programs written differently (``code`` and ``alt_code``).
The train/eval split is a hash of the question text (10 % eval), so the splits never overlap
whatever the seeds, and the SFT corpus only uses train questions.

**SFT transcripts** are ``user → assistant (one sentence + tool call) → tool → assistant
(\\boxed{answer})``. With probability ``mistake_share`` the first call holds a mistake, chosen
uniformly among those that apply to the problem (expected error kind in brackets):

- ``name_typo`` misspelt ``print`` (NameError); ``wrong_variable`` prints an unassigned name
  (NameError); ``missing_paren`` drops the last ``)`` (SyntaxError); ``unclosed_string`` opens a
  quote it never closes (SyntaxError); ``str_concat`` ``"The answer is " + int`` (TypeError);
  ``int_literal`` ``int("48,213")`` (ValueError); ``indent`` a wrongly (un)indented line
  (IndentationError); ``malformed_json`` a call missing a ``}`` (``malformed_call``; the tool
  text is ``parse_tool_call(...).error_text``) — these apply to every kind;
- ``zero_div`` the divisor copied as 0 (ZeroDivisionError; floordiv/mod); ``module_typo``
  ``import maths`` (ModuleNotFoundError; gcd/lcm/factdigits); ``index_off`` an off-by-one list
  index (IndexError; kth/fib).

The error is followed by the sandbox's real tool text and a fixing turn. With probability
``deep_fix_share`` (default 0.25) the fix rewrites the program the other way (loop ↔ built-in,
sieve ↔ trial division, Euclid ↔ ``math.gcd`` …) with "let me try a different approach"
reasoning, so SAAR's similarity (``difflib`` ratio from ``<tool_call>`` to the end of the turn)
falls below 0.5 ("deep"); other fixes are small edits (≥ 0.5, "shallow"). The measured ratio
of every fix is stored in the row's ``meta`` and summarised in ``<corpus>.stats.json``.

Every snippet runs in the sandbox (``run_many``, batched): tool turns are the real
``model_text()``; a transcript is dropped (and counted) when its mistaken call does not fail
with the intended kind, its final call fails, or the output differs from the ground truth.

Simplifies: one tool call per solution; templated one-sentence reasoning. Run:
``python -c "from tasks.synthetic import write_task_parquet as w; w(Path('t.parquet'), 512, 0, 'train')"``.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import random
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from models.chat import CALL_OPEN, MALFORMED_CALL, parse_tool_call, render_call

ARITH, ALGO = "synthetic/arith", "synthetic/algo"
EVAL_BUCKETS = 10
DEEP_THRESHOLD = 0.5
END_OF_TURN = "<|im_end|>"


@dataclass(frozen=True)
class Problem:
    kind: str
    source: str
    question: str
    answer: int
    code: str
    alt_code: str


ALT = {
    "mul": ("multiply(x, y)", "shift and add over the digits of y",
            "total = 0\nfor place, digit in enumerate(reversed(str(y))):\n    total += x * int(digit) * 10 ** place\nreturn total"),
    "sum": ("add_all(numbers)", "add column by column, carrying like on paper",
            "width = max(len(str(v)) for v in numbers)\ntotal, carry = 0, 0\nfor k in range(width + 2):\n"
            "    column = sum(v // 10 ** k % 10 for v in numbers) + carry\n    total += column % 10 * 10 ** k\n"
            "    carry = column // 10\nreturn total"),
    "divide": ("divide(n, d)", "long division: subtract d * 10 ** k while it fits",
               "q = 0\nfor k in range(len(str(n)), -1, -1):\n    while n >= d * 10 ** k:\n        n -= d * 10 ** k\n"
               "        q += 10 ** k\nreturn q, n"),
    "pow": ("power(base, exp)", "square and multiply",
            "result = 1\nwhile exp > 0:\n    if exp % 2 == 1:\n        result *= base\n    base *= base\n    exp //= 2\n"
            "return result"),
    "digitsum": ("digit_sum(n)", "peel off the last digit with divmod until nothing is left",
                 "total = 0\nwhile n > 0:\n    n, last = divmod(n, 10)\n    total += last\nreturn total"),
    "primes": ("count_primes(limit)", "sieve of Eratosthenes",
               "is_prime = [True] * limit\nis_prime[0] = is_prime[1] = False\nfor i in range(2, int(limit ** 0.5) + 1):\n"
               "    if is_prime[i]:\n        for j in range(i * i, limit, i):\n            is_prime[j] = False\n"
               "return sum(is_prime)"),
    "gcd": ("gcd(a, b)", "binary gcd: strip common factors of two, then subtract",
            "shift = 0\nwhile a % 2 == 0 and b % 2 == 0:\n    a, b, shift = a // 2, b // 2, shift + 1\n"
            "while a != b:\n    if a > b:\n        a -= b\n    else:\n        b -= a\nreturn a << shift"),
    "lcm": ("lcm(a, b)", "step through multiples of the larger number until the smaller divides it",
            "big, small = max(a, b), min(a, b)\nm = big\nwhile m % small != 0:\n    m += big\nreturn m"),
    "kth": ("kth_smallest(values, k)", "insertion sort by hand, then count from 1",
            "ordered = []\nfor v in values:\n    i = 0\n    while i < len(ordered) and ordered[i] < v:\n        i += 1\n"
            "    ordered.insert(i, v)\nreturn ordered[k - 1]"),
    "factdigits": ("factorial_digit_sum(n)", "build n! step by step, then add its digits",
                   "f = 1\nfor i in range(2, n + 1):\n    f *= i\nreturn sum(int(d) for d in str(f))"),
    "fib": ("fibonacci(n)", "build the whole sequence in a list, each term the sum of the two before it",
            "sequence = [0, 1]\nfor i in range(2, n + 1):\n    sequence.append(sequence[i - 1] + sequence[i - 2])\n"
            "return sequence[n]"),
}


def _alt(key: str, args: str, suffix: str = "") -> str:
    """The explicit, function-based program of ``key`` called with ``args`` (the "deep" rewrite)."""
    sig, comment, body = ALT[key]
    indented = "\n".join("    " + ln for ln in body.split("\n"))
    return f"def {sig}:\n    # {comment}\n{indented}\n\nprint({sig.split('(')[0]}({args}){suffix})"


def _mul(r: random.Random) -> Problem:
    a, b = r.randint(1000, 99999), r.randint(100, 9999)
    return Problem("mul", ARITH, f"What is {a} * {b}?", a * b, f"print({a} * {b})", _alt("mul", f"{a}, {b}"))


def _sum(r: random.Random) -> Problem:
    xs = [r.randint(1000, 9999999) for _ in range(r.randint(3, 5))]
    expr = " + ".join(map(str, xs))
    return Problem("sum", ARITH, f"Compute {expr}.", sum(xs), f"print({expr})", _alt("sum", str(xs)))


def _floordiv(r: random.Random) -> Problem:
    a, b = r.randint(10**5, 10**8), r.randint(7, 999)
    q = f"What is {a} divided by {b}, rounded down?"
    return Problem("floordiv", ARITH, q, a // b, f"print({a} // {b})", _alt("divide", f"{a}, {b}", "[0]"))


def _mod(r: random.Random) -> Problem:
    a, b = r.randint(10**5, 10**8), r.randint(7, 999)
    q = f"What is the remainder of {a} divided by {b}?"
    return Problem("mod", ARITH, q, a % b, f"print({a} % {b})", _alt("divide", f"{a}, {b}", "[1]"))


def _pow(r: random.Random) -> Problem:
    base = r.randint(2, 9999)
    exp = r.randint(3, max(3, int(15 / math.log10(base))))
    q = f"What is {base} to the power of {exp}?"
    return Problem("pow", ARITH, q, base**exp, f"print({base} ** {exp})", _alt("pow", f"{base}, {exp}"))


def _digitsum(r: random.Random) -> Problem:
    n = r.randint(10**6, 10**12)
    q = f"What is the sum of the digits of {n}?"
    code = f"print(sum(int(d) for d in str({n})))"
    return Problem("digitsum", ALGO, q, sum(map(int, str(n))), code, _alt("digitsum", str(n)))


def _primes(r: random.Random) -> Problem:
    n = r.randint(50, 10000)
    sieve = bytearray([0, 0]) + bytearray([1]) * (n - 2)
    for i in range(2, math.isqrt(n - 1) + 1):
        if sieve[i]:
            sieve[i * i :: i] = bytes(len(range(i * i, n, i)))
    count = sum(sieve)
    code = f"print(sum(1 for k in range(2, {n}) if all(k % d for d in range(2, int(k ** 0.5) + 1))))"
    return Problem("primes", ALGO, f"How many prime numbers are there below {n}?", count, code, _alt("primes", str(n)))


def _gcd(r: random.Random) -> Problem:
    g = r.randint(2, 500)
    a, b = g * r.randint(2, 2000), g * r.randint(2, 2000)
    q = f"What is the greatest common divisor of {a} and {b}?"
    return Problem("gcd", ALGO, q, math.gcd(a, b), f"import math\nprint(math.gcd({a}, {b}))", _alt("gcd", f"{a}, {b}"))


def _lcm(r: random.Random) -> Problem:
    a, b = r.randint(10, 9999), r.randint(10, 9999)
    q = f"What is the least common multiple of {a} and {b}?"
    return Problem("lcm", ALGO, q, math.lcm(a, b), f"import math\nprint(math.lcm({a}, {b}))", _alt("lcm", f"{a}, {b}"))


def _kth(r: random.Random) -> Problem:
    xs = [r.randint(1, 999) for _ in range(r.randint(5, 9))]
    k = r.randint(1, len(xs))
    q = f"Sort the list {xs} in increasing order. What is element number {k}?"
    return Problem("kth", ALGO, q, sorted(xs)[k - 1], f"print(sorted({xs})[{k - 1}])", _alt("kth", f"{xs}, {k}"))


def _factdigits(r: random.Random) -> Problem:
    n = r.randint(10, 1400)
    code = f"import math\nprint(sum(int(d) for d in str(math.factorial({n}))))"
    q = f"What is the sum of the digits of {n}! (the factorial of {n})?"
    return Problem("factdigits", ALGO, q, sum(map(int, str(math.factorial(n)))), code, _alt("factdigits", str(n)))


def _fib(r: random.Random) -> Problem:
    n, m = r.randint(10, 500), r.randint(10, 9999)
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    code = f"a, b = 0, 1\nfor _ in range({n}):\n    a, b = b, a + b\nprint(a % {m})"
    q = f"What is the Fibonacci number F({n}) modulo {m}, where F(0) = 0 and F(1) = 1?"
    return Problem("fib", ALGO, q, a % m, code, _alt("fib", str(n), f" % {m}"))


GENERATORS: dict[str, Callable[[random.Random], Problem]] = {
    g.__name__.lstrip("_"): g
    for g in (_mul, _sum, _floordiv, _mod, _pow, _digitsum, _primes, _gcd, _lcm, _kth, _factdigits, _fib)
}
_TOPIC = {
    "mul": "multiply the numbers", "sum": "add the numbers", "floordiv": "do the integer division",
    "mod": "compute the remainder", "pow": "compute the power", "digitsum": "sum the digits",
    "primes": "count the primes", "gcd": "compute the gcd", "lcm": "compute the lcm", "kth": "sort the list",
    "factdigits": "compute the factorial", "fib": "compute the Fibonacci number",
}
FIRST_SENTENCE = {kind: f"Let me {topic} with Python." for kind, topic in _TOPIC.items()}


def split_of(question: str) -> str:
    """``eval`` for one question in ten (by a hash of its text), else ``train``."""
    bucket = int(hashlib.sha1(question.encode()).hexdigest(), 16) % EVAL_BUCKETS
    return "eval" if bucket == 0 else "train"


def make_problems(n: int, seed: int, split: str) -> list[Problem]:
    """``n`` distinct problems of ``split`` (``train``/``eval``), kinds drawn uniformly."""
    if split not in ("train", "eval"):
        raise ValueError(f"split: {split!r} is not 'train' or 'eval'")
    r = random.Random(f"{seed}:{split}")
    kinds = sorted(GENERATORS)
    out: list[Problem] = []
    seen: set[str] = set()
    while len(out) < n:
        p = GENERATORS[r.choice(kinds)](r)
        if p.question not in seen and split_of(p.question) == split:
            seen.add(p.question)
            out.append(p)
    return out


def write_task_parquet(path: Path, n: int, seed: int, split: str) -> Path:
    """Write ``n`` problems of ``split`` as verl RL parquet (prompt, data_source, ability, reward_model, extra_info)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [
        {
            "prompt": [{"role": "user", "content": p.question}],
            "data_source": p.source,
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(p.answer)},
            "extra_info": {"split": split, "index": i, "kind": p.kind},
        }
        for i, p in enumerate(make_problems(n, seed, split))
    ]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


# ---------------------------------------------------------------- mistakes

_LAST_PRINT = re.compile(r"print\((.*)\)$")


def _split_last(code: str) -> tuple[str, str]:
    """(everything before the final ``print(...)`` line, the printed expression)."""
    head, _, last = code.rpartition("\n")
    m = _LAST_PRINT.fullmatch(last)
    if m is None:
        raise ValueError(f"code: last line {last!r} is not print(...)")
    return (head + "\n" if head else ""), m.group(1)


def _wrong_variable(code: str, r: random.Random) -> tuple[str, str]:
    head, expr = _split_last(code)
    wrong = r.choice(["answer", "res", "output", "value"])
    if expr.isidentifier() and (f"{expr} =" in code or f"{expr}," in code):
        return f"{head}print({wrong})", code
    return f"{head}result = {expr}\nprint({wrong})", f"{head}result = {expr}\nprint(result)"


def _indent(code: str, r: random.Random) -> str:
    lines = code.split("\n")
    blocks = [i for i, ln in enumerate(lines) if ln.startswith("    ")]
    if blocks:
        i = blocks[0]
        lines[i] = lines[i][4:]
    else:
        lines[-1] = "    " + lines[-1]
    return "\n".join(lines)


def _int_literal(code: str, r: random.Random) -> str:
    m = re.search(r"\b\d{4,}\b", code)
    digits = m.group(0)
    commas = f"{int(digits):,}"
    return code[: m.start()] + f'int("{commas}")' + code[m.end() :]


def _zero_div(code: str, r: random.Random) -> str:
    return re.sub(r"(//|%) \d+\)$", r"\1 0)", code)


def _index_off(p: Problem, r: random.Random) -> tuple[str, str]:
    if p.kind == "kth":
        n = p.question.count(",") + 1
        return re.sub(r"\[\d+\]\)$", f"[{n}])", p.code), p.code
    return p.alt_code.replace(" + 1):", "):", 1), p.alt_code


@dataclass(frozen=True)
class Mistake:
    name: str
    kind: str
    applies: Callable[[Problem], bool]
    make: Callable[[Problem, random.Random], tuple[str, str]]
    """(bad code, the correct program it was derived from)."""


def _on_code(fn: Callable[[str, random.Random], str]):
    return lambda p, r: (fn(p.code, r), p.code)


MISTAKES: list[Mistake] = [
    Mistake("name_typo", "NameError", lambda p: True,
            _on_code(lambda c, r: c.replace("print(", r.choice(["prnt(", "pritn(", "Print(", "printt("]), 1))),
    Mistake("wrong_variable", "NameError", lambda p: True, lambda p, r: _wrong_variable(p.code, r)),
    Mistake("missing_paren", "SyntaxError", lambda p: True, _on_code(lambda c, r: c[:-1])),
    Mistake("unclosed_string", "SyntaxError", lambda p: True,
            _on_code(lambda c, r: "{}print(\"{})".format(*_split_last(c)))),
    Mistake("str_concat", "TypeError", lambda p: True,
            _on_code(lambda c, r: "{}print(\"The answer is \" + {})".format(*_split_last(c)))),
    Mistake("int_literal", "ValueError", lambda p: re.search(r"\b\d{4,}\b", p.code) is not None, _on_code(_int_literal)),
    Mistake("indent", "IndentationError", lambda p: True, _on_code(_indent)),
    Mistake("malformed_json", MALFORMED_CALL, lambda p: True, lambda p, r: (p.code, p.code)),
    Mistake("zero_div", "ZeroDivisionError", lambda p: p.kind in ("floordiv", "mod"), _on_code(_zero_div)),
    Mistake("module_typo", "ModuleNotFoundError", lambda p: "import math" in p.code,
            _on_code(lambda c, r: c.replace("math", r.choice(["maths", "mathh", "Math"])))),
    Mistake("index_off", "IndexError", lambda p: p.kind in ("kth", "fib"), _index_off),
]


# ---------------------------------------------------------------- SFT corpus


@dataclass
class _Plan:
    problem: Problem
    mistake: Mistake | None = None
    deep: bool = False
    bad_call: str | None = None
    bad_code: str | None = None
    good_code: str = ""
    codes: list[str] = field(default_factory=list)


def plan_transcript(p: Problem, r: random.Random, mistake_share: float, deep_share: float) -> _Plan:
    """Decide the mistake (if any) and the fix of one transcript; list the snippets to run."""
    plan = _Plan(p, good_code=p.code)
    if r.random() < mistake_share:
        plan.mistake = r.choice([m for m in MISTAKES if m.applies(p)])
        bad, base = plan.mistake.make(p, r)
        plan.deep = r.random() < deep_share
        plan.good_code = (p.alt_code if base != p.alt_code else p.code) if plan.deep else base
        if plan.mistake.kind == MALFORMED_CALL:
            plan.bad_call = render_call(bad)[:-len("}</tool_call>")] + "</tool_call>"
        else:
            plan.bad_call, plan.bad_code = render_call(bad), bad
            plan.codes.append(bad)
    plan.codes.append(plan.good_code)
    return plan


def similarity(old_turn: str, new_turn: str) -> float:
    """SAAR's ratio: difflib over the text from ``<tool_call>`` to the end of each turn (+ end token)."""
    old = old_turn[old_turn.find(CALL_OPEN) :] + END_OF_TURN
    new = new_turn[new_turn.find(CALL_OPEN) :] + END_OF_TURN
    return difflib.SequenceMatcher(None, old, new).ratio()


def assemble(plan: _Plan, results: list) -> tuple[dict | None, str]:
    """The transcript row of an executed plan, or (None, why it was dropped)."""
    p, good = plan.problem, results[-1]
    meta = {"kind": p.kind, "source": p.source, "mistake": None, "error_kind": None, "fix": None, "similarity": None}
    messages = [{"role": "user", "content": p.question}]
    first = FIRST_SENTENCE[p.kind] + "\n"
    if plan.mistake is not None:
        if plan.bad_code is None:
            parsed = parse_tool_call(plan.bad_call)
            kind, tool_text = parsed.error_kind, parsed.error_text
        else:
            kind, tool_text = results[0].error_kind, results[0].model_text()
        if kind != plan.mistake.kind:
            return None, f"mistake {plan.mistake.name} gave {kind}, not {plan.mistake.kind}"
        how = "let me try a different approach" if plan.deep else "let me fix it"
        fix = f"The code raised {kind}; {how}.\n{render_call(plan.good_code)}"
        bad_turn = first + plan.bad_call
        messages += [{"role": "assistant", "content": bad_turn}, {"role": "tool", "content": tool_text},
                     {"role": "assistant", "content": fix}]
        ratio = similarity(bad_turn, fix)
        meta.update(mistake=plan.mistake.name, error_kind=kind, fix="deep" if plan.deep else "shallow",
                    similarity=round(ratio, 4))
    else:
        messages.append({"role": "assistant", "content": first + render_call(plan.good_code)})
    if not good.ok:
        return None, f"final call failed with {good.error_kind}"
    if good.stdout.strip() != str(p.answer):
        return None, "final output differs from the ground truth"
    messages += [{"role": "tool", "content": good.model_text()},
                 {"role": "assistant", "content": f"The answer is \\boxed{{{p.answer}}}."}]
    return {"messages": messages, "meta": meta}, "ok"


def _run_plans(plans: list[_Plan], sandbox, batch: int) -> list[list]:
    """Execute every plan's snippets with ``run_many`` in batches, under a progress bar."""
    from tqdm import tqdm

    codes = [c for plan in plans for c in plan.codes]
    flat: list = []
    with tqdm(total=len(codes), desc="sandbox", unit="snippet") as bar:
        for start in range(0, len(codes), batch):
            chunk = codes[start : start + batch]
            flat.extend(sandbox.run_many(chunk))
            bar.update(len(chunk))
    out, pos = [], 0
    for plan in plans:
        out.append(flat[pos : pos + len(plan.codes)])
        pos += len(plan.codes)
    return out


def _summarise(rows: list[dict], dropped: Counter, n: int, seed: int, mistake_share: float, deep_share: float) -> dict:
    metas = [r["meta"] for r in rows]
    fixes = [m for m in metas if m["mistake"]]
    return {
        "requested": n, "written": len(rows), "dropped": dict(dropped), "seed": seed,
        "mistake_share": mistake_share, "deep_fix_share": deep_share,
        "with_mistake": len(fixes),
        "mistakes": dict(Counter(m["mistake"] for m in fixes).most_common()),
        "error_kinds": dict(Counter(m["error_kind"] for m in fixes).most_common()),
        "fix_intended": dict(Counter(m["fix"] for m in fixes)),
        "fix_measured_deep": sum(m["similarity"] < DEEP_THRESHOLD for m in fixes),
        "kinds": dict(Counter(m["kind"] for m in metas).most_common()),
    }


def write_sft_corpus(path: Path, n: int, seed: int, mistake_share: float, sandbox,
                     deep_fix_share: float = 0.25, batch: int = 512) -> Path:
    """Write ``n`` checked warm-up transcripts as JSONL ``{"messages", "meta"}`` (+ ``.stats.json``)."""
    r = random.Random(f"sft:{seed}")
    plans = [plan_transcript(p, r, mistake_share, deep_fix_share) for p in make_problems(n, seed, "train")]
    rows, dropped = [], Counter()
    for plan, results in zip(plans, _run_plans(plans, sandbox, batch)):
        row, why = assemble(plan, results)
        if row is None:
            dropped[why] += 1
        else:
            rows.append(row)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
    stats = _summarise(rows, dropped, n, seed, mistake_share, deep_fix_share)
    path.with_suffix(".stats.json").write_text(json.dumps(stats, indent=2))
    return path


def read_sft_corpus(path: Path) -> list[list[dict]]:
    """The message lists of a corpus written by ``write_sft_corpus``."""
    with Path(path).open() as fh:
        return [json.loads(line)["messages"] for line in fh if line.strip()]
