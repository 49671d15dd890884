"""``flows.bench_decode``'s all-forwards bound: the prefill shapes it records are the prefill forwards the stream ran
(hand-counted on a tiny random Qwen2, and against the engine's own counters on a tiny rollout), and its report
prints both ratios (rollout / decode bound, rollout / all-forwards bound); ``compile_gain`` times a compiled decode
forward beside the eager one (here with dynamo's ``eager`` backend: the same kernels, so the logits agree exactly)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from flows.bench_decode import bench_decode, compile_gain, prefill_bound, record_prefills
from models.decode import DecodeStream

EOS, PAD, VOCAB = 1, 0, 48
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def model():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                      eos_token_id=EOS, pad_token_id=PAD, tie_word_embeddings=True)
    return Qwen2ForCausalLM(cfg).eval()


def _drain(stream: DecodeStream) -> dict:
    done = {}
    while stream.busy:
        for key, ids, _, _ in stream.step():
            done[key] = ids
    return done


def test_recorded_prefills_are_the_streams_prefill_forwards(model):
    stream = record_prefills(DecodeStream(model, EOS, PAD, max_batch=8, seed=0, keep_prefix=True,
                                          kv_cache="preallocated", lean_decode=True))
    stream.shapes = []
    a, b = [5, 6, 7, 8, 9], [10, 11, 12]
    stream.submit("a", a, 4)
    stream.submit("b", b, 4)
    out = _drain(stream)
    assert stream.prefills == [(2, 5, 0, 8)], "both prompts in one forward: 2 rows x 5 (b left-padded), 8 fed"
    stream.submit("a", a + out["a"] + [7, 8], 4)
    _drain(stream)
    reused = len(a) + len(out["a"]) - 1  # all but the last sampled token come from the cache
    assert stream.prefills[1] == (1, 3, reused, 3), "the last sampled token and the two new ones on the prefix"
    assert stream.stats["forwards"] - len(stream.shapes) == 2 == len(stream.prefills)
    assert stream.stats["prefill_tokens"] == 11 == sum(p[3] for p in stream.prefills)
    assert stream.stats["row_tokens"] - sum(n for n, _ in stream.shapes) == 2 * 5 + 1 * 3
    timed = prefill_bound(model, stream.prefills)
    assert (timed["forwards"], timed["tokens"]) == (2, 13)
    assert timed["wall_s"] > 0 and timed["cpu_s"] > 0


def test_a_tiny_rollout_reports_both_ratios_over_its_real_prefills(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    lines: list[str] = []
    out = bench_decode(str(ROOT / "assets" / "tiny-warm"), n_prompts=1, samples=2, repeats=1, echo=lines.append)
    run = out["runs"]["base"][0]
    decode_rows = sum(n for n, _ in run["shapes"])
    assert len(run["prefills"]) == run["stats"]["forwards"] - len(run["shapes"]) > 0
    assert sum(p[3] for p in run["prefills"]) == run["stats"]["prefill_tokens"]
    assert sum(n * s for n, s, _, _ in run["prefills"]) == run["stats"]["row_tokens"] - decode_rows
    assert run["prefills"][0][2] == 0, "the first prefill has no cache"
    summary = lines[-1]
    assert "rollout / the forward bound at its widths: cpu x" in summary
    assert "rollout / the all-forwards bound (decode and prefill forwards): cpu x" in summary
    side = out["sides"]["base"]
    assert side["all_ratio_cpu"] > side["bound_cpu_s"] / side["cpu_s"], "the prefill forwards add to the bound"
    assert side["all_ratio_cpu"] == pytest.approx((side["bound_cpu_s"] + side["prefill_cpu_s"]) / side["cpu_s"])


def test_compile_gain_times_the_compiled_forward_beside_the_eager_one(model):
    lines: list[str] = []
    out = compile_gain(model, [(3, 4), (2, 6), (3, 5)], repeats=1, backend="eager", echo=lines.append)
    assert out["logit_diff"] == 0.0, "dynamo's eager backend runs the same kernels: the same logits"
    assert out["eager_cpu_s"] > 0 and out["compiled_cpu_s"] > 0
    assert out["gain"] == pytest.approx(out["eager_cpu_s"] / out["compiled_cpu_s"])
    assert "torch.compile (eager) of the decode forward at 3 shapes" in lines[0]


def _recording_forward(events: list):
    """A decode / prefill forward that does what the real one does with its inputs and cache on a device without
    kernels (``meta``): writes each layer's new keys into the cache on the inputs' device, and records the devices
    it saw (a CPU cache or input beside the model's device raises in ``cache.update``)."""
    def forward(model, ids, pos, attn, cache, attention):
        cfg = model.config
        seen = {t.device.type for t in (ids, pos, attn)}
        n, s = ids.shape
        for layer in range(cfg.num_hidden_layers):
            k = torch.zeros(n, cfg.num_key_value_heads, s, cfg.hidden_size // cfg.num_attention_heads, device=ids.device)
            seen.add(cache.update(k, k, layer)[0].device.type)
        events.append(("forward", seen))
        return torch.zeros(n, s, cfg.vocab_size, device=ids.device)

    return forward


def test_the_bounds_run_on_the_models_device_and_synchronise_around_the_clock(model, monkeypatch):
    """Both bounds on a model on another device (``meta`` here, CUDA on a GPU): caches and inputs on that device,
    and the device synchronised before the clock starts and before it is read (else a GPU figure times kernel
    launches)."""
    from flows import bench_decode

    events: list = []
    monkeypatch.setattr(bench_decode, "synchronize", lambda device: events.append(("sync", device.type)))
    meta = type(model)(model.config).to("meta").eval()
    bench_decode.bound(meta, [(3, 4), (2, 6)], _recording_forward(events))
    assert events == [("sync", "meta"), ("forward", {"meta"}), ("forward", {"meta"}), ("sync", "meta")]
    events.clear()
    bench_decode.prefill_bound(meta, [(2, 5, 0, 8), (1, 3, 4, 3)], _recording_forward(events))
    assert events == [("sync", "meta"), ("forward", {"meta"}), ("forward", {"meta"}), ("sync", "meta")]
