"""tasks.training.schedule: the order stages run in at staleness k = 0, 1, 2 and with evaluations beside training.

Fake stages record their start (``R1+``) and end (``R1-``); gates make a fake wait for another's record, so each
test forces the hand-drawn timeline of the module docstring and fails (a gate times out) when the schedule does not
let the two stages overlap there, or runs one before its version exists.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tasks.training.schedule import PERF, StepFns, _perf, eval_on_both_lanes, rollout_version, run_steps

WAIT_S = 10.0


class Recorder:
    """Stage fakes: ``R<s>`` rollout (its version kept), ``T<s>`` train, ``L<s>`` log, ``E<v>`` evaluation."""

    def __init__(self, start_after: dict[str, str] | None = None, end_after: dict[str, str] | None = None,
                 due: set[int] = frozenset(), stop_at: int | None = None):
        self.start_after, self.end_after, self.due, self.stop_at = start_after or {}, end_after or {}, due, stop_at
        self.order: list[str] = []
        self.versions: dict[int, int] = {}
        self.perf: dict[int, dict] = {}
        self.threads: set[str] = set()
        self._seen: dict[str, threading.Event] = {}
        self._lock = threading.Lock()

    def _event(self, token: str) -> threading.Event:
        with self._lock:
            return self._seen.setdefault(token, threading.Event())

    def _mark(self, token: str) -> None:
        with self._lock:
            self.order.append(token)
        self._event(token).set()

    def _gate(self, token: str, gates: dict[str, str]) -> None:
        if token in gates and not self._event(gates[token]).wait(WAIT_S):
            raise AssertionError(f"{token} waited for {gates[token]} in vain; order so far {self.order}")

    def _stage(self, name: str) -> None:
        self.threads.add(threading.current_thread().name)
        self._gate(name + "+", self.start_after)
        self._mark(name + "+")
        self._gate(name + "-", self.end_after)
        self._mark(name + "-")

    def fns(self) -> StepFns:
        def rollout(step: int, version: int) -> None:
            self.versions[step] = version
            self._stage(f"R{step}")

        def log(step: int, perf: dict) -> bool:
            self.perf[step] = perf
            self._stage(f"L{step}")
            return step == self.stop_at

        return StepFns(rollout=rollout, train=lambda s: self._stage(f"T{s}"), log=log,
                       evaluate=lambda v: self._stage(f"E{v}"), eval_due=lambda v: v in self.due)


def seq(text: str) -> list[str]:
    return text.split()


@pytest.fixture
def pool():
    with ThreadPoolExecutor(8, thread_name_prefix="lane") as ex:
        yield ex.submit


def test_rollout_version_is_step_minus_k_clipped_at_zero():
    assert [rollout_version(s, 1) for s in range(4)] == [0, 0, 1, 2]
    assert [rollout_version(s, 2) for s in range(5)] == [0, 0, 0, 1, 2]
    assert [rollout_version(s, 0) for s in range(3)] == [0, 1, 2]


def test_k0_runs_everything_in_todays_order_in_the_calling_thread():
    rec = Recorder(due={0, 2, 3})
    timeline = run_steps(3, rec.fns(), k=0)
    assert rec.order == seq("E0+ E0- R0+ R0- T0+ T0- L0+ L0- R1+ R1- T1+ T1- L1+ L1- E2+ E2- "
                            "R2+ R2- T2+ T2- L2+ L2- E3+ E3-")
    assert rec.versions == {0: 0, 1: 1, 2: 2}
    assert rec.threads == {threading.current_thread().name}
    assert timeline.perf == {0: {}, 1: {}, 2: {}}  # nothing ran beside: no waits logged (today's metrics)


def test_k0_never_submits():
    def refuse(*_):
        raise AssertionError("k = 0 submitted a call")

    rec = Recorder()
    run_steps(2, rec.fns(), k=0, submit=refuse)
    assert rec.order == seq("R0+ R0- T0+ T0- L0+ L0- R1+ R1- T1+ T1- L1+ L1-")


def test_k1_rolls_out_step_s_plus_1_with_version_s_while_step_s_updates(pool):
    # rollout lane   R0 v0 | R1 v0 ----------- | R2 v1 ----------- |
    # trainer              | T0 ----- | L0 |  | T1 ----- | L1 |   | T2 | L2
    rec = Recorder(start_after={"R1+": "T0+", "R2+": "T1+"},
                   end_after={"T0-": "R1+", "R1-": "L0-", "T1-": "R2+", "R2-": "L1-"})
    run_steps(3, rec.fns(), k=1, submit=pool)
    assert rec.order == seq("R0+ R0- T0+ R1+ T0- L0+ L0- R1- T1+ R2+ T1- L1+ L1- R2- T2+ T2- L2+ L2-")
    assert rec.versions == {0: 0, 1: 0, 2: 1}


def test_k1_hands_rollout_s_plus_2_over_only_once_step_s_updated(pool):
    # R2 samples version 1: it must not start before T0 ended, even with the lane free (R1 ended first)
    rec = Recorder(end_after={"T0-": "R1-"})
    run_steps(3, rec.fns(), k=1, submit=pool)
    assert rec.order.index("R2+") > rec.order.index("T0-")
    assert rec.order.index("R1-") < rec.order.index("T0-")
    assert rec.versions == {0: 0, 1: 0, 2: 1}


@pytest.mark.parametrize("k", [1, 2])
def test_a_rollout_starts_only_once_its_version_exists(pool, k):
    """Instant rollouts, slow updates: the lane would run ahead; rollout t still starts only after the update that
    makes version t - k (the update of step t - k - 1)."""
    rec = Recorder()
    fns = rec.fns()
    slow = StepFns(fns.rollout, lambda s: (time.sleep(0.03), fns.train(s)), fns.log, fns.evaluate, fns.eval_due)
    run_steps(6, slow, k=k, submit=pool)
    for t in range(k + 1, 6):
        assert rec.order.index(f"R{t}+") > rec.order.index(f"T{t - k - 1}-"), (t, rec.order)
    assert rec.versions == {t: max(0, t - k) for t in range(6)}


def test_k2_runs_two_rollouts_ahead_never_three(pool):
    # rollout lane   R0 v0 | R1 v0 | R2 v0 ---------- | R3 v1 -------- |
    # trainer              | T0 ------------ | L0 | T1 | L1 | T2 | L2 | T3 | L3
    rec = Recorder(start_after={"R1+": "T0+", "T1+": "R2-", "R3+": "T1+"},
                   end_after={"T0-": "R2+", "R2-": "L0-", "T1-": "R3+", "R3-": "T2+", "T2-": "R3-"})
    run_steps(4, rec.fns(), k=2, submit=pool)
    assert rec.order == seq("R0+ R0- T0+ R1+ R1- R2+ T0- L0+ L0- R2- T1+ R3+ T1- L1+ L1- T2+ R3- T2- L2+ L2- "
                            "T3+ T3- L3+ L3-")
    assert rec.versions == {0: 0, 1: 0, 2: 0, 3: 1}


def test_eval_beside_goes_on_with_the_next_steps_and_the_end_waits(pool):
    # evaluation lane             | E1 ---------------------------- |
    # trainer   R0 T0 L0 | R1 T1 L1 | R2 T2 L2 |  (waits for E1)  end
    rec = Recorder(due={1}, end_after={"E1-": "L2-"})
    timeline = run_steps(3, rec.fns(), k=0, submit=pool, eval_beside=True)
    assert rec.order[:7] == seq("R0+ R0- T0+ T0- L0+ L0- E1+")
    assert rec.order[-1] == "E1-" and rec.order[-2] == "L2-"
    assert set(timeline.perf[2]) == set(PERF)


def test_eval_beside_with_k1(pool):
    # E1 runs on the evaluation lane beside R2 and T1; E3, the last, is handed over after its step, beside E1 or
    # after it (test_the_last_evaluation_on_both_lanes_starts_beside_the_one_before_it)
    rec = Recorder(due={1, 3}, start_after={"T1+": "E1+", "R2+": "E1+"}, end_after={"E1-": "R2+"})
    run_steps(3, rec.fns(), k=1, submit=pool, eval_beside=True)
    order = rec.order
    assert order.index("E1+") > order.index("L0-")
    assert order.index("E1-") > order.index("R2+")
    assert order.index("E3+") > order.index("L2-")
    assert rec.versions == {0: 0, 1: 0, 2: 1}


def test_the_last_evaluation_on_both_lanes_starts_beside_the_one_before_it(pool):
    """k = 1, evaluations beside, of 2 and 4 (the last): E4 is handed over after L3 while E2 still runs (E2 ends only
    once E4 started) and the end waits for both. Evaluations before the last still run one after another."""
    rec = Recorder(due={2, 4}, end_after={"E2-": "E4+"})
    run_steps(4, rec.fns(), k=1, submit=pool, eval_beside=True)
    order = rec.order
    assert order.index("L3-") < order.index("E4+") < order.index("E2-")
    rec = Recorder(due={1, 2, 4}, start_after={"T2+": "E2+"})
    run_steps(4, rec.fns(), k=1, submit=pool, eval_beside=True)
    assert rec.order.index("E2+") > rec.order.index("E1-")  # not the last: after E1


def test_the_last_evaluation_in_line_or_without_a_rollout_lane_waits_for_the_one_before_it(pool):
    for k, beside in ((0, True), (1, False)):
        rec = Recorder(due={2, 4}, end_after={"E2-": "L3-"} if beside else {})  # in line E2 holds the trainer
        run_steps(4, rec.fns(), k=k, submit=pool, eval_beside=beside)
        assert rec.order.index("E4+") > rec.order.index("E2-"), (k, beside)


def test_early_stop_waits_for_the_rollout_in_flight(pool):
    """Stopped at step 0's log: R1 (in flight) and R2 (handed over when T0 ended: version 1 existed) end before the
    run does; step 1 never trains."""
    rec = Recorder(stop_at=0, end_after={"R1-": "L0-"})
    run_steps(3, rec.fns(), k=1, submit=pool)
    assert "T1+" not in rec.order and rec.order[-1] == "R2-"
    assert rec.versions == {0: 0, 1: 0, 2: 1}


def test_waits_from_the_times():
    """Trainer ready at 3, batch at 9, update ended at 13; the rollout's lane free at 5, start 6, end 9."""
    perf = _perf((5.0, 6.0, 9.0), ready=3.0, got=9.0, trained=13.0)
    assert perf == {"perf/wait_for_batch_s": 6.0, "perf/wait_for_ckpt_s": 1.0, "perf/trainer_idle_ratio": 0.6,
                    "perf/rollouter_idle_ratio": 0.25}
    assert _perf((None, 0.0, 2.0), 0.0, 2.0, 4.0)["perf/wait_for_ckpt_s"] == 0.0  # the first rollout: no wait


def test_staleness_needs_a_submit_function():
    with pytest.raises(ValueError, match="needs a submit function"):
        run_steps(1, Recorder().fns(), k=1)


def test_a_failed_rollout_fails_the_run_and_the_next_one_never_runs(pool):
    seen = []

    def rollout(step, version):
        seen.append(step)
        if step == 0:
            raise OSError("sandbox pool gone")

    fns = StepFns(rollout=rollout, train=lambda s: None, log=lambda s, p: False, evaluate=lambda v: None,
                  eval_due=lambda v: False)
    with pytest.raises(OSError, match="sandbox pool gone"):
        run_steps(3, fns, k=1, submit=pool)
    assert seen == [0]


def test_only_the_last_evaluation_with_both_lanes_beside_is_rolled_on_both():
    assert eval_on_both_lanes(True, 1, True) and eval_on_both_lanes(True, 2, True)
    assert not eval_on_both_lanes(False, 1, True)  # an evaluation before the end: the rollout lane is busy
    assert not eval_on_both_lanes(True, 0, True)  # no rollout lane at k = 0
    assert not eval_on_both_lanes(True, 1, False)  # evaluations in line: no evaluation lane
