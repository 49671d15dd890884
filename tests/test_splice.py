"""Splice treatments (``models.splice``): hand-computed old log-probs, masks, weights, losses and metrics.

One row of four response tokens: token 0 is on-policy, tokens 1 and 2 were spliced in after a failed call, token 3
is a tool token (mask 0). The clean-context log-probs are −0.5, −2.0, −1.0; the spliced tokens were sampled with
log-probs −2.0 − ln 0.5 and −1.0 − ln 4, so π_clean/π_error = 0.5 and 4 on them.
"""

from __future__ import annotations

import math

import pytest
import torch

from models.config import TrainerConfig
from models.losses import LossBatch, get_loss, kl_penalty
from models.splice import TREATMENTS, SpliceView, get_treatment, splice_metrics, trains, treat_rows
from models.trainer import Sample

OLD = torch.tensor([-0.5, -2.0, -1.0, 0.0])
BEHAVIOUR = torch.tensor([-0.5, -2.0 - math.log(0.5), -1.0 - math.log(4.0), 0.0])
SPLICED = torch.tensor([0.0, 1.0, 1.0, 0.0])
MASK = torch.tensor([1.0, 1.0, 1.0, 0.0])
VIEW = SpliceView(OLD, BEHAVIOUR, SPLICED, MASK)
CFG = TrainerConfig()


def loss_and_grad(name: str, adv: float) -> tuple[float, list[float]]:
    """The DAPO loss at the update's first pass (new = the recomputed old) as the trainer builds it, and its gradient."""
    t = get_treatment(name)(VIEW, CFG)
    new = OLD.clone().unsqueeze(0).requires_grad_(True)
    mask = t.mask.unsqueeze(0)
    batch = LossBatch(new, t.old_lp.unsqueeze(0), torch.tensor([adv]), mask, float(mask.sum()),
                      weight=t.weight.unsqueeze(0))
    loss, _ = get_loss("dapo")(batch, CFG)
    loss.backward()
    return loss.item(), new.grad[0].tolist()


def test_registry_lists_every_treatment_and_rejects_unknown_names():
    assert sorted(TREATMENTS) == ["behaviour_old", "full", "mask", "truncated_is"]
    with pytest.raises(ValueError, match="registered: behaviour_old, full, mask, truncated_is"):
        get_treatment("importance")
    with pytest.raises(ValueError, match="unknown splice treatment 'clip'"):
        TrainerConfig(splice="clip")
    with pytest.raises(ValueError, match="needs a ratio loss"):
        TrainerConfig(splice="behaviour_old", loss="opmd")
    with pytest.raises(ValueError, match="exclude each other"):
        TrainerConfig(splice="truncated_is", opob=True)
    assert TrainerConfig().splice == "full"


def test_full_trains_spliced_tokens_like_any_other():
    t = get_treatment("full")(VIEW, CFG)
    assert t.old_lp.tolist() == OLD.tolist() and t.mask.tolist() == MASK.tolist() and t.weight.tolist() == [1.0] * 4
    loss, grad = loss_and_grad("full", 1.0)
    assert loss == pytest.approx(-1.0)
    assert grad == pytest.approx([-1 / 3, -1 / 3, -1 / 3, 0.0])


def test_mask_drops_spliced_tokens_from_numerator_and_denominator():
    t = get_treatment("mask")(VIEW, CFG)
    assert t.mask.tolist() == [1.0, 0.0, 0.0, 0.0] and t.old_lp.tolist() == OLD.tolist()
    loss, grad = loss_and_grad("mask", 1.0)
    assert loss == pytest.approx(-1.0)  # one token, token-mean over one
    assert grad == pytest.approx([-1.0, 0.0, 0.0, 0.0])


