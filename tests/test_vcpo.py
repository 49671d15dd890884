"""VCPO: ESS of sequence importance weights, the ESS-scaled learning rate, and the OPOB baseline, by hand."""

from __future__ import annotations

import math

import pytest
import torch

from models.config import TrainerConfig
from models.vcpo import LR_SCALES, ess_ratio, get_lr_scale, opob_baseline, seq_log_weights


def test_ess_ratio_by_hand():
    # w = [1, 1, 2]: (Σw)² / Σw² = 16 / 6, over N = 3
    assert ess_ratio(torch.log(torch.tensor([1.0, 1.0, 2.0]))) == pytest.approx(16 / 6 / 3)
    # equal weights: ρ = 1 whatever their size; one dominant weight: ρ → 1/N (and no overflow at e^800)
    assert ess_ratio(torch.tensor([5.0, 5.0, 5.0, 5.0])) == pytest.approx(1.0)
    assert ess_ratio(torch.tensor([800.0, 0.0, 0.0, 0.0])) == pytest.approx(0.25)


def test_sequence_log_weight_counts_policy_tokens_only():
    old = [torch.tensor([-1.0, -2.0, -3.0])]
    rollout = [torch.tensor([-1.5, -2.0, -2.0])]
    mask = [torch.tensor([1.0, 1.0, 0.0])]
    assert seq_log_weights(old, rollout, mask).tolist() == pytest.approx([0.5])


def test_lr_rules():
    assert sorted(LR_SCALES) == ["ess_linear", "ess_sqrt", "none"]
    assert get_lr_scale("ess_sqrt")(0.25, 1.0) == pytest.approx(0.5)
    assert get_lr_scale("ess_linear")(0.25, 1.0) == pytest.approx(0.25)
    assert get_lr_scale("ess_sqrt")(0.25, 0.5) == pytest.approx(math.sqrt(0.5))
    assert get_lr_scale("ess_sqrt")(0.9, 0.5) == 1.0  # never above the base learning rate
    assert get_lr_scale("none")(0.01, 1.0) == 1.0
    with pytest.raises(ValueError, match="trainer.lr_scale: unknown rule 'cosine'; registered: ess_linear, ess_sqrt"):
        get_lr_scale("cosine")
    with pytest.raises(ValueError, match="unknown rule 'cosine'"):
        TrainerConfig(lr_scale="cosine")


def test_opob_baseline_weights_rewards_by_gradient_norm_and_squared_weight():
    # W = ‖g‖²·w² = [1·1, 4·2²] = [1, 16] → b = (1·1 + 16·0) / 17
    assert opob_baseline([1.0, 4.0], [0.0, math.log(2.0)], [1.0, 0.0]) == pytest.approx(1 / 17, rel=1e-6)
    assert opob_baseline([2.0, 2.0], [0.0, 0.0], [1.0, 0.0]) == pytest.approx(0.5, rel=1e-6)


# -- in the trainer, on the tiny model ---------------------------------------------------------------


def _samples(model_dir, pad, log_w: list[float], rewards=(1.0, 0.0), group="g"):
    """Two rows whose rollout log-probs make their sequence log-weights exactly ``log_w`` (on the first token)."""
    from models.engine import load_causal_lm
    from models.forward import response_logprobs
    from models.trainer import Sample

    base = [Sample([5, 6, 7], [8, 9, 10, 11], [1, 1, 0, 1], 0.0), Sample([5, 6], [12, 13, 14], [1, 1, 1], 0.0)]
    with torch.no_grad():
        lp, _ = response_logprobs(load_causal_lm(model_dir), base, pad)
    out = []
    for i, (s, lw) in enumerate(zip(base, log_w)):
        rollout = lp[i, : len(s.response_ids)].tolist()
        rollout[0] -= lw
        out.append(Sample(s.prompt_ids, s.response_ids, s.response_mask, 1.0 if i == 0 else -1.0, rollout,
                          rewards[i], group))
    return out


def _update(model_dir, tmp_path, name, samples, **cfg):
    from models.trainer import update

    out = tmp_path / name
    metrics = update(model_dir, samples, TrainerConfig(mini_batches=1, **cfg), out, 0, seed=0)
    return metrics, out


