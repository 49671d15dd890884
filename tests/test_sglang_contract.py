"""SGLang's contract, checked with SGLang's own code: the client's requests and the CPU test server's answers.

From the wheel of the release ``requirements-gpu.lock`` pins (``tests.sglang_wheel.PINNED``, 0.5.14): its
``SamplingParams`` (what the server builds from every request's ``sampling_params``: unknown keys raise), the
fields of ``GenerateReqInput`` / ``AbortReq``, its finish-reason classes (``FINISH_MATCHED_TOKEN`` …, whose
``to_json`` is the answer's ``finish_reason``), its stop-id rule (``Req._check_token_based_finish``) and the eos ids
it derives from a model (``ModelConfig._get_hf_eos_token_id``); from a release that ships generated JSON types
(``TYPES``, 0.5.23: ``sglang/api/v1/api_types.py``, msgspec) ``GenerateRequest``, ``AbortRequest`` and
``GenerateResponse``, which decode every body here.

The server runs a copy of the tiny model whose ``generation_config.json`` lists two eos ids, as Qwen's does: the end
of turn and a token the model emits greedily on the third position (``OTHER``), so greedy turns reach "stopped on
another eos" for certain. Over HTTP the pipeline is checked on each path: another eos (the rollout closes the turn
with an untrained end-of-turn id), a stop string, ``/health`` 503 while starting (the engine waits; a shorter wait is
an error naming the URL), and an abort it did not ask for (retried, never a cut turn).
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from types import SimpleNamespace

import httpx
import pytest

from models.config import EngineConfig
from models.engine import GenRequest
from models.sglang_engine import EngineError, SGLangEngine
from models.sglang_test_server import start_test_server, stop_server
from tests.sglang_wheel import PINNED, TYPES, definitions, fields, module, sglang_sources

QUESTION = [{"role": "user", "content": "What is 2 + 3?"}]
BUDGET = 10


@pytest.fixture(scope="module")
def own():
    """The pinned release's own code (see module docstring)."""
    finish = definitions(PINNED, "sglang/srt/managers/schedule_batch.py",
                         ["BaseFinishReason", "FINISH_MATCHED_TOKEN", "FINISH_MATCHED_STR", "FINISH_LENGTH",
                          "FINISH_ABORT", "Req._check_token_based_finish"])
    eos = definitions(PINNED, "sglang/srt/configs/model_config.py", ["ModelConfig._get_hf_eos_token_id"])
    params = module(PINNED, "sglang/srt/sampling/sampling_params.py", f"sglang_{PINNED}_sampling_params")
    return SimpleNamespace(**{k: finish[k] for k in ("FINISH_MATCHED_TOKEN", "FINISH_MATCHED_STR", "FINISH_LENGTH",
                                                      "FINISH_ABORT")},
                           token_finish=finish["_check_token_based_finish"], hf_eos=eos["_get_hf_eos_token_id"],
                           SamplingParams=params.SamplingParams)


@pytest.fixture(scope="module")
def types():
    return module(TYPES, "sglang/api/v1/api_types.py", f"sglang_{TYPES}_api_types")


@pytest.fixture(scope="module")
def prompt(chat):
    return chat.prompt_ids(chat.messages(QUESTION))


@pytest.fixture(scope="module")
def two_eos(warm_model_dir, tmp_path_factory, chat, prompt):
    """(model folder, the other eos id): the tiny model with ``generation_config.eos_token_id`` = [end of turn, the
    token it emits greedily third]."""
    from models.decode import DecodeStream
    from models.engine import load_causal_lm

    stream = DecodeStream(load_causal_lm(warm_model_dir), -2, 0, 0.0, 1.0, 1, 0)
    stream.submit("q", prompt, 3)
    done = []
    while stream.busy:
        done += stream.step()
    [(_, greedy, _, _)] = done
    assert greedy[2] not in (chat.eos_id, *greedy[:2]), greedy
    folder = tmp_path_factory.mktemp("two-eos") / "model"
    shutil.copytree(warm_model_dir, folder)
    gen = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps({**gen, "eos_token_id": [chat.eos_id, greedy[2]]}))
    return folder, greedy[2]


