"""Advantage estimators registry: GRPO and R3L's reweighted estimators on hand-computed groups."""

from __future__ import annotations

from types import SimpleNamespace

import polars as pl
import pytest

from tasks.training.advantages import ESTIMATORS, compute_advantages, get_estimator, per_group, register_advantage

CFG = {"adv_eps": 1e-6, "reweight_alpha": 3.0, "reweight_success": 1.0}


def frame():
    # explore group p (2 base + 2 distill), a singleton reflect and retry group, a dropped group q
    return pl.DataFrame({
        "traj_id": ["b0", "b1", "d0", "d1", "r0", "t0", "q0", "q1"],
        "group_id": ["p", "p", "p", "p", "p/reflect/0", "p/retry/0", "q", "q"],
        "kind": ["base", "base", "distill", "distill", "reflect", "retry", "rollout", "rollout"],
        "reward": [0.0, 0.5, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0],
        "kept": [True, True, True, True, True, True, False, False],
    })


def adv(name):
    return compute_advantages(frame(), SimpleNamespace(advantage=name, **CFG))["advantage"].to_list()


def test_opmd_reweight_adv_on_an_r3l_step():
    # group p: mean .375 → 0 → -.375; .5 → 3 × .125; 1 → 1.0; singletons → 1.0; unkept → 0
    assert adv("opmd_reweight_adv") == pytest.approx([-0.375, 0.375, 1.0, -0.375, 1.0, 1.0, 0.0, 0.0])


def test_grpo_gives_singletons_nothing():
    # group p: mean .375, stdev sqrt(((.375)^2·2 + .125^2 + .625^2)/3) = 0.4787
    std = (((0.375 ** 2) * 2 + 0.125 ** 2 + 0.625 ** 2) / 3) ** 0.5
    expected = [(r - 0.375) / (std + 1e-6) for r in (0.0, 0.5, 1.0, 0.0)] + [0.0] * 4
    assert adv("grpo") == pytest.approx(expected)


def test_grpo_reweight_adv():
    std = (((0.375 ** 2) * 2 + 0.125 ** 2 + 0.625 ** 2) / 3) ** 0.5
    z = [(r - 0.375) / (std + 1e-6) for r in (0.0, 0.5, 1.0, 0.0)]
    assert adv("grpo_reweight_adv") == pytest.approx([z[0], 3 * z[1], 1.0, z[3], 1.0, 1.0, 0.0, 0.0])


def test_unknown_estimator_lists_the_registered_ones():
    with pytest.raises(ValueError, match="unknown estimator 'gae'; registered: grpo, grpo_reweight_adv, mean, opmd_"):
        get_estimator("gae")


def test_registry_extends_with_a_group_rule():
    register_advantage("test_centered")(per_group(lambda rewards, cfg: [r - sum(rewards) / len(rewards) for r in rewards]))
    try:
        assert adv("test_centered") == pytest.approx([-0.375, 0.125, 0.625, -0.375, 0.0, 0.0, 0.0, 0.0])
    finally:
        ESTIMATORS.pop("test_centered")
