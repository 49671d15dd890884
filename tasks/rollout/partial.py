"""APRIL partial rollouts: over-sample, stop at the target, abort the rest and carry it to the next step.

Reference: RLsys-Foundation/APRIL (a slime fork), ``slime/rollout/sglang_example.py::generate_rollout_async``
and ``abort``, ``slime/ray/buffer.py::Buffer``. One step of ``PartialRollout.run``:

1. **submit**: while the groups in flight (submitted, not yet judged) plus those that passed are fewer
   than ``target`` (APRIL's ``remaining_batch_size``: submitted minus filtered), submit ``over_sampling``
   more groups — carried groups first, FIFO, then fresh prompts — at most ``max_submissions`` times per step
   (the reference has no cap). ``submit_rule: in_flight`` counts the groups in flight only (``SUBMIT_RULES``). Every trajectory runs through the ordinary state machine
   (``tasks.rollout.machine.Rollout``) on the engine's continuous stream, tool calls in threads.
2. **judge**: when all samples of a group have terminated, its graded rewards decide whether it
   passes the dynamic-sampling filter (rewards not all equal; every graded group when the filter is off).
3. **stop**: once ``target`` groups passed, the engine stream is aborted (in-process rows stop; the
   SGLang client calls the servers' ``/abort_request``); each cut turn is kept as the trajectory's
   ``carry`` (ids, log-probs, the version of each id), tool calls in flight finish (their results are
   applied), and every group not judged — partial, not started, or complete but unjudged — goes to the
   buffer in submission order, behind the carried groups that were not drained.

A carried trajectory resumes where it stopped: a cut turn continues from its carried ids with the budget
left, and the handlers see the whole turn (``Rollout.whole_turn``). Tokens keep the policy version that
sampled them (``Trajectory.versions``); the trainer recomputes old log-probs on the final sequences as
the reference does, so off-policy tokens are only counted (``partial/*`` metrics), not corrected.

Differences from the reference, by design: groups that fail the filter stay in the step's batch (the mix
stage drops them, and the rows are logged); a group that passes in the same wake-up as the target-reaching
one is carried (the reference drops it: "we have not stored all the unused samples back"); the buffer is run
state (``tasks.rollout.buffer``), persisted with the step. Like the reference, every group still pending at
the stop — cut, not started, or finishing while the abort is handled — is carried.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from models.engine import GenOutput
from tasks.rollout.config import PartialConfig
from tasks.rollout.machine import Rollout, _call_failure, sampling_salt, setup_of
from tasks.rollout.toolcalls import ToolCalls
from tasks.rollout.types import Carry, PromptItem, State, Trajectory


@dataclass
class Group:
    """One prompt's samples; possibly started in an earlier step."""

    item: PromptItem
    trajs: list[Trajectory]
    resumed: bool = False
    """Drained from the buffer this step."""
    verdict: bool | None = None
    """Passed the filter (True), failed it (False), not judged (None)."""

    @property
    def key(self) -> str:
        return self.item.prompt_id

    @property
    def done(self) -> bool:
        return all(t.state is State.TERMINATED for t in self.trajs)


@dataclass
class PartialResult:
    batch: list[Group]
    """The judged groups of this step (passed first, then those the filter failed), in judging order."""
    buffer: list[Group]
    """What the next step drains first, FIFO."""
    counts: dict[str, int] = field(default_factory=dict)


SubmitRule = Callable[[int, int, int], bool]
"""``rule(in_flight, passed, target)``: submit another over-sampling batch now?"""
SUBMIT_RULES: dict[str, SubmitRule] = {
    "april": lambda in_flight, passed, target: in_flight + passed < target,
    "in_flight": lambda in_flight, passed, target: in_flight < target,
}

Fresh = Callable[[int, set[str]], list[PromptItem]]
"""``fresh(n, exclude)``: up to ``n`` new prompts, none whose id is in ``exclude``."""


