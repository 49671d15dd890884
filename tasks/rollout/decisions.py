"""How SAAR takes in a usable regeneration (a turn with a call, sampled after the error), and what a turn costs.

``DECISIONS`` (``rollout.saar.decide``) maps a name to the handler ``Rollout.on_retry_generated`` hands the
regeneration R2 of the failed turn R1 to:

* ``similarity`` (the reference): R2 is spliced over R1, shallow or deep by ``similarity_threshold``
  (``tasks.rollout.saar.splice``); the error is cut out, the position is retried while calls fail.
* ``importance`` (the CLEANER authors' "Plan B", their ``docs/plan_b_rollback.md``): one extra prefill scores R2
  in the clean context (``Engine.score``: everything before R1, same weights), and the importance ratio

      IS = exp( Σ_t log π(R2_t | clean context) − Σ_t log π(R2_t | error context) )

  (the error-context log-probs are R2's sampling log-probs) decides. ``IS ≥ importance_threshold`` → **replace**:
  R2 replaces the whole failed turn (never a shallow splice), marked spliced, and SAAR goes on as with
  ``similarity``. ``IS < importance_threshold`` → **append**: nothing is restored; R1 stays (mask 1, trained like
  any sampled turn), the error tool response follows (mask 0), and R2 is the next turn (mask 1, sampled in exactly
  that context: not spliced), counted against the turn budget, its call run as any turn's; a later failure may
  trigger SAAR again (a new position)::

      replace   | ... | R2 (mask 1, spliced 1)  | tool(R2's result) | ...
      append    | ... | R1 (mask 1) | error (mask 0) | R2 (mask 1, spliced 0) | tool(R2's result) | ...

  The score is a forward pass without sampling: it draws no random numbers, so every turn sampled after it is the
  one sampled without it. Each decision is a ``replace`` / ``append`` event with ``is_log_ratio`` (the log of IS);
  an appended R2's call closes its position's rollback: ``recovered`` when it runs ok, ``append_failed`` otherwise.

**Turn cost** (``rollout.saar.retries_cost_turns``). A trajectory's turns used are its visible assistant turns
(``assistant_turns``) plus, with the option on, every regeneration that did not become a visible turn (a splice
or a replace: ``Trajectory.retry_turns``). A regeneration kept as its own turn (an append, or one SAAR cannot use)
is a visible turn already and counts once. A turn with a call arriving when the turns used reach the budget
(``turn_budget``) ends the trajectory unrun (``turn_cap``), a regeneration too (event ``turn_cap``, the rollback
counted failed; so is an appended regeneration that does not fit in the response: event ``length``). So a purified trajectory has exactly the turns left that its raw version would have had. A chain
of 2 calls (budget 3), the first call failing once::

    raw          R1 fails | error | R2 ok | tool | turn 3 call  ──▶ turn_cap
    off (today)  R2 ok (spliced over R1) | tool | turn 2 ok | tool | turn 3 answer ──▶ stop
    on           R2 ok (spliced over R1) | tool | turn 2 call  ──▶ turn_cap (turns used: R1, R2, turn 2 = 3)
    used (on)    1 → 2 (R2)                      3
"""

from __future__ import annotations

import math
from typing import Protocol

from models.chat import ChatFormat, parse_tool_call
from models.engine import GenOutput
from tasks.rollout.config import RolloutConfig
from tasks.rollout.saar import splice
from tasks.rollout.types import SaarEvent, State, Trajectory


class Rollout(Protocol):
    """What a decision uses of ``tasks.rollout.machine.Rollout`` (which imports this module)."""

    cfg: RolloutConfig
    engine: object
    chat: ChatFormat

    def closer(self, out: GenOutput) -> list[int]: ...

    def budget(self, t: Trajectory) -> int: ...

    def turn_cap(self, t: Trajectory) -> int: ...

IS_CLIP = 700.0
"""Log-ratios above this are taken as this before ``exp`` (IS ≈ 1e304 ≥ any threshold; no overflow)."""


def turns_used(t: Trajectory) -> int:
    """Turns counted against the budget: the visible ones plus the regenerations counted (see module docstring)."""
    return t.assistant_turns + t.retry_turns


def failed_turn(t: Trajectory) -> tuple[int, list[int], list[float]]:
    """(end, ids, log-probs) of the failed turn being retried, its injected end-of-turn id left out."""
    start, end = t.snapshot.turn_start, len(t.response_ids)
    while end > start and t.response_mask[end - 1] == 0:
        end -= 1
    return end, t.response_ids[start:end], t.logprobs[start:end]


def take_similarity(r: Rollout, t: Trajectory, out: GenOutput, versions: list[int], text: str) -> None:
    """The reference's splice: shallow (old reasoning + R2's call) or deep by ``similarity_threshold``."""
    snap, s = t.snapshot, t.stats
    _, old_ids, old_lps = failed_turn(t)
    new_call = r.chat.call_start(out.token_ids)
    sp = splice(old_ids, old_lps, out.token_ids, out.logprobs, r.chat.call_start(old_ids), new_call, r.chat.decode,
                r.cfg.saar.similarity_threshold)
    kept = t.versions[snap.turn_start : snap.turn_start + sp.kept_old_prefix]
    kept_spliced = t.spliced[snap.turn_start : snap.turn_start + sp.kept_old_prefix]
    t.truncate(snap.turn_start)
    t.append(sp.ids, 1, sp.logprobs, kept + (versions[new_call:] if sp.decision == "shallow" else versions),
             kept_spliced + [1] * (len(sp.ids) - sp.kept_old_prefix))
    setattr(s, sp.decision, getattr(s, sp.decision) + 1)
    s.similarities.append(sp.similarity)
    event = SaarEvent(t.assistant_turns - 1, snap.retries, sp.decision, sp.similarity, snap.error_kind,
                      snap.error_text, r.chat.decode(old_ids), text)
    _replaced(r, t, out, r.chat.decode(sp.ids), event)


