"""Warm-up transcripts of chains (the multi-call regime's stage after ``tiny-warm``), mixed with single-call ones.

A chain transcript makes one call per step and then answers::

    user (the chain) → assistant (step 1's plan + call) → tool (its output)
                     → assistant ("r = <that output>", step 2's plan + call binding it) → tool → … → \\boxed{…}

Per step, independently: the program is a **wrong** one (the step's confusable computation) with probability
``chain_wrong_share`` — a later step then works on the wrong value it was given, as a policy would; with
probability ``mistake_share`` the call holds one planted mistake (``tasks.data.synthetic.mistakes``) followed by
the sandbox's real error and a fix turn (shallow, or with probability ``deep_fix_share`` the same computation
rewritten as a function in another style). A later call starts with the binding line ``r = <what the previous
call printed>``, the sandbox keeping no state between calls. Every snippet runs in the sandbox with the chain's
setup; a transcript whose mistake does not fail as intended, whose final call fails or whose outputs are not
what the generator computed is dropped and counted, as in ``tasks.data.synthetic.corpus``.

``write_warmup_corpus`` writes ``chain_share`` of the transcripts as chains (``sft`` questions of the chain
family) and the rest from the single-call corpus writer, so the single-call task is not forgotten.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from models.chat import render_call
from tasks.data.synthetic.chains import Chain, make_chains
from tasks.data.synthetic.corpus import CorpusMix, as_function, bound_names, build_rows, run_plans
from tasks.data.synthetic.mistakes import MISTAKES, applicable, plant
from tasks.data.synthetic.problems import Program, run_program


@dataclass
class CallPlan:
    """One call of a chain transcript: what it runs, and the broken first try when a mistake is planted."""

    text: str
    code: str
    expected: str
    bad_code: str | None = None
    mistake: str | None = None
    reason: str = ""
    hint: str = ""


@dataclass
class ChainPlan:
    chain: Chain
    calls: list[CallPlan] = field(default_factory=list)
    wrong_steps: int = 0

    @property
    def problem(self):  # ``run_plans`` reads ``plan.problem.setup``
        return self.chain

    @property
    def codes(self) -> list[str]:
        return [c for call in self.calls for c in ((call.bad_code, call.code) if call.bad_code else (call.code,))]


def plan_chain(chain: Chain, r: random.Random, mix: CorpusMix, wrong_share: float) -> ChainPlan:
    """Draw every call of a chain transcript (program, mistake, fix); expected outputs from the trusted runner."""
    plan, prev = ChainPlan(chain), None
    names = bound_names(chain.setup)
    for k, step in enumerate(chain.steps):
        wrong = r.random() < wrong_share
        plan.wrong_steps += wrong
        program = r.choice(step.wrong if wrong else step.right)
        bind = f"{step.input_name} = {prev}\n" if step.input_name else ""
        params = (*names, step.input_name) if step.input_name else names
        lead = f"Step {k + 1}: {step.input_name} = {prev}. " if step.input_name else "Step 1: "
        call = CallPlan(f"{lead}{program.plan}", bind + program.code, "")
        spots = applicable(program.code, params)
        if spots and r.random() < mix.mistake_share:
            mistake = r.choice(spots)
            broken = plant(mistake, program.code, r, params)
            if broken is not None:
                call.bad_code, call.reason, call.hint = bind + broken[0], broken[1], broken[2]
                call.mistake = mistake
                if r.random() < mix.deep_fix_share:
                    pool = [p for p in (step.wrong if wrong else step.right) if p.style != program.style] or [program]
                    other = r.choice(pool)
                    fix = Program(as_function(other, params), other.plan, "function")
                    call.reason = f"{call.reason} Let me rewrite it another way. {fix.plan}"
                    call.code = bind + fix.code
        call.expected = run_program(call.code, chain.setup)
        prev = call.expected
        plan.calls.append(call)
    return plan


def assemble_chain(plan: ChainPlan, results: list) -> tuple[dict | None, str]:
    """The transcript row of an executed chain plan, or (None, why it was dropped)."""
    messages = [{"role": "user", "content": plan.chain.question}]
    pos = 0
    for call in plan.calls:
        if call.bad_code is not None:
            bad, want = results[pos], MISTAKES[call.mistake].error_kind
            pos += 1
            if bad.error_kind != want:
                return None, f"{call.mistake}: gave {bad.error_kind}, not {want}"
            if call.hint not in bad.model_text():
                return None, f"{call.mistake}: error text lacks the hint"
            messages += [{"role": "assistant", "content": f"{call.text}\n{render_call(call.bad_code)}"},
                         {"role": "tool", "content": bad.model_text()},
                         {"role": "assistant", "content": f"{call.reason}\n{render_call(call.code)}"}]
        else:
            messages.append({"role": "assistant", "content": f"{call.text}\n{render_call(call.code)}"})
        res = results[pos]
        pos += 1
        if not res.ok:
            return None, f"call failed with {res.error_kind}"
        if res.stdout.strip() != call.expected:
            return None, "a call's output differs from the program's expected output"
        messages.append({"role": "tool", "content": res.model_text()})
    final = plan.calls[-1].expected
    messages.append({"role": "assistant", "content": f"The answer is \\boxed{{{final}}}."})
    meta = {"type": "solve", "kind": plan.chain.kind, "family": "chain", "calls": plan.chain.calls,
            "correct": final == str(plan.chain.answer), "wrong_steps": plan.wrong_steps,
            "mistakes": [c.mistake for c in plan.calls if c.mistake]}
    return {"messages": messages, "meta": meta}, "ok"


def build_chain_rows(n: int, seed: int, sandbox, mix: CorpusMix, wrong_share: float,
                     batch: int = 512) -> tuple[list[dict], Counter]:
    """``n`` planned chain transcripts of ``sft`` chains, executed and checked."""
    r = random.Random(f"chain-sft:{seed}")
    plans = [plan_chain(c, r, mix, wrong_share) for c in make_chains(n, seed, "sft")]
    rows, dropped = [], Counter()
    for plan, results in zip(plans, run_plans(plans, sandbox, batch)):
        row, why = assemble_chain(plan, results)
        if row is None:
            dropped[f"chain: {why}"] += 1
        else:
            rows.append(row)
    return rows, dropped


def write_warmup_corpus(path: Path, n: int, seed: int, sandbox, mix: CorpusMix, chain_share: float,
                        chain_wrong_share: float, batch: int = 512) -> Path:
    """Write ``n`` checked transcripts, ``chain_share`` of them chains, as JSONL (+ ``.stats.json``)."""
    n_chain = round(n * chain_share)
    single, dropped = build_rows(n - n_chain, seed, sandbox, mix, batch) if n > n_chain else ([], Counter())
    chains, chain_dropped = build_chain_rows(n_chain, seed, sandbox, mix, chain_wrong_share, batch)
    rows = single + chains
    random.Random(f"order:{seed}").shuffle(rows)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
    metas = [row["meta"] for row in chains]
    stats = {"requested": n, "chains_requested": n_chain, "chains_written": len(chains),
             "single_written": len(single), "dropped": dict(dropped + chain_dropped), "seed": seed,
             "mix": mix.__dict__, "chain_share": chain_share, "chain_wrong_share": chain_wrong_share,
             "chain_calls": dict(Counter(m["calls"] for m in metas)),
             "chain_correct": sum(m["correct"] for m in metas),
             "chain_mistakes": dict(Counter(x for m in metas for x in m["mistakes"]).most_common())}
    path.with_suffix(".stats.json").write_text(json.dumps(stats, indent=2))
    return path