def test_ess_scaled_step_equals_a_step_at_the_scaled_lr_and_the_lr_is_restored(warm_model_dir, tmp_path):
    from safetensors.torch import load_file

    samples = _samples(warm_model_dir, 0, [0.0, math.log(3.0)])  # w = [1, 3] → ESS 16/10, ρ = 0.8
    m, a = _update(warm_model_dir, tmp_path, "a", samples, lr=1e-3, lr_scale="ess_sqrt")
    assert m["train/ess_ratio"] == pytest.approx(0.8, rel=1e-4)
    assert m["train/lr_scale"] == pytest.approx(math.sqrt(0.8), rel=1e-4)
    _, b = _update(warm_model_dir, tmp_path, "b", samples, lr=1e-3 * math.sqrt(0.8))
    wa, wb, w0 = (load_file(p / "model.safetensors") for p in (a, b, warm_model_dir))
    assert any(not torch.equal(wa[k], w0[k]) for k in wa)
    assert all(torch.allclose(wa[k], wb[k], atol=1e-7) for k in wa)  # AdamW's first step is linear in lr
    assert torch.load(a / "optimizer.pt", weights_only=True)["param_groups"][0]["lr"] == 1e-3


def test_ess_is_reported_without_scaling_and_absent_without_rollout_logprobs(warm_model_dir, tmp_path):
    from models.trainer import Sample

    samples = _samples(warm_model_dir, 0, [0.0, math.log(3.0)])
    m, _ = _update(warm_model_dir, tmp_path, "c", samples, lr=1e-3)
    assert m["train/ess_ratio"] == pytest.approx(0.8, rel=1e-4) and m["train/lr_scale"] == 1.0
    bare = [Sample(s.prompt_ids, s.response_ids, s.response_mask, s.advantage) for s in samples]
    m, _ = _update(warm_model_dir, tmp_path, "d", bare, lr=1e-3)
    assert "train/ess_ratio" not in m


@pytest.mark.parametrize("vcpo", [{"lr_scale": "ess_sqrt"}, {"lr_scale": "ess_linear"}, {"opob": True}])
def test_vcpo_without_rollout_logprobs_is_an_error_naming_the_rows(warm_model_dir, tmp_path, vcpo):
    """VCPO never falls back to w = 1: a row without rollout log-probs (or with too few) stops the update."""
    from models.trainer import Sample

    a, b = _samples(warm_model_dir, 0, [0.0, math.log(3.0)])
    rows = [Sample(a.prompt_ids, a.response_ids, a.response_mask, a.advantage, a.rollout_lp, 1.0, "g", "0:p0:0"),
            Sample(b.prompt_ids, b.response_ids, b.response_mask, b.advantage, None, 0.0, "g", "0:p0:1"),
            Sample(b.prompt_ids, b.response_ids, b.response_mask, b.advantage, b.rollout_lp[:2], 0.0, "g", "0:p1:0")]
    with pytest.raises(ValueError, match=r"2 of 3 rows lack them: 0:p0:1 \(no rollout log-probs\), "
                                         r"0:p1:0 \(2 log-probs for 3 tokens\)"):
        _update(warm_model_dir, tmp_path, "e", rows, lr=1e-3, **vcpo)
    assert not (tmp_path / "e").exists()


class _Recorder:
    """An optimizer stand-in that records the gradients it is asked to apply."""

    def __init__(self, params):
        self.params = list(params)
        self.param_groups = [{"lr": 1.0}]
        self.grads = None

    def zero_grad(self, set_to_none=True):
        for p in self.params:
            p.grad = None

    def step(self):
        self.grads = [p.grad.clone() for p in self.params]


def _row_grads(model, samples, old, n_tokens, pad):
    from models.forward import response_logprobs
    from models.losses import LossBatch, get_loss

    grads = []
    for s, o in zip(samples, old):
        model.zero_grad(set_to_none=True)
        lp, mask = response_logprobs(model, [s], pad)
        loss, _ = get_loss("dapo")(LossBatch(lp, o[None, : lp.shape[1]], torch.ones(1), mask, n_tokens),
                                   TrainerConfig())
        loss.backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    return grads


