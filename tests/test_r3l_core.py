"""R3L core rules on hand-computed cases: pivotal credit masks, amplified advantages, grouping, OPMD/KL losses."""

from __future__ import annotations

import pytest
import torch

from models.losses import LOSSES, LossBatch, get_loss, kl_penalty, register_loss
from tasks.r3l.advantage import grpo_reweight_adv, opmd_reweight_adv
from tasks.r3l.credit import assistant_segments, pivotal_mask
from tasks.r3l.grouping import Kind, Planned, plan_rows, retry_succeeded
from tasks.r3l.report import ReportCheck

#            a a a e | t t | b b e | t t t | c c c e
DRAWN_MASK = [1, 1, 1, 1, 0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 1, 1]


def test_segments_of_the_drawn_example():
    assert assistant_segments(DRAWN_MASK) == [(0, 4), (6, 9), (12, 16)]
    assert assistant_segments([0, 0, 1]) == [(2, 3)] and assistant_segments([]) == []


@pytest.mark.parametrize("pivot, expected", [
    (0, DRAWN_MASK),
    (1, [0, 0, 0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 1, 1]),
    (2, [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1]),
    (3, [0] * 16),
    (7, [0] * 16),
    (-1, DRAWN_MASK),
])
def test_pivotal_mask(pivot, expected):
    before = list(DRAWN_MASK)
    assert pivotal_mask(DRAWN_MASK, pivot) == expected
    assert DRAWN_MASK == before, "the input mask is not modified"


@pytest.mark.parametrize("rewards, expected", [
    ([1.0, 0.0, 0.0, 0.5], [1.0, -0.375, -0.375, 0.375]),  # mean .375; 0.5 → 3 × 0.125
    ([1.0, 1.0], [1.0, 1.0]),  # an all-success group trains, unlike GRPO
    ([0.0, 0.0], [0.0, 0.0]),
    ([0.2, 0.6], [-0.2, 0.6]),  # mean .4: 0.6 is 0.2 above → 3 × 0.2
    ([1.0], [1.0]),  # singleton reflect/retry row
    ([0.4], [1.2]),  # singleton: baseline 0, 3 × 0.4
    ([0.0], [0.0]),
    ([1.5, 0.5], [1.0, -0.5]),
])
def test_opmd_reweight_adv(rewards, expected):
    assert opmd_reweight_adv(rewards) == pytest.approx(expected)


def test_opmd_reweight_alpha_and_threshold_are_parameters():
    assert opmd_reweight_adv([0.0, 0.5], alpha=2.0) == pytest.approx([-0.25, 0.5])
    assert opmd_reweight_adv([0.0, 0.5], success=0.5) == pytest.approx([-0.25, 1.0])


def test_grpo_reweight_adv():
    # mean .5, unbiased std .5: z = -1, 0, 1 → success gets 1.0, zero stays 0, the negative stays
    assert grpo_reweight_adv([0.0, 0.5, 1.0]) == pytest.approx([-1.0, 0.0, 1.0], abs=1e-5)
    # mean .2, std .2: z = -1, 0, 1 → the partial reward above the mean is amplified to 3
    assert grpo_reweight_adv([0.0, 0.2, 0.4]) == pytest.approx([-1.0, 0.0, 3.0], abs=1e-4)
    assert grpo_reweight_adv([0.4]) == pytest.approx([1.2]) and grpo_reweight_adv([1.0]) == [1.0]


OK = ReportCheck(True, False, "ok", 2)


@pytest.mark.parametrize("r1, r2, s1, s2, rule, expected", [
    (0.0, 1.0, 3, 3, True, True),
    (0.0, 0.5, 3, 1, True, False),  # improved but below success
    (1.0, 1.0, 3, 2, True, True),  # same reward, fewer steps (ALFWorld clause)
    (1.0, 1.0, 3, 2, False, False),  # math rule: only improvement counts
    (1.0, 1.0, 3, 3, True, False),
    (0.0, 0.0, 3, 1, True, False),
])
def test_retry_succeeded(r1, r2, s1, s2, rule, expected):
    assert retry_succeeded(r1, r2, s1, s2, fewer_steps_rule=rule) is expected


def test_the_math_rule_is_the_default_and_alfworlds_a_switch():
    """The reference's math workflows keep a retry only when it improved (r2 > r1); ALFWorld also when it
    succeeded in fewer steps. Here r1 = r2 = 1 in 2 steps instead of 3."""
    from tasks.rollout.r3l_config import R3LConfig

    kinds = lambda cfg: [r.kind for r in plan_rows("p", 0, 1.0, OK, True, (1.0, 3, 2),
                                                   fewer_steps_rule=cfg.fewer_steps_rule)]
    assert kinds(R3LConfig()) == [Kind.BASE, Kind.DISTILL]
    assert kinds(R3LConfig(fewer_steps_rule=True)) == [Kind.BASE, Kind.DISTILL, Kind.REFLECT, Kind.RETRY]
    assert [r.kind for r in plan_rows("p", 0, 1.0, OK, True, (1.0, 3, 2))] == [Kind.BASE, Kind.DISTILL]


def test_grouping_for_a_successful_retry():
    rows = plan_rows("p7", 1, 0.0, OK, True, (1.0, 3, 3))
    assert rows == [Planned(Kind.BASE, "p7", None, 2), Planned(Kind.DISTILL, "p7", None, 2),
                    Planned(Kind.REFLECT, "p7/reflect/1", 1.0, 0), Planned(Kind.RETRY, "p7/retry/1", 1.0, 2)]


