"""R3L texts and message lists: the reflection call, the guidance, the guided retry (plain messages).

Everything here is a pure function of messages and strings, chat-template agnostic: the
rollout turns these messages into token ids with ``models.chat.ChatFormat``, and the warm-up
corpus generator (``tasks/data/synthetic``) uses the same functions to write reflection and
guided-retry transcripts, so the policy is trained on exactly the texts it sees in RL.

Reference behaviour (seed-methods.md §1, R3L ``utils.format_trajectory_for_reflection``,
``get_reflect``, ``second_rollout``):

* **Trajectory log** (``format_trajectory``)::

      **System Rules & Context:**
      <system prompt>
      ==============================

      **Step 0**
        - User Observation/Feedback:
          <user question>
        - Assistant Thought & Action:
          <assistant turn 0>

      **Step 1**
        - User Observation/Feedback:
          <tool response 0>
        - Assistant Thought & Action:
          <assistant turn 1>
      ...

  Steps count assistant turns from 0; a ``tool`` message is the observation that opens the
  next step (here tools play the reference's environment). The log ends with a feedback
  message on the outcome (``outcome_feedback``), as the reference appends its final feedback.
* **Reflection call**: system = the reflection prompt, user = ``reflection_user_text(log)``;
  the answer is a JSON report (``REPORT_KEYS``), parsed by ``tasks.r3l.report``.
* **Guidance** (``guidance_text``): the self-correction text around ``json.dumps(report, indent=2)``.
* **Guided retry** (``guided_retry_messages``): the first ``pivot`` assistant turns (and the tool
  responses after them) are kept; for ``pivot > 0`` a system message
  ``"# Previous Attempt Analysis & Guidance\\n" + guidance`` follows them; for ``pivot == 0`` the
  same text is appended to the system prompt instead. The **distill** copy
  (``distill_messages``) is the same conversation without the guidance.

The reflection prompt is written here in our own words (``REFLECTION_PROMPT``). For tiny-context
models there is a compact variant of everything: ``REFLECTION_PROMPT_COMPACT`` (names no keys: a model
that uses it learnt the report from its warm-up corpus) and the **compact log** (``log_style="compact"``,
no head or tail around it)::

    Step 0
    User: <user question>
    You: <assistant turn 0>
    Step 1
    Tool: <tool response 0>
    You: <assistant turn 1>
    ...

The full layout costs ~55 tokens per step plus ~55 for the head and tail with the tiny model's
tokenizer, the compact one ~15 per step (issue 18: the full one made every warm-up reflection longer
than the warm-up's 512 tokens).
"""

from __future__ import annotations

import json

REPORT_KEYS = ("trajectory_summary", "root_cause_analysis", "trajectory_outcome", "improvement_suggestion",
               "retry_from_step")
OUTCOMES = ("success", "success_but_inefficient", "failure")

GUIDANCE_HEADER = "# Previous Attempt Analysis & Guidance\n"
"""Heading of the guidance, both as a system message at the pivot and appended to the system prompt."""

GUIDANCE_TEMPLATE = (
    "Your previous attempt encountered issues. Below is a reflection based on user and environment feedback:"
    "\n\n{report}\n\nApply the lessons learned from this reflection to avoid repeating the same mistakes. "
    "Do not mention or reference this guidance in your response."
)
"""The self-correction text of §1; ``{report}`` is the report as JSON."""

GUIDANCE_TEMPLATE_COMPACT = "A reflection on your previous attempt:\n{report}\nApply it and do not mention it."
"""A short guidance text for models with a small context window (the tiny model)."""

REFLECTION_USER_HEAD = "Here is last attempt trajectory log: \n\n"
REFLECTION_USER_TAIL = "\n\nPlease output in the specified JSON format."

