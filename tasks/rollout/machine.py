"""Multi-turn tool-use rollout with SAAR, as an enum state machine over a batch of trajectories.

Every trajectory is in one ``State``; a driver hands each engine output and each tool result
to the small handler of that state. Two drivers share the handlers: **continuous** (when the
engine offers ``stream``): a turn is submitted as soon as its trajectory is ready, a finished
turn's tool call runs in a thread while the others keep decoding, and its next turn joins the
batch with the trajectory's cached prefix (no round waits for its longest turn) — at a decode step
fixed by the seed, not by the sandbox's speed (``tasks.rollout.toolcalls``); **rounds**
(any engine): generate for every waiting trajectory in one batch, then execute every pending
call in one sandbox batch. Every tool call runs with the prompt's bound inputs
(``extra_info["setup"]``, run by the sandbox before the snippet in the same globals):

    GENERATING ──turn with a call──▶ EXECUTING ──ok──────────────────────▶ GENERATING
        │                               │ fail, SAAR on, retries left
        │ no call / caps                ▼
        ▼                           RETRYING ──regenerated, spliced / appended──▶ EXECUTING
    TERMINATED ◀── no call in the regenerated turn (SAAR off, recorded as failed)

Token bookkeeping (ids are appended turn by turn, never re-tokenised)::

    prompt_ids   | response_ids
                 | assistant turn 1      | tool response 1        | assistant turn 2 ...
    response_mask| 1 1 1 ... 1 <|im_end|>| 0 0 0 ... 0 (injected) | 1 1 ... 1
    logprobs     | engine log-probs      | 0.0                    | engine log-probs

The turn budget is per prompt (``turn_budget``): ``extra_info["max_turns"]`` when the prompt carries one (the
chain task's calls + 1) plus ``rollout.extra_turns``, else ``rollout.max_turns``. Only the policy's own assistant
turns count: a turn that makes a call when the budget is spent ends the trajectory unrun (``turn_cap``); SAAR's
regenerations replace a turn and never count, unless ``saar.retries_cost_turns`` (``tasks.rollout.decisions``,
"Turn cost"). A chain of 2 calls (budget 3), SAAR off, one failed call::

    turn 1  call ok      | tool | turn 2  call fails | tool (error) | turn 3  call  ──▶ turn_cap, the call never runs
    mask    1 ... 1      | 0..0 | 1 ... 1            | 0 ... 0      | 1 ... 1       (turn 3 trained, nothing after)

In RETRYING the engine sees ``prompt + response + error tool turn``, but the error tokens are
kept aside (``Snapshot.retry_suffix``); the accepted regeneration is spliced over the failed
turn (``tasks.rollout.saar.splice``; or, ``saar.decide: importance``, replaces it or is appended after the kept
error: ``tasks.rollout.decisions``), so a recovered position carries no error text. The spliced-in
tokens are marked (``Trajectory.spliced``: sampled in the error context, their log-probs are that
context's, the behaviour policy's; the old reasoning a shallow splice keeps is not marked). Infrastructure
failures of the sandbox raise out of the rollout (``SandboxInfraError``): they are never a code failure, a SAAR
trigger or a reward.
"""

from __future__ import annotations

import zlib
from concurrent.futures import ThreadPoolExecutor

from tqdm.auto import tqdm

from models.chat import ChatFormat, ParsedCall, parse_tool_call
from models.engine import Engine, GenOutput, GenRequest
from sandbox.result import ExecutionResult
from tasks.rollout.config import RolloutConfig
from tasks.rollout.decisions import DECISIONS, check_decide, close_append, turns_used
from tasks.rollout.saar import exhausted_note, is_raw
from tasks.rollout.toolcalls import ToolCalls
from tasks.rollout.types import Execution, PromptItem, SaarEvent, Snapshot, State, Trajectory


