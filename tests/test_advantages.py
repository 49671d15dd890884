"""Advantage estimators registry: GRPO and R3L's reweighted estimators on hand-computed groups."""

from __future__ import annotations

from types import SimpleNamespace

import polars as pl
import pytest

from tasks.training.advantages import ESTIMATORS, compute_advantages, get_estimator, per_group, register_advantage

CFG = {"adv_eps": 1e-6, "reweight_alpha": 3.0, "reweight_success": 1.0, "mc_eps": 1e-3}


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


def test_gae_writes_the_outcome_return():
    """The critic variant's advantage stage passes each row's reward on (the trainer turns it into GAE per token)."""
    assert adv("gae") == pytest.approx([0.0, 0.5, 1.0, 0.0, 1.0, 1.0, 0.0, 0.0])  # unkept rows: 0


def test_unknown_estimator_lists_the_registered_ones():
    with pytest.raises(ValueError, match="unknown estimator 'ppo'; registered: gae, grpo, grpo_reweight_adv, mc_grpo, mean, opmd_"):
        get_estimator("ppo")


def test_registry_extends_with_a_group_rule():
    register_advantage("test_centered")(per_group(lambda rewards, cfg: [r - sum(rewards) / len(rewards) for r in rewards]))
    try:
        assert adv("test_centered") == pytest.approx([-0.375, 0.125, 0.625, -0.375, 0.0, 0.0, 0.0, 0.0])
    finally:
        ESTIMATORS.pop("test_centered")


def mc(rewards):
    df = pl.DataFrame({"group_id": ["g"] * len(rewards), "reward": rewards, "kept": [True] * len(rewards),
                       "kind": ["rollout"] * len(rewards)})
    out = compute_advantages(df, SimpleNamespace(advantage="mc_grpo", **CFG))
    return out["advantage"].to_list(), out["dropped"].to_list()


def test_mc_grpo_median_mad_rescale_and_pivot_on_a_graded_group():
    # G+1 = 5: sorted [0, 0, .5, 1, 1] → median .5 (sample 4, the pivot); |r - .5| = [.5, .5, .5, .5, 0] → MAD .5;
    # A = ±.5 / (.5 + .001); 4 non-zero of 5 → × 5/4; the pivot is dropped
    a = 0.5 / 0.501 * 5 / 4
    adv, dropped = mc([1.0, 0.0, 0.0, 1.0, 0.5])
    assert adv == pytest.approx([a, -a, -a, a, 0.0])
    assert dropped == [False, False, False, False, True]


def test_mc_grpo_binary_rewards_scale_by_epsilon_and_drop_the_first_median_sample():
    # [1, 0, 0, 0, 1]: median 0, MAD 0 → A = 1 / .001 = 1000 for the successes; 2 non-zero of 5 → × 2.5;
    # the pivot is the first sample with the median reward (index 1); the other zeros still train with A = 0
    adv, dropped = mc([1.0, 0.0, 0.0, 0.0, 1.0])
    assert adv == pytest.approx([2500.0, 0.0, 0.0, 0.0, 2500.0])
    assert dropped == [False, True, False, False, False]


def test_mc_grpo_even_group_uses_the_lower_median_and_an_all_equal_group_only_drops_its_pivot():
    # [0, .2, .6, 1]: lower median .2; |r - .2| = [.2, 0, .4, .8] → lower median .2; 3 non-zero of 4 → × 4/3
    s = 4 / 3 / 0.201
    adv, dropped = mc([0.0, 0.2, 0.6, 1.0])
    assert adv == pytest.approx([-0.2 * s, 0.0, 0.4 * s, 0.8 * s])
    assert dropped == [False, True, False, False]
    assert mc([1.0, 1.0, 1.0]) == ([0.0, 0.0, 0.0], [True, False, False])


def test_the_mc_grpo_pivot_never_reaches_the_update(tmp_path):
    from tasks.training.config import MixConfig
    from tasks.training.mixing import advantage_step
    from tasks.training.stages import training_rows

    keys = {"run_id": ["r"] * 5, "step": [0] * 5, "traj_id": [f"0:p:{k}" for k in range(5)]}
    pl.DataFrame({**keys, "prompt_id": ["p"] * 5, "prompt_ids": [[1]] * 5, "response_ids": [[2]] * 5,
                  "response_mask": [[1]] * 5}).write_parquet(tmp_path / "trajectories.parquet")
    pl.DataFrame({**keys, "reward": [1.0, 0.0, 0.0, 1.0, 0.5]}).write_parquet(tmp_path / "scores.parquet")
    pl.DataFrame({**keys, "kept": [True] * 5, "adv_scale": [1.0] * 5}).write_parquet(tmp_path / "mix.parquet")
    metrics = advantage_step(tmp_path, MixConfig(advantage="mc_grpo"))
    assert metrics["train/dropped_rows"] == 1
    assert training_rows(tmp_path)["traj_id"].to_list() == ["0:p:0", "0:p:1", "0:p:2", "0:p:3"]
