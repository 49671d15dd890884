"""Math rewards, the strict rule, DAPO overlong shaping, the registry and grader errors.

Every math case below was checked by hand: ``expected`` is what a careful human grader says
about the response's final ``\\boxed{}`` answer against the ground truth.
Run: ``pytest tests/test_rewards.py``.
"""

from __future__ import annotations

import pytest

from tasks.rewards import registry as rewards
from tasks.rewards.registry import (
    GraderError,
    RewardConfig,
    RewardResult,
    compute_reward,
    grader_for,
    last_boxed,
    overlong_penalty,
    pass_at_k,
    pass_at_k_by_source,
    register_reward,
    unbox,
)

# (case id, final boxed answer written by the model, ground truth, equivalent?)
MATH_CASES = [
    ("int", "42", "42", True),
    ("int-wrong", "41", "42", False),
    ("int-neg", "-7", "-7", True),
    ("int-sign", "7", "-7", False),
    ("int-space", " 42 ", "42", True),
    ("thousands-sep", "1,000", "1000", True),
    ("frac-decimal", "\\frac{1}{2}", "0.5", True),
    ("decimal-frac", "0.5", "\\frac{1}{2}", True),
    ("dfrac", "\\dfrac{3}{4}", "\\frac{3}{4}", True),
    ("tfrac", "\\tfrac{3}{4}", "3/4", True),
    ("frac-slash", "3/4", "\\frac{3}{4}", True),
    ("frac-unreduced", "\\frac{2}{4}", "\\frac{1}{2}", True),
    ("frac-wrong", "\\frac{1}{3}", "\\frac{1}{2}", False),
    ("frac-neg", "-\\frac{1}{2}", "\\frac{-1}{2}", True),
    ("frac-shorthand", "\\frac12", "\\frac{1}{2}", True),
    ("mixed-decimal", "2.50", "2.5", True),
    ("decimal-wrong", "2.51", "2.5", False),
    ("sqrt-simplify", "2\\sqrt{2}", "\\sqrt{8}", True),
    ("sqrt-wrong", "\\sqrt{3}", "\\sqrt{2}", False),
    ("sqrt-rationalised", "\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}", True),
    ("cbrt", "\\sqrt[3]{8}", "2", True),
    ("radical-sum", "3+2\\sqrt{2}", "(1+\\sqrt{2})^2", True),
    ("pi-mult", "2\\pi", "2\\pi", True),
    ("pi-decimal", "6.28", "2\\pi", False),
    ("pi-frac", "\\frac{\\pi}{2}", "\\pi/2", True),
    ("power", "2^{10}", "1024", True),
    ("expr-expand", "x^2+2x+1", "(x+1)^2", True),
    ("expr-wrong", "x^2+1", "(x+1)^2", False),
    ("interval-left-right", "\\left[1, 3\\right)", "[1,3)", True),
    ("interval-open-closed", "[1,3]", "(1,3)", False),
    ("interval-inf", "(-\\infty, 2]", "(-\\infty,2]", True),
    ("interval-union", "(-\\infty,0)\\cup(1,\\infty)", "(-\\infty, 0) \\cup (1, \\infty)", True),
    ("set-order", "\\{2,1\\}", "\\{1,2\\}", True),
    ("set-wrong", "\\{1,3\\}", "\\{1,2\\}", False),
    ("set-vs-list", "1, 2", "\\{1,2\\}", True),
    ("tuple", "(1,2)", "(1,2)", True),
    ("tuple-order", "(2,1)", "(1,2)", False),
    ("units-text", "5\\text{ cm}", "5", True),
    ("units-mbox", "12\\mbox{ meters}", "12", True),
    ("units-wrong-value", "6\\text{ cm}", "5", False),
    ("degrees", "30^\\circ", "30", True),
    ("percent", "10\\%", "10", True),
    ("dollar", "\\$25", "25", True),
    ("text-wrapper", "\\text{42}", "42", True),
    ("equation-lhs", "x=2", "2", True),
    ("equation-lhs-wrong", "x=3", "2", False),
    ("sci-notation", "1.5\\times10^{3}", "1500", True),
    ("matrix-free-vector", "\\begin{pmatrix}1\\\\2\\end{pmatrix}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}", True),
    ("log", "\\log_2 8", "3", True),
    ("trig", "\\sin\\frac{\\pi}{6}", "\\frac{1}{2}", True),
    ("infinity", "\\infty", "\\infty", True),
    ("nested-braces", "\\frac{\\sqrt{3}}{\\sqrt{4}}", "\\frac{\\sqrt{3}}{2}", True),
    ("big-int", "123456789", "123456788", False),
]