class Rollout:
    """Runs the state machine for one step's batch (see module docstring)."""

    def __init__(self, cfg: RolloutConfig, engine: Engine, chat: ChatFormat, sandbox):
        check_decide(cfg.saar.decide, engine)
        self.cfg = cfg
        self.engine = engine
        self.chat = chat
        self.sandbox = sandbox
        self.tool_wait_s = 0.0  # decoding stood still for a lockstep tool call (``ToolCalls.waited_s``), summed
        self.spawned: list[Trajectory] = []
        """Trajectories a handler started mid-rollout (``tasks.rollout.paired``'s SAAR-off twins), each with its
        ``stream_key``; the continuous driver takes them in."""

    def new_trajectories(self, items: list[PromptItem], seed: int, step: int) -> list[Trajectory]:
        """``n_samples`` trajectories per prompt; ids ``step:prompt:sample`` are unique because prompts are."""
        ids = [item.prompt_id for item in items]
        if len(set(ids)) != len(ids):
            dup = sorted({i for i in ids if ids.count(i) > 1})
            raise ValueError(f"step {step}: prompt ids drawn twice in one batch: {dup} (trajectory ids would collide)")
        return [self.new_trajectory(item, seed, step, k) for item in items for k in range(self.cfg.n_samples)]

    def new_trajectory(self, item: PromptItem, seed: int, step: int, sample_idx: int) -> Trajectory:
        """Sample ``sample_idx`` of ``item``: prompt ids from the chat template, the seeded raw draw.

        A trajectory is raw only when SAAR could have acted on it: with SAAR off (the DAPO baseline)
        nothing is drawn raw, so raw/SAAR metrics are not split over a distinction that does not exist.
        """
        messages = self.chat.messages(item.messages)
        saar = self.cfg.saar
        raw = saar.enabled and is_raw(seed, step, item.prompt_id, sample_idx, saar.raw_share)
        return Trajectory(f"{step}:{item.prompt_id}:{sample_idx}", item, sample_idx, raw, self.chat.prompt_ids(messages),
                          list(messages), saar_on=saar.enabled and not raw, version=step, start_step=step)

    async def drive(self, t: Trajectory, agenerate, aexecute) -> Trajectory:
        """Run one trajectory to its end with async callables, through the same handlers as ``run``.

        ``agenerate(GenRequest) -> GenOutput``; ``aexecute(code, setup) -> ExecutionResult``. Used where an
        outer framework schedules trajectories one by one (the verl agent loop).
        """
        while t.state is not State.TERMINATED:
            if t.state is State.EXECUTING:
                call = t.pending
                res = await aexecute(call.code, setup_of(t)) if call.code is not None else _call_failure(call)
                self.on_executed(t, res)
            else:
                self.deliver(t, await agenerate(self.request(t)))
        t.truncate(self.budget(t))
        return t

    def run(self, items: list[PromptItem], seed: int, step: int, progress: bool = True,
            refill_round: int = 0) -> list[Trajectory]:
        return self.drive_all(self.new_trajectories(items, seed, step), seed, step, progress, refill_round=refill_round)

    def drive_all(self, trajs: list[Trajectory], seed: int, step: int, progress: bool = True,
                  stream: str = "", refill_round: int = 0) -> list[Trajectory]:
        """Run prepared trajectories to their ends; ``stream`` (a second phase) and ``refill_round`` > 0
        (a DAPO refill) salt the sampling seeds (``sampling_salt``)."""
        # disable=None: tqdm draws the bar only on a terminal, so a log or a pipe gets no carriage-return updates
        bar = tqdm(total=len(trajs), desc=f"rollout step {step}{stream and ' ' + stream}",
                   disable=None if progress else True, leave=False)
        salt = sampling_salt(seed, step, stream, refill_round)
        if self.cfg.scheduling == "continuous" and hasattr(self.engine, "stream"):
            self._run_continuous(trajs, salt, bar)
        else:
            self._run_rounds(trajs, salt, bar)
        bar.close()
        for t in trajs:
            t.truncate(self.budget(t))
        return trajs

    def turn_cap(self, t: Trajectory) -> int:
        """Turns ``t`` may use (``turn_budget`` with ``rollout.extra_turns``)."""
        return turn_budget(t.item, self.cfg.max_turns, self.cfg.extra_turns)

    def budget(self, t: Trajectory) -> int:
        """Response-token budget of ``t``: ``max_response_tokens`` plus its uncounted injected tokens."""
        return self.cfg.max_response_tokens + t.budget_extra

    def _run_rounds(self, trajs: list[Trajectory], salt: tuple[int, ...], bar) -> None:
        round_ = 0
        while True:
            gen = [t for t in trajs if t.state in (State.GENERATING, State.RETRYING)]
            if gen:
                outs = self.engine.generate([self.request(t) for t in gen], seed=hash((*salt, round_)) % 2**31)
                for t, out in zip(gen, outs):
                    self.deliver(t, out)
            exe = [t for t in trajs if t.state is State.EXECUTING]
            if exe:
                for t, res in zip(exe, self._execute(exe)):
                    self.on_executed(t, res)
            bar.update(sum(t.state is State.TERMINATED for t in trajs) - bar.n)
            if not gen and not exe:
                break
            round_ += 1

    def _run_continuous(self, trajs: list[Trajectory], salt: tuple[int, ...], bar) -> None:
        """Turns join the engine's decoding batch when ready; tool calls run in threads meanwhile and are
        handed back on the ``rollout.tool_lag_steps`` schedule (``tasks.rollout.toolcalls``)."""
        stream = self.engine.stream(seed=hash(salt) % 2**31)
        by_id = {t.traj_id: t for t in trajs}
        with ThreadPoolExecutor(max_workers=self.cfg.tool_threads, thread_name_prefix="tool") as pool:
            calls: ToolCalls[Trajectory] = ToolCalls(pool, self.cfg.tool_lag_steps)

            def route(t: Trajectory) -> None:
                while t.state is State.EXECUTING and t.pending.code is None:
                    self.on_executed(t, _call_failure(t.pending))
                while self.spawned:  # a twin starts from its original's cached prefix
                    twin = self.spawned.pop(0)
                    by_id[twin.stream_key] = twin
                    stream.copy_prefix(twin.traj_id, twin.stream_key)
                    route(twin)
                if t.state is State.EXECUTING:
                    calls.submit(t, self.sandbox.run, t.pending.code, setup_of(t))
                elif t.state is State.TERMINATED:
                    stream.release(t.stream_key or t.traj_id)
                    bar.update(1)
                else:
                    req = self.request(t)
                    if t.stream_key is None:
                        stream.submit(t.traj_id, req.input_ids, req.max_new_tokens)
                    else:  # a twin: its own cache, its original's draws
                        stream.submit(t.stream_key, req.input_ids, req.max_new_tokens, seed_key=t.traj_id)

            for t in trajs:
                route(t)
            while stream.busy or calls:
                calls.advance(stream, by_id, self.deliver, self.on_executed, route)
        self.tool_wait_s += calls.waited_s

    def request(self, t: Trajectory) -> GenRequest:
        """The engine request of a trajectory waiting in GENERATING or RETRYING (continuing a carried turn)."""
        if t.state is State.RETRYING:
            ctx = t.prompt_ids + t.response_ids + t.snapshot.retry_suffix
            start = t.snapshot.turn_start
        else:
            ctx, start = t.prompt_ids + t.response_ids, len(t.response_ids)
        carried = t.carry.ids if t.carry else []
        return GenRequest(ctx + carried, max(1, min(self.cfg.max_new_tokens, self.budget(t) - start) - len(carried)))

    def deliver(self, t: Trajectory, out: GenOutput) -> None:
        """Hand a finished generation to the handler of ``t``'s state (its tokens, and a carried prefix's, are
        counted as sampled here, once)."""
        t.stats.sampled_tokens += len(out.token_ids) + (len(t.carry.ids) if t.carry else 0)
        (self.on_retry_generated if t.state is State.RETRYING else self.on_generated)(t, out)

    def whole_turn(self, t: Trajectory, out: GenOutput) -> tuple[GenOutput, list[int]]:
        """The turn the handlers see — a carried prefix (partial rollouts) plus the new ids — and each id's version."""
        c, t.carry = t.carry, None
        if c is None:
            return out, [t.version] * len(out.token_ids)
        return (GenOutput(c.ids + out.token_ids, c.logprobs + out.logprobs, out.finish_reason),
                c.versions + [t.version] * len(out.token_ids))

    def _execute(self, trajs: list[Trajectory]) -> list[ExecutionResult]:
        return self.execute([t.pending for t in trajs], [setup_of(t) for t in trajs])

    def execute(self, calls: list[ParsedCall], setups: list[str | None]) -> list[ExecutionResult]:
        """Run calls (each with its prompt's bound inputs) in one sandbox batch; an unparsed call fails on its own."""
        runnable = [(c.code, s) for c, s in zip(calls, setups) if c.code is not None]
        ran = iter(self.sandbox.run_many([c for c, _ in runnable], setups=[s for _, s in runnable]) if runnable else [])
        return [next(ran) if c.code is not None else _call_failure(c) for c in calls]

    def _terminate(self, t: Trajectory, reason: str) -> None:
        t.state, t.finish_reason, t.pending = State.TERMINATED, reason, None

    def _saar_active(self, t: Trajectory) -> bool:
        return t.saar_on and t.stats.tool_rounds <= self.cfg.saar.max_tool_rounds

    # -- handlers, one per state --------------------------------------------------------------

    def on_generated(self, t: Trajectory, out: GenOutput) -> None:
        """GENERATING: a new assistant turn arrived (a turn cut by length never runs its call)."""
        out, versions = self.whole_turn(t, out)
        turn_start = len(t.response_ids)
        text = self.chat.decode(out.token_ids)
        t.append(out.token_ids, 1, out.logprobs, versions)
        t.append(self.closer(out), 0)
        t.messages.append({"role": "assistant", "content": text})
        t.assistant_turns += 1
        call = parse_tool_call(text)
        if out.finish_reason == "length":
            return self._terminate(t, "length")
        if call is None:
            return self._terminate(t, "stop")
        if self._dropped(call):
            return self._terminate(t, "malformed_call")
        if turns_used(t) >= self.turn_cap(t):
            return self._terminate(t, "turn_cap")
        t.pending, t.pending_start, t.state = call, turn_start, State.EXECUTING

    def closer(self, out: GenOutput) -> list[int]:
        """The end-of-turn id when a turn stopped without sampling it (another eos id such as
        ``<|endoftext|>``, a stop string): injected with mask 0 and log-prob 0 so the next turn's context
        is well formed, and never trained — the policy did not sample it. Nothing for a turn cut by length."""
        ended = out.token_ids and out.token_ids[-1] == self.chat.eos_id
        return [self.chat.eos_id] if out.finish_reason == "stop" and not ended else []

    def _dropped(self, call: ParsedCall) -> bool:
        """Reference mode (``malformed_call_is_failure`` off): an unparseable call is dropped, as if absent."""
        return call.code is None and call.error_kind == "malformed_call" and not self.cfg.saar.malformed_call_is_failure

    def on_executed(self, t: Trajectory, res: ExecutionResult) -> None:
        """EXECUTING: the pending call ran (or failed to parse)."""
        s, snap = t.stats, t.snapshot
        position, attempt = t.assistant_turns - 1, snap.retries if snap else 0
        t.executions.append(Execution(position, attempt, t.pending.code, res))
        s.sandbox_calls += int(t.pending.code is not None)
        s.retry_loops += int(s.errors_kept > 0 and attempt == 0)
        s.tool_calls += 1
        s.tool_rounds += 1
        if attempt == 0:
            s.first_attempt_total += 1
            s.first_attempt_success += int(res.ok)
        text = res.model_text(self.cfg.max_tool_response_chars, self.cfg.tool_response_truncate_side)
        if t.appended is not None:
            close_append(t, res.ok)
        if res.ok:
            s.tool_success += 1
            if snap is not None:
                s.rollbacks_recovered += 1
                t.events.append(SaarEvent(position, attempt, "recovered"))
                t.snapshot = None
            return self._continue_after_tool(t, text)
        s.failure_reasons[res.error_kind or "unknown"] += 1
        if snap is None and self._saar_active(t):
            snap = t.snapshot = Snapshot(turn_start=t.pending_start)
            s.rollbacks_triggered += 1
            t.events.append(SaarEvent(position, 0, "triggered", error_kind=res.error_kind, error_text=text))
        if snap is not None:
            if snap.retries < self.cfg.saar.max_tool_retries and self._saar_active(t):
                snap.error_kind, snap.error_text = res.error_kind, text
                snap.retry_suffix = self.chat.tool_response_ids(text)
                t.state, t.pending = State.RETRYING, None
                return None
            s.rollbacks_failed += 1
            t.events.append(SaarEvent(position, attempt, "exhausted", error_kind=res.error_kind, error_text=text))
            text = exhausted_note(text, snap.retries)
            t.saar_on, t.snapshot = False, None
        s.errors_kept += 1
        self._continue_after_tool(t, text)

    def on_retry_generated(self, t: Trajectory, out: GenOutput) -> None:
        """RETRYING: the model regenerated the failed turn after seeing the error; a usable regeneration goes to
        the decision ``rollout.saar.decide`` names (``tasks.rollout.decisions``)."""
        out, versions = self.whole_turn(t, out)
        t.snapshot.retries += 1
        new_text = self.chat.decode(out.token_ids)
        call = parse_tool_call(new_text)
        if out.finish_reason == "length" or call is None or self._dropped(call):
            return self._retry_failed(t, out, new_text, call, versions)
        DECISIONS[self.cfg.saar.decide](self, t, out, versions, new_text)

    def _retry_failed(self, t: Trajectory, out: GenOutput, new_text: str, call: ParsedCall | None,
                      versions: list[int]) -> None:
        """A regeneration SAAR cannot use — no call, a call the reference parser drops, or cut by length
        (even around a complete call: a turn the model did not finish is never spliced in nor run). The
        failed call, its error and the new turn all stay; SAAR is off; the trajectory ends."""
        snap, s, position = t.snapshot, t.stats, t.assistant_turns - 1
        kind = "length" if out.finish_reason == "length" else "no_call"
        t.append(snap.retry_suffix, 0)
        t.messages.append({"role": "tool", "content": snap.error_text})
        s.errors_kept += 1
        t.append(out.token_ids, 1, out.logprobs, versions)
        t.append(self.closer(out), 0)
        t.messages.append({"role": "assistant", "content": new_text})
        t.assistant_turns += 1
        s.rollbacks_failed += 1
        t.events.append(SaarEvent(position, snap.retries, kind, error_kind=snap.error_kind,
                                  error_text=snap.error_text, new_turn=new_text))
        t.saar_on, t.snapshot = False, None
        reason = {"length": "length", "no_call": "malformed_call" if call is not None else "stop"}[kind]
        self._terminate(t, reason)

    def _continue_after_tool(self, t: Trajectory, text: str) -> None:
        t.append(self.chat.tool_response_ids(text), 0)
        t.messages.append({"role": "tool", "content": text})
        t.pending = None
        if len(t.response_ids) >= self.budget(t):
            return self._terminate(t, "length")
        t.state = State.GENERATING