@pytest.fixture(scope="module")
def server(two_eos, tmp_path_factory):
    """(url, the /health statuses seen from launch until it served): listens at once, 503 for ≥ 1.5 s."""
    proc, url = start_test_server(two_eos[0], log_path=tmp_path_factory.mktemp("sglang") / "server.log",
                                  step_delay=0.01, start_delay=1.5, wait=False)
    statuses, deadline = [], time.monotonic() + 120
    try:
        while not statuses or statuses[-1] != 200:
            assert time.monotonic() < deadline and proc.poll() is None, f"server never served: {statuses[-5:]}"
            try:
                statuses.append(httpx.get(f"{url}/health", timeout=5).status_code)
            except httpx.TransportError:
                statuses.append(None)  # not listening yet
            time.sleep(0.1)
        yield url, statuses
    finally:
        stop_server(proc)


def _generate(url: str, ids: list[int], **params) -> dict:
    body = {"input_ids": ids, "return_logprob": True, "sampling_params": {"temperature": 1e-5, **params}}
    return httpx.post(f"{url}/generate", json=body, timeout=120).json()


def _decoded(types, answer: dict) -> dict:
    """``answer``, once SGLang's ``GenerateResponse`` decoded it (it raises on a contract violation)."""
    decoded = types.GenerateResponse.from_json_value(answer)
    assert decoded.output_ids == answer["output_ids"] and decoded.meta_info.finish_reason is not None
    return answer


def test_health_answers_503_while_the_server_starts(server):
    _, statuses = server
    assert 503 in statuses and statuses[-1] == 200
    assert statuses.index(200) > statuses.index(503), "503 until it serves, as SGLang's /health while Starting"
    source = (sglang_sources(PINNED) / "sglang/srt/entrypoints/http_server.py").read_text()
    assert "server_status == ServerStatus.Starting:\n        return Response(status_code=503)" in source


def test_the_clients_requests_are_valid_for_sglangs_own_types(own, types, tokenizer):
    """Every body the client sends: built by SGLang's ``SamplingParams`` (and verified), within the fields of its
    ``GenerateReqInput`` / ``AbortReq`` / ``UpdateWeightFromDiskReqInput``, decoded by the generated types; a typo
    is refused by each (the checks bite)."""
    client = SimpleNamespace(cfg=EngineConfig(kind="sglang", stop=["</answer>", "\n\n"], temperature=0.7), eos_id=2)
    body = SGLangEngine.payload(client, GenRequest([5, 6, 7], 12))
    params = body["sampling_params"]
    sp = own.SamplingParams(**params)
    sp.verify(vocab_size=len(tokenizer))
    sp.normalize(tokenizer)
    assert (sp.max_new_tokens, sp.stop_token_ids, sp.stop_strs, sp.no_stop_trim) == (12, {2}, ["</answer>", "\n\n"], True)
    io = "sglang/srt/managers/io_struct.py"
    assert set(body) <= fields(PINNED, io, "GenerateReqInput")
    assert {"rid", "abort_all"} <= fields(PINNED, io, "AbortReq")
    assert "model_path" in fields(PINNED, io, "UpdateWeightFromDiskReqInput")
    decoded = types.GenerateRequest.from_json_value(body).to_json_value()
    assert decoded["input_ids"] == [5, 6, 7] and decoded["return_logprob"] is True
    assert {k: decoded["sampling_params"][k] for k in params} == params
    assert types.AbortRequest.from_json_value({"rid": "", "abort_all": True}).abort_all is True
    typo = {**params, "max_tokens": 12}
    with pytest.raises(TypeError):
        own.SamplingParams(**typo)
    with pytest.raises(types.JsonContractError):
        types.GenerateRequest.from_json_value({**body, "sampling_params": typo})