REFLECTION_PROMPT = """You review the log of an agent's attempt at a task, using the feedback the user and the \
tools gave it. Find what went wrong, trace it back to its root cause, and turn the lesson into a principle the \
agent can reuse. Work like a Socratic questioner: ask "why?" about each symptom until you reach the flawed \
assumption, wrong mental model or missing knowledge underneath it. Then say from which step a new attempt should \
start.

Answer with one JSON object and nothing else, with exactly these keys:
{
"trajectory_summary": "1-3 sentences: the approach taken, the result, and how well it was executed.",
"root_cause_analysis": "A chain of why-questions from the visible symptom to the deepest cause, e.g. 'Why X? \
Because Y. Why Y? Because Z.' null only if the attempt was flawless.",
"trajectory_outcome": "exactly one of 'success' (goal reached, nothing to improve), 'success_but_inefficient' \
(goal reached with wasted or wrong steps), 'failure' (goal not reached).",
"improvement_suggestion": "A self-contained, reusable principle: the environment or tool it applies to, when it \
applies, the pitfall, and the fix with its reason. null if and only if the outcome is 'success'.",
"retry_from_step": "The integer step (0 to N-1) where the root cause first shows, i.e. the best point to restart \
from; 0 when the initial strategy was wrong. null if the outcome is 'success'."
}"""
"""Default reflection system prompt (same keys and rules as the reference's, in our words)."""

REFLECTION_PROMPT_COMPACT = "Reflect on the attempt as a JSON report: root cause, fix, step to retry from."
"""A short reflection prompt for models with a small context window (the tiny model, whose warm-up corpus
teaches the report's keys and rules by example); use it with ``log_style="compact"``."""

LOG_STYLES = ("full", "compact")
"""Renderings of the attempt in the reflection call (``format_trajectory``)."""

_COMPACT_ROLES = {"user": "User", "tool": "Tool", "assistant": "You", "system": "System"}


def format_trajectory(messages: list[dict], style: str = "full") -> str:
    """The trajectory log a reflection reads (layouts in the module docstring).

    ``messages``: the attempt's conversation (system, user, assistant, tool, ..., final
    feedback), without few-shot examples. ``user`` and ``tool`` messages open a step,
    ``assistant`` messages close it. ``style``: ``full`` (the reference's) or ``compact``.
    """
    if style == "compact":
        return _format_compact(messages)
    if style != "full":
        raise ValueError(f"log style {style!r}: expected one of {LOG_STYLES}")
    lines: list[str] = []
    step = 0
    for msg in messages:
        role, content = msg["role"], str(msg.get("content") or "")
        if role == "system":
            lines.append(f"**System Rules & Context:**\n{content}\n" + "=" * 30)
        elif role in ("user", "tool"):
            lines.append(f"\n**Step {step}**")
            lines.append(f"  - User Observation/Feedback:\n    {content.strip()}")
        elif role == "assistant":
            lines.append(f"  - Assistant Thought & Action:\n    {content.strip()}")
            step += 1
        else:
            raise ValueError(f"trajectory message with role {role!r}: expected system, user, tool or assistant")
    return "\n".join(lines)


def _format_compact(messages: list[dict]) -> str:
    lines: list[str] = []
    step, opened = 0, False
    for msg in messages:
        role, content = msg["role"], str(msg.get("content") or "").strip()
        if role not in _COMPACT_ROLES:
            raise ValueError(f"trajectory message with role {role!r}: expected system, user, tool or assistant")
        if role in ("user", "tool") and not opened:
            lines.append(f"Step {step}")
            opened = True
        elif role == "assistant":
            step, opened = step + 1, False
        lines.append(f"{_COMPACT_ROLES[role]}: {content}")
    return "\n".join(lines)


def count_steps(messages: list[dict]) -> int:
    """Steps of an attempt = its assistant turns (the ``N`` that bounds ``retry_from_step``)."""
    return sum(m["role"] == "assistant" for m in messages)


def outcome_feedback(reward: float, success_threshold: float = 1.0, answered: bool = True) -> str:
    """The final feedback message of a trajectory log: the outcome as the grader saw it (no answer key)."""
    if reward >= success_threshold:
        verdict = "the final answer is correct"
    elif answered:
        verdict = "the final answer is wrong"
    else:
        verdict = "no final answer was given"
    return f"Feedback: {verdict} (reward {reward:g}/{success_threshold:g})."


def reflection_user_text(log: str, style: str = "full") -> str:
    """The user message of the reflection call around a formatted trajectory log (the compact log alone)."""
    return log if style == "compact" else REFLECTION_USER_HEAD + log + REFLECTION_USER_TAIL