def test_grouping_for_a_failed_retry_and_ablations():
    assert plan_rows("p", 0, 0.0, OK, True, (0.0, 3, 2)) == [Planned(Kind.BASE, "p", None, 2),
                                                             Planned(Kind.DISTILL, "p", None, 2)]
    no_credit = plan_rows("p", 0, 0.0, OK, True, (1.0, 3, 3), pivotal_credit=False)
    assert [r.pivot for r in no_credit] == [0, 0, 0, 0]
    unmasked_retry = plan_rows("p", 0, 0.0, OK, True, (1.0, 3, 3), mask_retry=False)
    assert [r.pivot for r in unmasked_retry] == [2, 2, 0, 0]


@pytest.mark.parametrize("r1, check, has_ids, expected_kinds", [
    (1.0, ReportCheck(True, True, "perfect"), True, [Kind.BASE, Kind.REFLECT]),
    (1.0, ReportCheck(True, True, "perfect"), False, [Kind.BASE]),  # no reflection ids to train on
    (0.0, ReportCheck(True, True, "perfect"), True, [Kind.BASE]),  # a wrong "perfect" verdict is not kept
    (1.0, ReportCheck(False, False, "not_json"), True, [Kind.BASE]),
    (0.0, ReportCheck(False, False, "pivot_out_of_range"), True, [Kind.BASE]),
])
def test_grouping_without_a_retry(r1, check, has_ids, expected_kinds):
    rows = plan_rows("p", 3, r1, check, has_ids, None)
    assert [r.kind for r in rows] == expected_kinds
    assert rows[0] == Planned(Kind.BASE, "p", None, 0)
    if len(rows) > 1:
        assert rows[1] == Planned(Kind.REFLECT, "p/reflect/3", 1.0, 0)


def _batch(**kw):
    new = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]], requires_grad=True)
    base = {"new_lp": new, "old_lp": new.detach().clone(), "adv": torch.tensor([2.0, -1.0]),
            "mask": torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]]), "n_tokens": 3.0}
    return LossBatch(**{**base, **kw})


class Cfg:
    clip_low, clip_high, opmd_tau = 0.2, 0.28, 1.0


def test_opmd_loss_value_and_gradient():
    b = _batch()
    loss, stats = get_loss("opmd")(b, Cfg)
    # -(2·-1 + 2·-2 + -1·-0.5) / 3 tokens / (1 + τ) = 5.5 / 3 / 2
    assert loss.item() == pytest.approx(5.5 / 6)
    loss.backward()
    assert b.new_lp.grad.flatten().tolist() == pytest.approx([-2 / 6, -2 / 6, 0.0, 1 / 6, 0.0, 0.0])
    assert stats["ratio"].item() == pytest.approx(3.0) and stats["clipped"].item() == 0.0


def test_dapo_loss_at_ratio_one_and_per_token_advantages():
    loss, _ = get_loss("dapo")(_batch(), Cfg)
    assert loss.item() == pytest.approx(-(2 + 2 - 1) / 3)
    per_token = torch.tensor([[2.0, 0.0, 9.0], [-1.0, 9.0, 9.0]])
    assert get_loss("dapo")(_batch(adv=per_token), Cfg)[0].item() == pytest.approx(-(2 + 0 - 1) / 3)
    assert get_loss("opmd")(_batch(adv=per_token), Cfg)[0].item() == pytest.approx((2 - 0.5) / 3 / 2)  # -(2·-1 + -1·-0.5) / 3 / 2


def test_seq_mean_token_mean_aggregation_value_and_gradient():
    """Rows of 2 and 1 tokens: −((2 + 2)/2 + (−1)/1) / 2 rows = −0.5 (token-mean: −3/3 = −1); each token's
    gradient is −A / (its row's tokens) / rows."""
    b = _batch(agg="seq-mean-token-mean", n_seqs=2.0)
    loss, _ = get_loss("dapo")(b, Cfg)
    assert loss.item() == pytest.approx(-0.5)
    loss.backward()
    assert b.new_lp.grad.flatten().tolist() == pytest.approx([-0.5, -0.5, 0.0, 0.5, 0.0, 0.0])
    ref = torch.tensor([[0.0, -2.0, 0.0], [0.5, 0.0, 0.0]])  # k1 = new − ref: row 0 (−1 + 0)/2, row 1 −1/1
    assert kl_penalty(_batch(agg="seq-mean-token-mean", n_seqs=4.0, ref_lp=ref), "k1").item() == pytest.approx(-1.5 / 4)


def test_dapo_counts_clipped_tokens():
    b = _batch(old_lp=torch.tensor([[-1.5, -2.0, 0.0], [-0.5, 0.0, 0.0]]))  # ratio e^0.5 on token 0
    _, stats = get_loss("dapo")(b, Cfg)
    assert stats["clipped"].item() == 1.0


def test_k2_kl_penalty():
    b = _batch(ref_lp=torch.zeros(2, 3))
    assert kl_penalty(b, "k2").item() == pytest.approx(0.5 * (1 + 4 + 0.25) / 3)
    assert kl_penalty(b, "k1").item() == pytest.approx(-3.5 / 3)
    with pytest.raises(ValueError, match=r"^a KL penalty needs reference log-probs \(ref_lp\)"):
        kl_penalty(_batch(), "k2")
    with pytest.raises(ValueError, match="registered: k1, k2, k3"):
        kl_penalty(b, "k9")


def test_loss_registry_lists_valid_names_and_extends():
    with pytest.raises(ValueError, match="unknown loss 'ppo'; registered losses: dapo, opmd"):
        get_loss("ppo")

    @register_loss("test_zero")
    def zero(batch, cfg):
        return batch.new_lp.sum() * 0, {}

    try:
        assert get_loss("test_zero") is zero
    finally:
        LOSSES.pop("test_zero")