def test_behaviour_old_lets_the_clip_see_the_error_context_ratio():
    t = get_treatment("behaviour_old")(VIEW, CFG)
    assert t.old_lp.tolist() == pytest.approx(BEHAVIOUR.tolist()[:3] + [0.0])
    # ratios 1, 0.5, 4: positive advantage → 1, 0.5, clipped at 1.28 (no gradient)
    loss, grad = loss_and_grad("behaviour_old", 1.0)
    assert loss == pytest.approx(-(1 + 0.5 + 1.28) / 3)
    assert grad == pytest.approx([-1 / 3, -0.5 / 3, 0.0, 0.0])
    # negative advantage: min(-ρ, -clip(ρ)) → -1, -0.8 (clipped, no gradient), -4
    loss, grad = loss_and_grad("behaviour_old", -1.0)
    assert loss == pytest.approx((1 + 0.8 + 4) / 3)
    assert grad == pytest.approx([1 / 3, 0.0, 4 / 3, 0.0])


def test_truncated_is_weights_spliced_tokens_by_min_one_ratio():
    t = get_treatment("truncated_is")(VIEW, CFG)
    assert t.weight.tolist() == pytest.approx([1.0, 0.5, 1.0, 1.0])
    assert t.old_lp.tolist() == OLD.tolist()
    loss, grad = loss_and_grad("truncated_is", 1.0)
    assert loss == pytest.approx(-(1 + 0.5 + 1) / 3)
    assert grad == pytest.approx([-1 / 3, -0.5 / 3, -1 / 3, 0.0])


def test_truncated_is_weights_only_the_numerator_whatever_the_aggregation():
    """seq-mean-token-mean divides each row by its token count, not by its summed weights (which would train the
    unspliced token 3/2.5 = 1.2 times as hard as intended); the KL, the clip and ratio stats see no weight."""
    t = get_treatment("truncated_is")(VIEW, CFG)
    new = OLD.clone().unsqueeze(0).requires_grad_(True)
    ref = (OLD + torch.tensor([0.5, 1.0, -1.0, 0.0])).unsqueeze(0)
    batch = LossBatch(new, t.old_lp.unsqueeze(0), torch.tensor([1.0]), t.mask.unsqueeze(0), 3.0, ref,
                      "seq-mean-token-mean", 2.0, t.weight.unsqueeze(0))
    loss, stats = get_loss("dapo")(batch, CFG)
    loss.backward()
    assert loss.item() == pytest.approx(-(1 + 0.5 + 1) / 3 / 2)  # two rows in the mini-batch, this one's share
    assert new.grad[0].tolist() == pytest.approx([-1 / 6, -0.5 / 6, -1 / 6, 0.0])
    assert stats["ratio"].item() == pytest.approx(3.0) and stats["clipped"].item() == 0.0
    assert kl_penalty(batch, "k1").item() == pytest.approx(-(0.5 + 1.0 - 1.0) / 3 / 2)
    opmd, _ = get_loss("opmd")(batch, CFG)
    assert opmd.item() == pytest.approx(-(-0.5 + 0.5 * -2.0 + -1.0) / 3 / 2 / (1 + CFG.opmd_tau))


@pytest.mark.parametrize(("name", "adv", "weight"), [
    ("full", 1.0, 1.0), ("mask", 1.0, 0.0), ("truncated_is", 1.0, 0.75),
    ("behaviour_old", 1.0, 0.25), ("behaviour_old", -1.0, 2.0),
])
def test_metrics_count_gap_and_effective_weight(name, adv, weight):
    t = get_treatment(name)(VIEW, CFG)
    m = splice_metrics([VIEW], [t], [adv], CFG)
    assert m["splice/tokens"] == 2
    assert m["splice/logp_gap"] == pytest.approx((math.log(0.5) + math.log(4.0)) / 2)
    assert m["splice/effective_weight"] == pytest.approx(weight)