def test_the_server_stops_where_sglang_does(server, own, types, two_eos, prompt, chat, tokenizer):
    """Greedy turns of the two-eos model: ``ignore_eos`` runs to the budget; otherwise SGLang's own rule over those
    ids, with the eos ids it derives from the model, says where the turn stops and on which id — the other eos,
    third — and the server stops there (a budget of 3 ends on it as ``length``: SGLang checks length first); a stop
    string (the second token's
    text) stops after the first token whose text completes it, before any eos, ``ignore_eos`` or not."""
    url, _ = server
    folder, other = two_eos
    full = _decoded(types, _generate(url, prompt, max_new_tokens=BUDGET, ignore_eos=True))
    ids = full["output_ids"]
    assert len(ids) == BUDGET and full["meta_info"]["finish_reason"] == own.FINISH_LENGTH(length=BUDGET).to_json()
    assert [e[1] for e in full["meta_info"]["output_token_logprobs"]] == ids

    hf = SimpleNamespace(hf_config=SimpleNamespace(**json.loads((folder / "config.json").read_text())),
                         hf_generation_config=SimpleNamespace(**json.loads((folder / "generation_config.json").read_text())))
    req = SimpleNamespace(sampling_params=SimpleNamespace(ignore_eos=False, stop_token_ids={chat.eos_id}),
                          eos_token_ids=own.hf_eos(hf), tokenizer=SimpleNamespace(eos_token_id=tokenizer.eos_token_id,
                                                                                  additional_stop_token_ids=None),
                          output_ids=[], finished_reason=None, finished_len=None)
    assert req.eos_token_ids == {chat.eos_id, other}
    for token in ids:
        req.output_ids.append(token)
        if own.token_finish(req, [token]):
            break
    assert req.finished_len == 3 and req.finished_reason.matched == other, "SGLang stops on the other eos, third"
    stopped = _decoded(types, _generate(url, prompt, max_new_tokens=BUDGET, stop_token_ids=[chat.eos_id]))
    assert stopped["output_ids"] == ids[:3]
    assert stopped["meta_info"]["finish_reason"] == req.finished_reason.to_json() == {"type": "stop", "matched": other}

    at_budget = _decoded(types, _generate(url, prompt, max_new_tokens=3))
    assert at_budget["output_ids"] == ids[:3], "the other eos is the budget's last token"
    assert at_budget["meta_info"]["finish_reason"] == own.FINISH_LENGTH(length=3).to_json(), "SGLang checks length first"

    text = tokenizer.decode(ids[1:2])
    assert text and text not in tokenizer.decode(ids[:1])
    for ignore in (False, True):
        cut = _decoded(types, _generate(url, prompt, max_new_tokens=BUDGET, stop=[text], ignore_eos=ignore))
        assert cut["output_ids"] == ids[:2]
        assert cut["meta_info"]["finish_reason"] == own.FINISH_MATCHED_STR(matched=text).to_json()


def test_aborts_answer_as_sglang_does(server, own, types, prompt):
    """``abort_all`` with one request running and one waiting behind it: the running one answers SGLang's
    ``FINISH_ABORT()`` with what it sampled, the waiting one the tokenizer manager's "Abort in waiting queue" with
    nothing; both decode."""
    url, _ = server
    got: dict = {}
    runs = [threading.Thread(target=lambda k=k: got.update({k: _generate(url, prompt, max_new_tokens=400,
                                                                         ignore_eos=True)})) for k in ("run", "wait")]
    runs[0].start()
    time.sleep(0.5)
    runs[1].start()
    time.sleep(0.5)
    assert httpx.post(f"{url}/abort_request", json={"rid": "", "abort_all": True}).status_code == 200
    for t in runs:
        t.join(60)
    running, waiting = (_decoded(types, got[k]) for k in ("run", "wait"))
    assert running["meta_info"]["finish_reason"] == own.FINISH_ABORT().to_json()
    assert 0 < len(running["output_ids"]) == running["meta_info"]["completion_tokens"] < 400
    assert waiting["meta_info"]["finish_reason"] == {"type": "abort", "message": "Abort in waiting queue"}
    assert waiting["output_ids"] == []
    source = (sglang_sources(PINNED) / "sglang/srt/managers/tokenizer_manager.py").read_text()
    assert 'recv_obj.abort_message or "Abort in waiting queue"' in source


