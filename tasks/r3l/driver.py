"""The R3L rollout mode: base attempts, reflections, guided retries from the pivot, training rows.

One step, for every prompt (phases run batched over the whole step)::

    base ── n/2 attempts through the ordinary rollout (SAAR applies as configured) ── graded: r1
      │
    reflect ── the policy reads its attempt's log + outcome feedback, writes a JSON report
      │         parsed + validated (tasks.r3l.report); invalid / perfect → no retry
      ▼
    replay ── pivot k: the first k assistant turns are copied token for token and their tool
      │        calls re-run in the sandbox (no model calls); a call that now fails differently
      │        is recorded; the guidance goes in at the pivot (system message after turn k-1's
      │        tool response, or appended to the system prompt for k = 0)
      ▼
    retry ── generation continues through the ordinary state machine ── the guidance-free
               distill copy is the same ids with the guidance frame swapped out: graded r2

Rows and groups follow ``tasks.r3l.grouping.plan_rows``; masks ``tasks.r3l.credit``. A kept retry row
carries no tool executions or SAAR events: its distill copy (always a row when the retry ran) holds the
same ones, so each is written once. The
retry's guidance tokens do not count against ``max_response_tokens`` (``budget_extra``), so
its distill copy has the budget of an ordinary attempt.

With SAAR on: the base attempts are SAAR/raw as drawn; the reflection reads the final
(purified) conversation, so the pivot indexes purified turns, and the replay re-runs the
spliced (working) calls; the retry continues with SAAR as its base attempt had it, and its
rollbacks are spliced into both the retry and the distill copy.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from models.chat import ParsedCall, parse_tool_call
from models.engine import GenRequest
from sandbox.result import ExecutionResult
from tasks.r3l.credit import assistant_segments, pivotal_mask
from tasks.r3l.grouping import Kind, plan_rows
from tasks.r3l.prompts import (
    GUIDANCE_HEADER,
    GUIDANCE_TEMPLATE,
    GUIDANCE_TEMPLATE_COMPACT,
    REFLECTION_PROMPT,
    REFLECTION_PROMPT_COMPACT,
    count_steps,
    guidance_text,
    insert_guidance,
    outcome_feedback,
    reflection_request,
)
from tasks.r3l.report import ReportCheck, read_reflection
from tasks.rollout.machine import Rollout, sampling_salt, setup_of
from tasks.rollout.r3l_config import R3LConfig
from tasks.rollout.types import PromptItem, State, Trajectory

RewardFn = Callable[[Trajectory], "float | None"]


NOT_RUN = ReportCheck(False, False, "not_run")


@dataclass(frozen=True)
class Replay:
    """One tool call re-run on the way to the pivot, beside how it went the first time."""

    position: int
    code: str | None
    ok: bool
    error_kind: str | None
    error_text: str
    original_ok: bool | None
    original_error_kind: str | None

    @property
    def changed(self) -> bool:
        return (self.ok, self.error_kind) != (self.original_ok, self.original_error_kind)


@dataclass
class Reflection:
    """Everything R3L did with one base attempt."""

    base: Trajectory
    r1: float | None
    steps1: int
    messages: list[dict] = field(default_factory=list)
    prompt_ids: list[int] = field(default_factory=list)
    response_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    text: str = ""
    finish_reason: str = ""
    report: object | None = None
    check: ReportCheck = NOT_RUN
    replays: list[Replay] = field(default_factory=list)
    retry: Trajectory | None = None
    distill: Trajectory | None = None
    r2: float | None = None
    steps2: int | None = None
    succeeded: bool = False
    plain_prefix: list[dict] = field(default_factory=list)
    """The retry's messages up to the pivot without the guidance (the distill copy's prefix)."""
    retry_prefix_len: int = 0
    """How many of the retry's messages precede its first new turn."""
    note: str = ""
    """Why no retry ran although the report was valid (``replay_unavailable``, ``ungraded``), else ''."""
    guidance: tuple[int, int, list[int]] | None = None
    """Retry response span of the tool+guidance frame and the plain tool ids the distill copy uses."""


@dataclass
class R3LResult:
    rows: list[Trajectory]
    reflections: list[Reflection]
    rewards: dict[str, float]
    """Graded reward of every base and distill row (by traj id), for group statistics."""


def reflection_prompt(cfg: R3LConfig) -> str:
    return {"full": REFLECTION_PROMPT, "compact": REFLECTION_PROMPT_COMPACT}.get(cfg.reflection_prompt,
                                                                                 cfg.reflection_prompt)


def guidance_template(cfg: R3LConfig) -> str:
    return {"full": GUIDANCE_TEMPLATE, "compact": GUIDANCE_TEMPLATE_COMPACT}.get(cfg.guidance_template,
                                                                                 cfg.guidance_template)


