"""Continuous batching (``models.decode.DecodeStream``) on a small random Qwen2 model.

The reference for every log-prob is a plain teacher-forced forward of the whole sequence
(no cache, no padding): if positions, masks or the spliced caches were wrong, they would differ.
"""

from __future__ import annotations

import random

import pytest
import torch

from models.decode import DecodeStream
from models.engine import EngineConfig, GenRequest, TransformersEngine

EOS, PAD, VOCAB = 1, 0, 48


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                      eos_token_id=EOS, pad_token_id=PAD, tie_word_embeddings=True)
    model = Qwen2ForCausalLM(cfg)
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)  # peaked next-token distributions, like a trained model's
    out = tmp_path_factory.mktemp("rand")
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def model(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir).eval()


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    r = random.Random(seed)
    return [[r.randint(2, VOCAB - 1) for _ in range(r.randint(3, 30))] for _ in range(n)]


def _teacher_forced(model, ids: list[int], out: list[int], temperature: float = 1.0) -> list[float]:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids + out])).logits[0].float() / temperature
    lp = torch.log_softmax(logits, -1)
    return [lp[len(ids) - 1 + j, t].item() for j, t in enumerate(out)]


def _drain(stream: DecodeStream, max_rows: list[int] | None = None) -> dict:
    done = {}
    while stream.busy:
        for key, ids, lps, reason in stream.step():
            done[key] = (ids, lps, reason)
        if max_rows is not None:
            max_rows.append(len(stream.rows))
    return done


def test_logprobs_match_teacher_forcing_and_rows_leave(model):
    prompts = _prompts(12)
    stream = DecodeStream(model, EOS, PAD, temperature=0.8, max_batch=5, seed=3)
    for i, p in enumerate(prompts):
        stream.submit(i, p, 5 + 3 * i)
    seen: list[int] = []
    done = _drain(stream, seen)
    assert sorted(done) == list(range(12)) and max(seen) <= 5
    for i, (ids, lps, reason) in done.items():
        assert reason == ("stop" if ids[-1] == EOS else "length")
        assert EOS not in ids[:-1] and len(ids) <= 5 + 3 * i
        assert reason == "stop" or len(ids) == 5 + 3 * i
        assert max(abs(a - b) for a, b in zip(lps, _teacher_forced(model, prompts[i], ids, 0.8))) < 1e-4
    generated = sum(len(v[0]) for v in done.values())
    assert stream.counters == {"generated": generated, "decode_slots": generated}, "no slot decodes padding"
    assert {r for _, _, r in done.values()} == {"stop", "length"}, "the draw should hit both ends"


def test_prefix_of_a_key_is_reused_for_its_next_turn(model):
    prompts = _prompts(4, seed=1)
    stream = DecodeStream(model, EOS, PAD, max_batch=8, seed=0, keep_prefix=True)
    for i, p in enumerate(prompts):
        stream.submit(i, p, 6)
    first = _drain(stream)
    reused_before = stream.stats["reused_tokens"]
    contexts = {i: prompts[i] + first[i][0] + [7, 8, 9] for i in range(4)}
    for i, ctx in contexts.items():
        stream.submit(i, ctx, 6)
    second = _drain(stream)
    fed = sum(len(prompts[i]) + len(first[i][0]) - 1 for i in range(4))
    assert stream.stats["reused_tokens"] - reused_before == fed, "all but the last sampled token come from cache"
    for i, (ids, lps, _) in second.items():
        assert max(abs(a - b) for a, b in zip(lps, _teacher_forced(model, contexts[i], ids))) < 1e-4
    stream.release(0)
    assert 0 not in stream.store and 1 in stream.store


def test_new_rows_join_beside_rows_that_reuse_a_prefix(model):
    prompts = _prompts(3, seed=4)
    stream = DecodeStream(model, EOS, PAD, max_batch=8, seed=0, keep_prefix=True)
    stream.submit("a", prompts[0], 6)
    first = _drain(stream)
    context = prompts[0] + first["a"][0] + [7, 8]
    stream.submit("a", context, 6)
    stream.submit("b", prompts[1], 6)
    stream.submit("c", prompts[2], 6)
    done = _drain(stream)
    assert sorted(done) == ["a", "b", "c"]
    for key, ids in (("a", context), ("b", prompts[1]), ("c", prompts[2])):
        assert max(abs(x - y) for x, y in zip(done[key][1], _teacher_forced(model, ids, done[key][0]))) < 1e-4


def test_a_rows_draw_does_not_depend_on_its_batch(model):
    prompts = _prompts(6, seed=2)
    alone = DecodeStream(model, EOS, PAD, max_batch=8, seed=5)
    alone.submit("x", prompts[0], 12)
    crowd = DecodeStream(model, EOS, PAD, max_batch=8, seed=5)
    for i, p in enumerate(prompts[1:]):
        crowd.submit(i, p, 20)
    crowd.step()
    crowd.submit("x", prompts[0], 12)
    assert _drain(alone)["x"][0] == _drain(crowd)["x"][0]


