"""The warm-up SFT corpus: sandbox-checked transcripts with wrong programs, mistakes and fixes.

A transcript is chat messages ``user → assistant (plan + call) → tool → assistant
(\\boxed{output})``. Per problem (``sft`` split only):

* the program is a **wrong** one (the confusable computation, runs cleanly, prints another
  number) with probability ``wrong_share``, else a right one; styles are drawn uniformly;
* with probability ``mistake_share`` the first call holds one planted mistake
  (``tasks.data.synthetic.mistakes``) and is followed by the sandbox's real error and a fix turn:
  a **shallow** fix is that one edit, introduced by a sentence naming it; with probability
  ``deep_fix_share`` the fix is **deep**: new reasoning and the same computation rewritten as
  a function in another style (right stays right, wrong stays wrong), so the fix never
  changes whether the answer is correct;
* the last turn boxes what the final call printed, so a wrong program ends wrong.

Beside the solving transcripts, a small share of R3L transcripts (``reflect_share``,
``retry_share``; ``tasks.data.synthetic.reflect``): a reflection on a solving transcript with the
diagnosis the generator knows to be right, and a guided retry from the pivot. Their ``meta.type``
is ``reflection`` / ``retry`` (``solve`` for the others).

Every snippet runs in the sandbox with the problem's setup (``run_many(codes, setups=...)``,
batched). A transcript is dropped (and counted by reason) when its mistake does not fail with
the intended kind and hint, its final call fails, or its output is not what the program
should print. The measured SAAR similarity of every fix is stored in ``meta`` and the
corpus's make-up in ``<corpus>.stats.json``.

Run: ``write_sft_corpus(Path("sft.jsonl"), 40000, 0, sandbox)`` (see ``CorpusConfig``).
"""

from __future__ import annotations

import difflib
import json
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from models.chat import CALL_OPEN, render_call
from tasks.data.synthetic.mistakes import MISTAKES, applicable, plant
from tasks.data.synthetic.problems import Problem, Program, make_problems, run_program

END_OF_TURN = "<|im_end|>"
DEEP_THRESHOLD = 0.5


@dataclass(frozen=True)
class CorpusMix:
    """Shares that shape the corpus (the knobs of the warm-up gate)."""

    wrong_share: float = 0.4
    mistake_share: float = 0.5
    deep_fix_share: float = 0.25
    reflect_share: float = 0.04
    """Per solved transcript, the chance of also writing an R3L reflection on it (``reflect``)."""
    retry_share: float = 0.04
    """Per transcript that was not a clean success, the chance of also writing a guided retry."""


@dataclass
class Plan:
    problem: Problem
    program: Program
    correct: bool
    expected: str
    mistake: str | None = None
    bad_code: str | None = None
    reason: str = ""
    hint: str = ""
    fix: Program | None = None
    deep: bool = False
    codes: list[str] = field(default_factory=list)


def bound_names(setup: str) -> tuple[str, ...]:
    return tuple(line.split(" = ", 1)[0] for line in setup.splitlines())


def as_function(program: Program, params: tuple[str, ...]) -> str:
    """``program`` rewritten as a function ``solve(<inputs>)`` documented by its plan (a deep rewrite)."""
    lines = program.code.split("\n")
    imports = [ln for ln in lines if ln.startswith("import ")]
    body = [ln for ln in lines if not ln.startswith("import ")]
    if not body[-1].startswith("print("):
        raise ValueError(f"program does not end with print(...): {program.code!r}")
    body[-1] = "return " + body[-1][len("print(") : -1]
    args = ", ".join(p for p in params if p in program.code)
    head = [*imports, f"def solve({args}):", f'    """{program.plan}"""']
    return "\n".join([*head, *("    " + ln for ln in body), "", "", f"result = solve({args})", "print(result)"])


def _rewrite(p: Problem, program: Program, correct: bool, r: random.Random) -> Program:
    pool = p.right if correct else p.wrong
    others = [q for q in pool if q.style != program.style] or [program]
    other = r.choice(others)
    return Program(as_function(other, bound_names(p.setup)), other.plan, "function")