def test_treat_rows_applies_the_configured_treatment_and_names_a_row_without_behaviour_logprobs():
    row = Sample([1], [5, 6, 7, 8], [1, 1, 1, 0], 1.0, BEHAVIOUR.tolist(), group="g", spliced=[0, 1, 1, 0])
    plain = Sample([1], [5, 6], [1, 1], -1.0, None, group="h")
    rows, olds, weights, m = treat_rows([row, plain], [OLD, torch.tensor([-0.1, -0.2])],
                                        TrainerConfig(splice="mask"))
    assert rows[0].response_mask == [1, 0, 0, 0] and rows[1] is plain
    assert weights[1].tolist() == [1.0, 1.0] and m["splice/tokens"] == 2 and m["splice/effective_weight"] == 0.0
    _, olds, _, _ = treat_rows([row], [OLD], TrainerConfig(splice="behaviour_old"))
    assert olds[0].tolist() == pytest.approx(BEHAVIOUR.tolist())
    lacking = Sample([1], [5, 6, 7, 8], [1, 1, 1, 0], 1.0, None, group="g7", spliced=[0, 1, 1, 0])
    with pytest.raises(ValueError, match="row 0 \\(group 'g7'\\) has 2 spliced tokens but no behaviour"):
        treat_rows([lacking], [OLD], TrainerConfig(splice="full"))


def _policy_update(warm_model_dir, chat, out, samples, splice: str) -> tuple[dict, torch.Tensor]:
    from models.engine import load_causal_lm
    from models.forward import response_logprobs
    from models.trainer import update

    cfg = TrainerConfig(lr=1e-3, mini_batches=1, splice=splice)
    metrics = update(warm_model_dir, samples, cfg, out, chat.tokenizer.pad_token_id, seed=0)
    with torch.no_grad():
        lp, _ = response_logprobs(load_causal_lm(out), samples, chat.tokenizer.pad_token_id)
    return metrics, lp


def test_update_trains_mask_like_a_response_mask_without_the_spliced_tokens(warm_model_dir, chat, tmp_path):
    """The trainer wires the treatment in: ``mask`` on spliced tokens is the same update as ``full`` on rows whose
    response mask already excludes them; ``truncated_is`` with no gap (behaviour = clean) is the same as ``full``."""
    from models.engine import load_causal_lm
    from models.forward import response_logprobs

    prompt = chat.prompt_ids([{"role": "user", "content": "What is 2 + 2?"}])
    good, bad = chat.encode("So \\boxed{4}.") + [chat.eos_id], chat.encode("So \\boxed{5}.") + [chat.eos_id]
    with torch.no_grad():
        lp, _ = response_logprobs(load_causal_lm(warm_model_dir), [Sample(prompt, good, [1] * len(good), 1.0),
                                                                    Sample(prompt, bad, [1] * len(bad), -1.0)],
                                  chat.tokenizer.pad_token_id)
    spl = [[0, 0, 1, 1] + [0] * (len(good) - 4), [0, 1, 1] + [0] * (len(bad) - 3)]
    rows = [Sample(prompt, ids, [1] * len(ids), a, lp[i, : len(ids)].tolist(), spliced=s)
            for i, (ids, a, s) in enumerate([(good, 1.0, spl[0]), (bad, -1.0, spl[1])])]
    cut = [Sample(prompt, r.response_ids, [1 - f for f in r.spliced], r.advantage) for r in rows]
    m_mask, lp_mask = _policy_update(warm_model_dir, chat, tmp_path / "mask", rows, "mask")
    m_cut, lp_cut = _policy_update(warm_model_dir, chat, tmp_path / "cut", cut, "full")
    assert torch.allclose(lp_mask, lp_cut, atol=1e-6) and m_mask["train/tokens"] == m_cut["train/tokens"]
    assert m_mask["splice/tokens"] == 2 + 2 and m_mask["splice/effective_weight"] == 0.0
    assert m_mask["splice/logp_gap"] == pytest.approx(0.0, abs=1e-5)  # behaviour = clean here
    # behaviour log-probs ln 2 above the clean ones on spliced tokens: π_clean/π_error = 0.5, weight 0.5
    half = [Sample(prompt, r.response_ids, r.response_mask, r.advantage,
                   [x + math.log(2.0) * f for x, f in zip(r.rollout_lp, r.spliced)], spliced=r.spliced) for r in rows]
    m_is, lp_is = _policy_update(warm_model_dir, chat, tmp_path / "is", half, "truncated_is")
    m_full, lp_full = _policy_update(warm_model_dir, chat, tmp_path / "full", half, "full")
    assert m_is["splice/effective_weight"] == pytest.approx(0.5, abs=1e-4) and m_full["splice/effective_weight"] == 1.0
    assert m_is["splice/logp_gap"] == pytest.approx(-math.log(2.0), abs=1e-5)
    assert not torch.allclose(lp_is, lp_full, atol=1e-5) and not torch.allclose(lp_is, lp_mask, atol=1e-5)


