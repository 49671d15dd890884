"""StarPO-S / RAGEN-2 group filters on hand-made groups, and RAGEN-2's MI formulas on a small matrix."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

from tasks.envs.collapse import mi_diagnostics, success_metrics
from tasks.envs.config import GroupFilterConfig
from tasks.envs.filters import apply_filter, loss_scale, max_kept_trajectories, minibatch_shortfall

# reward std (ddof=1) per group: g0 0.5, g1 0.57735, g2 0, g3 0.48563
GROUPS = {"g0": [1, 0, 0, 0], "g1": [1, 1, 0, 0], "g2": [0.5] * 4, "g3": [0.1, 0, 1, 0]}


def _table(groups: dict) -> pl.DataFrame:
    return pl.DataFrame([{"group": g, "score": float(s)} for g, scores in groups.items() for s in scores])


@pytest.mark.parametrize("ratio, reverse, kept", [
    (1.0, False, ["g1", "g0", "g3", "g2"]),
    (0.5, False, ["g1", "g0"]),
    (0.25, False, ["g1"]),
    (0.5, True, ["g2", "g3"]),
    (0.2, False, []),                  # int(0.2 · 4) = 0 groups, as RAGEN's topk(int(ratio·G))
])
def test_std_filter_keeps_top_ratio(ratio, reverse, kept):
    res = apply_filter(_table(GROUPS), GroupFilterConfig(kind="std", ratio=ratio, reverse=reverse))
    assert res.kept == kept and res.empty == (not kept)


@pytest.mark.parametrize("top_p, include_zero, kept", [
    (0.9, False, ["g1", "g0", "g3"]),  # target 0.9·1.56298 − 0.01 = 1.3967 needs all three
    (0.6, False, ["g1", "g0"]),        # target 0.9278: 0.577 + 0.5 = 1.077
    (0.3, False, ["g1"]),              # target 0.4589: 0.577 alone
    (1.0, False, ["g0", "g1", "g3"]),  # ≥ 1 keeps every non-zero group
    (1.0, True, ["g0", "g1", "g2", "g3"]),
    (0.6, True, ["g1", "g0"]),         # zero groups add nothing to the sum and are never chosen
])
def test_top_p_linear_filter(top_p, include_zero, kept):
    res = apply_filter(_table(GROUPS), GroupFilterConfig(kind="top_p", top_p=top_p, include_zero=include_zero))
    assert res.kept == kept


def test_top_p_on_all_equal_groups_keeps_nothing():
    flat = {"a": [1, 1, 1], "b": [0, 0, 0]}
    for include_zero in (False, True):
        res = apply_filter(_table(flat), GroupFilterConfig(kind="top_p", include_zero=include_zero))
        assert res.empty and res.metrics["rollout/empty_after_filter"] == 1.0
        assert res.metrics["rollout/filter_zero_count"] == 2


def test_filter_metrics_and_loss_scaling():
    res = apply_filter(_table(GROUPS), GroupFilterConfig(kind="std", ratio=0.5, loss_scaling="sqrt"))
    m = res.metrics
    assert m["rollout/in_group_std"] == pytest.approx((0.5 + 0.57735 + 0 + 0.48563) / 4, abs=1e-5)
    assert m["rollout/in_group_std_max"] == pytest.approx(0.57735, abs=1e-5)
    assert m["rollout/chosen_in_group_std"] == pytest.approx((0.5 + 0.57735) / 2, abs=1e-5)
    assert m["rollout/in_group_max"] == pytest.approx(0.875)
    assert m["rollout/in_group_mean"] == pytest.approx((0.25 + 0.5 + 0.5 + 0.275) / 4)
    assert m["rollout/chosen_in_group_mean"] == pytest.approx(0.375)
    assert m["rollout/filter_kept_count"] == 2 and m["rollout/filter_kept_ratio"] == 0.5
    assert res.advantage_scale == pytest.approx(math.sqrt(0.5))
    assert loss_scale(0.25, "linear") == 0.25 and loss_scale(0.25, "none") == 1.0
    with pytest.raises(ValueError, match="valid: \\['linear', 'none', 'sqrt'\\]"):
        loss_scale(0.5, "cube")


def test_single_member_groups_have_zero_std():
    res = apply_filter(_table({"a": [1.0], "b": [0.0, 1.0]}), GroupFilterConfig(kind="std", ratio=0.5))
    assert res.kept == ["b"]


def test_filter_that_keeps_fewer_than_the_minibatches_says_so():
    assert minibatch_shortfall(32, 4) is None
    msg = minibatch_shortfall(2, 4)
    assert "kept 2 trajectories, fewer than trainer.mini_batches=4" in msg
    assert max_kept_trajectories(GroupFilterConfig(kind="std", ratio=0.25), 8, 16) == 32
    assert max_kept_trajectories(GroupFilterConfig(kind="std", ratio=0.1), 8, 16) == 0
    assert max_kept_trajectories(GroupFilterConfig(kind="top_p"), 8, 16) is None


# -- MI diagnostics ---------------------------------------------------------------------------

CROSS = np.array([[-1.0, -3.0], [-2.0, -2.0], [-4.0, -1.0], [-1.0, -1.0]])
COLS = np.array([0, 0, 1, 1])


def test_mi_formulas_on_a_small_matrix():
    m = mi_diagnostics(CROSS, COLS)
    # marginal_i = logsumexp_j L[i, j] − log 2 = (−1.566219, −2, −1.644560, −1); matched = (−1, −2, −1, −1)
    assert m["collapse/conditional_entropy_est"] == pytest.approx(1.25)
    assert m["collapse/reasoning_entropy_est"] == pytest.approx(1.552695, abs=1e-6)
    assert m["collapse/mi_estimate"] == pytest.approx(0.302695, abs=1e-6)
    assert m["collapse/mi_upper_bound"] == pytest.approx(math.log(2))
    assert m["collapse/retrieval_accuracy"] == 0.75      # row 4 ties: argmax picks column 0, the wrong one
    assert m["collapse/retrieval_chance_level"] == 0.5
    assert m["collapse/marginal_std"] == pytest.approx(0.358530, abs=1e-6)
    assert m["collapse/mi_zscore"] == pytest.approx(0.302695 / (0.358530 + 1e-3), abs=1e-5)


def test_identical_prompts_count_as_one_column_for_retrieval():
    m = mi_diagnostics(CROSS, COLS, col_keys=["same", "same"])
    assert m["collapse/retrieval_accuracy"] == 1.0 and m["collapse/retrieval_chance_level"] == 1.0


def test_input_agnostic_reasoning_has_zero_mi():
    flat = np.tile(np.array([[-2.0, -2.0, -2.0]]), (6, 1))
    m = mi_diagnostics(flat, np.array([0, 1, 2, 0, 1, 2]))
    assert m["collapse/mi_estimate"] == pytest.approx(0.0) and m["collapse/mi_zscore"] == pytest.approx(0.0)


def test_mi_rejects_bad_shapes():
    with pytest.raises(ValueError, match="≥ 2 prompts"):
        mi_diagnostics(np.zeros((3, 1)), np.zeros(3, dtype=int))
    with pytest.raises(ValueError, match="col_ids"):
        mi_diagnostics(CROSS, np.array([0, 1, 2, 0]))


def test_success_and_pass_at_group():
    df = pl.DataFrame({"group": ["a", "a", "b", "b", "c", "c"], "success": [True, False, False, False, True, True]})
    assert success_metrics(df, "frozen_lake") == {"frozen_lake/success": 0.5, "frozen_lake/pass_at_2": pytest.approx(2 / 3)}


# -- the mix stage with a group filter ----------------------------------------------------------

def _step(tmp_path, rewards: dict[str, list[float]], step: int = 3):
    from tasks.stores.records import write_frames

    rows = [{"run_id": "r", "step": step, "traj_id": f"{p}{i}", "prompt_id": p, "raw": False, "rollbacks_recovered": 0}
            for p, rs in rewards.items() for i in range(len(rs))]
    scores = [{"run_id": "r", "step": step, "traj_id": f"{p}{i}", "reward": float(r), "graded": True,
               "correct": r > 0} for p, rs in rewards.items() for i, r in enumerate(rs)]
    folder = tmp_path / f"{step:06d}"
    write_frames({"trajectories": pl.DataFrame(rows), "scores": pl.DataFrame(scores)}, folder)
    return folder


def test_mix_step_counts_empty_steps_and_flags_the_early_stop(tmp_path):
    from tasks.training.config import MixConfig
    from tasks.training.mixing import mix_step

    cfg = MixConfig(dynamic_sampling=False, group_filter={"kind": "top_p", "empty_stop_steps": 5})
    flat = _step(tmp_path, {"a": [1, 1], "b": [0, 0]})
    m = mix_step(flat, cfg, mini_batches=2, empty_before=3)
    assert m["rollout/consecutive_empty_after_filter_steps"] == 4 and m["early_stopped/empty_filtered_steps"] == 0
    m = mix_step(flat, cfg, mini_batches=2, empty_before=4)
    assert m["early_stopped/empty_filtered_steps"] == 1.0 and m["mix/trajectories_kept"] == 0
    live = _step(tmp_path, {"a": [1, 0], "b": [0, 0]}, step=4)
    m = mix_step(live, cfg, mini_batches=4, empty_before=4)
    assert m["rollout/consecutive_empty_after_filter_steps"] == 0 and m["mix/filter_shortfall"] == 1.0


def test_loss_scaling_reaches_the_advantage(tmp_path):
    from tasks.training.config import MixConfig
    from tasks.training.mixing import advantage_step, mix_step

    folder = _step(tmp_path, {"a": [1, 0], "b": [0.5, 0], "c": [0, 0], "d": [1, 1]})
    cfg = MixConfig(dynamic_sampling=False, group_filter={"kind": "std", "ratio": 0.25, "loss_scaling": "linear"})
    mix_step(folder, cfg)
    advantage_step(folder, cfg)
    adv = pl.read_parquet(folder / "advantages.parquet").sort("traj_id")
    # only group a is kept (highest std); GRPO gives ±0.7071 (ddof=1), scaled by the kept share 1/4
    assert adv["advantage"].to_list()[:2] == pytest.approx([0.25 * 0.70710, -0.25 * 0.70710], abs=1e-4)
    assert adv["advantage"].to_list()[2:] == [0.0] * 6


def test_collapse_panel_draws_every_signal_family(tmp_path):
    from tasks.envs.plots import PANELS, _keys, plot_collapse

    keys = ["rollout/in_group_std", "train/entropy", "train/grad_norm", "train/clip_frac", "train/approx_kl",
            "response_length", "frozen_lake/success", "frozen_lake/pass_at_8", "eval/frozen_lake/success",
            "collapse/mi_estimate", "collapse/retrieval_accuracy"]
    rows = [{"step": s, "key": k, "value": float(s)} for s in range(3) for k in keys]
    png = plot_collapse(pl.DataFrame(rows), tmp_path / "collapse.png", "run")
    assert png.stat().st_size > 10_000
    assert _keys(keys, PANELS["success"]) == ["frozen_lake/success", "frozen_lake/pass_at_8"]   # eval/ kept apart
    assert all(_keys(keys, wanted) for wanted in PANELS.values())


def test_mean_only_normalisation_keeps_the_reward_scale(tmp_path):
    from tasks.training.config import MixConfig
    from tasks.training.mixing import advantage_step, mix_step

    folder = _step(tmp_path, {"hit": [1.0, 0.1], "miss": [0.0, 0.1]})
    cfg = MixConfig(dynamic_sampling=False, advantage="mean")
    mix_step(folder, cfg)
    advantage_step(folder, cfg)
    adv = pl.read_parquet(folder / "advantages.parquet").sort("traj_id")["advantage"].to_list()
    assert adv == pytest.approx([0.45, -0.45, -0.05, 0.05])   # hit0, hit1, miss0, miss1: r - group mean