def _response(answer: str) -> str:
    return f"Let me compute this.\n<tool_call>...</tool_call>\nThe result checks out, so the answer is \\boxed{{{answer}}}."


@pytest.mark.parametrize("case_id,answer,gold,expected", MATH_CASES, ids=[c[0] for c in MATH_CASES])
def test_math_verify_cases(case_id, answer, gold, expected):
    result = compute_reward("aime2024", _response(answer), gold)
    assert result.correct is expected, (answer, gold)
    assert result.reward == (1.0 if expected else 0.0)
    assert result.metrics == {"acc": float(expected), "has_answer": 1.0}


def test_math_case_count():
    assert len(MATH_CASES) >= 50
    assert sum(not c[3] for c in MATH_CASES) >= 12


def test_synthetic_uses_last_boxed_answer():
    text = "First guess \\boxed{12}. Tool says 13.\nSo the answer is \\boxed{13}"
    result = compute_reward("synthetic/arith", text, "13")
    assert result == RewardResult(1.0, True, {"acc": 1.0, "has_answer": 1.0}, "13")
    assert not compute_reward("synthetic/algo", text, "12").correct


def test_missing_box_scores_incorrect_with_has_answer_zero():
    result = compute_reward("synthetic/arith", "The answer is 13.", "13")
    assert result.correct is False and result.reward == 0.0
    assert result.metrics["has_answer"] == 0.0 and result.extracted is None


def test_incorrect_reward_configurable():
    cfg = RewardConfig(incorrect_reward=-1.0)
    assert compute_reward("math", "\\boxed{3}", "4", cfg=cfg).reward == -1.0


STRICT = RewardConfig(math_mode="strict")


def test_strict_exact_string_match():
    assert compute_reward("aime2025", "thus \\boxed{0.5}", "0.5", cfg=STRICT).correct
    assert not compute_reward("aime2025", "thus \\boxed{\\frac{1}{2}}", "0.5", cfg=STRICT).correct
    assert not compute_reward("aime2025", "thus \\boxed{ 0.5}", "0.5", cfg=STRICT).correct


def test_strict_only_looks_at_final_100_chars():
    text = "\\boxed{7}" + "x" * 100
    assert not compute_reward("aime2025", text, "7", cfg=STRICT).correct
    assert compute_reward("aime2025", text, "7").correct
    near_end = "y" * 500 + "\\boxed{7}" + "z" * 80
    assert compute_reward("aime2025", near_end, "7", cfg=STRICT).correct


def test_strict_box_cut_by_window_is_missing():
    text = "\\boxed{123456}" + "w" * 92
    assert compute_reward("aime2025", text, "123456", cfg=STRICT).extracted is None


@pytest.mark.parametrize(
    "text,boxed,inner",
    [
        ("a \\boxed{1} b \\boxed{2}", "\\boxed{2}", "2"),
        ("\\boxed{\\frac{1}{2}}", "\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\fbox{9}", "\\fbox{9}", "9"),
        ("so \\boxed 5$", "\\boxed 5", "5"),
        ("\\boxed{unclosed", None, None),
        ("no box", None, None),
    ],
)
def test_last_boxed_and_unbox(text, boxed, inner):
    assert last_boxed(text) == boxed
    assert unbox(boxed) == inner


@pytest.mark.parametrize(
    "length,expected",
    [(0, 0.0), (80, 0.0), (81, -0.05), (90, -0.5), (100, -1.0), (150, -1.0)],
)
def test_overlong_penalty_dapo(length, expected):
    assert overlong_penalty(length, max_len=100, buffer_len=20, penalty_factor=1.0) == pytest.approx(expected)


def test_overlong_penalty_factor_and_disabled():
    assert overlong_penalty(95, 100, 10, penalty_factor=0.5) == pytest.approx(-0.25)
    assert overlong_penalty(100, 100, 0) == 0.0
    with pytest.raises(ValueError, match="buffer_len"):
        overlong_penalty(10, 100, 200)


def test_registry_patterns_case_insensitive_and_default():
    assert grader_for("synthetic/arith")[0] == "synthetic/*"
    assert grader_for("AIME2024")[0] == "aime*"
    assert grader_for("gpqa_diamond")[0] == "gpqa*"
    assert grader_for("something_else")[0] == "*"


def test_grader_crash_raises_grader_error_with_row_id(monkeypatch):
    grader_for("x")
    monkeypatch.setattr(rewards, "_REGISTRY", list(rewards._REGISTRY))

    @register_reward("crashy/*")
    def crashy(solution_str, ground_truth, extra_info, *, sandbox, cfg):
        raise KeyError("boom")

    with pytest.raises(GraderError) as info:
        compute_reward("crashy/x", "\\boxed{1}", "1", {"index": 17})
    err = info.value
    assert err.data_source == "crashy/x" and err.row_id == "17" and not err.infra
    assert "KeyError" in str(err) and "row='17'" in str(err)


