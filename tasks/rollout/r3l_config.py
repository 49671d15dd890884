"""R3L settings (``rollout.r3l``): every constant of the reference (seed-methods.md §1) in config.

It lives beside the rollout's other config slices (``RolloutConfig.r3l`` nests it), below the ``tasks.r3l``
driver that reads it. Light on imports (pydantic only) so the run config can be built cheaply.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class R3LConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    base_samples: int | None = Field(None, ge=1)
    """Base rollouts per prompt; None = ``rollout.n_samples // 2`` (the reference: half for rollout,
    half for reflection + retry)."""

    reflection_prompt: str = "full"
    """System prompt of the reflection call: ``full`` (``tasks.r3l.prompts.REFLECTION_PROMPT``),
    ``compact`` (``REFLECTION_PROMPT_COMPACT``, for tiny-context models) or the prompt text itself.
    Use the one the policy's warm-up corpus used."""

    log_style: str = Field("full", pattern="^(full|compact)$")
    """How the reflection call renders the attempt: ``full`` (the reference's log between its head and
    tail) or ``compact`` (``Step k`` / ``User:`` / ``Tool:`` / ``You:`` lines, ~4x fewer tokens; pair it
    with ``reflection_prompt=compact``). Use the one the policy's warm-up corpus used."""

    guidance_template: str = "full"
    """Guidance text around the report: ``full`` (the reference's self-correction text), ``compact``,
    or a text containing ``{report}``."""

    guidance_indent: int | None = 2
    """``json.dumps`` indent of the report inside the guidance (2 = reference; None = compact JSON)."""

    max_reflect_tokens: int = Field(4096, ge=1)
    """Token budget of the reflection (the reference: 4096)."""

    max_reflect_prompt_tokens: int | None = Field(None, ge=1)
    """Reflection prompts longer than this are not sent (counted as ``too_long``, handled like an
    invalid report); set it to what the model's context holds minus ``max_reflect_tokens``."""

    success_threshold: float = 1.0
    """A reward at or above this is a success (the reference: ``reward >= 1.0``)."""

    fewer_steps_rule: bool = False
    """A retry also succeeds when it reaches success in fewer steps than the base attempt. False = the
    reference's math workflows (dapo, qwen_math, countdown: only ``r2 > r1 and r2 >= success``), the tasks
    here; True = its ALFWorld / WebShop / ScienceWorld rule."""

    pivotal_credit: bool = True
    """Mask the assistant turns before the pivot out of the loss in base, distill and retry rows
    (False = the reference's ``R3L_w_o_credit`` ablation)."""

    mask_retry: bool = True
    """Also mask the retry row's prefix (the ALFWorld reference; its math workflows leave it unmasked). Kept
    on here: the prefix turns are copied from the base attempt, sampled without the guidance in context, so
    the retry row trains only tokens sampled under the guidance (docs/methods.md)."""

    keep_perfect_reflections: bool = True
    """Train on a reflection that calls a successful attempt ``success`` (reward 1.0, own group)."""
