"""StarPO-S group filters: which prompt groups train, chosen by the spread of their rewards.

Input is a table with one row per trajectory: ``group`` (the prompt/start-state group) and
``score`` (the trajectory reward, format penalties included). Per group the reward std
(``ddof=1``, as ``torch.std``), max, mean and sum are computed; a registered filter picks groups:

* ``std`` (RAGEN StarPO-S, ``_filter_rollout``): the ``int(ratio·G)`` groups with the highest std
  (``reverse``: the lowest); ``ratio`` = 1 keeps all. Ties keep the earlier group.
* ``top_p`` (RAGEN-2 ``RolloutFilter._select_top_groups``, linear mode): drop zero-std groups unless
  ``include_zero``; ``top_p`` ≥ 1 keeps the rest; otherwise sort by std, descending, and keep the
  shortest prefix whose sum reaches ``top_p``·Σstd − ``eps``, stopping at the first zero std; if the
  target is not reached, keep nothing (the step is skipped).
* ``none``: keep every group.

``loss_scaling`` turns the kept share of groups into an advantage multiplier (linear: the share,
sqrt: its root). Metrics follow RAGEN's names (``rollout/in_group_std`` …, ``chosen_in_group_*``,
``filter_kept_count`` / ``filter_kept_ratio`` / ``filter_zero_count``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from tasks.envs.config import GroupFilterConfig, max_kept_trajectories  # noqa: F401  (re-exported)

ZERO = 1e-10


@dataclass(frozen=True)
class FilterResult:
    kept: list = field(default_factory=list)
    """Kept group ids, in selection order."""

    metrics: dict = field(default_factory=dict)
    advantage_scale: float = 1.0

    @property
    def empty(self) -> bool:
        return not self.kept


def group_stats(df: pl.DataFrame) -> pl.DataFrame:
    """Per group (first-seen order): n, reward std (ddof=1; 0 for one member), max, mean, sum."""
    return (df.group_by("group", maintain_order=True)
            .agg(pl.len().alias("n"), pl.col("score").std(ddof=1).fill_null(0.0).fill_nan(0.0).alias("std"),
                 pl.col("score").max().alias("max"), pl.col("score").mean().alias("mean"),
                 pl.col("score").sum().alias("sum")))


_FILTERS: dict[str, Callable[[np.ndarray, GroupFilterConfig], list[int]]] = {}


def register_filter(name: str):
    def deco(fn):
        _FILTERS[name] = fn
        return fn

    return deco


@register_filter("none")
def _keep_all(stds: np.ndarray, cfg: GroupFilterConfig) -> list[int]:
    return list(range(len(stds)))


@register_filter("std")
def select_std(stds: np.ndarray, cfg: GroupFilterConfig) -> list[int]:
    """RAGEN StarPO-S: top ``int(ratio·G)`` groups by std (lowest with ``reverse``)."""
    k = int(cfg.ratio * len(stds))
    order = np.argsort(stds if cfg.reverse else -stds, kind="stable")
    return [int(i) for i in order[:k]]


@register_filter("top_p")
def select_top_p(stds: np.ndarray, cfg: GroupFilterConfig) -> list[int]:
    """RAGEN-2 linear top-p over reward std (see module docstring)."""
    idx = np.arange(len(stds))
    if not cfg.include_zero:
        idx = idx[np.abs(stds) > ZERO]
    if cfg.top_p >= 1.0 or idx.size == 0:
        return [int(i) for i in idx]
    scores = stds[idx]
    order = np.argsort(-scores, kind="stable")
    target = cfg.top_p * float(scores.sum()) - cfg.eps
    total, kept = 0.0, []
    for j in order:
        if total >= target or scores[j] <= 0:
            break
        total += float(scores[j])
        kept.append(int(idx[j]))
    return kept if total >= target else []


def filter_names() -> list[str]:
    return sorted(_FILTERS)


def loss_scale(kept_ratio: float, mode: str) -> float:
    """Advantage multiplier for ``filter_loss_scaling`` ``none`` / ``linear`` / ``sqrt``."""
    scales = {"none": 1.0, "linear": kept_ratio, "sqrt": math.sqrt(kept_ratio)}
    if mode not in scales:
        raise ValueError(f"loss_scaling: unknown mode {mode!r}; valid: {sorted(scales)}")
    return scales[mode]


def _mean(values: np.ndarray) -> float:
    return float(values.mean()) if values.size else 0.0


def apply_filter(df: pl.DataFrame, cfg: GroupFilterConfig) -> FilterResult:
    """Select groups of ``df`` (columns ``group``, ``score``) with the filter ``cfg.kind``."""
    try:
        select = _FILTERS[cfg.kind]
    except KeyError:
        raise ValueError(f"filter kind {cfg.kind!r} is unknown; valid: {filter_names()}") from None
    stats = group_stats(df)
    groups = stats["group"].to_list()
    std, mx, mean = (stats[c].to_numpy().astype(float) for c in ("std", "max", "mean"))
    chosen = select(std, cfg) if len(groups) else []
    ratio = len(chosen) / len(groups) if groups else 0.0
    sel = np.array(chosen, dtype=int)
    metrics = {
        "rollout/in_group_std": _mean(std), "rollout/in_group_std_max": float(std.max()) if std.size else 0.0,
        "rollout/in_group_max": _mean(mx), "rollout/in_group_mean": _mean(mean),
        "rollout/chosen_in_group_std": _mean(std[sel]), "rollout/chosen_in_group_max": _mean(mx[sel]),
        "rollout/chosen_in_group_mean": _mean(mean[sel]),
        "rollout/filter_kept_count": float(len(chosen)), "rollout/filter_kept_ratio": ratio,
        "rollout/filter_zero_count": float((np.abs(std) <= ZERO).sum()),
        "rollout/empty_after_filter": float(not chosen),
    }
    return FilterResult([groups[i] for i in chosen], metrics, loss_scale(ratio, cfg.loss_scaling))


def minibatch_shortfall(kept_trajectories: int, mini_batches: int) -> str | None:
    """A message when the kept trajectories cannot fill ``mini_batches`` optimizer steps (None when they can)."""
    if kept_trajectories >= mini_batches:
        return None
    return (f"group filter kept {kept_trajectories} trajectories, fewer than trainer.mini_batches={mini_batches}: "
            f"this step makes {kept_trajectories} optimizer step(s); raise the filter's ratio/top_p, the groups "
            f"per step or the samples per group, or lower trainer.mini_batches")
