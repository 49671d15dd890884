"""R3L transcripts for the warm-up corpus: reflections on attempts, and guided retries.

The generator knows what went wrong in each attempt it wrote, so it can write the diagnosis a
good reflector would give (``report_for``):

=====================================  ==========================  ===================================
attempt                                outcome                     root cause, pivot
=====================================  ==========================  ===================================
right program, first call ran          ``success``                 none (null guidance and pivot)
right program, a mistake then the fix  ``success_but_inefficient`` the planted mistake, step 0
wrong program (with or without slip)   ``failure``                 the confusable computation, step 0
=====================================  ==========================  ===================================

(every mistake and every program choice sits in the first assistant turn, so the pivot is 0).
``reflection_transcript`` is the R3L reflection call (``tasks.r3l.reflection_messages`` with the
compact prompt and the compact log; the attempt as the R3L driver formats it, with the outcome feedback) plus the
report as the assistant turn; ``retry_transcript`` is a guided retry from the pivot
(``tasks.r3l.guided_retry_messages``, compact guidance) that solves the problem with a right
program. RL runs of the tiny model in R3L mode must use the same variants
(``rollout.r3l.reflection_prompt=compact``, ``log_style=compact``, ``guidance_template=compact``,
``guidance_indent=null``: ``configs/tiny.yaml``). With the committed tokenizer a reflection transcript is
~250-500 tokens (``tests/test_synthetic.py`` pins that they fit the warm-up's ``max_len``).
"""

from __future__ import annotations

import random

from models.chat import render_call
from tasks.r3l import (
    GUIDANCE_TEMPLATE_COMPACT,
    REFLECTION_PROMPT_COMPACT,
    guided_retry_messages,
    outcome_feedback,
    reflection_messages,
)

GOALS = {
    "floordiv": "the quotient rounded down (//)", "mod": "the remainder (%)",
    "range_incl": "a sum that includes both ends, so range needs the end + 1",
    "range_excl": "a sum that stops before the end, so range ends at the end itself",
    "gcd": "the greatest common divisor", "lcm": "the least common multiple",
    "digit_sum": "the sum of the digits", "digit_count": "the number of digits",
    "kth_smallest": "the k-th smallest, at index k - 1 of the increasing order",
    "kth_largest": "the k-th largest, at index k - 1 of the decreasing order",
    "sum_mod": "the remainder of the sum (%)", "max_digitsum": "the element whose digit sum is largest",
    "fib": "F(n) with F(0) = 0, which the pair loop reaches after n steps",
    "arith_term": "term n with term 1 = s, so s plus (n - 1) steps of d",
}
"""What each kind asks for, in the words a reflection uses to name the right computation."""


def report_for(plan, messages: list[dict]) -> dict:
    """The report a correct reflection gives on the attempt ``messages`` that ``plan`` produced.

    Short on purpose (the tiny tokenizer spends ~1.7 characters per token and the keys alone cost
    ~90 tokens): a reflection transcript must fit the warm-up's ``max_len``."""
    p, answer = plan.problem, messages[-2]["content"]
    if plan.correct and plan.mistake is None:
        return {"trajectory_summary": f"Answered {answer}: right.", "root_cause_analysis": None,
                "trajectory_outcome": "success", "improvement_suggestion": None, "retry_from_step": None}
    if plan.correct:
        return {"trajectory_summary": f"Step 0 failed, step 1 fixed it. Answered {answer}: right.",
                "root_cause_analysis": f"Why did step 0 fail? {plan.reason}",
                "trajectory_outcome": "success_but_inefficient",
                "improvement_suggestion": f"Check the code first: {plan.reason}", "retry_from_step": 0}
    right = p.right[0]
    return {"trajectory_summary": f"Answered {answer}: wrong.",
            "root_cause_analysis": f"Why wrong? The code did: {plan.program.plan} Why? The question asks for "
                                   f"{GOALS[p.kind]}.",
            "trajectory_outcome": "failure",
            "improvement_suggestion": f"For {GOALS[p.kind]}: {right.plan}", "retry_from_step": 0}


def reflection_transcript(plan, messages: list[dict]) -> list[dict]:
    """The reflection call on the attempt (as the R3L driver asks it) with the right report as the answer."""
    feedback = outcome_feedback(1.0 if plan.correct else 0.0, 1.0, answered=True)
    return reflection_messages(messages, REFLECTION_PROMPT_COMPACT, report_for(plan, messages), feedback, indent=None,
                               style="compact")


def retry_transcript(plan, messages: list[dict], r: random.Random) -> list[dict]:
    """A guided retry from the pivot (step 0) that solves the problem cleanly with a right program."""
    p = plan.problem
    right = r.choice(p.right)
    continuation = [{"role": "assistant", "content": f"{right.plan}\n{render_call(right.code)}"},
                    {"role": "tool", "content": str(p.answer)},
                    {"role": "assistant", "content": f"The answer is \\boxed{{{p.answer}}}."}]
    return guided_retry_messages(messages, report_for(plan, messages), 0, continuation,
                                 template=GUIDANCE_TEMPLATE_COMPACT, indent=None)
