"""Aborting generation in flight (partial rollouts): the in-process stream stops rows and hands back what they
sampled; the SGLang client calls the server's ``/abort_request``, and the CPU test server honours it."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from models.config import EngineConfig
from models.engine import GenRequest, load_causal_lm, make_engine
from models.sglang_test_server import start_test_server, stop_server

NEVER = 10**6
"""An end-of-turn id outside the vocabulary: no row stops before its budget, so aborts always find it running
(on the server, as on SGLang, that also takes ``ignore_eos``: it stops on the model's own eos ids otherwise)."""


def _to_budget(eng):
    """``eng``'s requests with ``ignore_eos``: SGLang (and the test server) stop on every eos id of the model whatever
    ``stop_token_ids`` say, so turns that must run to their budget ask for it."""
    plain = eng.payload

    def payload(req):
        body = plain(req)
        body["sampling_params"]["ignore_eos"] = True
        return body

    eng.payload = payload
    return eng


@pytest.fixture(scope="module")
def model(warm_model_dir):
    return load_causal_lm(warm_model_dir)


def _stream(model, chat, seed=0):
    from models.decode import DecodeStream

    return DecodeStream(model, NEVER, chat.eos_id, temperature=3.0, max_batch=2, seed=seed)


def test_abort_returns_each_rows_partial_turn_and_leaves_the_rest_decoding(model, chat):
    prompt = chat.prompt_ids([{"role": "user", "content": "What is 12 * 7?"}])
    s = _stream(model, chat)
    for key in ("a", "b", "queued"):
        s.submit(key, prompt, 24)
    for _ in range(6):
        assert s.step() == []
    partial = s.abort({"a", "queued"})
    assert [(k, len(ids), reason) for k, ids, _, reason in partial] == [("a", 6, "abort"), ("queued", 0, "abort")]
    _, ids, lps, _ = partial[0]
    assert len(lps) == 6 and all(lp <= 0 for lp in lps)
    assert [r.key for r in s.rows] == ["b"] and not s.queue
    while s.busy:
        s.step()
    # the same row alone, same seed: the aborted row's tokens are the start of what it would have sampled
    alone = _stream(model, chat)
    alone.submit("a", prompt, 24)
    out = []
    while alone.busy:
        out += alone.step()
    assert out[0][1][:6] == ids
    assert s.abort() == []


@pytest.fixture(scope="module")
def server(warm_model_dir, tmp_path_factory):
    """Paced at ≥ 10 ms a token, so an abort sent after 1 s lands mid-generation (unpaced, the tiny model
    decodes 600 tokens in ~0.8 s and the abort would race it)."""
    proc, url = start_test_server(warm_model_dir, log_path=tmp_path_factory.mktemp("sglang") / "server.log",
                                  step_delay=0.01)
    yield url
    stop_server(proc)


def _long_body(chat, n=600):
    prompt = chat.prompt_ids([{"role": "user", "content": "Count."}])
    return {"input_ids": prompt, "return_logprob": True,
            "sampling_params": {"temperature": 3.0, "max_new_tokens": n, "stop_token_ids": [NEVER], "ignore_eos": True}}


def test_test_server_honours_abort_all_with_the_partial_output(server, chat):
    got: dict = {}
    t = threading.Thread(target=lambda: got.update(httpx.post(f"{server}/generate", json=_long_body(chat),
                                                              timeout=120).json()))
    t.start()
    time.sleep(1.0)
    r = httpx.post(f"{server}/abort_request", json={"rid": "", "abort_all": True})
    assert r.status_code == 200
    t.join(60)
    meta = got["meta_info"]
    assert meta["finish_reason"]["type"] == "abort"
    assert 0 < meta["completion_tokens"] < 600
    assert len(meta["output_token_logprobs"]) == meta["completion_tokens"] == len(got["output_ids"])
    # an abort applies to requests that arrived before it: the next one runs to its end
    after = httpx.post(f"{server}/generate", json=_long_body(chat, 5), timeout=120).json()
    assert after["meta_info"]["finish_reason"]["type"] in ("stop", "length")
    assert httpx.get(f"{server}/get_server_info").json()["aborted_requests"] >= 1


def test_test_server_aborts_one_request_by_rid(server, chat):
    got: dict = {}
    bodies = {"x": {**_long_body(chat), "rid": "x"}, "y": {**_long_body(chat, 40), "rid": "y"}}
    threads = [threading.Thread(target=lambda k=k: got.update({k: httpx.post(f"{server}/generate", json=bodies[k],
                                                                             timeout=120).json()}))
               for k in bodies]
    for t in threads:
        t.start()
    time.sleep(1.0)
    httpx.post(f"{server}/abort_request", json={"rid": "x"})
    for t in threads:
        t.join(60)
    assert got["x"]["meta_info"]["finish_reason"]["type"] == "abort"
    assert got["y"]["meta_info"]["finish_reason"]["type"] in ("stop", "length")


def test_sglang_stream_abort_calls_the_server_and_returns_partial_turns(server, warm_model_dir, chat):
    eng = _to_budget(make_engine(EngineConfig(kind="sglang", server_urls=[server], temperature=3.0, max_retries=0),
                                 warm_model_dir, NEVER, 0))
    try:
        prompt = chat.prompt_ids([{"role": "user", "content": "Count."}])
        s = eng.stream(seed=0)
        s.submit("short", prompt, 3)
        for k in range(3):
            s.submit(f"long{k}", prompt, 600)
        finished = []
        while not finished:
            finished = s.step()
        assert [(k, len(ids), reason) for k, ids, _, reason in finished] == [("short", 3, "length")]
        time.sleep(0.5)
        aborted = sorted(s.abort())
        assert [k for k, *_ in aborted] == ["long0", "long1", "long2"] and not s.busy
        for _, ids, lps, reason in aborted:
            assert reason == "abort" and len(ids) == len(lps) < 600 and all(lp <= 0 for lp in lps)
        assert eng.generate([GenRequest(prompt, 2)], seed=0)[0].finish_reason == "length"  # the server still serves
    finally:
        eng.close()


class _Box:
    """A sandbox double (no tool call is expected: the turns are random tokens)."""

    def run(self, code, setup=None):
        raise AssertionError("no tool call expected")


def test_partial_rollout_over_the_sglang_engine_aborts_on_the_server_and_resumes_the_cut_turns(server, warm_model_dir,
                                                                                               chat):
    """Turns of 48 tokens (no end-of-turn id can be sampled). Step 1: a carried group with 40 ids of each turn
    already sampled (version 0) needs 8 more and passes (rewards 0, 1) = the target, while the fresh group's rows,
    48 tokens to go, are aborted on the server (its counter moves by 2) and carried with version 1. Step 2 resumes
    them through HTTP to 48 tokens: versions 1 for the carried ids, 2 for the rest."""
    from tasks.rollout.config import PartialConfig, RolloutConfig
    from tasks.rollout.machine import Rollout
    from tasks.rollout.partial import Group, PartialRollout
    from tasks.rollout.types import Carry, PromptItem, State

    eng = _to_budget(make_engine(EngineConfig(kind="sglang", server_urls=[server], temperature=3.0, max_retries=0),
                                 warm_model_dir, NEVER, 0))
    try:
        runner = Rollout(RolloutConfig(n_samples=2, max_turns=1, max_new_tokens=48, max_response_tokens=48), eng,
                         chat, _Box())
        item = {p: PromptItem(p, [{"role": "user", "content": f"Count {p}."}], "math", "4") for p in ("old", "new")}
        old = Group(item["old"], [runner.new_trajectory(item["old"], 0, 0, k) for k in range(2)])
        for t in old.trajs:
            t.carry = Carry(list(range(100, 140)), [-0.5] * 40, [0] * 40)
        fresh = [item["new"]]
        take = lambda n, exclude: [fresh.pop()] if fresh else []
        driver = PartialRollout(runner, PartialConfig(enabled=True, over_sampling=2), 1, lambda t: float(t.sample_idx))
        aborted_before = httpx.get(f"{server}/get_server_info").json()["aborted_requests"]
        r1 = driver.run([old], take, 0, 1)
        assert [g.key for g in r1.batch] == ["old"] and [g.key for g in r1.buffer] == ["new"]
        for t in r1.batch[0].trajs:
            assert t.state is State.TERMINATED and len(t.response_ids) == 48
            assert t.response_ids[:40] == list(range(100, 140)) and t.logprobs[:40] == [-0.5] * 40
            assert t.versions == [0] * 40 + [1] * 8
        assert r1.counts["aborted_requests"] == 2
        assert httpx.get(f"{server}/get_server_info").json()["aborted_requests"] - aborted_before == 2
        cut = [len(t.carry.ids) if t.carry else 0 for t in r1.buffer[0].trajs]
        assert all(n < 48 for n in cut) and r1.counts["aborted_tokens"] == sum(cut)
        for t in r1.buffer[0].trajs:
            assert t.state is State.GENERATING and t.response_ids == []
            assert t.carry is None or (t.carry.versions == [1] * len(t.carry.ids) == [1] * len(t.carry.logprobs))

        r2 = driver.run(r1.buffer, take, 0, 2)
        assert [g.key for g in r2.batch] == ["new"] and r2.buffer == [] and r2.counts["aborted_requests"] == 0
        for t, n in zip(r2.batch[0].trajs, cut):
            assert len(t.response_ids) == 48 and t.versions == [1] * n + [2] * (48 - n)
    finally:
        eng.close()


def test_a_negative_step_delay_is_refused_before_the_model_loads(warm_model_dir):
    from models.sglang_test_server import Backend

    with pytest.raises(ValueError, match="step_delay must be >= 0 seconds, got -0.5"):
        Backend(str(warm_model_dir), step_delay=-0.5)