def test_reward_config_is_strict_and_documented():
    with pytest.raises(Exception, match="extra"):
        RewardConfig(nonsense=1)
    fields = RewardConfig.model_fields
    assert all(f.description for f in fields.values()), [k for k, f in fields.items() if not f.description]
    assert RewardConfig().math_mode == "math_verify"


# (case id, response text, ground truth, expected correct)
CHOICE_CASES = [
    ("boxed-letter", "So the particle is the photon.\n\\boxed{B}", "B", True),
    ("boxed-wrong", "\\boxed{C}", "B", False),
    ("boxed-paren", "Final: \\boxed{(B)}", "B", True),
    ("boxed-text", "\\boxed{\\text{B}}", "B", True),
    ("boxed-textbf", "\\boxed{\\textbf{D}}", "D", True),
    ("boxed-lowercase", "\\boxed{b}", "B", True),
    ("boxed-letter-paren-text", "\\boxed{B) photon}", "B", True),
    ("boxed-letter-dot", "\\boxed{A.}", "A", True),
    ("boxed-text-only", "\\boxed{photon}", "B", False),
    ("boxed-number", "\\boxed{42}", "B", False),
    ("last-box-wins", "Maybe \\boxed{A}... no, it is \\boxed{C}", "C", True),
    ("last-box-wins-wrong", "It is \\boxed{C}. Hmm, actually \\boxed{A}", "C", False),
    ("phrase-answer-is", "After checking, the answer is (D).", "D", True),
    ("phrase-answer-colon", "Answer: C", "C", True),
    ("phrase-bold", "The correct option is **A**", "A", True),
    ("phrase-final-answer", "Final answer: (B)", "B", True),
    ("phrase-last-wins", "Answer: A was my first thought. Final answer: (B)", "B", True),
    ("no-answer", "I am not sure which one is right.", "B", False),
    ("box-beats-phrase", "The answer is (A). On reflection \\boxed{B}", "B", True),
    ("gold-paren", "\\boxed{C}", "(C)", True),
    ("gold-boxed", "\\boxed{C}", "\\boxed{C}", True),
    ("empty-box", "\\boxed{}", "A", False),
]


@pytest.mark.parametrize("case_id,text,gold,expected", CHOICE_CASES, ids=[c[0] for c in CHOICE_CASES])
def test_choice_cases(case_id, text, gold, expected):
    result = compute_reward("gpqa_diamond", text, gold)
    assert result.correct is expected, (text, result.extracted)
    assert result.reward == (1.0 if expected else 0.0)


def test_choice_case_count_and_strict_boxed_option():
    assert len(CHOICE_CASES) >= 20
    cfg = RewardConfig(mc_allow_unboxed=False)
    assert not compute_reward("gpqa_diamond", "the answer is (D).", "D", cfg=cfg).correct
    assert compute_reward("gpqa_diamond", "\\boxed{D}", "D", cfg=cfg).correct


def test_choice_bad_ground_truth_is_a_grader_error():
    with pytest.raises(GraderError, match="option letter"):
        compute_reward("gpqa_diamond", "\\boxed{A}", "photon", {"id": "q1"})


@pytest.mark.parametrize("n,c,k,expected", [(4, 0, 1, 0.0), (4, 4, 2, 1.0), (4, 1, 1, 0.25), (4, 1, 2, 0.5), (5, 2, 3, 0.9)])
def test_pass_at_k(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected)


def test_pass_at_k_by_source():
    records = [("aime", "q1", True), ("aime", "q1", False), ("aime", "q2", False), ("aime", "q2", False),
               ("gpqa", "g1", True)]
    got = pass_at_k_by_source(records, ks=(1, 2))
    assert got == pytest.approx({"aime/pass@1": 0.25, "aime/pass@2": 0.5, "gpqa/pass@1": 1.0})
    with pytest.raises(ValueError, match="pass_at_k"):
        pass_at_k(2, 3, 1)


def test_strict_mode_grades_multiple_choice_like_the_reference():
    assert compute_reward("gpqa_diamond", "so \\boxed{B}", "B", cfg=STRICT).correct
    assert not compute_reward("gpqa_diamond", "so \\boxed{(B)}", "B", cfg=STRICT).correct
    assert not compute_reward("gpqa_diamond", "the answer is (B)", "B", cfg=STRICT).correct
