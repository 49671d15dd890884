"""The warm-up gate: its four rates on hand-made trajectories, the checks, the card section, a real run."""

from __future__ import annotations

import json
from types import SimpleNamespace as NS

import pytest

from tasks.data.synthetic import KINDS
from tasks.training.gate import (
    GateConfig,
    card_section,
    combine_reports,
    gate_figures,
    trajectory_facts,
    update_card,
)


def _row(kind, call=True, failed=False, failure=None, recovered=False, correct=False):
    return {"kind": kind, "has_call": call, "first_failed": failed, "failure": failure, "recovered": recovered,
            "correct": correct}


ROWS = [
    _row("gcd", correct=True), _row("gcd"), _row("mod", failed=True, failure="NameError", recovered=True, correct=True),
    _row("mod", failed=True, failure="NameError", recovered=True), _row("mod", failed=True, failure="SyntaxError"),
    _row("gcd", call=False), _row("mod", correct=True), _row("mod", correct=True),
]


def test_rates_and_checks_by_hand():
    rep = gate_figures(ROWS, GateConfig())
    o = rep["overall"]
    # 7 trajectories call a tool; 3 first calls fail; 2 of them recover; clean: 3 of 4 right; recovered: 1 of 2
    assert o["first_call_failure"]["rate"] == pytest.approx(3 / 7) and o["first_call_failure"]["n"] == 7
    assert o["tool_call"]["rate"] == pytest.approx(7 / 8) and o["tool_call"]["se"] == pytest.approx((7 / 64 / 8) ** 0.5)
    assert o["recovery"]["rate"] == pytest.approx(2 / 3)
    assert o["p_correct_clean"]["rate"] == pytest.approx(0.75) and o["p_correct_clean"]["n"] == 4
    assert o["p_correct_recovered"]["rate"] == pytest.approx(0.5)
    assert o["p_correct_clean"]["se"] == pytest.approx((0.75 * 0.25 / 4) ** 0.5)
    assert rep["gap"] == pytest.approx(-0.25) and o["accuracy"]["rate"] == pytest.approx(4 / 8)
    assert rep["checks"] == {"first_call_failure": True, "recovery": False, "p_correct_clean": False, "gap": False}
    assert not rep["passed"]
    assert rep["by_kind"]["mod"]["first_call_failure"]["rate"] == pytest.approx(3 / 5)
    assert rep["by_failure"]["NameError"]["count"] == 2 and rep["by_failure"]["NameError"]["recovery"]["rate"] == 1.0
    assert list(rep["by_failure"]) == ["NameError", "SyntaxError"]
    loose = GateConfig(min_recovery=0.6, p_correct_clean=(0.4, 0.8), max_gap=0.25)
    assert gate_figures(ROWS, loose)["passed"]


def test_facts_of_a_trajectory():
    fail = NS(result=NS(ok=False, error_kind="NameError"), position=0)
    fixed = NS(result=NS(ok=True, error_kind=None), position=0)
    item = NS(extra_info={"kind": "gcd"}, data_source="synthetic/numbers")
    recovered = NS(executions=[fail, fixed], events=[NS(kind="triggered", position=0), NS(kind="recovered", position=0)],
                   item=item)
    assert trajectory_facts(recovered, True) == {"kind": "gcd", "has_call": True, "first_failed": True,
                                                 "failure": "NameError", "recovered": True, "correct": True}
    lost = NS(executions=[fail], events=[NS(kind="triggered", position=0), NS(kind="exhausted", position=0)], item=item)
    assert trajectory_facts(lost, False)["recovered"] is False
    silent = NS(executions=[], events=[], item=NS(extra_info={}, data_source="synthetic/arith"))
    assert trajectory_facts(silent, False) == {"kind": "synthetic/arith", "has_call": False, "first_failed": False,
                                               "failure": None, "recovered": False, "correct": False}


def test_card_section_is_replaced_not_appended(tmp_path):
    rep = gate_figures(ROWS, GateConfig())
    rep["model"] = "m"
    card = tmp_path / "MODEL_CARD.md"
    card.write_text("# model\n\ntext\n")
    update_card(card, rep)
    update_card(card, rep)
    text = card.read_text()
    assert text.count("## Warm-up gate") == 1 and text.startswith("# model\n\ntext\n")
    assert "does not pass" in card_section(rep) and "| recovery | 66.7 % ± 27.2 (n = 3) |" in text
    assert "| tool-call rate | 87.5 % ± 11.7 (n = 8) |" in text


@pytest.mark.slow
def test_gate_on_a_real_model(tmp_path):
    """The committed warm-up model through the real rollout (continuous batching, local sandbox)."""
    from models.config import EngineConfig
    from sandbox.config import SandboxConfig
    from tasks.rollout.config import RolloutConfig
    from tasks.training.gate import run_gate

    cfg = GateConfig(n_prompts=6, samples=2, seed=1)
    rep = run_gate("assets/tiny-warm", cfg, RolloutConfig(max_new_tokens=192, max_response_tokens=512),
                   EngineConfig(), SandboxConfig(backend="local", workers=1), progress=False)
    o = rep["overall"]
    assert o["trajectories"] == 12 and o["first_call_failure"]["n"] + o["no_call"]["rate"] * 12 == pytest.approx(12)
    assert set(rep["by_kind"]) <= set(KINDS) and sum(r["trajectories"] for r in rep["by_kind"].values()) == 12
    assert json.loads(json.dumps(rep)) == rep, "the report is plain JSON"