def _engine(url: str, **cfg) -> SGLangEngine:
    return SGLangEngine(EngineConfig(kind="sglang", server_urls=[url], temperature=1e-5, **cfg), "m", 2, 0)


def test_a_turn_stopped_on_another_eos_is_closed_with_an_untrained_end_of_turn(server, chat, prompt, two_eos):
    """Through the rollout over HTTP: the turn's ids are the three sampled (the last the other eos, trained), then
    the end-of-turn id the policy never sampled, mask 0 and log-prob 0, so the next context is well formed."""
    from tasks.rollout.config import RolloutConfig
    from tasks.rollout.machine import Rollout
    from tasks.rollout.types import PromptItem

    url, _ = server
    eng = _engine(url)
    try:
        runner = Rollout(RolloutConfig(n_samples=1, max_turns=1, max_new_tokens=BUDGET, max_response_tokens=64),
                         eng, chat, None)
        [t] = runner.run([PromptItem("q", QUESTION, "math", "5")], seed=0, step=0, progress=False)
    finally:
        eng.close()
    assert t.prompt_ids == prompt
    assert len(t.response_ids) == 4 and t.response_ids[2] == two_eos[1] and t.response_ids[3] == chat.eos_id
    assert t.response_mask == [1, 1, 1, 0] and t.logprobs[3] == 0.0 and all(lp <= 0 for lp in t.logprobs[:3])
    assert t.finish_reason == "stop"


def test_the_engine_on_stop_strings_starting_servers_and_foreign_aborts(server, prompt, tokenizer):
    """A stop string ends the turn where the server matched it (finish ``stop``, ids as sampled); an engine made
    while its server starts waits for it, and one that gives up first names the URL and the 503; an abort the
    client did not ask for (another caller's ``abort_all``) is retried, never returned as a finished turn."""
    url, _ = server
    eng = _engine(url, stop=[tokenizer.decode(_generate(url, prompt, max_new_tokens=2)["output_ids"][1:2])])
    try:
        [out] = eng.generate([GenRequest(prompt, BUDGET)], seed=0)
        assert out.finish_reason == "stop" and len(out.token_ids) == len(out.logprobs) == 2
    finally:
        eng.close()

    proc, late = start_test_server(server_model(url), start_delay=3.0, wait=False)
    try:
        deadline = time.monotonic() + 120
        while _status(late) != 503:  # listening, the model loaded, 3 s of starting ahead
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        with pytest.raises(EngineError, match=f"{late} not healthy after 1s \\(HTTP 503\\)"):
            _engine(late, health_timeout_s=1.0)
        _engine(late, health_timeout_s=120.0).close()
        assert _status(late) == 200
    finally:
        stop_server(proc)

    eng = _engine(url, max_retries=2)
    plain = eng.payload
    eng.payload = lambda req: {**plain(req), "sampling_params": {**plain(req)["sampling_params"], "ignore_eos": True}}
    try:
        before = httpx.get(f"{url}/get_server_info").json()["aborted_requests"]
        threading.Timer(0.5, lambda: httpx.post(f"{url}/abort_request", json={"rid": "", "abort_all": True})).start()
        [out] = eng.generate([GenRequest(prompt, 200)], seed=0)
        assert out.finish_reason in ("stop", "length") and out.token_ids
        assert httpx.get(f"{url}/get_server_info").json()["aborted_requests"] == before + 1
    finally:
        eng.close()


def server_model(url: str) -> str:
    return httpx.get(f"{url}/get_model_info").json()["model_path"]