def test_opob_step_follows_reward_minus_baseline_times_row_gradients(warm_model_dir):
    from models.engine import load_causal_lm
    from models.old_logprobs import old_logprobs as _old_logprobs
    from models.trainer import _log_weights, _opob_step

    cfg = TrainerConfig(opob=True, grad_clip=1e9)
    model = load_causal_lm(warm_model_dir)
    samples = _samples(warm_model_dir, 0, [0.0, math.log(2.0)], rewards=(1.0, 0.0))
    old = _old_logprobs(model, samples, 0, cfg)
    log_w = _log_weights(samples, old)
    n_tokens = float(sum(sum(s.response_mask) for s in samples))
    g = _row_grads(model, samples, old, n_tokens, 0)
    sq = [float(sum((x * x).sum() for x in gi)) for gi in g]
    b = (sq[0] * 1.0 + sq[1] * 4.0 * 0.0) / (sq[0] + sq[1] * 4.0)  # W = ‖g‖²·w², w = [1, 2]
    opt = _Recorder(model.parameters())
    totals = dict.fromkeys(("loss", "grad_norm", "clipped", "ratio", "tokens", "kl", "entropy", "approx_kl"), 0.0)
    _opob_step(model, opt, samples, old, None, cfg, 0, totals, log_w, 1.0)
    expected = [(1.0 - b) * a + (0.0 - b) * c for a, c in zip(g[0], g[1])]
    assert 0 < b < 1
    assert all(torch.allclose(x, y, atol=1e-6) for x, y in zip(opt.grads, expected))


def test_opob_gives_a_group_of_equal_rewards_no_gradient(warm_model_dir):
    from models.engine import load_causal_lm
    from models.old_logprobs import old_logprobs as _old_logprobs
    from models.trainer import _log_weights, _opob_step

    cfg = TrainerConfig(opob=True)
    model = load_causal_lm(warm_model_dir)
    samples = _samples(warm_model_dir, 0, [0.0, 1.5], rewards=(1.0, 1.0))
    old = _old_logprobs(model, samples, 0, cfg)
    opt = _Recorder(model.parameters())
    totals = dict.fromkeys(("loss", "grad_norm", "clipped", "ratio", "tokens", "kl", "entropy", "approx_kl"), 0.0)
    _opob_step(model, opt, samples, old, None, cfg, 0, totals, _log_weights(samples, old), 1.0)
    assert max(float(x.abs().max()) for x in opt.grads) < 1e-6


_TOTALS = ("loss", "grad_norm", "clipped", "ratio", "tokens", "kl", "entropy", "approx_kl")


def test_opob_baselines_and_std_units_are_per_group_and_its_metrics_add_up(warm_model_dir):
    """Two groups in one mini-batch, ``opob_norm_by_std``: each group has its own baseline and unit 1/std
    (population std: rewards (1, 0) → 0.5, (2, 0.5) → 0.75), and every total is added to what is there."""
    from models.engine import load_causal_lm
    from models.forward import response_logprobs_entropy
    from models.old_logprobs import old_logprobs as _old_logprobs
    from models.trainer import _log_weights, _opob_step

    cfg = TrainerConfig(opob=True, opob_norm_by_std=True, grad_clip=1e9)
    model = load_causal_lm(warm_model_dir)
    mb = (_samples(warm_model_dir, 0, [0.0, math.log(2.0)], rewards=(1.0, 0.0), group="a")
          + _samples(warm_model_dir, 0, [0.0, 0.0], rewards=(2.0, 0.5), group="b"))
    old = _old_logprobs(model, mb, 0, cfg)
    g = _row_grads(model, mb, old, 12.0, 0)  # 3 policy tokens a row, 12 in the mini-batch
    sq = [float(sum((x * x).sum() for x in gi)) for gi in g]
    b_a = sq[0] * 1.0 / (sq[0] + 4.0 * sq[1])  # W = ‖g‖²·w², w = [1, 2]; rewards (1, 0)
    b_b = (sq[2] * 2.0 + sq[3] * 0.5) / (sq[2] + sq[3])  # w = [1, 1]; rewards (2, 0.5)
    coef = [2.0 * (1.0 - b_a), 2.0 * (0.0 - b_a), 4 / 3 * (2.0 - b_b), 4 / 3 * (0.5 - b_b)]
    expected = [sum(c * gi[k] for c, gi in zip(coef, g)) for k in range(len(g[0]))]
    opt = _Recorder(model.parameters())
    totals = dict.fromkeys(_TOTALS, 1.0)
    _opob_step(model, opt, mb, old, None, cfg, 0, totals, _log_weights(mb, old), 1.0)
    assert 0 < b_a < 1 and 0.5 < b_b < 2
    # float32 gradients up to ~2, summed in another order than the hand-built expectation: 1e-5 (this machine's
    # kernels differ from the expectation by up to 1.1e-5; the baselines and units under test scale whole rows)
    assert all(torch.allclose(x, y, rtol=1e-5, atol=2e-5) for x, y in zip(opt.grads, expected))
    with torch.no_grad():
        _, mask, ent = response_logprobs_entropy(model, mb, 0)
    assert totals["loss"] == pytest.approx(1.0 + sum(c * -0.25 for c in coef), abs=1e-5)  # each row's loss: −3/12
    assert totals["grad_norm"] == pytest.approx(1.0 + math.sqrt(sum(float((x * x).sum()) for x in expected)), rel=1e-4)
    assert totals["tokens"] == 13.0 and totals["clipped"] == 1.0
    assert totals["ratio"] == pytest.approx(1.0 + 12.0, abs=1e-4)  # a token sum of ratios 1
    assert totals["approx_kl"] == pytest.approx(1.0, abs=1e-5)
    assert totals["entropy"] == pytest.approx(1.0 + float((ent * mask).sum()), rel=1e-5)
    assert totals["kl"] == 1.0