def test_tiny_top_p_is_greedy(model):
    prompts = _prompts(3, seed=4)
    stream = DecodeStream(model, EOS, PAD, top_p=1e-9, max_batch=8, seed=0)
    for i, p in enumerate(prompts):
        stream.submit(i, p, 6)
    for i, (ids, _, _) in _drain(stream).items():
        ctx = list(prompts[i])
        for tok in ids:
            with torch.no_grad():
                assert tok == int(model(input_ids=torch.tensor([ctx])).logits[0, -1].argmax())
            ctx.append(tok)


@pytest.mark.parametrize("batching", ["continuous", "static"])
def test_engine_honours_budgets_in_both_modes(model_dir, batching):
    engine = TransformersEngine(EngineConfig(batching=batching, max_batch=4), model_dir, EOS, PAD)
    reqs = [GenRequest(p, 3 + i) for i, p in enumerate(_prompts(7, seed=6))]
    outs = engine.generate(reqs, seed=1)
    for req, out in zip(reqs, outs):
        assert len(out.token_ids) == len(out.logprobs) <= req.max_new_tokens
        assert out.finish_reason == ("stop" if out.token_ids[-1] == EOS else "length")
        ref = _teacher_forced(engine.model, req.input_ids, out.token_ids)
        assert max(abs(a - b) for a, b in zip(out.logprobs, ref)) < 1e-4
    c = engine.counters
    assert c["generated"] == sum(len(o.token_ids) for o in outs)
    assert (c["decode_slots"] == c["generated"]) == (batching == "continuous")


def _turns(model, kv_cache: str, capacity: int | None = None) -> tuple[dict, dict, dict]:
    """Two turns per key with prefix reuse, rows leaving at different times, wide and narrow joiners."""
    stream = DecodeStream(model, EOS, PAD, temperature=0.9, max_batch=4, seed=7, keep_prefix=True, kv_cache=kv_cache)
    if capacity is not None:
        stream.kv.capacity = capacity
    prompts = _prompts(9, seed=8)
    for i, p in enumerate(prompts):
        stream.submit(i, p, 4 + 5 * (i % 3))
    first = _drain(stream)
    for i, p in enumerate(prompts):
        stream.submit(i, p + first[i][0] + [5, 6, 7], 9)
    second = _drain(stream)
    return first, second, {**stream.stats, **({"kv_moves": stream.kv.moves} if kv_cache == "preallocated" else {})}


@pytest.mark.parametrize("capacity", [None, 8])
def test_preallocated_cache_decodes_what_concatenation_decodes_bit_for_bit(model, capacity):
    """Same ids, same log-probs to the last bit, same prefix reuse; capacity 8 forces the window to move and the
    buffers to grow (a prompt of 30 ids already exceeds it)."""
    ref_first, ref_second, ref_stats = _turns(model, "concat")
    first, second, stats = _turns(model, "preallocated", capacity)
    assert first == ref_first and second == ref_second
    assert stats.pop("kv_moves") >= (2 if capacity else 0), "capacity 8 must make the window move"
    assert stats == ref_stats and stats["reused_tokens"] > 0
    assert {r for _, _, r in ref_first.values()} == {"stop", "length"}


def test_preallocated_window_moves_rows_up_when_one_leaves():
    """Hand-checked layout: rows 0, 1, 2 hold 10, 20, 30 at every position; dropping row 1 moves row 2 up
    and trims the window to the longest remaining row."""
    from models.kv_cache import SlotKV

    kv = SlotKV(max_rows=4, capacity=16)
    block = torch.stack([torch.full((1, 3, 2), 10.0 * (r + 1)) for r in range(3)])
    kv.merge([block], [block.clone()])
    keys, _ = kv.views()
    assert keys[0].shape == (3, 1, 3, 2) and kv.width == 3
    kv.drop([0, 2], longest=2)
    keys, _ = kv.views()
    assert keys[0].shape == (2, 1, 2, 2)
    assert keys[0][:, 0, :, 0].tolist() == [[10.0, 10.0], [30.0, 30.0]]
    assert kv.row(1, 1)[0][0].flatten().tolist() == [30.0, 30.0]


def test_leaving_rows_are_filled_from_the_end_copying_only_the_movers_own_positions():
    """Hand-checked: of 5 rows, rows 1 and 4 leave -> row 3 fills slot 1 (row 4 was last anyway); only row 3's own
    2 positions are copied, so slot 1's older column keeps row 1's stale value (masked for the new row)."""
    from models.kv_cache import SlotKV, fill_from_end

    assert fill_from_end(5, {1, 4}) == [0, 3, 2]
    assert fill_from_end(5, {0, 1}) == [3, 4, 2]
    assert fill_from_end(4, {3}) == [0, 1, 2] and fill_from_end(3, {0, 1, 2}) == []
    kv = SlotKV(max_rows=5, capacity=16)
    block = torch.stack([torch.full((1, 3, 2), 10.0 * (r + 1)) for r in range(5)])
    kv.merge([block], [block.clone()])
    kv.drop(fill_from_end(5, {1, 4}), longest=3, lengths=[3, 2, 3])
    keys, values = kv.views()
    assert keys[0][:, 0, :, 0].tolist() == [[10.0, 10.0, 10.0], [20.0, 40.0, 40.0], [30.0, 30.0, 30.0]]
    assert values[0][:, 0, :, 0].tolist() == keys[0][:, 0, :, 0].tolist()


