"""Config slices of the rollout: the agent loop's budgets (``RolloutConfig``), SAAR (``SAARConfig``) and APRIL
partial rollouts (``PartialConfig``).

Pydantic only, so flow modules and the CLI read them without loading torch.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer

from tasks.rollout.r3l_config import R3LConfig


class OffFieldsOmitted(BaseModel):
    """A slice whose ``OMIT_WHEN_OFF`` fields are left out of its dump (hence out of every stage's cache key) while
    they hold the value given there: runs made before such a field existed keep their keys
    (``tests/test_stage_keys.py``)."""

    OMIT_WHEN_OFF: ClassVar[dict[str, object]] = {}

    @model_serializer(mode="wrap")
    def _omit_off(self, handler):
        out = handler(self)
        for name, off in self.OMIT_WHEN_OFF.items():
            if name in out and out[name] == off:
                del out[name]
        return out


class SAARConfig(OffFieldsOmitted):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)
    OMIT_WHEN_OFF: ClassVar[dict[str, object]] = {"retries_cost_turns": False, "decide": "similarity",
                                                  "importance_threshold": 0.5}

    enabled: bool = True
    """Turn SAAR on (CLEANER) or off (plain DAPO baseline: errors stay in trajectories)."""

    raw_share: float = Field(0.3, ge=0, le=1)
    """Share of samples rolled out raw (no SAAR), so the policy keeps its error-recovery skill."""

    similarity_threshold: float = Field(0.5, ge=0, le=1)
    """Ratio at or above which a fix is spliced shallow (old reasoning kept); below → deep."""

    max_tool_retries: int = Field(3, ge=1)
    """Regenerations per failed position (so at most ``max_tool_retries + 1`` executions)."""

    max_tool_rounds: int = Field(30, ge=1)
    """Safety switch: after this many tool rounds in a trajectory (retries included) SAAR turns off."""

    malformed_call_is_failure: bool = True
    """Treat an unparseable call as a failure SAAR handles (here); False = reference: the call is
    dropped and the trajectory ends."""

    retries_cost_turns: bool = False
    """"Purify but keep the cost": every regeneration counts against the trajectory's turn budget as the turn it
    would have been in the raw trajectory, so a purified trajectory has no more turns left than its raw version
    (``tasks.rollout.decisions``, "Turn cost"). False: regenerations replace a turn and never count."""

    decide: Literal["similarity", "importance"] = "similarity"
    """How a usable regeneration is taken in (``tasks.rollout.decisions.DECISIONS``): ``similarity`` (the
    reference's shallow/deep splice over the failed turn by ``similarity_threshold``) or ``importance`` (the CLEANER
    authors' Plan B: the importance ratio of the regeneration between the clean and the error context decides to
    replace the whole failed turn, or to append the regeneration after the kept error; needs an engine with
    ``score``)."""

    importance_threshold: float = Field(0.5, ge=0)
    """``decide: importance``: an importance ratio below this appends (failed turn and error kept), at or above it
    replaces the failed turn (Plan B's ``rollback_is_threshold``)."""


class PartialConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    enabled: bool = False
    """APRIL partial rollouts (``tasks.rollout.partial``): over-sample prompts, stop the rollout once
    ``data.prompts_per_step`` complete groups passed the dynamic-sampling filter, abort the generation in
    flight and carry every unfinished group (finished samples, partial turns with log-probs and the policy
    version of each token) to the next step, which drains them first."""

    over_sampling: int | None = Field(None, ge=1)
    """Groups submitted at a time (APRIL's ``over_sampling_batch_size``), at least ``data.prompts_per_step``;
    another batch is submitted as ``submit_rule`` says. None: twice ``data.prompts_per_step`` (APRIL's
    scripts: 64 over 32)."""

    submit_rule: Literal["april", "in_flight"] = "april"
    """When another over-sampling batch is submitted (``tasks.rollout.partial.SUBMIT_RULES``): ``april`` (the
    reference) while the groups in flight plus those already passed are fewer than ``data.prompts_per_step``;
    ``in_flight`` while the groups in flight alone are: it submits again as groups pass, keeping the decoding
    batch fuller at the cost of more aborted and carried (off-policy) work."""

    max_submissions: int = Field(4, ge=1)
    """Over-sampling batches submitted in one step at most (the first included): bounds a step's cost when few
    groups pass the filter; the step then trains what passed."""


class RolloutConfig(OffFieldsOmitted):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)
    OMIT_WHEN_OFF: ClassVar[dict[str, object]] = {"tool_response_truncate_side": "right", "extra_turns": 0,
                                                  "staleness": 0}
    """``tool_response_truncate_side`` left at ``right`` is the cut every run made before the field existed."""

    n_samples: int = Field(4, ge=1)
    """Samples per prompt (one GRPO group)."""

    max_turns: int = Field(4, ge=1)
    """Assistant turns per trajectory (SAAR regenerations do not count unless ``saar.retries_cost_turns``); a prompt
    whose ``extra_info`` has its own ``max_turns`` (the chain task's calls + 1) uses that instead, plus
    ``extra_turns`` (``tasks.rollout.machine.turn_budget``)."""

    extra_turns: int = Field(0, ge=0)
    """Turns added to a prompt's own budget (``extra_info["max_turns"]``): 2 gives a chain of k calls k + 3 turns.
    Not added to ``max_turns``, the budget of prompts without one, which is itself the setting of their slack.
    Read wherever the budget is (training rollouts, R3L retries, evaluations: they use the run's rollout)."""

    max_new_tokens: int = Field(128, ge=1)
    """Token budget of one assistant turn."""

    max_response_tokens: int = Field(512, ge=8)
    """Token budget of the whole response (assistant + tool tokens); the response is cut there."""

    max_tool_response_chars: int = Field(256, ge=16)
    """Characters of a tool response the model sees (the rest cut on ``tool_response_truncate_side``, marked)."""

    tool_response_truncate_side: Literal["right", "left", "middle"] = "right"
    """Where a long tool response is cut (``sandbox.result.TRUNCATE``): ``right`` keeps the head (the
    reference's way), ``left`` the tail, ``middle`` both ends; the verl loop takes verl's
    ``multi_turn.tool_response_truncate_side``."""

    scheduling: Literal["continuous", "rounds"] = "continuous"
    """``continuous``: turns join the engine's decoding batch as soon as their trajectory is ready
    (engines with ``stream``); ``rounds``: all waiting turns are generated together, then all calls run."""

    tool_threads: int = Field(8, ge=1)
    """Continuous scheduling: tool calls running at once (threads calling the sandbox)."""

    tool_lag_steps: int = Field(1, ge=0)
    """Continuous scheduling: a tool call submitted after decode step k rejoins the batch after step k + this,
    waiting for it there if need be, so the batch's make-up (and every float of a step) depends on the seed and the
    calls' results alone. Those do not depend on the machine's load: the sandbox's limit is CPU time
    (``sandbox/THREAT_MODEL.md``, "Time limits"), so a rerun reproduces the rollout bit for bit, beside a CPU hog too
    (``tests/test_sandbox_cputime.py``), unless a call (a) needs about as much CPU time as ``sandbox.timeout_s``
    (within the clock's 10 ms ticks and the ~+-12 % by which the same work's CPU time varies with cache and
    frequency contention, ``sandbox/THREAT_MODEL.md``): it may time out in one run only; (b) blocks until the
    wall-clock backstop ``sandbox.wall_timeout_s``, or computes while it gets less than a fifth of a CPU: its
    verdict (``wall_timeout``) or its output so far can differ; or (c) prints what
    differs between runs by itself (the clock, ``random``: each snippet is seeded afresh). 0 = as soon as it is back
    (never waits; a near-tie token can differ between reruns when the sandbox's timing differs).
    ``tasks.rollout.toolcalls``."""

    saar: SAARConfig = SAARConfig()
    """SAAR rollback settings."""

    mode: Literal["standard", "r3l"] = "standard"
    """Training rollouts: ``standard`` (``n_samples`` attempts per prompt) or ``r3l`` (n/2 attempts, each
    reflected on by the policy and retried from its pivot with the guidance; ``tasks.r3l``). Evaluation
    always uses plain attempts."""

    r3l: R3LConfig = R3LConfig()
    """R3L settings (used when ``mode`` is ``r3l``)."""

    partial: PartialConfig = PartialConfig()
    """APRIL partial rollouts (off by default; ``mode: standard``, ``scheduling: continuous``, tool-use prompts)."""

    staleness: int = Field(0, ge=0)
    """Bounded staleness k (``tasks.training.schedule``): the rollout of step s samples with policy version
    max(0, s − k), so with k = 1 the rollout of step s + 1 runs beside the update of step s. The lag is fixed by
    step index, never by timing (a run, and a resumed one, is reproducible bit for bit). 0: today's synchronous
    run, every stage in the flow process. k ≥ 1: rollout and score run in a rollout lane (a worker process,
    ``tasks.training.lanes``) with ``engine.threads`` torch threads while the update runs in the flow process with
    ``trainer.threads``; on C cores set engine.threads + trainer.threads = C. Not part of the rollout stage's key
    (its policy argument already says which version it samples); part of every later stage's key when ≥ 1."""
