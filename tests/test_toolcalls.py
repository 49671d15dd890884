"""Tool calls beside the decoding stream (``tasks.rollout.toolcalls``): the lockstep schedule hands calls back at
their due step in submission order whatever order they finish in, so a rollout is the same bit for bit however
slow the sandbox is; ``tool_lag_steps=0`` hands back whatever is done."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

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


def _rollouts(warm_model_dir, chat, lag: int, delays, work) -> list[list[tuple]]:
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
        for delay in delays:
            cfg = RolloutConfig(n_samples=4, max_new_tokens=96, tool_lag_steps=lag, tool_threads=4)
            trajs = Rollout(cfg, engine, chat, _SlowSandbox(box, delay)).run(items, 3, 1, progress=False)
            out.append([(tuple(t.response_ids), tuple(t.logprobs)) for t in trajs])
    return out


def test_a_lockstep_rollout_is_the_same_bit_for_bit_however_slow_the_sandbox(warm_model_dir, chat, tmp_path):
    fast, slow, jitter = lambda code: 0.0, lambda code: 0.08, lambda code: 0.002 * (hash(code) % 40)
    a, b, c = _rollouts(warm_model_dir, chat, 1, [fast, slow, jitter], tmp_path)
    assert sum(len(ids) for ids, _ in a) > 6 * 4 * 20  # real multi-turn rollouts with calls
    assert a == b == c  # token ids and every log-prob, exactly
    d, e = _rollouts(warm_model_dir, chat, 0, [fast, slow], tmp_path)
    assert [ids for ids, _ in d] != [] and d != e  # as soon as back: the batch's make-up follows the timing
