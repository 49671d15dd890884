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
* ``grpo_reweight_adv``: the same amplification on GRPO-normalised scores;
* ``mc_grpo``: MC-GRPO (arXiv 2601.22582; ``lotusroot-kim/MC-GRPO``, ``_generate_and_score_completions``
  with ``mc``): a group holds G+1 samples (``rollout.n_samples`` = G+1); A = (r − median) / (MAD + ``mc_eps``)
  with MAD = median |r − median| (the lower median for an even count, as ``torch.median``); the non-zero
  advantages (|A| > 1e-6) are multiplied by (G+1) / #non-zero; the pivot — the first sample in the group
  whose reward is the median — is dropped (it never trains), so G samples carry gradients. No std division.

* ``gae``: the critic variant (RAGEN's PPO with GAE, γ = λ = 1 by default): the row's outcome reward is
  written as its "advantage" — it is the return — and the update computes per-token GAE advantages from a
  value head on the policy and trains the head (``models.critic``; ``trainer.critic`` holds γ, λ, the value
  loss coefficient, the head's learning rate). Selecting it turns ``trainer.critic.enabled`` on.

An estimator may return ``None`` for a row: the row is **dropped** (``dropped`` column, advantage 0): it is
kept by the group filters but never reaches the update, not even as zero-advantage tokens in the token-mean.

To add one: ``@register_advantage("name")`` on ``fn(kept: pl.DataFrame, cfg) -> list[float]``
here (the config validates names against ``ESTIMATORS``); ``per_group`` lifts a rule on one
group's reward list to that signature.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import polars as pl

from tasks.r3l.advantage import grpo_reweight_adv, opmd_reweight_adv

Estimator = Callable[[pl.DataFrame, object], "list[float | None]"]
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
                out[i] = None if a is None else float(a)
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


def mc_grpo(rewards: list[float], eps: float, zero_atol: float = 1e-6) -> list[float | None]:
    """MC-GRPO on one group of G+1 rewards: median baseline, MAD scale, non-zero rescaling, pivot dropped (None)."""
    med = statistics.median_low(rewards)
    mad = statistics.median_low([abs(r - med) for r in rewards]) + eps
    adv: list[float | None] = [(r - med) / mad for r in rewards]
    nonzero = sum(abs(a) > zero_atol for a in adv)
    if nonzero:
        adv = [a * len(rewards) / nonzero if abs(a) > zero_atol else a for a in adv]
    adv[rewards.index(med)] = None
    return adv


register_advantage("mc_grpo")(per_group(lambda rewards, cfg: mc_grpo(rewards, cfg.mc_eps)))


@register_advantage("gae")
def outcome_return(kept: pl.DataFrame, cfg) -> list[float]:
    """The critic variant: each row's outcome reward (its return, on the last trained token); the update turns it
    into per-token GAE advantages with the policy's value head (``models.critic``), no group baseline."""
    return [float(r) for r in kept["reward"].to_list()]


def compute_advantages(df: pl.DataFrame, cfg) -> pl.DataFrame:
    """``df`` with ``advantage`` (the configured estimator on kept rows, 0 elsewhere) and ``dropped`` (kept rows
    the estimator left out of the update: MC-GRPO's pivot)."""
    df = df.with_row_index("_row")
    kept = df.filter(pl.col("kept"))
    adv = get_estimator(cfg.advantage)(kept, cfg) if kept.height else []
    values = pl.DataFrame({"_row": kept["_row"], "advantage": pl.Series(adv, dtype=pl.Float64),
                           "dropped": pl.Series([a is None for a in adv], dtype=pl.Boolean)})
    out = df.join(values, on="_row", how="left").with_columns(pl.col("advantage").fill_null(0.0),
                                                             pl.col("dropped").fill_null(False))
    return out.sort("_row").drop("_row")
