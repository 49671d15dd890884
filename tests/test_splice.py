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
from models.losses import LossBatch, get_loss
from models.splice import TREATMENTS, SpliceView, get_treatment, splice_metrics, treat_rows
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
    batch = LossBatch(new, t.old_lp.unsqueeze(0), torch.tensor([adv]), mask * t.weight.unsqueeze(0), float(mask.sum()))
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
    from models.trainer import response_logprobs, update

    cfg = TrainerConfig(lr=1e-3, mini_batches=1, splice=splice)
    metrics = update(warm_model_dir, samples, cfg, out, chat.tokenizer.pad_token_id, seed=0)
    with torch.no_grad():
        lp, _ = response_logprobs(load_causal_lm(out), samples, chat.tokenizer.pad_token_id)
    return metrics, lp


def test_update_trains_mask_like_a_response_mask_without_the_spliced_tokens(warm_model_dir, chat, tmp_path):
    """The trainer wires the treatment in: ``mask`` on spliced tokens is the same update as ``full`` on rows whose
    response mask already excludes them; ``truncated_is`` with no gap (behaviour = clean) is the same as ``full``."""
    from models.engine import load_causal_lm
    from models.trainer import response_logprobs

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
