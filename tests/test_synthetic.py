"""The synthetic task: bound inputs, confusable programs, disjoint splits, planted mistakes, the corpus.

Programs run in the real local sandbox with the problem's setup code (the same call the
rollout makes), so what is checked here is what the model will see.
"""

from __future__ import annotations

import json
import random
import re

import pytest

from models.chat import parse_tool_call
from tasks.data.synthetic import (
    KINDS,
    CorpusMix,
    make_problems,
    split_of,
    task_rows,
    write_sft_corpus,
    write_task_parquet,
)
from tasks.data.synthetic.corpus import as_function, bound_names, plan_transcript, similarity
from tasks.data.synthetic.mistakes import MISTAKES, plant, typo
from tasks.data.synthetic.problems import Program, make, run_program


@pytest.fixture(scope="module")
def box():
    from sandbox.base import make_sandbox
    from sandbox.config import SandboxConfig

    with make_sandbox(SandboxConfig(backend="local", workers=2)) as sb:
        yield sb


def _values(setup: str) -> list[str]:
    return re.findall(r"-?\d+", setup)


def test_a_hand_computed_problem():
    # 62384 // 6509 = 9 and 62384 - 9 * 6509 = 3803
    p = make("floordiv", "What is a divided by b, rounded down?", [("a", 62384), ("b", 6509)],
             [Program("print(a // b)", "I divide.", "operator")], [Program("print(a % b)", "I take the remainder.", "operator")])
    assert (p.answer, p.setup, p.source) == (9, "a = 62384\nb = 6509", "synthetic/arith")
    assert p.question == "Variables: a = 62384, b = 6509.\nWhat is a divided by b, rounded down?"
    assert run_program("print(a % b)", p.setup) == "3803"
    assert make("floordiv", "q", [("a", 8), ("b", 3)], [Program("print(a // b)", "", "")],
                [Program("print(a % b)", "", "")]) is None, "a wrong program printing the answer is no wrong program"


def test_inputs_are_bound_not_copied(box):
    problems = make_problems(140, 7, "rl")
    assert {p.kind for p in problems} == set(KINDS)
    progs = [(p, prog, prog in p.right) for p in problems for prog in p.right + p.wrong]
    for p, prog, _ in progs:
        assert not any(v in prog.code for v in _values(p.setup) if len(v) > 1), (p.kind, prog.code)
        assert p.question.startswith("Variables: ") and all(f"{n} = " in p.question for n in bound_names(p.setup))
    results = box.run_many([prog.code for _, prog, _ in progs], setups=[p.setup for p, _, _ in progs])
    unbound = box.run_many([prog.code for _, prog, _ in progs[:40]])
    for (p, prog, right), res in zip(progs, results):
        assert res.ok, (p.kind, prog.code, res.model_text())
        assert (res.stdout.strip() == str(p.answer)) == right, (p.kind, prog.code)
    assert all(not r.ok and r.error_kind == "NameError" for r in unbound), "without the setup no program runs"


def test_splits_are_disjoint_and_rl_eval_never_sft(tmp_path):
    import pyarrow.parquet as pq

    qs = {s: {p.question for p in make_problems(n, 3, s)} for s, n in (("sft", 4000), ("rl", 800), ("eval", 300))}
    assert not qs["sft"] & qs["rl"] and not qs["sft"] & qs["eval"] and not qs["rl"] & qs["eval"]
    assert all(split_of(q) == s for s, group in qs.items() for q in group)
    rows = pq.read_table(write_task_parquet(tmp_path / "rl.parquet", 50, 0, "rl")).to_pylist()
    assert all(split_of(r["prompt"][0]["content"]) == "rl" for r in rows)
    assert rows[0]["extra_info"]["setup"] and rows[0]["extra_info"]["split"] == "rl"
    with pytest.raises(ValueError, match="sft"):
        write_task_parquet(tmp_path / "x.parquet", 5, 0, "sft")
    with pytest.raises(ValueError, match="valid"):
        make_problems(3, 0, "rl", kinds=["nope"])
    assert split_of("Variables: a = 62384, b = 6509.\nWhat is a divided by b, rounded down?") == "sft"