def test_unknown_kv_cache_is_named(model):
    with pytest.raises(ValueError, match="engine.kv_cache: unknown 'paged'; valid: \\['concat', 'preallocated'\\]"):
        DecodeStream(model, EOS, PAD, kv_cache="paged")


def test_samples_of_one_prompt_share_one_prefill(model):
    """8 samples of 2 prompts admitted together: 2 prompts prefilled instead of 8; each row still draws its own
    tokens (its own generator), and every log-prob matches teacher forcing."""
    prompts = _prompts(2, seed=9)
    runs = {}
    for share in (False, True):
        stream = DecodeStream(model, EOS, PAD, max_batch=8, seed=4, share_prefill=share, kv_cache="preallocated")
        for i in range(8):
            stream.submit(i, prompts[i % 2], 12)
        runs[share] = (_drain(stream), stream.stats)
    (plain, plain_stats), (shared, stats) = runs[False], runs[True]
    assert stats["prefill_tokens"] == len(prompts[0]) + len(prompts[1])
    assert stats["shared_tokens"] == 3 * (len(prompts[0]) + len(prompts[1])) == plain_stats["prefill_tokens"] - stats["prefill_tokens"]
    assert {k: v[0] for k, v in shared.items()} == {k: v[0] for k, v in plain.items()}
    assert len({tuple(shared[i][0]) for i in range(0, 8, 2)}) > 1, "samples of one prompt differ"
    for i, (ids, lps, _) in shared.items():
        assert max(abs(a - b) for a, b in zip(lps, _teacher_forced(model, prompts[i % 2], ids))) < 1e-4


@pytest.mark.parametrize("kv_cache", ["concat", "preallocated"])
def test_lean_decode_step_is_transformers_forward_bit_for_bit(model, kv_cache, monkeypatch):
    """Same ids, same log-probs to the last bit as transformers' forward — decode steps and prefills (the lean
    prefill is taken: counted) — over two turns with prefix reuse and rows of different lengths (so the decode steps
    see padding masks, and a lone row none)."""
    from models import lean_decode
    from models.lean_decode import supports

    assert supports(model)
    calls: list[str] = []
    for name in ("decode_forward", "prefill_forward"):
        plain = getattr(lean_decode, name)
        monkeypatch.setattr(lean_decode, name, lambda *a, _f=plain, _n=name: calls.append(_n) or _f(*a))
    runs = []
    for lean in (False, True):
        stream = DecodeStream(model, EOS, PAD, temperature=0.9, max_batch=4, seed=7, keep_prefix=True,
                              kv_cache=kv_cache, lean_decode=lean)
        assert stream.lean == lean
        prompts = _prompts(6, seed=11)
        for i, p in enumerate(prompts):
            stream.submit(i, p, 4 + 5 * (i % 3))
        first = _drain(stream)
        for i, p in enumerate(prompts):
            stream.submit(i, p + first[i][0] + [5, 6], 9)
        runs.append((first, _drain(stream), stream.stats))
    assert runs[0] == runs[1]
    assert len(calls) == runs[1][2]["forwards"] and calls.count("prefill_forward") >= 2, \
        "every forward of the lean stream (prefills of both turns included) went through models.lean_decode"


def test_row_draws_are_the_generators_numbers_one_by_one():
    """Draws taken a block at a time are the numbers one ``torch.rand(1)`` per token gives (the previous path),
    across a block's end; two rows' streams are their own."""
    from models.sampling import BLOCK, RowDraws

    gen = torch.Generator().manual_seed(123)
    one_by_one = [torch.rand(1, generator=gen).item() for _ in range(BLOCK + 5)]
    draws = RowDraws(123)
    assert [draws.next() for _ in range(BLOCK + 5)] == one_by_one
    assert RowDraws(124).next() != one_by_one[0]


def test_lean_decode_inlines_only_modules_it_knows(model):
    """Plain linears, RMSNorms and the SiLU MLP are computed inline with the same result to the bit; a module with a
    hook (as a wrapped or instrumented one) is called as it is."""
    from models.lean_decode import _inline

    layer = model.model.layers[0]
    x = torch.randn(3, 1, layer.self_attn.q_proj.in_features)
    for module in (layer.self_attn.q_proj, layer.input_layernorm, layer.mlp):
        fn = _inline(module)
        assert fn is not module and torch.equal(fn(x), module(x))
    handle = layer.mlp.register_forward_hook(lambda *a: None)
    try:
        assert _inline(layer.mlp) is layer.mlp
    finally:
        handle.remove()
