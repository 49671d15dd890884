"""The RL step's speed switches compute what the slow paths compute (issue 31; ``cleaner bench-step`` times them).

* the update's forwards without a padding mask and with logits from the first response position only, and the
  first mini-batch's forwards reused as its old-log-prob pass: the same log-probs, losses, gradient norms;
* the background trace writer: jobs in order, a failure is raised (naming the step) at the next submit and at
  the flush, never swallowed; a logged step whose traces never got written gets them on the resumed log;
* ``bench-step``'s sides switch exactly what they say.

The preallocated decoding cache is pinned bit for bit in ``tests/test_decode.py``.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import torch

from flows.bench_step import SWITCHES, side_overrides
from models.config import TrainerConfig
from models.engine import load_causal_lm
from models.forward import ForwardSwitches, response_logprobs
from models.old_logprobs import first_forwards as _first_forwards
from models.old_logprobs import fusable
from models.trainer import Sample, update
from tasks.stores.trace_writer import TraceWriteError, TraceWriter

TINY = Path(__file__).resolve().parents[1] / "configs" / "tiny.yaml"
OFF = {"fuse_old_logprobs": False, "causal_only": False, "response_logits": False, "share_prompts": False}


@pytest.fixture(scope="module")
def samples(chat):
    """Six rows with prompts of 3 lengths (so rows are padded, and the first response position differs per row)
    and responses of 2..13 tokens, some with injected (mask-0) tokens."""
    rows = []
    for i, q in enumerate(["2 + 2?", "What is 12 * 34?", "Sum the numbers 1 2 3 4 5 6 7 8 9, please."] * 2):
        prompt = chat.prompt_ids([{"role": "user", "content": q}])
        resp = (chat.encode(f"The answer is \\boxed{{{i * 7}}} because I ran it.") + [chat.eos_id])[: 2 + 2 * i + i % 2]
        mask = [1] * len(resp) if i % 2 else [1] * (len(resp) - 1) + [0]
        rows.append(Sample(prompt, resp, mask, 1.0 if i % 3 else -0.5))
    return rows


def _alone(model, samples: list[Sample], pad: int) -> list[torch.Tensor]:
    """Each row's log-probs in a batch of its own: no padding, no mask, every position's logits."""
    with torch.no_grad():
        return [response_logprobs(model, [s], pad)[0][0] for s in samples]


@pytest.mark.parametrize("fast", [ForwardSwitches(True, False), ForwardSwitches(False, True), ForwardSwitches(True, True)])
def test_fast_forwards_give_each_row_its_own_logprobs(warm_model_dir, chat, samples, fast):
    model = load_causal_lm(warm_model_dir)
    pad = chat.tokenizer.pad_token_id
    with torch.no_grad():
        lp, mask = response_logprobs(model, samples, pad, fast=fast)
    for i, (s, ref) in enumerate(zip(samples, _alone(model, samples, pad))):
        assert lp[i, : len(s.response_ids)].tolist() == pytest.approx(ref.tolist(), abs=1e-5)
        assert mask[i].tolist()[: len(s.response_ids)] == [float(m) for m in s.response_mask]
        assert not lp[i, len(s.response_ids) :].any()


def test_shared_prompts_give_each_row_its_own_logprobs_and_the_plain_gradient(warm_model_dir, chat, samples):
    """Three prompts of different lengths, two rows each: 3 prompts forwarded once each (phase 1), every row's
    log-probs as in a batch of its own, zeros past its response, and the gradient of sum(log-prob x mask) the one
    the plain forward gives (phase 1's share arrives through ``backward``: without it the embeddings' gradient
    misses the prompts' tokens)."""
    from models.forward import SharedPrompts, response_forward

    pad = chat.tokenizer.pad_token_id
    model = load_causal_lm(warm_model_dir)
    order = [5, 0, 3, 1, 4, 2]
    prompts = SharedPrompts(model, [samples[i] for i in order], pad)
    assert len(prompts.index) == 3 and prompts.width == max(len(s.prompt_ids) for s in samples) - 1
    for lo in (0, 3):
        chunk = [samples[i] for i in order[lo : lo + 3]]
        lp, mask, ent, _ = prompts.forward(chunk)
        (lp * mask).sum().backward()
        for row, s in enumerate(chunk):
            n = len(s.response_ids)
            assert lp[row, :n].tolist() == pytest.approx(_alone(model, [s], pad)[0].tolist(), abs=1e-5)
            assert not lp[row, n:].any() and not ent[row, n:].any() and ent[row, :n].min() > 0
            assert mask[row, :n].tolist() == [float(m) for m in s.response_mask]
    before = model.model.embed_tokens.weight.grad.clone()
    prompts.backward()
    shared = [p.grad.clone() for p in model.parameters()]
    assert not torch.equal(before, shared[0]), "the prompts' gradient arrives in backward()"
    model.zero_grad()
    lp, mask, _, _ = response_forward(model, samples, pad)
    (lp * mask).sum().backward()
    for got, p in zip(shared, model.parameters()):
        assert (got - p.grad).abs().max() <= 1e-5 * p.grad.abs().max()  # float32 sums in another order


def test_first_minibatch_forwards_are_its_old_logprobs(warm_model_dir, chat, samples):
    """The fused rows' old log-probs are their forwards' outputs detached, equal to a pass of their own; the other
    rows come from the no-grad pass; the forwards keep their graph for the update's backward."""
    model = load_causal_lm(warm_model_dir)
    pad = chat.tokenizer.pad_token_id
    cfg = TrainerConfig(micro_batch=2)
    forwards, old, _, prompts = _first_forwards(model, samples, [4, 1, 3], pad, cfg)
    assert prompts is not None and len(forwards) == 2 and forwards[0][0].requires_grad and not old[4].requires_grad
    assert torch.equal(old[1], forwards[0][0][1, : len(samples[1].response_ids)].detach())
    for s, got, ref in zip(samples, old, _alone(model, samples, pad)):
        assert got.shape == (len(s.response_ids),)
        assert got.tolist() == pytest.approx(ref.tolist(), abs=1e-5)


def _update(warm_model_dir, chat, samples, tmp_path, name: str, mini_batches: int, **switches) -> dict:
    # micro_batch 3: two mini-batches of 3 rows are one micro-batch each, so the first one is fused; one of 6 rows
    # is two micro-batches (not fused: the fused forwards would all be held until the step)
    cfg = TrainerConfig(lr=2e-4, mini_batches=mini_batches, micro_batch=3, **switches)
    return update(warm_model_dir, samples, cfg, tmp_path / name, chat.tokenizer.pad_token_id, seed=3)


@pytest.mark.parametrize(("mini_batches", "tol"), [(1, 1e-6), (2, 1e-5)])
def test_every_switch_gives_the_update_of_the_slow_path(warm_model_dir, chat, samples, tmp_path, mini_batches, tol):
    """Loss, gradient norm and every other ``train/*`` figure of the slow path, switch by switch and all together.

    One mini-batch: the switches only reorder float sums of one forward and backward, so every figure is within
    1e-6 (relative above 1: a float32 norm of 9 has ULPs of 1e-6). Two mini-batches (the second one's old log-probs
    come from the no-grad pass, the first one's from the fused forwards): the second step's figures also carry the
    first step's rounding through Adam, whose first step is ±lr on every weight whatever its gradient's size, so a
    rounding-sized gradient that changes sign moves a weight by 2·lr — on these 6 rows (gradient norm ≈ 9) up to
    1.4e-6 of the second step's mean ratio; within 1e-5."""
    slow = _update(warm_model_dir, chat, samples, tmp_path, "slow", mini_batches, **OFF, micro_tokens=None)
    assert slow["train/optimizer_steps"] == mini_batches and slow["train/grad_norm"] > 0
    for name in [*OFF, "micro_tokens", "all"]:
        switches = {k: (k == name or name == "all") for k in OFF}
        tokens = 40 if name in ("micro_tokens", "all") else None  # 2 rows wider than 20 tokens go one by one
        fast = _update(warm_model_dir, chat, samples, tmp_path, name, mini_batches, **switches, micro_tokens=tokens)
        for key, value in slow.items():
            if key.startswith("train/"):
                assert fast[key] == pytest.approx(value, rel=tol, abs=tol), (name, key)


def test_micro_batches_are_cut_by_rows_and_by_padded_tokens():
    """Hand-computed: widths 3, 4, 10, 11, 30 (whole rows) with at most 3 rows and 24 padded tokens: [3, 4] then
    10 would make 3 x 10 = 30 > 24; [10, 11] (2 x 11 = 22); 30 alone (wider than the budget). Shared prompts count
    1 + the response: the same rows are 2, 2, 3, 3, 4 wide, so 3 rows a micro-batch (the row cap)."""
    from models.forward import micro_spans

    rows = [Sample([1] * (w - r), [2] * r, [1] * r, 1.0) for w, r in ((3, 1), (4, 1), (10, 2), (11, 2), (30, 3))]
    assert micro_spans(rows, 3, 24, share_prompts=False) == [(0, 2), (2, 4), (4, 5)]
    assert micro_spans(rows, 3, None, share_prompts=False) == [(0, 3), (3, 5)]
    assert micro_spans(rows, 3, 24, share_prompts=True) == [(0, 3), (3, 5)]
    assert micro_spans(rows, 3, 1, share_prompts=True) == [(i, i + 1) for i in range(5)]
    assert micro_spans([], 3, 24, share_prompts=True) == []
    assert micro_spans(rows[:2], 3, 8, share_prompts=False) == [(0, 2)], "2 x 4 = 8 fits a budget of 8"
    assert micro_spans(rows[:2], 3, 7, share_prompts=False) == [(0, 1), (1, 2)]
    assert micro_spans([rows[4], rows[0], rows[1]], 3, 24, share_prompts=False) == [(0, 1), (1, 3)], \
        "a new micro-batch is as wide as its own rows, not the one before"


def test_fusion_only_where_it_is_exact(warm_model_dir):
    model = load_causal_lm(warm_model_dir)
    assert fusable(model, TrainerConfig(), critic=False)
    assert not fusable(model, TrainerConfig(fuse_old_logprobs=False), critic=False)
    assert not fusable(model, TrainerConfig(), critic=True)
    assert not fusable(model, TrainerConfig(opob=True), critic=False)
    model.model.layers[0].mlp.add_module("drop", torch.nn.Dropout(0.1))
    assert not fusable(model, TrainerConfig(), critic=False), "a dropout draws anew in every forward"


def test_trace_writer_runs_jobs_in_order_and_raises_a_failure_naming_it():
    writer, seen, gate = TraceWriter(), [], threading.Event()
    writer.submit("step 0", lambda: (gate.wait(5), seen.append(0)))
    writer.submit("step 1", lambda: seen.append(1))
    assert writer.pending() >= 1
    gate.set()
    writer.flush()
    assert seen == [0, 1] and writer.pending() == 0

    def boom():
        raise OSError("database is locked")

    writer.submit("step 2 (runs/x/steps/000002)", boom)
    writer.submit("step 3", lambda: seen.append(3))
    with pytest.raises(TraceWriteError, match=r"step 2 \(runs/x/steps/000002\): database is locked") as err:
        writer.flush()
    assert isinstance(err.value.__cause__, OSError) and seen == [0, 1, 3]
    writer.flush()  # raised once, then forgotten

    writer.submit("step 4", boom)
    while writer.pending():
        threading.Event().wait(0.01)
    with pytest.raises(TraceWriteError, match="step 4"):
        writer.submit("step 5", lambda: None)


def test_a_logged_step_without_its_traces_gets_them_when_logged_again(tmp_path, monkeypatch):
    """The process died after MLflow had the step but before the background writer wrote its traces: the step has
    no ``logged.json``, so a resumed run logs it again; the stores are not written again, the traces are."""
    from tasks.stores.config import TrackingConfig
    from tasks.training import stages
    from tasks.training.setups import LogSetup

    step_dir = tmp_path / "000003"
    step_dir.mkdir()
    (step_dir / "rollout.metrics.json").write_text(json.dumps({"time/rollout_s": 2.0}))
    calls = []
    monkeypatch.setattr(stages.tracking, "logged_steps", lambda cfg, mlrun: {3})
    monkeypatch.setattr(stages, "_trace_frames", lambda folder: {"folder": folder})
    monkeypatch.setattr(stages, "_step_traces", lambda *args: calls.append(args) or 0.1)
    setup = LogSetup(tracking=TrackingConfig(mlflow_uri=f"sqlite:///{tmp_path / 'm.db'}"))
    stages.log_stage(step_dir, 3, "run", "mlrun", "ckpt", setup, {"arm": "cleaner"})
    assert len(calls) == 1 and calls[0][1:3] == (3, "mlrun") and calls[0][6] == 2.0
    assert json.loads((step_dir / "logged.json").read_text()) == {"checkpoint": "ckpt"}
    (step_dir / stages.TRACES_DONE).write_text("{}")
    stages.log_stage(step_dir, 3, "run", "mlrun", "ckpt", setup)
    assert len(calls) == 1, "traces already written are not written again"


def test_bench_sides_switch_what_they_name():
    before, after = side_overrides("before"), side_overrides("after")
    assert before == ["engine.kv_cache=concat", "engine.share_prefill=false", "engine.lean_decode=false",
                      "trainer.fuse_old_logprobs=false", "trainer.causal_only=false", "trainer.response_logits=false",
                      "trainer.share_prompts=false", "trainer.micro_tokens=null", "tracking.background_traces=false"]
    assert after == ["engine.kv_cache=preallocated", "engine.share_prefill=true", "engine.lean_decode=true",
                     "trainer.fuse_old_logprobs=true", "trainer.causal_only=true", "trainer.response_logits=true",
                     "trainer.share_prompts=true", "trainer.micro_tokens=2048", "tracking.background_traces=true"]
    one = side_overrides("lean_decode")
    assert one[2] == "engine.lean_decode=true" and one[:2] + one[3:] == before[:2] + before[3:]
    assert set(SWITCHES) == {"kv_cache", "share_prefill", "lean_decode", "fuse_old_logprobs", "causal_only",
                             "response_logits", "share_prompts", "micro_tokens", "background_traces"}
    with pytest.raises(ValueError, match="unknown side 'fast'; valid: before, after, kv_cache"):
        side_overrides("fast")


def test_after_is_every_default():
    """``after`` = the defaults: the fast paths are what a run uses unless a config turns them off."""
    from flows.config import RunConfig, load_config

    cfg = load_config(TINY, side_overrides("after"))
    defaults = RunConfig()
    assert cfg.engine.model_dump() == defaults.engine.model_dump()
    assert cfg.trainer.model_dump() == load_config(TINY, []).trainer.model_dump()
    assert cfg.tracking.background_traces == defaults.tracking.background_traces


def test_bench_step_runs_both_sides_end_to_end_and_finds_them_the_same(tmp_path):
    """The command itself (its stores, stages and report), on 2 prompts x 2 samples, one step a block."""
    from flows.bench_step import bench_step

    lines: list[str] = []
    report = bench_step(TINY, tmp_path / "bench", repeats=2, steps_per_block=1, echo=lines.append,
                        overrides=["data.prompts_per_step=2", "rollout.n_samples=2", "sandbox.backend=local",
                                   "tracking.traces_per_step=2"])
    assert report["same"], report["differences"]
    assert report["differences"]["after"]["token_ids"] == 0.0
    assert (report["prompts"], report["samples"]) == (2, 2)
    for side in ("before", "after"):
        assert report["sides"][side]["wall"] > 0 and report["sides"][side]["update"] > 0
    assert report["ratio"]["after"] > 0 and any(line.startswith("before / after: x") for line in lines)
