"""R3L texts: trajectory log layout, reflection/guided-retry messages, report parsing and the validation table."""

from __future__ import annotations

import json

import pytest

from tasks.r3l import (
    GUIDANCE_HEADER,
    GUIDANCE_TEMPLATE_COMPACT,
    REFLECTION_PROMPT,
    REFLECTION_PROMPT_COMPACT,
    check_report,
    count_steps,
    distill_messages,
    format_trajectory,
    guidance_text,
    guided_retry_messages,
    outcome_feedback,
    parse_reflection,
    pivot_cut,
    read_reflection,
    reflection_messages,
    reflection_request,
    validate_reflect_report,
)

ATTEMPT = [
    {"role": "system", "content": "Use the tool."},
    {"role": "user", "content": "What is 6*7?"},
    {"role": "assistant", "content": "Compute it. <tool_call>A</tool_call>"},
    {"role": "tool", "content": "NameError: name 'prnt' is not defined\n"},
    {"role": "assistant", "content": "<tool_call>B</tool_call>"},
    {"role": "tool", "content": "42"},
    {"role": "assistant", "content": "\\boxed{41}"},
]
REPORT = {"trajectory_summary": "s", "root_cause_analysis": "Why? Because.", "trajectory_outcome": "failure",
          "improvement_suggestion": "copy the printed number", "retry_from_step": 2}


def test_format_trajectory_layout_matches_the_reference():
    log = format_trajectory([*ATTEMPT, {"role": "user", "content": "Feedback: wrong"}])
    assert log == (
        "**System Rules & Context:**\nUse the tool.\n" + "=" * 30 + "\n"
        "\n**Step 0**\n  - User Observation/Feedback:\n    What is 6*7?\n"
        "  - Assistant Thought & Action:\n    Compute it. <tool_call>A</tool_call>\n"
        "\n**Step 1**\n  - User Observation/Feedback:\n    NameError: name 'prnt' is not defined\n"
        "  - Assistant Thought & Action:\n    <tool_call>B</tool_call>\n"
        "\n**Step 2**\n  - User Observation/Feedback:\n    42\n"
        "  - Assistant Thought & Action:\n    \\boxed{41}\n"
        "\n**Step 3**\n  - User Observation/Feedback:\n    Feedback: wrong")
    assert count_steps(ATTEMPT) == 3


def test_compact_log_layout_and_request():
    fb = outcome_feedback(0.0)
    log = format_trajectory([*ATTEMPT, {"role": "user", "content": fb}], "compact")
    assert log == ("System: Use the tool.\n"
                   "Step 0\nUser: What is 6*7?\nYou: Compute it. <tool_call>A</tool_call>\n"
                   "Step 1\nTool: NameError: name 'prnt' is not defined\nYou: <tool_call>B</tool_call>\n"
                   "Step 2\nTool: 42\nYou: \\boxed{41}\n"
                   "Step 3\nUser: " + fb)
    req = reflection_request(ATTEMPT, REFLECTION_PROMPT_COMPACT, fb, "compact")
    assert req == [{"role": "system", "content": REFLECTION_PROMPT_COMPACT}, {"role": "user", "content": log}]
    full = reflection_messages(ATTEMPT, REFLECTION_PROMPT_COMPACT, REPORT, fb, style="compact")
    assert full == [*req, {"role": "assistant", "content": json.dumps(REPORT)}]
    assert len(log) < len(format_trajectory([*ATTEMPT, {"role": "user", "content": fb}])) / 2


def test_format_trajectory_rejects_unknown_roles_and_styles():
    for style in ("full", "compact"):
        with pytest.raises(ValueError, match="role 'function'"):
            format_trajectory([{"role": "function", "content": "x"}], style)
    with pytest.raises(ValueError, match="log style 'short'.*full.*compact"):
        format_trajectory(ATTEMPT, "short")


def test_reflection_request_and_transcript():
    fb = outcome_feedback(0.0)
    assert fb == "Feedback: the final answer is wrong (reward 0/1)."
    assert outcome_feedback(1.0) == "Feedback: the final answer is correct (reward 1/1)."
    assert outcome_feedback(0.0, answered=False).startswith("Feedback: no final answer")
    req = reflection_request(ATTEMPT, REFLECTION_PROMPT, fb)
    assert [m["role"] for m in req] == ["system", "user"] and req[0]["content"] == REFLECTION_PROMPT
    user = req[1]["content"]
    assert user.startswith("Here is last attempt trajectory log: \n\n**System Rules & Context:**")
    assert user.endswith("    " + fb + "\n\nPlease output in the specified JSON format.")
    full = reflection_messages(ATTEMPT, REFLECTION_PROMPT_COMPACT, REPORT, fb)
    assert full[:2] == reflection_request(ATTEMPT, REFLECTION_PROMPT_COMPACT, fb)
    assert full[2] == {"role": "assistant", "content": json.dumps(REPORT)}
    assert json.loads(full[2]["content"]) == REPORT


def test_guidance_text_wraps_the_indented_report():
    text = guidance_text(REPORT)
    assert text.startswith("Your previous attempt encountered issues. Below is a reflection based on user and "
                           "environment feedback:\n\n{\n  \"trajectory_summary\": \"s\",")
    assert text.endswith("}\n\nApply the lessons learned from this reflection to avoid repeating the same mistakes. "
                         "Do not mention or reference this guidance in your response.")
    assert json.dumps(REPORT, indent=2) in text