@pytest.mark.parametrize("opob", [True, False])
@pytest.mark.parametrize("micro_batch", [1, 2])
def test_a_kl_penalty_adds_its_gradient_per_micro_batch(warm_model_dir, micro_batch, opob):
    """``kl_coef``: the KL term's gradient (k2 = ½(new − ref)², token mean over the mini-batch, in micro-batches
    of one row or both) is added to the policy gradient — OPOB's (r − b)·g (without rollout log-probs every
    weight is 1) or DAPO's A·g at ratio 1 (advantages +1, −1) — and ``kl`` sums the micro-batches' parts."""
    from models.engine import load_causal_lm
    from models.forward import response_logprobs
    from models.losses import LossBatch, kl_penalty
    from models.old_logprobs import old_logprobs as _old_logprobs
    from models.trainer import _minibatch_step, _opob_step

    cfg = TrainerConfig(opob=opob, grad_clip=1e9, kl_coef=0.5, kl_estimator="k2", micro_batch=micro_batch)
    model = load_causal_lm(warm_model_dir)
    mb = _samples(warm_model_dir, 0, [0.0, 0.0], rewards=(1.0, 0.0))
    old = _old_logprobs(model, mb, 0, cfg)
    ref = [o - 0.3 for o in old]
    g = _row_grads(model, mb, old, 6.0, 0)
    sq = [float(sum((x * x).sum() for x in gi)) for gi in g]
    b = sq[0] / (sq[0] + sq[1])
    kl_grad = [torch.zeros_like(p) for p in model.parameters()]
    for s, o, r in zip(mb, old, ref):
        model.zero_grad(set_to_none=True)
        lp, mask = response_logprobs(model, [s], 0)
        (0.5 * kl_penalty(LossBatch(lp, o[None], torch.zeros(1), mask, 6.0, r[None]), "k2")).backward()
        kl_grad = [k + p.grad for k, p in zip(kl_grad, model.parameters())]
    coef = [1.0 - b, 0.0 - b] if opob else [1.0, -1.0]
    expected = [coef[0] * x + coef[1] * y + k for x, y, k in zip(g[0], g[1], kl_grad)]
    opt = _Recorder(model.parameters())
    totals = dict.fromkeys(_TOTALS, 0.0)
    (_opob_step if opob else _minibatch_step)(model, opt, mb, old, ref, cfg, 0, totals, None, 1.0)
    assert all(torch.allclose(x, y, rtol=1e-4, atol=1e-5) for x, y in zip(opt.grads, expected))
    assert any(float(k.abs().max()) > 1e-2 for k in kl_grad)
    assert totals["kl"] == pytest.approx(0.5 * 0.3**2, abs=1e-6)  # ½·0.09 on each of the 6 tokens, over 6
    if not opob:  # DAPO's part −(1·3 − 1·3)/6 = 0, plus 0.5 × the KL
        assert totals["loss"] == pytest.approx(0.5 * 0.5 * 0.3**2, abs=1e-6)