def _status(url: str) -> int | None:
    try:
        return httpx.get(f"{url}/health", timeout=5).status_code
    except httpx.TransportError:
        return None


def test_the_score_request_is_valid_for_sglangs_own_types(own, types, tokenizer):
    """``SGLangEngine.score``'s body: its sampling params built (and verified) by SGLang's ``SamplingParams`` — one
    greedy token, what a prefill needs at least — its fields within ``GenerateReqInput``, decoded by the types."""
    body = SGLangEngine.score_payload([5, 6, 7], [8, 9])
    sp = own.SamplingParams(**body["sampling_params"])
    sp.verify(vocab_size=len(tokenizer))
    assert (sp.max_new_tokens, sp.top_k) == (1, 1), "temperature 0: SGLang samples greedily (top_k 1)"
    assert set(body) <= fields(PINNED, "sglang/srt/managers/io_struct.py", "GenerateReqInput")
    decoded = types.GenerateRequest.from_json_value(body).to_json_value()
    assert decoded["input_ids"] == [5, 6, 7, 8, 9] and decoded["logprob_start_len"] == 2
    with pytest.raises(ValueError, match="non-empty"):
        SGLangEngine.score_payload([5], [])


def test_input_logprobs_answer_as_sglang_builds_them(server, types, prompt, warm_model_dir):
    """``logprob_start_len`` = s: SGLang's own ``_process_input_token_logprobs`` turns the prefill's log-probs
    (position k's logits score id k + 1; the last scores the sampled token) into entries for ids s.., the first
    ``None``; the server answers those entries (raw logits, temperature 1) and the engine's ``score`` reads the
    response's from them — the in-process model's own log-probs. A start past the input is SGLang's 400."""
    from models.engine import load_causal_lm, token_logprobs

    url, _ = server
    ids, start = prompt + [11, 12, 13], len(prompt) - 1
    answer = _decoded(types, httpx.post(f"{url}/generate", json=SGLangEngine.score_payload(prompt, [11, 12, 13]),
                                        timeout=120).json())
    model = load_causal_lm(warm_model_dir)
    prefill = token_logprobs(model, ids, start + 1) + [-0.5]  # SGLang's last entry: the sampled token's, dropped
    process = definitions(PINNED, "sglang/srt/managers/scheduler_components/logprob_result_processor.py",
                          ["SchedulerLogprobResultProcessor._process_input_token_logprobs"])
    req = SimpleNamespace(logprob=SimpleNamespace(), origin_input_ids=ids, logprob_start_len=start)
    me = SimpleNamespace(_is_multi_item_scoring=lambda r: False, model_config=SimpleNamespace(vocab_size=10**6))
    process["_process_input_token_logprobs"](me, req, prefill)
    entries = answer["meta_info"]["input_token_logprobs"]
    assert [e[1] for e in entries] == req.logprob.input_token_logprobs_idx == ids[start:]
    assert entries[0][0] is None and req.logprob.input_token_logprobs_val[0] is None
    assert [e[0] for e in entries[1:]] == pytest.approx(req.logprob.input_token_logprobs_val[1:], abs=1e-5)
    eng = SGLangEngine(EngineConfig(kind="sglang", server_urls=[url]), "m", 2, 0)
    try:
        assert eng.score(prompt, [11, 12, 13]) == [e[0] for e in entries[1:]]
        eng.cfg = eng.cfg.model_copy(update={"temperature": 0.7})
        with pytest.raises(EngineError, match="temperature"):
            eng.score(prompt, [11])
    finally:
        eng.close()
    bad = httpx.post(f"{url}/generate", json={"input_ids": [1, 2], "return_logprob": True, "logprob_start_len": 5,
                                              "sampling_params": {"max_new_tokens": 1}})
    assert bad.status_code == 400 and "logprob_start_len=5 is higher than" in bad.json()["error"]["message"]
    source = (sglang_sources(PINNED) / "sglang/srt/managers/scheduler.py").read_text()
    assert "is higher than the number of input tokens" in source
