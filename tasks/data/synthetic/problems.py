"""Problems of the synthetic tool-use task: bound inputs, programs right and wrong, splits, parquet.

A ``Problem`` states its inputs in the question *and* binds them in ``setup`` code
(``a = 62384\\nb = 6509``) that the sandbox runs before every snippet of the trajectory
(``Sandbox.run(code, setup=...)``), so a program names its inputs and never copies digits.
Difficulty lives in choosing the program: every kind has ``right`` programs (at least two
styles, e.g. built-in vs loop, used by deep rewrites) and ``wrong`` programs — the confusable
computation a careless solver picks (``//`` for a remainder, gcd for an lcm, the k-th smallest
for the k-th largest, an off-by-one index). A wrong program runs cleanly and prints a number
that differs from the answer (checked when the problem is drawn). Each ``Program`` carries the
one-sentence plan that introduces it in a transcript.

Kinds register themselves with ``@kind(name, family)``; families live in sibling modules
(``arith``, ``numbers``, ``lists``, ``sequences``). ``data_source`` is ``synthetic/<family>``.

Task families (``@task_family``: ``single``, one call, here; ``chain``, 2–3 dependent calls,
``tasks.data.synthetic.chains``) turn (n, seed, split, exclude) into verl rows; ``data.family`` picks one.

Splits are a hash of the question text: ``eval`` (1 bucket in 20), ``rl`` (3 in 20) and
``sft`` (the rest). The warm-up corpus draws only ``sft`` questions, RL prompts only ``rl``
and evaluation only ``eval``, so the three never share a question whatever the seeds.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

SPLITS = ("sft", "rl", "eval")
BUCKETS = 20
_SPLIT_OF_BUCKET = {0: "eval", 1: "rl", 2: "rl", 3: "rl"}


@dataclass(frozen=True)
class Program:
    """One way to compute something: its code (using the bound names), its plan sentence, its style."""

    code: str
    plan: str
    style: str


@dataclass(frozen=True)
class Problem:
    kind: str
    family: str
    question: str
    setup: str
    answer: int
    right: tuple[Program, ...]
    wrong: tuple[Program, ...]

    @property
    def source(self) -> str:
        return f"synthetic/{self.family}"


@dataclass(frozen=True)
class Kind:
    name: str
    family: str
    draw: Callable[[random.Random], Problem]


KINDS: dict[str, Kind] = {}


def kind(name: str, family: str):
    """Register a problem generator ``draw(rng) -> Problem`` under ``name``."""

    def deco(draw: Callable[[random.Random], Problem]):
        KINDS[name] = Kind(name, family, draw)
        return draw

    return deco


def bind(pairs: list[tuple[str, object]]) -> tuple[str, str]:
    """(setup code, the question's ``Variables:`` line) binding ``pairs`` of (name, value)."""
    setup = "\n".join(f"{n} = {v!r}" for n, v in pairs)
    shown = ", ".join(f"{n} = {v!r}" for n, v in pairs)
    return setup, f"Variables: {shown}."


def run_program(code: str, setup: str) -> str:
    """What ``code`` prints after ``setup`` (trusted generator code; used to check answers).

    ``print`` is bound to a buffer in the program's globals rather than by redirecting
    ``sys.stdout``, which a host may have patched (Prefect's ``log_prints`` replaces ``print``).
    """
    import io

    buf = io.StringIO()

    def _print(*args, sep: str = " ", end: str = "\n", **_) -> None:
        buf.write(sep.join(map(str, args)) + end)

    scope: dict = {"print": _print}
    exec(setup, scope)
    exec(code, scope)
    return buf.getvalue().strip()


def make(kind_name: str, question: str, pairs: list[tuple[str, object]], right: list[Program],
         wrong: list[Program]) -> Problem | None:
    """A checked problem: every right program prints the answer, every wrong one prints another
    number; ``None`` when the drawn values make a wrong program coincide with the answer."""
    k = KINDS[kind_name]
    setup, shown = bind(pairs)
    outs = [run_program(p.code, setup) for p in right]
    if len(set(outs)) != 1:
        raise AssertionError(f"{kind_name}: right programs disagree {outs} on {setup!r}")
    if any(run_program(p.code, setup) == outs[0] for p in wrong):
        return None
    return Problem(kind_name, k.family, f"{shown}\n{question}", setup, int(outs[0]), tuple(right), tuple(wrong))


def split_of(question: str) -> str:
    """``eval``, ``rl`` or ``sft`` by a hash of the question text (1 : 3 : 16 buckets of 20)."""
    bucket = int(hashlib.sha1(question.encode()).hexdigest(), 16) % BUCKETS
    return _SPLIT_OF_BUCKET.get(bucket, "sft")


def make_problems(n: int, seed: int, split: str, kinds: list[str] | None = None,
                  exclude: frozenset[str] = frozenset()) -> list[Problem]:
    """``n`` distinct problems of ``split``, kinds drawn uniformly (from ``kinds`` if given), none whose question is
    in ``exclude`` (a fresh held-out file drawn beside another one)."""
    import tasks.data.synthetic  # noqa: F401  (registers the kinds)

    if split not in SPLITS:
        raise ValueError(f"split: {split!r} is not one of {SPLITS}")
    names = sorted(kinds or KINDS)
    unknown = set(names) - set(KINDS)
    if unknown:
        raise ValueError(f"kinds: unknown {sorted(unknown)}; valid: {sorted(KINDS)}")
    r = random.Random(f"{seed}:{split}")
    out: list[Problem] = []
    seen: set[str] = set(exclude)
    while len(out) < n:
        p = KINDS[r.choice(names)].draw(r)
        if p is not None and p.question not in seen and split_of(p.question) == split:
            seen.add(p.question)
            out.append(p)
    return out


def task_rows(problems: list[Problem], split: str) -> list[dict]:
    """verl RL rows: prompt, data_source, ability, reward_model, extra_info (split, index, kind, setup)."""
    return [
        {
            "prompt": [{"role": "user", "content": p.question}],
            "data_source": p.source,
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(p.answer)},
            "extra_info": {"split": split, "index": i, "kind": p.kind, "setup": p.setup},
        }
        for i, p in enumerate(problems)
    ]