def test_opob_mini_batches_hold_whole_groups_in_a_seeded_order():
    """OPOB's baseline is per group, so its mini-batches split the sorted group keys (a, b, c), shuffled by the
    step's seed (seed 0: a, c, b), never the rows; without OPOB the rows are shuffled (seed 0: 4 2 1 0 5 3)."""
    import random

    from models.trainer import Sample, _minibatches

    rows = [Sample([1], [2], [1], 0.0, group=g) for g in "abacbc"]  # a = rows 0, 2; b = 1, 4; c = 3, 5
    assert _minibatches(rows, TrainerConfig(opob=True, mini_batches=2), random.Random(0)) == [[0, 2, 3, 5], [1, 4]]
    assert _minibatches(rows, TrainerConfig(opob=True, mini_batches=3), random.Random(0)) == [[0, 2], [3, 5], [1, 4]]
    assert _minibatches(rows, TrainerConfig(mini_batches=2), random.Random(0)) == [[4, 2, 1], [0, 5, 3]]


def test_opob_through_update_two_groups_with_kl_and_ess(warm_model_dir, tmp_path):
    """``update`` with OPOB, a KL reference and ``ess_sqrt``, two groups in two mini-batches (seed 0: a, then b).
    ESS by hand: w = [1, 2] → 9/10, w = [1, 3] → 16/20; the lr scale is √ρ per step; the first step's KL is 0
    (the policy is the reference), the second's is read off the checkpoint of a step on group a alone."""
    from models.engine import load_causal_lm
    from models.forward import response_logprobs
    from models.trainer import update

    a = _samples(warm_model_dir, 0, [0.0, math.log(2.0)], rewards=(1.0, 0.0), group="a")
    b = _samples(warm_model_dir, 0, [0.0, math.log(3.0)], rewards=(0.0, 1.0), group="b")
    cfg = TrainerConfig(opob=True, mini_batches=2, lr=1e-3, kl_coef=0.5, kl_estimator="k2", lr_scale="ess_sqrt")
    m = update(warm_model_dir, a + b, cfg, tmp_path / "both", 0, seed=0, ref_dir=warm_model_dir)
    update(warm_model_dir, a, cfg.model_copy(update={"mini_batches": 1}), tmp_path / "a", 0, seed=0,
           ref_dir=warm_model_dir)
    with torch.no_grad():
        ref, mask = response_logprobs(load_causal_lm(warm_model_dir), b, 0)
        moved, _ = response_logprobs(load_causal_lm(tmp_path / "a"), b, 0)
    kl_b = float((0.5 * (moved - ref) ** 2 * mask).sum()) / 6
    assert kl_b > 1e-6
    assert m["train/kl"] == pytest.approx((0.0 + kl_b) / 2, rel=1e-3)
    assert m["train/ess_ratio"] == pytest.approx((0.9 + 0.8) / 2, rel=1e-4)
    assert m["train/ess_ratio_min"] == pytest.approx(0.8, rel=1e-4)
    assert m["train/lr_scale"] == pytest.approx((math.sqrt(0.9) + math.sqrt(0.8)) / 2, rel=1e-4)
    assert (m["train/optimizer_steps"], m["train/tokens"], m["train/sequences"]) == (2, 12, 4)


def test_update_hands_opob_the_importance_weights(warm_model_dir, tmp_path):
    """Through ``update``, OPOB's baseline sees the rows' importance weights: with w = [1, 2] (b = ‖g₀‖² /
    (‖g₀‖² + 4‖g₁‖²)) the step differs from the same rows on policy (w = [1, 1], ESS ratio 1)."""
    from safetensors.torch import load_file

    samples = _samples(warm_model_dir, 0, [0.0, math.log(2.0)], rewards=(1.0, 0.0))
    on_policy = _samples(warm_model_dir, 0, [0.0, 0.0], rewards=(1.0, 0.0))
    weighted, a = _update(warm_model_dir, tmp_path, "weighted", samples, opob=True, lr=1e-3)
    plain, b = _update(warm_model_dir, tmp_path, "plain", on_policy, opob=True, lr=1e-3)
    assert weighted["train/ess_ratio"] == pytest.approx(0.9, rel=1e-4) and plain["train/ess_ratio"] == pytest.approx(1.0)
    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert any(not torch.allclose(wa[k], wb[k], atol=1e-7) for k in wa)