def test_every_mistake_fails_as_intended_and_its_message_names_the_fix(box):
    r = random.Random(0)
    cases = []
    for p in make_problems(200, 5, "sft"):
        for prog in p.right + p.wrong:
            for name in MISTAKES:
                broken = plant(name, prog.code, r, bound_names(p.setup))
                if broken is not None:
                    cases.append((name, p, prog, *broken))
    by_name = {}
    for c in cases:
        by_name.setdefault(c[0], []).append(c)
    assert set(by_name) == set(MISTAKES)
    sample = [c for cs in by_name.values() for c in cs[:12]]
    results = box.run_many([c[3] for c in sample], setups=[c[1].setup for c in sample])
    ok = 0
    for (name, _p, _prog, bad, reason, hint), res in zip(sample, results):
        assert res.error_kind == MISTAKES[name].error_kind, (name, bad, res.model_text())
        ok += hint in res.model_text()
        assert reason.endswith(".") and len(reason) < 90
    assert ok >= 0.95 * len(sample), "the error message names the fix (the corpus drops the rare exceptions)"
    assert typo("print", random.Random(1)) in ("printt", "prnt", "pint", "prit", "rint")
    assert plant("missing_paren", "print(a // b)", r)[:1] == ("print(a // b",)
    assert plant("iterate_int", "for _ in range(n):\n    x += 1", r)[0] == "for _ in n:\n    x += 1"


def test_deep_rewrite_is_a_function_of_the_same_computation():
    prog = Program("import math\nprint(math.gcd(a, b))", "math.gcd gives the gcd.", "builtin")
    code = as_function(prog, ("a", "b"))
    assert code == ('import math\ndef solve(a, b):\n    """math.gcd gives the gcd."""\n    return math.gcd(a, b)\n\n\n'
                    "result = solve(a, b)\nprint(result)")
    assert run_program(code, "a = 12\nb = 18") == "6"


def test_corpus_is_checked_and_keeps_correctness_through_fixes(tmp_path, box):
    mix = CorpusMix(wrong_share=0.4, mistake_share=0.6, deep_fix_share=0.4, reflect_share=0.0, retry_share=0.0)
    path = write_sft_corpus(tmp_path / "sft.jsonl", 160, 2, box, mix)
    stats = json.loads(path.with_suffix(".stats.json").read_text())
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert {r["meta"]["type"] for r in rows} == {"solve"} and stats["r3l"] == {}
    assert stats["written"] == len(rows) >= 155 and stats["requested"] == 160
    sft = {p.question: p for p in make_problems(160, 2, "sft")}
    for row in rows:
        msgs, meta = row["messages"], row["meta"]
        p = sft[msgs[0]["content"]]
        roles = [m["role"] for m in msgs]
        boxed = msgs[-1]["content"]
        assert boxed == f"The answer is \\boxed{{{msgs[-2]['content']}}}."
        assert (msgs[-2]["content"] == str(p.answer)) == meta["correct"], "a wrong program ends wrong, a fix keeps it"
        if meta["mistake"] is None:
            assert roles == ["user", "assistant", "tool", "assistant"]
            continue
        assert roles == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
        first, err, fix = msgs[1]["content"], msgs[2]["content"], msgs[3]["content"]
        assert meta["error_kind"] in err and meta["similarity"] == round(similarity(first, fix), 4)
        if meta["fix"] == "shallow":
            assert meta["similarity"] >= 0.5 and "another way" not in fix
        else:
            assert "def solve(" in parse_tool_call(fix).code and "another way" in fix
    n = len(rows)
    assert 0.25 < stats["wrong_program"] / n < 0.55 and 0.45 < stats["with_mistake"] / n < 0.75
    assert stats["fix_intended"]["deep"] >= 0.25 * stats["with_mistake"] and stats["fix_measured_deep"] >= 1
    assert set(stats["kinds"]) == set(KINDS)


