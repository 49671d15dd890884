"""The ``sglang`` HTTP engine against the CPU test server (same JSON contract as SGLang), and an RL step through it.

The server (``models.sglang_test_server``) runs the tiny model in its own process group on a
free loopback port, started once per module and stopped by its process-group id.
"""

from __future__ import annotations

import duckdb
import httpx
import pytest

from models.config import EngineConfig
from models.engine import GenRequest, make_engine
from models.sglang_engine import EngineError, SGLangEngine, wait_healthy
from models.sglang_test_server import free_port, start_test_server, stop_server


@pytest.fixture(scope="module")
def server(warm_model_dir, tmp_path_factory):
    proc, url = start_test_server(warm_model_dir, log_path=tmp_path_factory.mktemp("sglang") / "server.log")
    yield url
    stop_server(proc)


@pytest.fixture(scope="module")
def engine(server, warm_model_dir, chat):
    eng = make_engine(EngineConfig(kind="sglang", server_urls=[server], max_retries=1), warm_model_dir, chat.eos_id, 0)
    yield eng
    eng.close()


def test_registry_builds_the_http_engine(engine):
    assert isinstance(engine, SGLangEngine)


def test_generate_honours_budgets_logprobs_and_end_of_turn(engine, chat):
    prompt = chat.prompt_ids([{"role": "user", "content": "What is 2 + 3?"}])
    reqs = [GenRequest(prompt, 4), GenRequest(prompt + chat.encode("Sure"), 24), GenRequest(prompt, 1)]
    outs = engine.generate(reqs, seed=0)
    assert len(outs) == 3
    for req, out in zip(reqs, outs):
        assert len(out.token_ids) == len(out.logprobs) >= 1
        assert all(lp <= 0.0 for lp in out.logprobs)
        assert len(out.token_ids) <= req.max_new_tokens
        if out.finish_reason == "stop":
            assert out.token_ids[-1] == chat.eos_id
        else:
            assert len(out.token_ids) == req.max_new_tokens and chat.eos_id not in out.token_ids


def test_a_stop_without_the_end_of_turn_id_returns_only_sampled_ids(engine, chat):
    """A stop string or another eos id ended the turn: no end-of-turn id with log-prob 0 is invented
    (it would be trained as a policy token); the rollout closes such a turn with an untrained one."""
    ids = chat.encode("Go. <tool_call>") + [chat.tokenizer.convert_tokens_to_ids("<|endoftext|>")]
    data = {"meta_info": {"finish_reason": {"type": "stop", "matched": ids[-1]},
                          "output_token_logprobs": [[-0.5, t, None] for t in ids]}}
    out = engine._parse(data, GenRequest([1, 2], 64), "http://server")
    assert out.token_ids == ids and out.logprobs == [-0.5] * len(ids) and out.finish_reason == "stop"


def test_requests_are_concurrent_so_the_server_batches_them(engine, server, chat):
    prompt = chat.prompt_ids([{"role": "user", "content": "What is 7 * 8?"}])
    engine.generate([GenRequest(prompt, 8) for _ in range(12)], seed=1)
    info = httpx.get(f"{server}/get_server_info").json()
    assert info["max_batch_seen"] > 1


def test_wire_format_is_sglang_native(engine, chat):
    body = engine.payload(GenRequest([1, 2, 3], 5))
    assert body["input_ids"] == [1, 2, 3] and body["return_logprob"] is True
    params = body["sampling_params"]
    assert params["max_new_tokens"] == 5 and params["stop_token_ids"] == [chat.eos_id]
    assert params["temperature"] == 1.0 and params["top_p"] == 1.0


def test_load_weights_updates_every_server(engine, server, warm_model_dir, tmp_path):
    copy = tmp_path / "policy_copy"
    copy.mkdir()
    for f in warm_model_dir.iterdir():
        if f.is_file():
            (copy / f.name).write_bytes(f.read_bytes())
    engine.load_weights(copy)
    assert httpx.get(f"{server}/get_model_info").json()["model_path"] == str(copy)
    engine.load_weights(warm_model_dir)
    assert httpx.get(f"{server}/get_model_info").json()["model_path"] == str(warm_model_dir)


def test_an_adapter_checkpoint_is_served_as_merged_weights(engine, server, warm_model_dir, tmp_path):
    from tests.test_lora import _adapter

    adapter = _adapter(warm_model_dir, tmp_path / "policy_000003", 0)
    engine.load_weights(adapter)
    merged = tmp_path / "policy_000003-merged"
    assert httpx.get(f"{server}/get_model_info").json()["model_path"] == str(merged)
    assert (merged / "model.safetensors").exists() and not (merged / "adapter_config.json").exists()
    engine.load_weights(warm_model_dir)