def _rows_with_weights(warm_model_dir, chat) -> tuple[list[Sample], list[list[float]]]:
    """Three rows of different lengths under one prompt, spliced at different places with π_clean/π_error = 1/2,
    1/4, 1/8 (behaviour log-probs ln k above the clean ones), and the per-token weights truncated_is must give."""
    from models.engine import load_causal_lm
    from models.forward import response_logprobs

    prompt = chat.prompt_ids([{"role": "user", "content": "What is 2 + 2?"}])
    texts = ["So \\boxed{4}.", "The answer is \\boxed{5}, I think.", "4"]
    ids = [chat.encode(t) + [chat.eos_id] for t in texts]
    plain = [Sample(prompt, r, [1] * len(r), 0.0) for r in ids]
    with torch.no_grad():
        lp, _ = response_logprobs(load_causal_lm(warm_model_dir), plain, chat.tokenizer.pad_token_id)
    spliced = [[0, 1, 1] + [0] * (len(ids[0]) - 3), [0] * (len(ids[1]) - 3) + [1, 1, 0], [1] + [0] * (len(ids[2]) - 1)]
    masks = [[1] * len(ids[0]), [1] * (len(ids[1]) - 1) + [0], [1] * len(ids[2])]
    rows, weights = [], []
    for i, (r, f, m, k, adv) in enumerate(zip(ids, spliced, masks, (2.0, 4.0, 8.0), (1.0, -0.5, 2.0))):
        behaviour = [x + math.log(k) * g for x, g in zip(lp[i, : len(r)].tolist(), f)]
        rows.append(Sample(prompt, r, m, adv, behaviour, group="g", row_id=f"r{i}", spliced=f))
        weights.append([1.0 / k if g else 1.0 for g in f])
    return rows, weights


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_trainer_gradient_matches_an_independently_written_weighted_loss(warm_model_dir, chat, tmp_path, monkeypatch,
                                                                         agg):
    """The first optimizer step's gradient (new = old: every ratio 1, nothing clipped) is that of
    −Σ_rows Σ_t mask·w·A·log π / N — N the mini-batch's trained tokens (token-mean), or each row's own token count
    and then the row count (seq-mean-token-mean) — with w each token's own weight: weights moved to other rows
    (e.g. reversed within a micro-batch) or into the denominators change it."""
    from models import trainer
    from models.engine import load_causal_lm
    from models.forward import response_logprobs

    rows, weights = _rows_with_weights(warm_model_dir, chat)
    seen: list[dict[str, torch.Tensor]] = []
    real_step = trainer._optimizer_step

    def recording_step(model, opt, cfg, lr_scale):
        seen.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        return real_step(model, opt, cfg, lr_scale)

    monkeypatch.setattr(trainer, "_optimizer_step", recording_step)
    cfg = TrainerConfig(lr=1e-3, mini_batches=1, micro_batch=2, grad_clip=1e9, splice="truncated_is", loss_agg=agg)
    metrics = trainer.update(warm_model_dir, rows, cfg, tmp_path / "out", chat.tokenizer.pad_token_id, seed=0)
    assert metrics["splice/effective_weight"] == pytest.approx((2 * 0.5 + 2 * 0.25 + 0.125) / 5, abs=1e-5)

    model = load_causal_lm(warm_model_dir)
    model.train()
    lp, _ = response_logprobs(model, rows, chat.tokenizer.pad_token_id)
    per_row = []
    for i, s in enumerate(rows):
        m, w = torch.tensor(s.response_mask, dtype=lp.dtype), torch.tensor(weights[i], dtype=lp.dtype)
        numerator = (lp[i, : len(m)] * m * w).sum() * s.advantage
        per_row.append(numerator / m.sum() / len(rows) if agg == "seq-mean-token-mean" else numerator)
    n_tokens = sum(sum(s.response_mask) for s in rows)
    expected = -sum(per_row) / (1 if agg == "seq-mean-token-mean" else n_tokens)
    expected.backward()
    want = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert set(want) == set(seen[0])
    worst = max(float((seen[0][n] - g).abs().max() / g.abs().max().clamp(min=1e-12)) for n, g in want.items())
    assert worst < 1e-4, worst


