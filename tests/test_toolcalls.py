"""Tool calls beside the decoding stream (``tasks.rollout.toolcalls``): the lockstep schedule hands calls back at
their due step in submission order whatever order they finish in, so a rollout is the same bit for bit however
slow the sandbox is; ``tool_lag_steps=0`` hands back whatever is done, so
there the rollout follows the timing (shown with timings fixed by construction, not by sleeping under load)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from tasks.rollout.toolcalls import ToolCalls


def _gated(events: dict[str, threading.Event], name: str) -> str:
    events[name].wait(5)
    return f"ran {name}"


def test_lockstep_hands_calls_back_at_their_step_in_submission_order_whatever_finishes_first():
    events = {n: threading.Event() for n in "abc"}
    with ThreadPoolExecutor(4) as pool:
        calls = ToolCalls(pool, lag=2)
        calls.submit("a", _gated, events, "a")  # due after step 2
        calls.stepped()
        calls.submit("b", _gated, events, "b")  # due after step 3
        calls.submit("c", _gated, events, "c")  # due after step 3
        events["c"].set()
        events["b"].set()
        time.sleep(0.05)
        assert calls.due(decoding=True) == []  # b and c are back, but not due; a is neither
        calls.stepped()
        threading.Timer(0.1, events["a"].set).start()
        assert calls.due(decoding=True) == [("a", "ran a")]  # waited for a at its step
        calls.stepped()
        assert calls.due(decoding=True) == [("b", "ran b"), ("c", "ran c")] and not calls


def test_lockstep_with_nothing_decoding_jumps_to_the_earliest_due_step():
    events = {n: threading.Event() for n in "ab"}
    for e in events.values():
        e.set()
    with ThreadPoolExecutor(2) as pool:
        calls = ToolCalls(pool, lag=1)
        calls.submit("a", _gated, events, "a")
        calls.stepped()
        calls.stepped()
        calls.submit("b", _gated, events, "b")  # due at 3
        assert calls.due(decoding=False) == [("a", "ran a")] and calls.tick == 2
        assert calls.due(decoding=False) == [("b", "ran b")] and calls.tick == 3


def test_lag_zero_hands_back_only_what_is_done_and_waits_for_one_when_idle():
    events = {n: threading.Event() for n in "ab"}
    with ThreadPoolExecutor(2) as pool:
        calls = ToolCalls(pool, lag=0)
        calls.submit("a", _gated, events, "a")
        calls.submit("b", _gated, events, "b")
        events["b"].set()
        time.sleep(0.05)
        assert calls.due(decoding=True) == [("b", "ran b")]
        threading.Timer(0.05, events["a"].set).start()
        assert calls.due(decoding=False) == [("a", "ran a")] and not calls
    with pytest.raises(ValueError, match="tool_lag_steps"):
        ToolCalls(pool, lag=-1)


def test_a_call_that_raises_raises_from_due():
    def broken():
        raise RuntimeError("sandbox down")

    with ThreadPoolExecutor(1) as pool:
        calls = ToolCalls(pool, lag=1)
        calls.submit("a", broken)
        calls.stepped()
        with pytest.raises(RuntimeError, match="sandbox down"):
            calls.due(decoding=True)


class _SlowSandbox:
    """The local sandbox with a delay per call that ``delay(code)`` decides (another machine's timing)."""

    def __init__(self, box, delay):
        self.box, self.delay = box, delay

    def run(self, code, setup=None, timeout_s=None):
        time.sleep(self.delay(code))
        return self.box.run(code, setup, timeout_s)

    def run_many(self, codes, setups=None, timeout_s=None):
        return [self.run(c, s, timeout_s) for c, s in zip(codes, setups or [None] * len(codes))]


class _Scheduled:
    """Stands in for the rollout's tool-thread pool with a sandbox timing fixed by construction: a call runs in the
    decoding thread ``after`` decode steps after its submission (0: at once), or as soon as nothing decodes."""

    def __init__(self, after: int):
        self.after, self.steps, self.held = after, 0, []

    def __call__(self, **_):  # called as ``ThreadPoolExecutor(max_workers=..., thread_name_prefix=...)``
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.run_due(idle=True)

    def submit(self, fn, *args) -> Future:
        f: Future = Future()
        self.held.append((self.steps + self.after, f, fn, args))
        self.run_due()
        return f

    def run_due(self, idle: bool = False) -> None:
        for item in [h for h in self.held if idle or h[0] <= self.steps]:
            self.held.remove(item)
            _, f, fn, args = item
            f.set_result(fn(*args))


class _CountedStream:
    """The engine's decoding stream, telling the scheduled pool about every decode step and every idle look."""

    def __init__(self, stream, pool: _Scheduled):
        self.stream, self.pool = stream, pool

    def __getattr__(self, name):
        return getattr(self.stream, name)

    @property
    def busy(self) -> bool:
        if not self.stream.busy:
            self.pool.run_due(idle=True)
        return self.stream.busy

    def step(self):
        out = self.stream.step()
        self.pool.steps += 1
        self.pool.run_due()
        return out


class _CountedEngine:
    def __init__(self, engine, pool: _Scheduled):
        self.engine, self.pool = engine, pool

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def stream(self, *args, **kwargs):
        return _CountedStream(self.engine.stream(*args, **kwargs), self.pool)


def _rollouts(warm_model_dir, chat, lag: int, arms, work, monkeypatch=None) -> list[list[tuple]]:
    """One rollout of 6 prompts x 4 samples per arm: a delay per call (real tool threads) or a ``_Scheduled`` pool."""
    from models.config import EngineConfig
    from models.engine import TransformersEngine
    from sandbox.base import make_sandbox
    from sandbox.config import SandboxConfig
    from tasks.data.loader import load_prompts
    from tasks.data.synthetic import write_task_parquet
    from tasks.rollout.config import RolloutConfig
    from tasks.rollout.machine import Rollout

    items = list(load_prompts(str(write_task_parquet(work / "eval.parquet", 6, 0, "eval"))))
    engine = TransformersEngine(EngineConfig(max_batch=8), warm_model_dir, chat.eos_id, chat.tokenizer.pad_token_id)
    out = []
    with make_sandbox(SandboxConfig(workers=2)) as box:
        for arm in arms:
            cfg = RolloutConfig(n_samples=4, max_new_tokens=96, tool_lag_steps=lag, tool_threads=4)
            if isinstance(arm, _Scheduled):
                monkeypatch.setattr("tasks.rollout.machine.ThreadPoolExecutor", arm)
                rollout = Rollout(cfg, _CountedEngine(engine, arm), chat, box)
            else:
                rollout = Rollout(cfg, engine, chat, _SlowSandbox(box, arm))
            trajs = rollout.run(items, 3, 1, progress=False)
            out.append([(tuple(t.response_ids), tuple(t.logprobs)) for t in trajs])
    return out


def test_a_lockstep_rollout_is_the_same_bit_for_bit_however_slow_the_sandbox(warm_model_dir, chat, tmp_path):
    fast, slow, jitter = lambda code: 0.0, lambda code: 0.08, lambda code: 0.002 * (hash(code) % 40)
    a, b, c = _rollouts(warm_model_dir, chat, 1, [fast, slow, jitter], tmp_path)
    assert sum(len(ids) for ids, _ in a) > 6 * 4 * 20  # real multi-turn rollouts with calls
    assert a == b == c  # token ids and every log-prob, exactly


def test_as_soon_as_back_the_batch_follows_the_sandbox_timing(warm_model_dir, chat, tmp_path, monkeypatch):
    """The negative control, with both timings fixed by construction (not by sleeping on a loaded machine): calls
    back at once vs calls back 8 decode steps later. Under ``tool_lag_steps=0`` the batch's make-up follows the
    timing, so the rollouts differ; each timing alone reproduces itself."""
    now, now_again, late = _rollouts(warm_model_dir, chat, 0, [_Scheduled(0), _Scheduled(0), _Scheduled(8)],
                                     tmp_path, monkeypatch)
    assert sum(len(ids) for ids, _ in now) > 6 * 4 * 20
    assert now == now_again
    assert now != late


def test_the_lockstep_wait_counts_only_what_decoding_stood_still_for():
    events = {n: threading.Event() for n in "ab"}
    with ThreadPoolExecutor(2) as pool:
        calls = ToolCalls(pool, lag=1)
        events["a"].set()
        calls.submit("a", _gated, events, "a")
        calls.stepped()
        assert calls.due(decoding=True) == [("a", "ran a")]
        calls.submit("b", _gated, events, "b")
        calls.stepped()
        threading.Timer(0.2, events["b"].set).start()
        assert calls.due(decoding=True) == [("b", "ran b")]
        assert calls.waited_s >= 0.19  # decoding stood still until the timer let b finish
        waited = calls.waited_s
        events["b"].clear()
        calls.submit("b", _gated, events, "b")
        threading.Timer(0.1, events["b"].set).start()
        assert calls.due(decoding=False) == [("b", "ran b")] and calls.waited_s == waited  # nothing was decoding
    with ThreadPoolExecutor(1) as pool:
        calls = ToolCalls(pool, lag=0)
        events["a"].set()
        calls.submit("a", _gated, events, "a")
        assert calls.due(decoding=False) == [("a", "ran a")] and calls.waited_s == 0.0
