"""Tool calls in flight beside a continuous decoding stream, handed back on a schedule the sandbox cannot change.

The continuous drivers (``Rollout._run_continuous``, ``PartialRollout``) decode while tool calls run in threads;
a trajectory whose call is back rejoins the decoding batch. *When* it rejoins decides the batch's make-up at
every later step, and a batch of another shape rounds its floats differently, so a near-tie token can come
out differently (``models.decode``: a row's draws are its own, its logits are not bit-stable across shapes).

``lag`` (``rollout.tool_lag_steps``) picks the schedule:

* ``lag`` ≥ 1, **lockstep**: a call submitted after decode step k is handed back after step k + lag,
  waiting for it there if it is not back yet, in submission order. The batch's make-up then depends on the
  seed and the calls' results alone, so a rerun reproduces every rollout bit for bit however slow the sandbox,
  as long as every call gives the same result (see below: a timeout near the limit may not).
  Cost: the batch waits for a call slower than ``lag`` decode steps.
* ``lag`` = 0, **as soon as back**: a call is handed back at the first look after it finished (no waiting;
  a rerun can differ at a near-tie token once the sandbox's timing differs).

With nothing decoding, the next calls due are waited for (lockstep: the earliest due step; else any one).
``waited_s`` sums the seconds decoding stood still because a call due under lockstep was not back yet (the
schedule's price; waits with nothing decoding happen under either schedule and are not counted; 0 under lag 0).
The rollout stage logs it as ``rollout/tool_wait_s``.

What lockstep guarantees: the batch's make-up, hence every token and log-prob, given the calls' *results*. The
results do not depend on the machine's load either — the sandbox's limit (``sandbox.timeout_s``) is CPU time — but
for the cases ``rollout.tool_lag_steps``'s docstring lists (a call needing about its limit, one that blocks until
the wall-clock backstop, output that differs by itself).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Generic, TypeVar

from models.engine import GenOutput

T = TypeVar("T")


class ToolCalls(Generic[T]):
    """Calls in flight, each with its owner (a trajectory) and the decode step at which it is handed back."""

    def __init__(self, pool: ThreadPoolExecutor, lag: int):
        if lag < 0:
            raise ValueError(f"rollout.tool_lag_steps: {lag} < 0")
        self.pool, self.lag, self.tick, self.waited_s = pool, lag, 0, 0.0
        self.running: dict[Future, tuple[T, int]] = {}  # insertion order = submission order

    def __bool__(self) -> bool:
        return bool(self.running)

    def submit(self, owner: T, fn: Callable, *args) -> None:
        self.running[self.pool.submit(fn, *args)] = (owner, self.tick + self.lag)

    def stepped(self) -> None:
        """One decode step was taken."""
        self.tick += 1

    def due(self, decoding: bool) -> list[tuple[T, object]]:
        """(owner, result) of every call handed back now, in submission order under lockstep; a call that
        raised raises here (an infrastructure failure is never a result)."""
        if not self.running:
            return []
        if self.lag == 0:
            done = [f for f in self.running if f.done()] if decoding else \
                list(wait(self.running, return_when=FIRST_COMPLETED).done)
            return self._collect(done)
        if not decoding:
            self.tick = max(self.tick, min(at for _, at in self.running.values()))
        t0 = time.perf_counter()
        out = self._collect([f for f, (_, at) in self.running.items() if at <= self.tick])
        if decoding:
            self.waited_s += time.perf_counter() - t0
        return out

    def drain(self) -> list[tuple[T, object]]:
        """Every call still in flight, waited for, in submission order."""
        return self._collect(list(self.running))

    def _collect(self, done: list[Future]) -> list[tuple[T, object]]:
        return [(self.running.pop(f)[0], f.result()) for f in done]

    def advance(self, stream, owners: dict, deliver: Callable, executed: Callable, route: Callable) -> None:
        """One step of a continuous driver (``Rollout._run_continuous``, ``PartialRollout``): a decode step of
        ``stream`` if it is busy — each finished turn ``deliver``-ed to its owner (``owners[stream key]``) and
        ``route``-d on — then every call handed back now, its result ``executed`` and its owner routed on."""
        decoding = stream.busy
        if decoding:
            outs = stream.step()
            self.stepped()
            for key, ids, lps, reason in outs:
                owner = owners[key]
                deliver(owner, GenOutput(ids, lps, reason))
                route(owner)
        for owner, res in self.due(decoding):
            executed(owner, res)
            route(owner)