def take_importance(r: Rollout, t: Trajectory, out: GenOutput, versions: list[int], text: str) -> None:
    """Plan B: score R2 in the clean context, then replace the whole failed turn or append R2 (module docstring)."""
    snap, s = t.snapshot, t.stats
    clean = t.prompt_ids + t.response_ids[: snap.turn_start]
    scored = r.engine.score(clean, list(out.token_ids))
    if len(scored) != len(out.token_ids):
        raise RuntimeError(f"engine.score gave {len(scored)} log-probs for {len(out.token_ids)} tokens "
                           f"(trajectory {t.traj_id})")
    log_ratio = math.fsum([*scored, *(-lp for lp in out.logprobs)])  # one correctly rounded sum of the differences
    s.is_log_ratios.append(log_ratio)
    _, old_ids, _ = failed_turn(t)
    position, old_text = t.assistant_turns - 1, r.chat.decode(old_ids)
    if math.exp(min(log_ratio, IS_CLIP)) >= r.cfg.saar.importance_threshold:
        s.planb_replace += 1
        t.truncate(snap.turn_start)
        t.append(out.token_ids, 1, out.logprobs, versions, [1] * len(out.token_ids))
        event = SaarEvent(position, snap.retries, "replace", None, snap.error_kind, snap.error_text, old_text, text,
                          is_log_ratio=log_ratio)
        return _replaced(r, t, out, text, event)
    s.planb_append += 1
    s.errors_kept += 1
    t.events.append(SaarEvent(position, snap.retries, "append", None, snap.error_kind, snap.error_text, old_text,
                              text, is_log_ratio=log_ratio))
    t.append(snap.retry_suffix, 0)
    t.messages.append({"role": "tool", "content": snap.error_text})
    start = len(t.response_ids)
    t.append(out.token_ids, 1, out.logprobs, versions)
    t.append(r.closer(out), 0)
    t.messages.append({"role": "assistant", "content": text})
    t.assistant_turns += 1
    t.snapshot, t.appended = None, (position, snap.retries)
    if len(t.response_ids) > r.budget(t):
        return _unrun(t, "length")
    _to_execute(r, t, text, start)


def _replaced(r: Rollout, t: Trajectory, out: GenOutput, text: str, event: SaarEvent) -> None:
    """After a splice or a replace: close the turn, log the decision, count the regeneration, run its call."""
    t.append(r.closer(out), 0)
    t.messages[-1] = {"role": "assistant", "content": text}
    t.events.append(event)
    t.retry_turns += int(r.cfg.saar.retries_cost_turns)
    _to_execute(r, t, text, t.snapshot.turn_start)


def _to_execute(r: Rollout, t: Trajectory, text: str, start: int) -> None:
    """The regenerated turn's call runs, unless the budget is spent (``turn_cap``)."""
    if turns_used(t) >= r.turn_cap(t):
        return _unrun(t, "turn_cap")
    t.pending, t.pending_start, t.state = parse_tool_call(text), start, State.EXECUTING


def _unrun(t: Trajectory, reason: str) -> None:
    """The trajectory ends before the regeneration's call runs: its open rollback failed (event ``reason``)."""
    snap = t.snapshot
    if snap is not None or t.appended is not None:
        position, attempt = (t.assistant_turns - 1, snap.retries) if snap is not None else t.appended
        t.stats.rollbacks_failed += 1
        t.events.append(SaarEvent(position, attempt, reason, error_kind=snap.error_kind if snap else None,
                                  error_text=snap.error_text if snap else None))
    t.saar_on = t.saar_on and snap is None
    t.snapshot, t.appended = None, None
    _end(t, reason)


def _end(t: Trajectory, reason: str) -> None:
    t.state, t.finish_reason, t.pending = State.TERMINATED, reason, None


def close_append(t: Trajectory, ok: bool) -> None:
    """An appended R2's call ran: its position's rollback is recovered (ok) or failed (``append_failed``)."""
    (position, attempt), t.appended = t.appended, None
    if ok:
        t.stats.rollbacks_recovered += 1
        t.events.append(SaarEvent(position, attempt, "recovered"))
    else:
        t.stats.rollbacks_failed += 1
        t.events.append(SaarEvent(position, attempt, "append_failed"))


DECISIONS = {"similarity": take_similarity, "importance": take_importance}
"""``rollout.saar.decide`` → the handler of a usable regeneration (see module docstring)."""


def check_decide(decide: str, engine) -> None:
    """``rollout.saar.decide`` names a decision, and ``importance`` has an engine that can score."""
    if decide not in DECISIONS:
        raise ValueError(f"rollout.saar.decide: unknown decision {decide!r}; valid: {sorted(DECISIONS)}")
    if decide == "importance" and not hasattr(engine, "score"):
        raise ValueError(f"rollout.saar.decide: importance needs an engine with score(); "
                         f"{type(engine).__name__} has none (the verl agent loop scores nothing)")