FamilyRows = Callable[[int, int, str, frozenset], list[dict]]
FAMILIES: dict[str, FamilyRows] = {}


def task_family(name: str):
    """Register a task family ``rows(n, seed, split, exclude) -> verl rows`` under ``name`` (``data.family``)."""

    def deco(rows: FamilyRows) -> FamilyRows:
        FAMILIES[name] = rows
        return rows

    return deco


@task_family("single")
def single_rows(n: int, seed: int, split: str, exclude: frozenset[str] = frozenset()) -> list[dict]:
    """The single-call task: one problem of a registered kind per prompt."""
    return task_rows(make_problems(n, seed, split, exclude=exclude), split)


def family_rows(family: str) -> FamilyRows:
    """The rows function of ``family``; an unknown name is an error naming ``data.family`` and the valid ones."""
    import tasks.data.synthetic  # noqa: F401  (registers the families)

    if family not in FAMILIES:
        raise ValueError(f"data.family: unknown task family {family!r}; valid: {sorted(FAMILIES)}")
    return FAMILIES[family]


def write_task_parquet(path: Path, n: int, seed: int, split: str, exclude: frozenset[str] = frozenset(),
                       family: str = "single") -> Path:
    """Write ``n`` prompts of task ``family`` and ``split`` (``rl`` for training prompts, ``eval`` held out), none
    whose question is in ``exclude``, as verl parquet; written under a temporary name and renamed, so runs started
    together never read a half-written file."""
    import os

    import pyarrow as pa
    import pyarrow.parquet as pq

    if split == "sft":
        raise ValueError("split: 'sft' questions belong to the warm-up corpus, not to RL or evaluation prompts")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    rows = family_rows(family)(n, seed, split, exclude)
    pq.write_table(pa.Table.from_pylist(rows), tmp)
    tmp.replace(path)
    return path