def reflection_request(trajectory_messages: list[dict], system: str, feedback: str | None = None,
                       style: str = "full") -> list[dict]:
    """The reflection call: ``system`` = the reflection prompt, user = the attempt formatted in ``style``.

    ``feedback`` (e.g. ``outcome_feedback(...)``) is appended to the attempt as a last ``user``
    message before formatting, as the reference logs its final feedback.
    """
    attempt = list(trajectory_messages)
    if feedback is not None:
        attempt.append({"role": "user", "content": feedback})
    log = format_trajectory(attempt, style)
    return [{"role": "system", "content": system}, {"role": "user", "content": reflection_user_text(log, style)}]


def report_text(report: dict, indent: int | None = None) -> str:
    """A report as the reflector writes it (compact JSON unless ``indent``)."""
    return json.dumps(report, ensure_ascii=False, indent=indent)


def reflection_messages(trajectory_messages: list[dict], system: str, report: dict, feedback: str | None = None,
                        indent: int | None = None, style: str = "full") -> list[dict]:
    """A complete reflection transcript (for SFT): the reflection call plus the report as the assistant turn."""
    return [*reflection_request(trajectory_messages, system, feedback, style),
            {"role": "assistant", "content": report_text(report, indent)}]


def guidance_text(report: dict, template: str = GUIDANCE_TEMPLATE, indent: int | None = 2) -> str:
    """The guidance given to the retry: ``template`` around ``json.dumps(report, indent=indent)``."""
    return template.replace("{report}", json.dumps(report, ensure_ascii=False, indent=indent))


def pivot_cut(messages: list[dict], pivot: int) -> int:
    """Index in ``messages`` just before the ``pivot``-th assistant turn (0-based): the retry's prefix end.

    For ``pivot == 0`` this is the first assistant turn (the prefix is the prompt); for
    ``pivot == k`` the prefix holds the first ``k`` assistant turns and the tool responses that
    followed them. ``messages`` may also end at the pivot (exactly ``pivot`` assistant turns: the
    whole list is the prefix); fewer turns, or a negative pivot, is a ``ValueError``.
    """
    seen = 0
    for i, msg in enumerate(messages):
        if msg["role"] == "assistant":
            if seen == pivot:
                return i
            seen += 1
    if seen == pivot >= 0:
        return len(messages)
    raise ValueError(f"pivot {pivot} is out of range: the trajectory has {seen} assistant turns")


def insert_guidance(prefix: list[dict], guidance: str, pivot: int) -> list[dict]:
    """``prefix`` (the conversation up to the pivot) with ``GUIDANCE_HEADER + guidance`` put in as §1 says."""
    text = GUIDANCE_HEADER + guidance
    if pivot > 0:
        return [*prefix, {"role": "system", "content": text}]
    if prefix and prefix[0]["role"] == "system":
        return [{"role": "system", "content": f"{prefix[0]['content']}\n\n{text}"}, *prefix[1:]]
    return [{"role": "system", "content": text}, *prefix]


def guided_retry_messages(prefix_messages: list[dict], guidance_report: dict, pivot: int,
                          continuation: list[dict], template: str = GUIDANCE_TEMPLATE,
                          indent: int | None = 2) -> list[dict]:
    """A guided retry: the attempt cut at ``pivot``, the guidance inserted there, then ``continuation``.

    ``prefix_messages``: the first attempt's conversation (it may run past the pivot; it is cut
    with ``pivot_cut``); ``continuation``: the retry's new assistant/tool turns from the pivot on.
    With no system message and ``pivot == 0`` the guidance becomes the system message (the chat
    template's default system prompt is then not shown).
    """
    prefix = prefix_messages[: pivot_cut(prefix_messages, pivot)]
    return [*insert_guidance(prefix, guidance_text(guidance_report, template, indent), pivot), *continuation]


def distill_messages(prefix_messages: list[dict], pivot: int, continuation: list[dict]) -> list[dict]:
    """The guidance-free copy of a guided retry (what R3L trains in the explore group)."""
    return [*prefix_messages[: pivot_cut(prefix_messages, pivot)], *continuation]
