"""The rollout's data: a prompt (``PromptItem``), a trajectory being built (``Trajectory``) and its logs.

A ``Trajectory`` carries the token bookkeeping (``response_ids`` / ``response_mask`` /
``logprobs``, appended turn by turn), its ``State`` in the state machine of
``tasks.rollout.machine``, the SAAR statistics, and the event log of every attempt
(``SaarEvent``, ``Execution``) beside the final, purified sequence. Light on imports (no torch),
so loaders and the step tables use these types without loading an engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from models.chat import ParsedCall
from sandbox.result import ExecutionResult
from tasks.rollout.saar import TrajStats


class State(Enum):
    GENERATING = "generating"
    RETRYING = "retrying"
    EXECUTING = "executing"
    TERMINATED = "terminated"


@dataclass(frozen=True)
class PromptItem:
    prompt_id: str
    messages: list[dict]
    data_source: str
    ground_truth: str
    extra_info: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Execution:
    position: int
    attempt: int
    code: str | None
    result: ExecutionResult


@dataclass(frozen=True)
class SaarEvent:
    """One SAAR decision at a position: triggered, shallow, deep, replace, append, recovered, exhausted, no_call,
    length, turn_cap, append_failed (``tasks.rollout.decisions``)."""

    position: int
    attempt: int
    kind: str
    similarity: float | None = None
    error_kind: str | None = None
    error_text: str | None = None
    failed_turn: str | None = None
    new_turn: str | None = None
    is_log_ratio: float | None = None
    """``replace`` / ``append`` (``saar.decide: importance``): the log importance ratio that decided; else None."""


@dataclass
class Snapshot:
    """State kept while a failed position is being retried."""

    turn_start: int
    retries: int = 0
    error_kind: str | None = None
    error_text: str = ""
    retry_suffix: list[int] = field(default_factory=list)


@dataclass
class Carry:
    """A turn an abort cut short (partial rollouts): what was sampled so far, continued by the next request."""

    ids: list[int]
    logprobs: list[float]
    versions: list[int]
    """The policy version that sampled each id."""


@dataclass
class Trajectory:
    traj_id: str
    item: PromptItem
    sample_idx: int
    raw: bool
    prompt_ids: list[int]
    messages: list[dict]
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    state: State = State.GENERATING
    assistant_turns: int = 0
    saar_on: bool = True
    snapshot: Snapshot | None = None
    pending: ParsedCall | None = None
    pending_start: int = 0
    finish_reason: str = ""
    stats: TrajStats = field(default_factory=TrajStats)
    events: list[SaarEvent] = field(default_factory=list)
    executions: list[Execution] = field(default_factory=list)
    kind: str = "rollout"
    """What the row is for training: ``rollout`` (ordinary), or an R3L kind (``tasks.r3l.grouping.Kind``)."""
    group_id: str | None = None
    """The advantage group; None = the prompt id (one GRPO group per prompt)."""
    fixed_reward: float | None = None
    """A reward set by the method (R3L reflect/retry rows: 1.0) instead of the grader's."""
    pivot: int = 0
    """Assistant turns masked out of the loss at the start of the response (R3L pivotal credit)."""
    parent: str | None = None
    """The trajectory this row was derived from (R3L: the base attempt)."""
    budget_extra: int = 0
    """Injected tokens (R3L guidance) that do not count against ``max_response_tokens``."""
    versions: list[int] = field(default_factory=list)
    """The policy version behind each response token (an injected token: the version of its turn)."""
    version: int = 0
    """The policy version generating now (the step; a partial rollout resumed later gets the newer one)."""
    start_step: int = 0
    """The step this trajectory was started in (later than it only for partial rollouts carried over)."""
    carry: Carry | None = None
    """The turn an abort cut short (partial rollouts); the next request continues it."""
    spliced: list[int] = field(default_factory=list)
    """1 on response tokens sampled in an error context and spliced over the failed turn (SAAR); their
    ``logprobs`` are the behaviour log-probs of that context (``models.splice``)."""
    retry_turns: int = 0
    """Regenerations counted against the turn budget (``saar.retries_cost_turns``; ``tasks.rollout.decisions``)."""
    appended: tuple[int, int] | None = None
    """(position, attempt) of the rollback whose regeneration was appended (``saar.decide: importance``) and whose
    call has not run yet."""
    stream_key: str | None = None
    """The decoding stream's key when it is not ``traj_id``: a SAAR-off twin decoding beside its SAAR-on original
    under the same id (``tasks.rollout.paired``); its draws stay seeded by ``traj_id``."""

    def append(self, ids: list[int], mask: int, lps: list[float] | None = None,
               versions: list[int] | None = None, spliced: list[int] | None = None) -> None:
        self.response_ids += ids
        self.response_mask += [mask] * len(ids)
        self.logprobs += lps if lps is not None else [0.0] * len(ids)
        self.versions += versions if versions is not None else [self.version] * len(ids)
        self.spliced += spliced if spliced is not None else [0] * len(ids)

    def truncate(self, n: int) -> None:
        del self.response_ids[n:], self.response_mask[n:], self.logprobs[n:], self.versions[n:], self.spliced[n:]
