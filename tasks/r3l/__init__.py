"""R3L (reflect, then retry from the pivot): the method's pure parts, free of engine and sandbox.

* ``tasks.r3l.prompts``: trajectory log for the reflection, reflection prompts, guidance,
  reflection and guided-retry transcripts as plain chat messages (for the rollout and for the
  warm-up corpus alike);
* ``tasks.r3l.report``: parse + validate a reflection report (the reference's table).

Reference behaviour: seed-methods.md §1 (shiweijiezero/R3L @ d503f6c). Corpus writers call::

    from tasks.r3l import reflection_messages, guided_retry_messages, REFLECTION_PROMPT_COMPACT
    reflection_messages(attempt_messages, REFLECTION_PROMPT_COMPACT, report, feedback=outcome_feedback(0.0))
    guided_retry_messages(attempt_messages, report, pivot=1, continuation=[...assistant/tool turns...],
                          template=GUIDANCE_TEMPLATE_COMPACT, indent=None)

The compact prompt/template variants keep a tiny-context model's transcripts short; whatever
the corpus uses, the RL run must use the same (``rollout.r3l`` config) so SFT and RL texts match.
"""

from tasks.r3l.prompts import (
                               GUIDANCE_HEADER,
                               GUIDANCE_TEMPLATE,
                               GUIDANCE_TEMPLATE_COMPACT,
                               OUTCOMES,
                               REFLECTION_PROMPT,
                               REFLECTION_PROMPT_COMPACT,
                               REPORT_KEYS,
                               count_steps,
                               distill_messages,
                               format_trajectory,
                               guidance_text,
                               guided_retry_messages,
                               insert_guidance,
                               outcome_feedback,
                               pivot_cut,
                               reflection_messages,
                               reflection_request,
                               reflection_user_text,
                               report_text,
)
from tasks.r3l.report import ReportCheck, check_report, parse_reflection, read_reflection, validate_reflect_report

__all__ = [
    "GUIDANCE_HEADER", "GUIDANCE_TEMPLATE", "GUIDANCE_TEMPLATE_COMPACT", "OUTCOMES", "REFLECTION_PROMPT", "REFLECTION_PROMPT_COMPACT", "REPORT_KEYS",
    "ReportCheck", "check_report", "count_steps", "distill_messages", "format_trajectory", "guidance_text",
    "guided_retry_messages", "insert_guidance", "outcome_feedback", "parse_reflection", "pivot_cut", "read_reflection",
    "reflection_messages", "reflection_request", "reflection_user_text", "report_text", "validate_reflect_report",
]