def _part(start: int, end: int, rows: list[dict], **bar) -> dict:
    cfg = GateConfig(start=start, n_prompts=end, samples=1, **bar)
    return {**gate_figures(rows, cfg), "model": "m", "rollout_s": 1.5, "rows": rows}


def test_parts_on_adjacent_prompts_combine_into_the_figures_of_all_their_rows():
    first, second = _part(0, 5, ROWS[:5]), _part(5, 8, ROWS[5:])
    both = combine_reports([second, first])
    assert both["overall"] == gate_figures(ROWS, GateConfig())["overall"]
    # 8 rows: 3 first calls of 7 fail (from 2 of 5 and 1 of 2), 2 recover, P(correct | clean) 3 of 4
    assert both["overall"]["first_call_failure"]["rate"] == pytest.approx(3 / 7)
    assert both["overall"]["p_correct_clean"]["rate"] == pytest.approx(3 / 4)
    assert (both["bar"]["start"], both["bar"]["n_prompts"], both["parts"], both["rollout_s"]) == (0, 8, 2, 3.0)
    assert "5 `eval` prompts × 1" in card_section(first) and "8 `eval` prompts × 1" in card_section(both)
    assert "3 `eval` prompts × 1" in card_section(second)


def test_parts_that_do_not_fit_together_are_refused():
    with pytest.raises(ValueError, match="adjacent prompt ranges"):
        combine_reports([_part(0, 4, ROWS[:4]), _part(5, 8, ROWS[5:])])
    with pytest.raises(ValueError, match="differ in their bar or sampling"):
        combine_reports([_part(0, 5, ROWS[:5]), _part(5, 8, ROWS[5:], seed=1)])
    with pytest.raises(ValueError, match="has no rows"):
        combine_reports([{k: v for k, v in _part(0, 5, ROWS[:5]).items() if k != "rows"}])
    with pytest.raises(ValueError, match="gate.start"):
        GateConfig(start=5, n_prompts=5)


@pytest.mark.slow
def test_gate_command_on_a_compacted_adapter_in_two_parts(warm_model_dir, tmp_path):
    """``cleaner warmup-gate`` on a committed-style LoRA adapter (float16, no tokenizer files, pointing at
    another base): linked to ``model.base``, the tokenizer is the base's; two parts combine into one report."""
    from typer.testing import CliRunner

    from flows.cli import app
    from models.config import LoraSpec
    from models.lora import add_lora, compact_adapter, load_policy

    adapter = tmp_path / "adapter"
    add_lora(load_policy(warm_model_dir), LoraSpec(r=2, target_modules=["q_proj"])).save_pretrained(adapter)
    compact_adapter(adapter)
    conf = json.loads((adapter / "adapter_config.json").read_text())
    (adapter / "adapter_config.json").write_text(json.dumps({**conf, "base_model_name_or_path": "/elsewhere"}))
    sets = [f"model.base={warm_model_dir}", f"output_dir={tmp_path / 'runs'}", "gate.samples=1",
            "sandbox.backend=local", "rollout.max_new_tokens=64", f"tracking.mlflow_uri=sqlite:///{tmp_path / 'm.db'}",
            f"tracking.artifact_root={tmp_path / 'art'}", f"tracking.duckdb_path={tmp_path / 'c.duckdb'}"]
    args = ["warmup-gate", "--model", str(adapter), *(a for s in sets for a in ("--set", s))]
    runner = CliRunner()
    for span in (["gate.start=0", "gate.n_prompts=2"], ["gate.start=2", "gate.n_prompts=3"]):
        res = runner.invoke(app, [*args, *(a for s in span for a in ("--set", s))])
        assert res.exit_code == 0, res.output
    parts = [tmp_path / "runs" / "gate" / name for name in ("adapter-to2.json", "adapter-from2-to3.json")]
    reports = [json.loads(p.read_text()) for p in parts]
    assert [len(r["rows"]) for r in reports] == [2, 1] and reports[0]["model"] == str(adapter)
    assert [r["prompt"] for r in reports[1]["rows"]] == ["gate/2"]
    res = runner.invoke(app, [*args, "--write", *(a for p in parts for a in ("--combine", str(p)))])
    assert res.exit_code == 0, res.output
    written = json.loads((adapter / "gate.json").read_text())
    assert written["overall"]["trajectories"] == 3 and written["bar"]["n_prompts"] == 3
    assert "3 held-out trajectories (3 `eval` prompts × 1" in (adapter / "MODEL_CARD.md").read_text()