def test_pruning_a_checkpoint_removes_its_merged_copy_and_keeps_the_current_one(tmp_path):
    from flows.train import RunInfo, _prune

    ckpts = tmp_path / "checkpoints"
    for name in ["policy_000001", "policy_000001-merged", "policy_000002", "policy_000002-merged", "policy_000003"]:
        (ckpts / name).mkdir(parents=True)
    _prune(RunInfo("r", str(tmp_path), "m", "start"), 1, ckpts / "policy_000003")
    assert sorted(p.name for p in ckpts.iterdir()) == ["policy_000003"]


def test_bad_checkpoint_is_an_error_naming_the_server(engine, server, tmp_path):
    with pytest.raises(EngineError, match=f"{server}/update_weights_from_disk"):
        engine.load_weights(tmp_path / "does-not-exist")


def test_unreachable_server_fails_health_wait_with_its_url(warm_model_dir):
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(EngineError, match=url):
        wait_healthy(url, timeout_s=0.5)
    with pytest.raises(ValueError, match="engine.server_urls"):
        make_engine(EngineConfig(kind="sglang"), warm_model_dir, 0, 0)


def test_5xx_is_retried_then_raised_never_an_empty_turn(engine, server):
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(str(request.url))
        return httpx.Response(503, text="overloaded")

    real = engine.client
    engine.client = httpx.Client(transport=httpx.MockTransport(handler))
    try:
        with pytest.raises(EngineError, match="HTTP 503"):
            engine.generate([GenRequest([1, 2, 3], 4)], seed=0)
    finally:
        engine.client.close()
        engine.client = real
    assert len(calls) == engine.cfg.max_retries + 1 and all(c.startswith(server) for c in calls)


def test_connection_refused_is_retried_on_the_next_url(engine, chat):
    dead = f"http://127.0.0.1:{free_port()}"
    live = engine.urls
    engine.urls = [dead, *live]
    try:
        prompt = chat.prompt_ids([{"role": "user", "content": "1 + 1?"}])
        outs = engine.generate([GenRequest(prompt, 3) for _ in range(4)], seed=0)
        assert all(out.token_ids for out in outs)
        engine.urls = [dead]
        with pytest.raises(EngineError, match=dead):
            engine.generate([GenRequest(prompt, 3)], seed=0)
    finally:
        engine.urls = live


@pytest.mark.slow
def test_rl_step_through_http_fills_the_stores(prefect_harness, server, warm_model_dir, tmp_path):
    from flows.train import train

    overrides = [
        f"model.path={warm_model_dir}", f"output_dir={tmp_path / 'runs'}",
        f"data.train_path={tmp_path / 'train.parquet'}", f"data.eval_path={tmp_path / 'eval.parquet'}",
        "data.n_train=16", "data.n_eval=4", "data.prompts_per_step=2", "rollout.n_samples=2",
        "rollout.max_new_tokens=32", "rollout.max_response_tokens=128", "train.steps=2", "train.eval_every=0",
        "data.refill_rounds=0",
        "engine.kind=sglang", f"engine.server_urls=[{server}]",
        f"tracking.mlflow_uri=sqlite:///{tmp_path / 'mlflow.db'}", f"tracking.artifact_root={tmp_path / 'mlartifacts'}",
        f"tracking.duckdb_path={tmp_path / 'cleaner.duckdb'}",
    ]
    result = train("configs/tiny.yaml", overrides, "httpstep")
    con = duckdb.connect(str(tmp_path / "cleaner.duckdb"), read_only=True)
    try:
        n = con.execute("SELECT count(*) FROM trajectories WHERE run_id = 'httpstep' AND step = 0").fetchone()[0]
        assert n >= 4 and n % 2 == 0, "2 prompts x 2 samples (plus any DAPO refill groups)"
        steps = con.execute("SELECT DISTINCT step FROM steps WHERE run_id = 'httpstep'").fetchall()
        assert {r[0] for r in steps} == {0, 1}
    finally:
        con.close()
    served = httpx.get(f"{server}/get_model_info").json()["model_path"]
    assert served.endswith("policy_000001"), "step 1 must roll out with the weights synced after step 0"
    assert result["final_checkpoint"].endswith("policy_000002")


@pytest.mark.slow
def test_benchmark_reports_both_engines_and_the_ratio(warm_model_dir, tmp_path):
    from tasks.training.bench_engines import bench_engines

    lines: list[str] = []
    res = bench_engines(warm_model_dir, tmp_path / "bench", steps=2, prompts=2, n_samples=2, max_new_tokens=16,
                        echo=lines.append)
    for kind in ("transformers", "sglang"):
        assert len(res[kind]["steps_s"]) == 2 and res[kind]["generated_tokens"] > 0
    assert res["ratio_step"] == pytest.approx(res["sglang"]["step_s"] / res["transformers"]["step_s"])
    assert lines[-1].startswith("HTTP / in-process: step") and "bar: step <= 1.3x" in lines[-1]