def test_pivot_cut_and_guided_retry_at_a_later_step():
    assert pivot_cut(ATTEMPT, 0) == 2 and pivot_cut(ATTEMPT, 1) == 4 and pivot_cut(ATTEMPT, 2) == 6
    assert pivot_cut(ATTEMPT[:4], 1) == 4, "a prefix that ends at the pivot is the whole prefix"
    with pytest.raises(ValueError, match="pivot 4 is out of range"):
        pivot_cut(ATTEMPT, 4)
    cont = [{"role": "assistant", "content": "\\boxed{42}"}]
    retry = guided_retry_messages(ATTEMPT, REPORT, 2, cont)
    assert retry[:6] == ATTEMPT[:6]
    assert retry[6] == {"role": "system", "content": GUIDANCE_HEADER + guidance_text(REPORT)}
    assert retry[7:] == cont
    assert distill_messages(ATTEMPT, 2, cont) == [*ATTEMPT[:6], *cont]


def test_guided_retry_from_step_zero_extends_the_system_prompt():
    cont = [{"role": "assistant", "content": "x"}]
    retry = guided_retry_messages(ATTEMPT, REPORT, 0, cont, indent=None)
    assert retry[0] == {"role": "system",
                        "content": "Use the tool.\n\n" + GUIDANCE_HEADER + guidance_text(REPORT, indent=None)}
    assert retry[1:] == [ATTEMPT[1], *cont]
    bare = guided_retry_messages(ATTEMPT[1:], REPORT, 0, cont)
    assert bare[0] == {"role": "system", "content": GUIDANCE_HEADER + guidance_text(REPORT)}
    assert distill_messages(ATTEMPT, 0, cont) == [*ATTEMPT[:2], *cont]


@pytest.mark.parametrize("text, expected", [
    ('Sure. ```json\n{"a": 1}\n``` done', {"a": 1}),
    ('{"a": {"b": 2}} trailing } brace', None),
    ("no json at all", None),
    ("[1, 2]", [1, 2]),
    ("}{", None),
    ("", None),
])
def test_parse_reflection(text, expected):
    report, err = parse_reflection(text)
    assert report == expected
    assert (err is None) == (expected is not None)


def _r(**kw):
    return {**REPORT, **kw}


@pytest.mark.parametrize("report, steps, valid, perfect, reason, pivot", [
    (None, 3, False, False, "not_object", None),
    ([REPORT], 3, False, False, "not_object", None),
    ({k: v for k, v in REPORT.items() if k != "root_cause_analysis"}, 3, False, False, "missing_keys", None),
    ({k: v for k, v in REPORT.items() if k != "trajectory_outcome"}, 3, False, False, "missing_keys", None),
    (_r(trajectory_outcome="success", improvement_suggestion=None, retry_from_step=None), 3, True, True, "perfect", None),
    (_r(trajectory_outcome="success", retry_from_step=99), 3, True, True, "perfect", None),
    (_r(trajectory_outcome="Success"), 3, False, False, "bad_outcome", None),
    (_r(trajectory_outcome="partial"), 3, False, False, "bad_outcome", None),
    (_r(improvement_suggestion=None), 3, False, False, "missing_guidance", None),
    ({k: v for k, v in REPORT.items() if k != "retry_from_step"}, 3, False, False, "missing_guidance", None),
    (_r(retry_from_step=None), 3, False, False, "missing_guidance", None),
    (_r(retry_from_step="two"), 3, False, False, "pivot_not_int", None),
    (_r(retry_from_step=True), 3, False, False, "pivot_not_int", None),
    (_r(retry_from_step=1.5), 3, False, False, "pivot_not_int", None),
    (_r(retry_from_step=[1]), 3, False, False, "pivot_not_int", None),
    (_r(retry_from_step=-1), 3, False, False, "pivot_out_of_range", None),
    (_r(retry_from_step=3), 3, False, False, "pivot_out_of_range", None),
    (_r(retry_from_step=0), 0, False, False, "pivot_out_of_range", None),
    (_r(retry_from_step=2), 3, True, False, "ok", 2),
    (_r(retry_from_step="1"), 3, True, False, "ok", 1),
    (_r(retry_from_step=2.0), 3, True, False, "ok", 2),
    (_r(retry_from_step=0, trajectory_outcome="success_but_inefficient"), 1, True, False, "ok", 0),
])
def test_validation_table(report, steps, valid, perfect, reason, pivot):
    check = check_report(report, steps)
    assert (check.valid, check.perfect, check.reason, check.pivot) == (valid, perfect, reason, pivot)
    assert validate_reflect_report(report, steps) == (valid, perfect)


def test_read_reflection_never_raises_on_garbage():
    assert read_reflection("{not json}", 3)[1].reason == "not_json"
    assert read_reflection("x" * 10 + "{" * 5000 + "}" * 5000, 3)[1].valid is False
    report, check = read_reflection("Report: " + json.dumps(REPORT), 3)
    assert report == REPORT and check.reason == "ok" and check.pivot == 2


def test_compact_guidance_template():
    text = guidance_text(REPORT, GUIDANCE_TEMPLATE_COMPACT, indent=None)
    assert text == f"A reflection on your previous attempt:\n{json.dumps(REPORT)}\nApply it and do not mention it."
    retry = guided_retry_messages(ATTEMPT, REPORT, 1, [], GUIDANCE_TEMPLATE_COMPACT, None)
    assert retry[-1]["content"] == GUIDANCE_HEADER + text