def split_messages(t: Trajectory, chat) -> tuple[list[dict], list[dict], int]:
    """``(prompt messages, generated messages, few-shot count)`` of a trajectory."""
    n_prompt = len(chat.messages(t.item.messages))
    return t.messages[:n_prompt], t.messages[n_prompt:], len(chat.fewshot)


def attempt_messages(t: Trajectory, chat) -> list[dict]:
    """The attempt as the reflection reads it: the prompt without few-shot turns, then the generated turns
    (their end-of-turn token text removed, so the log holds no special token)."""
    prompt, generated, n_shot = split_messages(t, chat)
    own_system = bool(t.item.messages) and t.item.messages[0]["role"] == "system"
    head = 1 if own_system or chat.system_prompt else 0
    eos = chat.eos_token
    turns = [{**m, "content": _strip_eos(m["content"], eos)} if m["role"] == "assistant" else m for m in generated]
    return [*prompt[:head], *prompt[head + n_shot:], *turns]


class R3LRollout:
    """Runs the R3L mode for one step's prompts (see the module docstring)."""

    def __init__(self, runner: Rollout, cfg: R3LConfig, reward_fn: RewardFn):
        self.runner, self.cfg, self.reward_fn = runner, cfg, reward_fn
        self.chat = runner.chat
        n_base = cfg.base_samples or max(1, runner.cfg.n_samples // 2)
        self.base_runner = Rollout(runner.cfg.model_copy(update={"n_samples": n_base}), runner.engine, runner.chat,
                                   runner.sandbox)

    def run(self, items: list[PromptItem], seed: int, step: int, progress: bool = True,
            refill_round: int = 0) -> R3LResult:
        bases = self.base_runner.run(items, seed, step, progress, refill_round=refill_round)
        refl = [Reflection(t, self.reward_fn(t), count_steps(split_messages(t, self.chat)[1])) for t in bases]
        self._reflect(refl, seed, step, refill_round)
        todo = [r for r in refl if r.check.valid and not r.check.perfect and r.r1 is not None]
        self._prepare_retries(todo, step)
        ready = [r for r in todo if r.retry is not None]
        self.runner.drive_all([r.retry for r in ready], seed, step, progress, stream="r3l-retry",
                              refill_round=refill_round)
        for r in ready:
            self._finish_retry(r)
        return self._rows(refl)

    # -- reflection ------------------------------------------------------------------------------

    def _reflect(self, refl: list[Reflection], seed: int, step: int, refill_round: int = 0) -> None:
        system = reflection_prompt(self.cfg)
        asked: list[Reflection] = []
        for r in refl:
            if r.r1 is None:
                r.check = ReportCheck(False, False, "ungraded")
                continue
            answered = r.base.finish_reason == "stop"
            r.messages = reflection_request(attempt_messages(r.base, self.chat), system,
                                            outcome_feedback(r.r1, self.cfg.success_threshold, answered),
                                            self.cfg.log_style)
            r.prompt_ids = self.chat.prompt_ids(r.messages)
            if self.cfg.max_reflect_prompt_tokens and len(r.prompt_ids) > self.cfg.max_reflect_prompt_tokens:
                r.check = ReportCheck(False, False, "too_long")
                continue
            asked.append(r)
        if not asked:
            return
        reqs = [GenRequest(r.prompt_ids, self.cfg.max_reflect_tokens) for r in asked]
        outs = self.runner.engine.generate(reqs, seed=reflection_seed(seed, step, refill_round))
        for r, out in zip(asked, outs):
            r.response_ids, r.logprobs, r.finish_reason = list(out.token_ids), list(out.logprobs), out.finish_reason
            r.text = self.chat.decode(out.token_ids)
            r.report, r.check = read_reflection(self._body(r.response_ids), r.steps1)

    # -- replay to the pivot ---------------------------------------------------------------------

    def _prepare_retries(self, todo: list[Reflection], step: int) -> None:
        plans: list[tuple[Reflection, list[tuple[int, int]], list[ParsedCall]]] = []
        for r in todo:
            plan = self._replay_plan(r)
            if plan is None:
                r.note = "replay_unavailable"
                continue
            plans.append((r, *plan))
        calls = [(c, setup_of(r.base)) for r, _, cs in plans for c in cs]
        results = iter(self.runner.execute([c for c, _ in calls], [s for _, s in calls]))
        for r, segs, calls in plans:
            ran = [next(results) for _ in calls]
            r.replays = [_replay(r.base, j, c, res, self.runner.cfg.max_tool_response_chars)
                         for j, (c, res) in enumerate(zip(calls, ran))]
            r.retry = self._retry_trajectory(r, segs, ran, step)

    def _replay_plan(self, r: Reflection) -> tuple[list[tuple[int, int]], list[ParsedCall]] | None:
        """Segments and calls of the first ``pivot`` turns, or None when the ids do not hold them whole."""
        k = r.check.pivot or 0
        segs = assistant_segments(r.base.response_mask)
        _, generated, _ = split_messages(r.base, self.chat)
        if k > len(segs) or (k and segs[k - 1][1] >= len(r.base.response_ids)):
            return None
        turns = [m for m in generated if m["role"] == "assistant"][:k]
        calls = [parse_tool_call(m["content"]) for m in turns]
        if any(c is None for c in calls):
            return None
        return segs[:k], calls  # type: ignore[return-value]

    def _retry_trajectory(self, r: Reflection, segs, ran: list[ExecutionResult], step: int) -> Trajectory:
        base, k, chat = r.base, r.check.pivot or 0, self.chat
        guidance = guidance_text(r.report, guidance_template(self.cfg), self.cfg.guidance_indent)
        prompt, generated, _ = split_messages(base, chat)
        texts = [res.model_text(self.runner.cfg.max_tool_response_chars) for res in ran]
        prefix = list(prompt)
        for j, turn in enumerate(m for m in generated if m["role"] == "assistant"):
            if j == k:
                break
            prefix += [turn, {"role": "tool", "content": texts[j]}]
        messages = insert_guidance(prefix, guidance, k)
        r.plain_prefix, r.retry_prefix_len = prefix, len(messages)
        t = Trajectory(f"{base.traj_id}:retry", base.item, base.sample_idx, base.raw,
                       chat.prompt_ids(messages) if k == 0 else list(base.prompt_ids), messages,
                       saar_on=self.runner.cfg.saar.enabled and not base.raw, kind=Kind.RETRY.value,
                       parent=base.traj_id)
        for j, (s, e) in enumerate(segs):
            t.append(base.response_ids[s:e], 1, base.logprobs[s:e])
            if j < k - 1:
                t.append(chat.tool_response_ids(texts[j]), 0)
            else:
                start, plain = len(t.response_ids), chat.tool_response_ids(texts[j])
                t.append(chat.tool_system_ids(texts[j], GUIDANCE_HEADER + guidance), 0)
                r.guidance = (start, len(t.response_ids), plain)
                t.budget_extra = len(t.response_ids) - start - len(plain)
        t.assistant_turns = k
        if k >= self.runner.turn_cap(base):
            t.state, t.finish_reason = State.TERMINATED, "turn_cap"
        return t

    # -- after the retry -------------------------------------------------------------------------

    def _finish_retry(self, r: Reflection) -> None:
        retry, base = r.retry, r.base
        d = Trajectory(f"{base.traj_id}:distill", base.item, base.sample_idx, base.raw, list(base.prompt_ids),
                       [*r.plain_prefix, *retry.messages[r.retry_prefix_len:]], kind=Kind.DISTILL.value,
                       parent=base.traj_id, state=State.TERMINATED, finish_reason=retry.finish_reason,
                       assistant_turns=retry.assistant_turns, stats=retry.stats, events=list(retry.events),
                       executions=list(retry.executions))
        ids, mask, lps, spl = retry.response_ids, retry.response_mask, retry.logprobs, retry.spliced
        if r.guidance is not None:
            s, e, plain = r.guidance
            ids, mask, lps = ids[:s] + plain + ids[e:], mask[:s] + [0] * len(plain) + mask[e:], lps[:s] + [0.0] * len(plain) + lps[e:]
            spl = spl[:s] + [0] * len(plain) + spl[e:]
        d.response_ids, d.response_mask, d.logprobs, d.spliced = list(ids), list(mask), list(lps), list(spl)
        r.distill = d
        r.r2 = self.reward_fn(d)
        r.steps2 = count_steps(split_messages(d, self.chat)[1])
        if r.r2 is None:
            r.note = "ungraded"

    def _rows(self, refl: list[Reflection]) -> R3LResult:
        cfg, rows, rewards = self.cfg, [], {}
        for r in refl:
            retry = (r.r2, r.steps1, r.steps2) if r.distill is not None and r.r2 is not None else None
            has_ids = bool(r.response_ids) and cfg.keep_perfect_reflections
            plan = plan_rows(r.base.item.prompt_id, r.base.sample_idx, r.r1 if r.r1 is not None else 0.0, r.check,
                             has_ids, retry, cfg.success_threshold, cfg.fewer_steps_rule, cfg.pivotal_credit,
                             cfg.mask_retry)
            for p in plan:
                t = {Kind.BASE: r.base, Kind.DISTILL: r.distill, Kind.RETRY: r.retry}.get(p.kind) or self._reflect_row(r)
                t.kind, t.group_id, t.fixed_reward, t.pivot = p.kind.value, p.group_id, p.reward, p.pivot
                t.response_mask = pivotal_mask(t.response_mask, p.pivot)
                if p.kind is Kind.RETRY:  # its calls and SAAR events are recorded once, under the distill copy
                    t.executions, t.events = [], []
                rows.append(t)
            r.succeeded = any(p.kind is Kind.RETRY for p in plan)
            if r.r1 is not None:
                rewards[r.base.traj_id] = r.r1
            if retry is not None:
                rewards[r.distill.traj_id] = r.r2
        return R3LResult(rows, refl, rewards)

    def _body(self, ids: list[int]) -> str:
        """A generated turn's text without the end-of-turn id it stopped on (found by id: the same characters
        spelled with ordinary tokens are the policy's text and stay)."""
        return self.chat.decode(ids[:-1] if ids and ids[-1] == self.chat.eos_id else ids)

    def _reflect_row(self, r: Reflection) -> Trajectory:
        t = Trajectory(f"{r.base.traj_id}:reflect", r.base.item, r.base.sample_idx, r.base.raw, list(r.prompt_ids),
                       [*r.messages, {"role": "assistant", "content": self._body(r.response_ids)}],
                       parent=r.base.traj_id, state=State.TERMINATED, finish_reason=r.finish_reason)
        t.append(r.response_ids, 1, r.logprobs)
        t.assistant_turns = 1
        return t


def reflection_seed(seed: int, step: int, refill_round: int = 0) -> int:
    """The engine seed of a step's reflection call: from ``sampling_salt`` (ints only), so a resumed or retried
    step draws the same reflections in any process (``hash`` of a ``str`` changes with PYTHONHASHSEED)."""
    return hash(sampling_salt(seed, step, "r3l-reflect", refill_round)) % 2**31


def _replay(base: Trajectory, position: int, call: ParsedCall, res: ExecutionResult, max_chars: int) -> Replay:
    orig = next((e for e in reversed(base.executions) if e.position == position), None)
    return Replay(position, call.code, res.ok, res.error_kind, "" if res.ok else res.model_text(max_chars),
                  orig.result.ok if orig else None, orig.result.error_kind if orig else None)


def r3l_metrics(refl: list[Reflection], rows: list[Trajectory], success: float = 1.0) -> dict[str, float]:
    """Per-step ``r3l/*`` metrics (names follow the reference's where it has one)."""
    asked = [r for r in refl if r.check.reason not in ("ungraded",)]
    valid = [r for r in asked if r.check.valid]
    retried = [r for r in refl if r.distill is not None and r.r2 is not None]
    pivots = [r.check.pivot for r in valid if r.check.pivot is not None]
    replays = [p for r in refl for p in r.replays]
    out: dict[str, float] = {
        "r3l/reflections": len(asked),
        "r3l/valid_rate": len(valid) / len(asked) if asked else 0.0,
        "r3l/perfect_rate": sum(r.check.perfect for r in asked) / len(asked) if asked else 0.0,
        "r3l/retries": len(retried),
        "r3l/retry_succeeded": sum(r.succeeded for r in refl),
        "r3l/replay_calls": len(replays),
        "r3l/replay_changed": sum(p.changed for p in replays),
        "r3l/replay_unavailable": sum(r.note == "replay_unavailable" for r in refl),
    }
    if pivots:
        out["r3l/pivot_mean"] = statistics.fmean(pivots)
        for k, n in sorted(Counter(pivots).items()):
            out[f"r3l/pivot/{k}"] = n
    if retried:
        out["r3l/second_success"] = statistics.fmean(r.r2 >= success for r in retried)
        out["r3l/second_improve"] = statistics.fmean(r.r2 > r.r1 for r in retried)
        out["r3l/second_reward_diff"] = statistics.fmean(r.r2 - r.r1 for r in retried)
    for reason, n in sorted(Counter(r.check.reason for r in refl if not r.check.valid).items()):
        out[f"r3l/invalid/{reason}"] = n
    for kind, n in sorted(Counter(t.kind for t in rows).items()):
        out[f"r3l/rows/{kind}"] = n
    return out


def _strip_eos(text: str, eos: str) -> str:
    """A message's text without its end-of-turn token's characters at the end. Read from text (a base
    trajectory's response mask can be rewritten by then, so its runs no longer mark its turns): a turn that spelled
    them with ordinary tokens before stopping on another eos id loses them too, in the attempt the reflection reads
    only."""
    return text[: -len(eos)] if eos and text.endswith(eos) else text