class PartialRollout:
    """Runs one step of partial rollouts (module docstring) with a ``Rollout``'s handlers."""

    def __init__(self, runner: Rollout, cfg: PartialConfig, target: int, grade: Callable[[Trajectory], float | None],
                 dynamic_sampling: bool = True):
        if not hasattr(runner.engine, "stream"):
            raise ValueError("rollout.partial.enabled: the engine has no stream to abort (use a continuous engine)")
        self.runner, self.cfg, self.target, self.grade = runner, cfg, target, grade
        self.over = cfg.over_sampling or 2 * target
        if cfg.submit_rule not in SUBMIT_RULES:
            raise ValueError(f"rollout.partial.submit_rule: unknown rule {cfg.submit_rule!r}; "
                             f"valid: {', '.join(sorted(SUBMIT_RULES))}")
        self.submit_due = SUBMIT_RULES[cfg.submit_rule]
        self.dynamic_sampling = dynamic_sampling

    def run(self, buffered: list[Group], fresh: Fresh, seed: int, step: int) -> PartialResult:
        self.step, self.seed = step, seed
        self.pending = deque(buffered)
        self.submitted: list[Group] = []
        self.judged: list[Group] = []
        self.of: dict[str, Group] = {}
        self.by_id: dict[str, Trajectory] = {}
        self.counts = dict.fromkeys(("submissions", "submitted_groups", "resumed_groups", "passed_groups",
                                     "filtered_groups", "aborted_requests", "aborted_tokens"), 0)
        self.stream = self.runner.engine.stream(seed=hash(sampling_salt(seed, step)) % 2**31)
        with ThreadPoolExecutor(max_workers=self.runner.cfg.tool_threads, thread_name_prefix="tool") as pool:
            self.calls: ToolCalls[Trajectory] = ToolCalls(pool, self.runner.cfg.tool_lag_steps)
            self._loop(fresh)
            self._abort()
        self.runner.tool_wait_s += self.calls.waited_s
        batch = [g for g in self.judged if g.verdict] + [g for g in self.judged if not g.verdict]
        left = [g for g in self.submitted if g.verdict is None]
        return PartialResult(batch, list(self.pending) + left, self.counts)

    def _passed(self) -> int:
        return self.counts["passed_groups"]

    def _loop(self, fresh: Fresh) -> None:
        while self._passed() < self.target:
            in_flight = sum(g.verdict is None for g in self.submitted)
            if (self.submit_due(in_flight, self._passed(), self.target)
                    and self.counts["submissions"] < self.cfg.max_submissions):
                self._submit(fresh)
                continue  # carried groups that were already complete have just been judged
            if not (self.stream.busy or self.calls):
                return  # nothing in flight and nothing more to submit: the step trains what passed
            self._advance()

    def _advance(self) -> None:
        """One decoding step of the stream (or a wait for a tool call): the continuous driver's step
        (``ToolCalls.advance``), every finished turn or call routed on to its group."""
        self.calls.advance(self.stream, self.by_id, self.runner.deliver, self.runner.on_executed, self._route)

    def _submit(self, fresh: Fresh) -> int:
        """Submit up to ``over`` groups: carried ones first (FIFO), then fresh prompts; returns how many."""
        self.counts["submissions"] += 1
        take: list[Group] = []
        while self.pending and len(take) < self.over:
            g = self.pending.popleft()
            g.resumed = True
            take.append(g)
        if len(take) < self.over:
            busy = {g.key for g in [*self.submitted, *self.pending, *take]}
            for item in fresh(self.over - len(take), busy):
                take.append(Group(item, [self.runner.new_trajectory(item, self.seed, self.step, k)
                                         for k in range(self.runner.cfg.n_samples)]))
        self.counts["submitted_groups"] += len(take)
        self.counts["resumed_groups"] += sum(g.resumed for g in take)
        for g in take:
            self.submitted.append(g)
            for t in g.trajs:
                t.version = self.runner.version_at(self.step)
                self.of[t.traj_id], self.by_id[t.traj_id] = g, t
        for g in take:
            for t in g.trajs:
                self._route(t)
        return len(take)

    def _route(self, t: Trajectory) -> None:
        """Send ``t`` where its state says: the sandbox, the engine stream, or (ended) to its group's judge."""
        r = self.runner
        while t.state is State.EXECUTING and t.pending.code is None:
            r.on_executed(t, _call_failure(t.pending))
        if t.state is State.EXECUTING:
            self.calls.submit(t, r.sandbox.run, t.pending.code, setup_of(t))
        elif t.state is State.TERMINATED:
            self.stream.release(t.traj_id)
            g = self.of[t.traj_id]
            if g.done and g.verdict is None and self._passed() < self.target:
                self._judge(g)
        else:
            req = r.request(t)
            self.stream.submit(t.traj_id, req.input_ids, req.max_new_tokens)

    def _judge(self, g: Group) -> None:
        rewards = [r for r in (self.grade(t) for t in g.trajs) if r is not None]
        g.verdict = bool(rewards) and (not self.dynamic_sampling or len(set(rewards)) > 1)
        self.counts["passed_groups" if g.verdict else "filtered_groups"] += 1
        self.judged.append(g)

    def _abort(self) -> None:
        """Stop generation in flight (each cut turn becomes a carry), let running tool calls finish."""
        for key, ids, lps, reason in self.stream.abort() if self.stream.busy else []:
            t = self.by_id[key]
            if reason == "abort":
                c = t.carry or Carry([], [], [])
                if ids or t.carry:
                    t.carry = Carry(c.ids + ids, c.logprobs + lps, c.versions + [t.version] * len(ids))
                self.counts["aborted_requests"] += 1
                self.counts["aborted_tokens"] += len(ids)
            else:  # the server finished it before the abort reached it
                self.runner.deliver(t, GenOutput(ids, lps, reason))
                self._settle(t)
        for t, res in self.calls.drain():
            self.runner.on_executed(t, res)
            self._settle(t)

    def _settle(self, t: Trajectory) -> None:
        """Run ``t``'s pending calls now (after the stop nothing is generated, but a started call completes)."""
        r = self.runner
        while t.state is State.EXECUTING:
            call = t.pending
            r.on_executed(t, r.sandbox.run(call.code, setup_of(t)) if call.code is not None else _call_failure(call))