def plan_transcript(p: Problem, r: random.Random, mix: CorpusMix) -> Plan:
    """Draw the program, the mistake (if any) and the fix of one transcript; list its snippets."""
    correct = r.random() >= mix.wrong_share
    program = r.choice(p.right if correct else p.wrong)
    plan = Plan(p, program, correct, str(p.answer))
    bound = bound_names(p.setup)
    names = applicable(program.code, bound)
    if names and r.random() < mix.mistake_share:
        plan.mistake = r.choice(names)
        broken = plant(plan.mistake, program.code, r, bound)
        if broken is not None:
            plan.bad_code, plan.reason, plan.hint = broken
            plan.deep = r.random() < mix.deep_fix_share
            plan.fix = _rewrite(p, program, correct, r) if plan.deep else program
            plan.codes.append(plan.bad_code)
        else:
            plan.mistake = None
    plan.codes.append((plan.fix or program).code)
    if not correct:
        plan.expected = run_program(plan.codes[-1], p.setup)
    return plan


def similarity(old_turn: str, new_turn: str) -> float:
    """SAAR's ratio: difflib over the text from ``<tool_call>`` to the end of each turn (+ end token)."""
    old = old_turn[old_turn.find(CALL_OPEN) :] + END_OF_TURN
    new = new_turn[new_turn.find(CALL_OPEN) :] + END_OF_TURN
    return difflib.SequenceMatcher(None, old, new).ratio()


def assemble(plan: Plan, results: list) -> tuple[dict | None, str]:
    """The transcript row of an executed plan, or (None, why it was dropped)."""
    p, final = plan.problem, results[-1]
    meta = {"type": "solve", "kind": p.kind, "family": p.family, "style": plan.program.style, "correct": plan.correct,
            "mistake": None, "error_kind": None, "fix": None, "similarity": None}
    messages = [{"role": "user", "content": p.question}]
    first = f"{plan.program.plan}\n{render_call(plan.program.code if plan.mistake is None else plan.bad_code)}"
    messages.append({"role": "assistant", "content": first})
    if plan.mistake is not None:
        bad, want = results[0], MISTAKES[plan.mistake].error_kind
        text = bad.model_text()
        if bad.error_kind != want:
            return None, f"{plan.mistake}: gave {bad.error_kind}, not {want}"
        if plan.hint not in text:
            return None, f"{plan.mistake}: error text lacks the hint"
        if plan.deep:
            fix = f"{plan.reason} Let me rewrite it another way. {plan.fix.plan}"
        else:
            fix = plan.reason
        fix_turn = f"{fix}\n{render_call(plan.fix.code)}"
        messages += [{"role": "tool", "content": text}, {"role": "assistant", "content": fix_turn}]
        meta.update(mistake=plan.mistake, error_kind=bad.error_kind, fix="deep" if plan.deep else "shallow",
                    similarity=round(similarity(first, fix_turn), 4))
    if not final.ok:
        return None, f"final call failed with {final.error_kind}"
    if final.stdout.strip() != plan.expected:
        return None, "final output differs from the program's expected output"
    messages += [{"role": "tool", "content": final.model_text()},
                 {"role": "assistant", "content": f"The answer is \\boxed{{{plan.expected}}}."}]
    return {"messages": messages, "meta": meta}, "ok"


def run_plans(plans: list[Plan], sandbox, batch: int = 512) -> list[list]:
    """Execute every plan's snippets (each with its problem's setup) with ``run_many``, in batches."""
    from tqdm import tqdm

    jobs = [(code, plan.problem.setup) for plan in plans for code in plan.codes]
    flat: list = []
    with tqdm(total=len(jobs), desc="sandbox", unit="snippet") as bar:
        for start in range(0, len(jobs), batch):
            chunk = jobs[start : start + batch]
            results = sandbox.run_many([c for c, _ in chunk], setups=[s for _, s in chunk])
            for res in results:
                if res.error_kind == "setup_error":
                    raise RuntimeError(f"setup code failed in the sandbox (a generator bug): {res.stderr[-300:]}")
            flat.extend(results)
            bar.update(len(chunk))
    out, pos = [], 0
    for plan in plans:
        out.append(flat[pos : pos + len(plan.codes)])
        pos += len(plan.codes)
    return out


