"""Bounded-staleness scheduling of a run's steps: which stage runs when, fixed by step index, never by timing.

The rollout of step s samples with policy version ``rollout_version(s, k) = max(0, s − k)`` (``rollout.staleness``
k): with k = 1 the rollout of step s + 1 runs while step s updates, sampled by version s. The rollouts of a run run
one after another (one rollout lane), at most k ahead of the trainer: rollout t is handed over once version t − k
exists. The trainer (the calling thread) trains step s on rollout s's batch; its update makes version s + 1.
With ``eval_beside`` an evaluation of version N is handed over and the steps go on (the evaluations run one after
another too, but for the last: see below); the run's end waits for all. With k = 0 and no evaluation beside,
everything runs in the calling thread in today's order (``submit`` is never called): rollout 0, train 0, log 0,
evaluation 1, rollout 1, ...

k = 1, three steps (``R`` rollout + score on the rollout lane, ``T`` mix + advantage + update, ``L`` log, in the
calling thread; ``v`` the version sampled)::

    rollout lane   R0 v0 | R1 v0 ---------------- | R2 v1 ---------------- |
    trainer              | T0 ---------- | L0 | … | T1 ---------- | L1 | … | T2 | L2

k = 2: R0, R1, R2 all sample version 0 and run back to back; R3 (version 1) is handed over when T0 ends::

    rollout lane   R0 v0 | R1 v0 | R2 v0 --------------- | R3 v1 ------------ |
    trainer              | T0 ------------- | L0 | T1 … | T2 … | T3 …

``eval_beside`` with k = 1: E1 (version 1) is handed over after L0 and runs on the evaluation lane beside R2, T1::

    evaluation lane                   | E1 -------------------- |
    trainer          | T0 | L0 | T1 | L1 | T2 | L2 | (waits for E1, then the run ends)

The run's last evaluation (``eval_on_both_lanes``) is handed over at once, beside the one before it: its parts are
pulled by whichever lane is free (``tasks.training.eval_shards``), so the rollout lane starts on them while the
evaluation lane still runs E2, and the evaluation lane joins when E2 ends::

    evaluation lane        | E2 ---------------------- | E4 parts … | grade E4 |
    rollout lane     | R3 v2 |                | E4 parts ---------- |
    trainer            | T2 | L2 | T3 ------ | L3 | (waits for E2 and E4, then the run ends)

``run_steps`` needs no Prefect: ``submit(fn, *args) -> future`` is a Prefect task's ``.submit`` in the train flow
(``flows.train_steps``) and a ``concurrent.futures`` executor's in benchmarks. It returns each step's waits
(``PERF``, handed to the step's log too) and how long the run's end waited for its evaluations.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

PERF = ("perf/wait_for_batch_s", "perf/wait_for_ckpt_s", "perf/trainer_idle_ratio", "perf/rollouter_idle_ratio")
"""A step's waits. ``wait_for_batch_s``: the trainer waiting for its batch (prime-rl's trainer ``time/wait_for_batch``;
verl fully_async's ``fully_async/total_wait_time``); ``wait_for_ckpt_s``: the rollout lane, free, waiting for the
weights it samples with (prime-rl's orchestrator ``time/wait_for_ckpt``); ``trainer_idle_ratio``: wait for batch /
(wait for batch + the step's mix, advantage and update); ``rollouter_idle_ratio``: wait for weights / (wait for
weights + the rollout) (verl fully_async's ``fully_async/trainer/idle_ratio`` and ``fully_async/rollouter/idle_ratio``)."""
EVAL_WAIT = "perf/eval_wait_s"
"""How long the run's end waited for evaluations still running beside training."""


def rollout_version(step: int, k: int) -> int:
    """The policy version the rollout of ``step`` samples with, at staleness ``k``."""
    return max(0, step - k)


def eval_on_both_lanes(last: bool, k: int, eval_beside: bool) -> bool:
    """Whether an evaluation is rolled out in parts pulled by the evaluation lane and the rollout lane
    (``tasks.training.eval_shards``), handed over at once beside the evaluation before it: the run's last one, when
    the rollout runs beside training (k ≥ 1: its lane is idle once the last rollout is in) and the evaluations do
    too."""
    return last and k >= 1 and eval_beside


@dataclass(frozen=True)
class StepFns:
    """What a run's steps do; each blocks until its work is done."""

    rollout: Callable[[int, int], object]
    """Rollout and score of step s with policy version v: ``rollout(s, v)``."""
    train: Callable[[int], object]
    """Mix, advantage and update of step s (makes version s + 1)."""
    log: Callable[[int, dict[str, float]], bool]
    """Log step s with its waits (``PERF``; empty when nothing ran beside); True stops the run early."""
    evaluate: Callable[[int], object]
    """Evaluate version N (and report its line)."""
    eval_due: Callable[[int], bool]
    """Whether version N is evaluated."""


@dataclass
class Timeline:
    """What ``run_steps`` measured: each step's waits (``PERF``) and the run end's wait for evaluations."""

    perf: dict[int, dict[str, float]] = field(default_factory=dict)
    eval_wait_s: float = 0.0


def _done(value: object) -> Future:
    fut: Future = Future()
    fut.set_result(value)
    return fut


class _Chain:
    """Calls that run one after another, each handed to ``submit`` (run now when ``submit`` is None) and started
    once the one before it ended; records when each started and ended and when the lane became free for it."""

    def __init__(self, submit: Callable | None, clock: Callable[[], float]):
        self.submit, self.clock = submit, clock
        self.times: dict[int, tuple[float | None, float, float]] = {}
        """key → (when the call before it ended, or None for the first; start; end)."""
        self.futures: list = []
        self._ended: dict[int, threading.Event] = {}
        self._failed: set[int] = set()
        self._last: int | None = None
        self._lock = threading.Lock()

    def add(self, key: int, fn: Callable, *args, after: bool = True):
        """Hand over ``fn(*args)``, to run after the call added before it (at once, beside it, when not ``after``);
        its future."""
        before, self._last = self._last if after else None, key
        self._ended[key] = threading.Event()
        fut = _done(self._call(key, before, fn, args)) if self.submit is None else \
            self.submit(self._call, key, before, fn, args)
        self.futures.append(fut)
        return fut

    def _call(self, key: int, before: int | None, fn: Callable, args: tuple):
        try:
            lane_free = None
            if before is not None:
                self._ended[before].wait()
                if before in self._failed:
                    raise RuntimeError(f"not run: the call before it ({before}) failed")
                lane_free = self.times[before][2]
            start = self.clock()
            out = fn(*args)
            with self._lock:
                self.times[key] = (lane_free, start, self.clock())
            return out
        except BaseException:
            self._failed.add(key)
            raise
        finally:
            self._ended[key].set()

    def wait_all(self) -> None:
        """Wait for every call; raise the first failure."""
        errors = []
        for fut in self.futures:
            try:
                fut.result()
            except BaseException as err:  # noqa: BLE001 — every call is waited for, then the first error raised
                errors.append(err)
        if errors:
            raise errors[0]


def run_steps(steps: int, fns: StepFns, k: int = 0, submit: Callable | None = None, eval_beside: bool = False,
              clock: Callable[[], float] = time.perf_counter) -> Timeline:
    """Run ``steps`` steps at staleness ``k`` (rollouts beside the trainer when k ≥ 1; evaluations beside it
    with ``eval_beside``); ``submit`` runs a call elsewhere (needed when either is on). Returns the waits."""
    if (k or eval_beside) and submit is None:
        raise ValueError("run_steps: rollout.staleness ≥ 1 or eval.beside_training needs a submit function")
    rollouts = _Chain(submit if k else None, clock)
    evals = _Chain(submit if eval_beside else None, clock)
    timeline = Timeline()
    launched = 0

    def launch(upto: int) -> None:  # every rollout up to step ``upto`` (their versions exist)
        nonlocal launched
        while launched <= min(upto, steps - 1):
            rollouts.add(launched, fns.rollout, launched, rollout_version(launched, k))
            launched += 1

    try:
        if k:
            launch(k)
        if fns.eval_due(0):
            evals.add(0, fns.evaluate, 0)
        for step in range(steps):
            launch(step + k)
            ready = clock()
            rollouts.futures[step].result()
            got = clock()
            fns.train(step)
            trained = clock()
            if k:
                launch(step + 1 + k)
            perf = _perf(rollouts.times[step], ready, got, trained) if k or eval_beside else {}
            timeline.perf[step] = perf
            stop = fns.log(step, perf)
            if fns.eval_due(step + 1):
                last = eval_on_both_lanes(step + 1 == steps, k, eval_beside)  # beside the one before it
                evals.add(step + 1, fns.evaluate, step + 1, after=not last)
            if stop:
                break
    finally:
        t0 = clock()
        rollouts.wait_all()
        evals.wait_all()
        timeline.eval_wait_s = clock() - t0
    return timeline


def _perf(rollout: tuple[float | None, float, float], ready: float, got: float, trained: float) -> dict[str, float]:
    """A step's waits (``PERF``) from its rollout's times, when the trainer was ready for the batch, got it, and
    ended its update."""
    lane_free, start, end = rollout
    wait_ckpt = max(0.0, start - lane_free) if lane_free is not None else 0.0
    wait_batch = max(0.0, got - ready)
    return {"perf/wait_for_batch_s": wait_batch, "perf/wait_for_ckpt_s": wait_ckpt,
            "perf/trainer_idle_ratio": wait_batch / max(trained - ready, 1e-9),
            "perf/rollouter_idle_ratio": wait_ckpt / max(wait_ckpt + end - start, 1e-9)}