def sampling_salt(seed: int, step: int, stream: str = "", refill_round: int = 0) -> tuple[int, ...]:
    """What the engine seeds of a rollout are hashed from: ints only — ``hash`` of a ``str`` changes with
    every process (PYTHONHASHSEED), so a stream name enters as its CRC-32 and a rerun samples the same."""
    salt = (seed, step)
    if stream:
        salt += (zlib.crc32(stream.encode()),)
    if refill_round:
        salt += (1_000_003, refill_round)
    return salt


def turn_budget(item: PromptItem, default: int, extra: int = 0) -> int:
    """Assistant turns ``item`` may take: its ``extra_info["max_turns"]`` (an int ≥ 1) plus ``extra``
    (``rollout.extra_turns``) when given, else ``default`` (``rollout.max_turns``, without ``extra``); anything else
    there is an error naming the prompt."""
    budget = item.extra_info.get("max_turns") if item.extra_info else None
    if budget is None:
        return default
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise ValueError(f"prompt {item.prompt_id}: extra_info.max_turns={budget!r} must be an integer >= 1")
    return budget + extra


def setup_of(t: Trajectory) -> str | None:
    """The bound-input code of the trajectory's prompt (``extra_info["setup"]``), run before every call."""
    setup = t.item.extra_info.get("setup") if t.item.extra_info else None
    return setup or None


def _call_failure(call: ParsedCall) -> ExecutionResult:
    """A call that could not be run (malformed JSON, unknown tool): a failure of its own kind."""
    return ExecutionResult(
        ok=False, exit_code=None, stdout="", stderr=call.error_text or "", error_kind=call.error_kind,
        timed_out=False, memory_exceeded=False, duration_s=0.0,
    )