def summarise(rows: list[dict], dropped: Counter, n: int, seed: int, mix: CorpusMix) -> dict:
    metas = [r["meta"] for r in rows if r["meta"]["type"] == "solve"]
    fixes = [m for m in metas if m["mistake"]]
    return {
        "requested": n, "written": len(metas), "dropped": dict(dropped), "seed": seed,
        "mix": mix.__dict__, "wrong_program": sum(not m["correct"] for m in metas),
        "with_mistake": len(fixes),
        "mistakes": dict(Counter(m["mistake"] for m in fixes).most_common()),
        "error_kinds": dict(Counter(m["error_kind"] for m in fixes).most_common()),
        "fix_intended": dict(Counter(m["fix"] for m in fixes)),
        "fix_measured_deep": sum(m["similarity"] < DEEP_THRESHOLD for m in fixes),
        "wrong_program_among_mistakes": sum(not m["correct"] for m in fixes),
        "kinds": dict(Counter(m["kind"] for m in metas).most_common()),
        "styles": dict(Counter(m["style"] for m in metas).most_common()),
        "r3l": dict(Counter(f"{r['meta']['type']}/{r['meta']['outcome']}" for r in rows
                            if r["meta"]["type"] != "solve").most_common()),
    }


def r3l_rows(pairs: list[tuple[Plan, dict]], seed: int, mix: CorpusMix) -> list[dict]:
    """Reflection and guided-retry transcripts on a random share of the solving transcripts."""
    from tasks.data.synthetic.reflect import reflection_transcript, report_for, retry_transcript

    r = random.Random(f"r3l:{seed}")
    out = []
    for plan, row in pairs:
        msgs, kind = row["messages"], plan.problem.kind
        outcome = report_for(plan, msgs)["trajectory_outcome"]
        if r.random() < mix.reflect_share:
            out.append({"messages": reflection_transcript(plan, msgs),
                        "meta": {"type": "reflection", "kind": kind, "outcome": outcome}})
        if outcome != "success" and r.random() < mix.retry_share:
            out.append({"messages": retry_transcript(plan, msgs, r),
                        "meta": {"type": "retry", "kind": kind, "outcome": outcome}})
    return out


def build_rows(n: int, seed: int, sandbox, mix: CorpusMix, batch: int = 512) -> tuple[list[dict], Counter]:
    """``n`` planned transcripts of ``sft`` questions, executed and checked, plus the R3L share, shuffled."""
    r = random.Random(f"sft:{seed}")
    plans = [plan_transcript(p, r, mix) for p in make_problems(n, seed, "sft")]
    pairs, dropped = [], Counter()
    for plan, results in zip(plans, run_plans(plans, sandbox, batch)):
        row, why = assemble(plan, results)
        if row is None:
            dropped[why] += 1
        else:
            pairs.append((plan, row))
    rows = [row for _, row in pairs] + r3l_rows(pairs, seed, mix)
    random.Random(f"order:{seed}").shuffle(rows)
    return rows, dropped


def write_sft_corpus(path: Path, n: int, seed: int, sandbox, mix: CorpusMix = CorpusMix(), batch: int = 512) -> Path:
    """Write ``n`` checked warm-up transcripts as JSONL ``{"messages", "meta"}`` (+ ``.stats.json``)."""
    rows, dropped = build_rows(n, seed, sandbox, mix, batch)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
    path.with_suffix(".stats.json").write_text(json.dumps(summarise(rows, dropped, n, seed, mix), indent=2))
    return path


def read_sft_corpus(path: Path) -> list[list[dict]]:
    """The message lists of a corpus written by ``write_sft_corpus``."""
    with Path(path).open() as fh:
        return [json.loads(line)["messages"] for line in fh if line.strip()]


def read_sft_types(path: Path) -> list[str]:
    """The ``meta.type`` of each row of a corpus (``solve``, ``reflection``, ``retry``), in file order."""
    with Path(path).open() as fh:
        return [json.loads(line).get("meta", {}).get("type", "solve") for line in fh if line.strip()]