@pytest.mark.parametrize("extra", [{"loss_agg": "seq-mean-token-mean", "lr_scale": "ess_linear"},
                                   {"critic": {"enabled": True}}], ids=["seq-mean-ess", "gae"])
def test_mask_is_a_cut_response_mask_for_ess_gae_and_rows_left_empty(warm_model_dir, chat, tmp_path, extra):
    """``mask`` against the same rows with the spliced tokens cut from their response masks — and the row whose
    every trained token was spliced left out, as the step leaves out a row with nothing to train: the same update,
    the same ESS (rollout log-probs off the clean ones on spliced and unspliced tokens), the same value loss (GAE's
    outcome reward on the last unspliced token), the same row count in seq-mean-token-mean."""
    from models.engine import load_causal_lm
    from models.forward import response_logprobs
    from models.trainer import update

    rows, _ = _rows_with_weights(warm_model_dir, chat)
    off = [[x - 0.3 * (t % 3 == 0) for t, x in enumerate(r.rollout_lp)] for r in rows]
    rows = [Sample(r.prompt_ids, r.response_ids, r.response_mask, r.advantage, o, group=r.group, row_id=r.row_id,
                   spliced=f) for r, o, f in zip(rows, off, [rows[0].spliced, rows[1].spliced,
                                                                [1] * len(rows[2].response_ids)])]
    cut = [Sample(r.prompt_ids, r.response_ids, [m * (1 - f) for m, f in zip(r.response_mask, r.spliced)],
                  r.advantage, r.rollout_lp, group=r.group, row_id=r.row_id) for r in rows[:2]]
    assert not trains(rows[2].response_mask, rows[2].spliced, "mask") and trains(rows[2].response_mask, None, "mask")
    out = {}
    for name, samples, splice in (("mask", rows, "mask"), ("cut", cut, "full")):
        cfg = TrainerConfig(lr=1e-3, mini_batches=1, micro_batch=2, splice=splice, **extra)
        metrics = update(warm_model_dir, samples, cfg, tmp_path / name, chat.tokenizer.pad_token_id, seed=0)
        with torch.no_grad():
            lp, _ = response_logprobs(load_causal_lm(tmp_path / name), cut, chat.tokenizer.pad_token_id)
        out[name] = metrics, lp
    (m_mask, lp_mask), (m_cut, lp_cut) = out["mask"], out["cut"]
    assert torch.allclose(lp_mask, lp_cut, atol=1e-6)
    assert not torch.allclose(lp_cut, response_logprobs(load_causal_lm(warm_model_dir), cut,
                                                        chat.tokenizer.pad_token_id)[0].detach(), atol=1e-5)
    assert m_mask["train/sequences"] == m_cut["train/sequences"] == 2
    for key in ("train/tokens", "train/ess_ratio", "train/value_loss", "train/loss"):
        assert (key in m_mask) == (key in m_cut), key
        assert m_mask.get(key, 0.0) == pytest.approx(m_cut.get(key, 0.0), rel=1e-5), key
    if "lr_scale" in extra:
        assert m_cut["train/ess_ratio"] < 0.999  # the weights differ between rows: a check that could fail
    else:
        assert m_cut["train/value_loss"] > 0
