"""Advantage estimators as a registry: ``mix.advantage`` names one; the advantage stage applies it.

An estimator takes the step's **kept** rows (a polars frame with at least ``group_id``,
``reward`` and ``kind``) and the mix config, and returns one advantage per row, in order;
rows that do not train get 0. Outcome advantages are per sequence: the trainer broadcasts
them over the row's mask-1 tokens.

Registered:

* ``grpo``: (r − group mean) / (group std + ε), unbiased std; a group of one gets 0 (DESIGN §2);
* ``mean``: r − group mean (RAGEN's ``reward_normalization.method: mean``): the reward scale is kept, so a
  group whose rewards differ by 0.1 weighs less than one whose rewards differ by 1; a group of one gets 0;
* ``opmd_reweight_adv``: R3L's positive amplification (``tasks.r3l.advantage``): baseline the
  group mean (0 for a group of one), successes get exactly 1, positive scores × ``reweight_alpha``;
* ``grpo_reweight_adv``: the same amplification on GRPO-normalised scores.

To add one: ``@register_advantage("name")`` on ``fn(kept: pl.DataFrame, cfg) -> list[float]``
here (the config validates names against ``ESTIMATORS``); ``per_group`` lifts a rule on one
group's reward list to that signature.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import polars as pl

from tasks.r3l.advantage import grpo_reweight_adv, opmd_reweight_adv

Estimator = Callable[[pl.DataFrame, object], list[float]]
ESTIMATORS: dict[str, Estimator] = {}


def register_advantage(name: str) -> Callable[[Estimator], Estimator]:
    def add(fn: Estimator) -> Estimator:
        ESTIMATORS[name] = fn
        return fn
    return add


def get_estimator(name: str) -> Estimator:
    if name not in ESTIMATORS:
        raise ValueError(f"mix.advantage: unknown estimator {name!r}; registered: {', '.join(sorted(ESTIMATORS))}")
    return ESTIMATORS[name]


def per_group(rule: Callable[[list[float], object], list[float]]) -> Estimator:
    """An estimator applying ``rule(group rewards, cfg)`` to every ``group_id`` group."""
    def estimate(kept: pl.DataFrame, cfg) -> list[float]:
        out = [0.0] * kept.height
        rows: dict[str, list[int]] = {}
        for i, g in enumerate(kept["group_id"].to_list()):
            rows.setdefault(g, []).append(i)
        rewards = kept["reward"].to_list()
        for idx in rows.values():
            for i, a in zip(idx, rule([rewards[i] for i in idx], cfg)):
                out[i] = float(a)
        return out
    return estimate


def _grpo(rewards: list[float], cfg) -> list[float]:
    if len(rewards) < 2:
        return [0.0] * len(rewards)
    mean, std = statistics.fmean(rewards), statistics.stdev(rewards)
    return [(r - mean) / (std + cfg.adv_eps) for r in rewards]


register_advantage("grpo")(per_group(_grpo))
register_advantage("mean")(per_group(lambda rewards, cfg: [r - statistics.fmean(rewards) for r in rewards]
                                     if len(rewards) > 1 else [0.0] * len(rewards)))
register_advantage("opmd_reweight_adv")(per_group(
    lambda rewards, cfg: opmd_reweight_adv(rewards, cfg.reweight_alpha, cfg.reweight_success)))
register_advantage("grpo_reweight_adv")(per_group(
    lambda rewards, cfg: grpo_reweight_adv(rewards, cfg.reweight_alpha, cfg.reweight_success, cfg.adv_eps)))


def compute_advantages(df: pl.DataFrame, cfg) -> pl.DataFrame:
    """``df`` with an ``advantage`` column: the configured estimator on kept rows, 0 elsewhere."""
    df = df.with_row_index("_row")
    kept = df.filter(pl.col("kept"))
    adv = get_estimator(cfg.advantage)(kept, cfg) if kept.height else []
    values = pl.DataFrame({"_row": kept["_row"], "advantage": pl.Series(adv, dtype=pl.Float64)})
    out = df.join(values, on="_row", how="left").with_columns(pl.col("advantage").fill_null(0.0))
    return out.sort("_row").drop("_row")