def test_plan_draws_from_the_mix():
    r = random.Random(0)
    problems = make_problems(400, 0, "sft")
    plans = [plan_transcript(p, r, CorpusMix(0.4, 0.5, 0.25)) for p in problems]
    wrong = sum(not pl.correct for pl in plans) / len(plans)
    mistaken = [pl for pl in plans if pl.mistake]
    assert 0.33 < wrong < 0.47 and 0.42 < len(mistaken) / len(plans) < 0.58
    assert all(pl.codes[-1] == pl.program.code for pl in mistaken if not pl.deep)
    none = plan_transcript(problems[0], random.Random(0), CorpusMix(0.0, 0.0, 0.0))
    assert none.mistake is None and none.correct and none.codes == [none.program.code]
    rows = task_rows(problems[:3], "rl")
    assert rows[1]["extra_info"] == {"split": "rl", "index": 1, "kind": problems[1].kind, "setup": problems[1].setup}


def test_r3l_transcripts_carry_the_right_diagnosis_and_fit(tmp_path, box):
    from tasks.r3l import check_report, parse_reflection

    mix = CorpusMix(wrong_share=0.4, mistake_share=0.5, reflect_share=0.5, retry_share=0.5)
    path = write_sft_corpus(tmp_path / "sft.jsonl", 80, 4, box, mix)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    refl = [r for r in rows if r["meta"]["type"] == "reflection"]
    retry = [r for r in rows if r["meta"]["type"] == "retry"]
    assert len(refl) >= 25 and len(retry) >= 15
    assert {r["meta"]["outcome"] for r in refl} == {"success", "success_but_inefficient", "failure"}
    for row in refl:
        msgs = row["messages"]
        assert [m["role"] for m in msgs] == ["system", "user", "assistant"] and msgs[1]["content"].startswith("Step 0\n")
        report, _ = parse_reflection(msgs[2]["content"])
        steps = msgs[1]["content"].count("\nYou: ")
        check = check_report(report, steps)
        assert check.valid and check.perfect == (row["meta"]["outcome"] == "success")
        assert check.pivot in (None, 0) and report["trajectory_outcome"] == row["meta"]["outcome"]
        assert ("the final answer is correct" in msgs[1]["content"]) == (row["meta"]["outcome"] != "failure")
    sft = {p.question: p for p in make_problems(80, 4, "sft")}
    for row in retry:
        msgs = row["messages"]
        assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool", "assistant"]
        assert msgs[0]["content"].startswith("# Previous Attempt Analysis & Guidance\n")
        p = sft[msgs[1]["content"]]
        assert parse_tool_call(msgs[2]["content"]).code in [q.code for q in p.right]
        assert msgs[4]["content"] == f"The answer is \\boxed{{{p.answer}}}." and row["meta"]["outcome"] != "success"
    _r3l_transcripts_fit_the_warm_up(path)


def _r3l_transcripts_fit_the_warm_up(path):
    """Issue 18: every reflection used to be longer than the warm-up's max_len and was skipped, unseen."""
    from transformers import AutoTokenizer

    from models.chat import ChatFormat
    from models.config import WarmupConfig
    from models.sft import check_lengths, length_census
    from tasks.data.synthetic import read_sft_corpus, read_sft_types

    transcripts, kinds = read_sft_corpus(path), read_sft_types(path)
    chat = ChatFormat(AutoTokenizer.from_pretrained("assets/tiny-warm"), None)
    max_len = WarmupConfig().max_len
    census = length_census(transcripts, chat, max_len, kinds)
    assert set(census) == {"solve", "reflection", "retry"} and census["reflection"]["n"] >= 25
    fit = {k: 1 - r["too_long"] / r["n"] for k, r in census.items()}
    assert fit["solve"] == 1.0 and fit["retry"] >= 0.9 and fit["reflection"] >= 0.7, census
    check_lengths(census, max_len)
    outcomes = {json.loads(line)["meta"].get("outcome") for line, msgs, kind in
                zip(path.read_text().splitlines(), transcripts, kinds)
                if kind == "reflection" and length_census([msgs], chat, max_len)["all"]["too_long"] == 0}
    assert outcomes == {"success", "success_but_inefficient", "failure"}, "a reflection outcome that never fits"


def test_answers_do_not_depend_on_who_owns_print(monkeypatch):
    """Prefect's log_prints replaces builtins.print; drawing problems must not notice."""
    import builtins

    monkeypatch.setattr(builtins, "print", lambda *a, **k: None)
    assert run_program("print(a % b)", "a = 62384\nb = 6509") == "3803"
    assert len(make_problems(20, 0, "eval")) == 20
