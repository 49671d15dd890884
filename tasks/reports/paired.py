"""Paired-seed statistics and number formats shared by the compare report's modules (``tasks.reports.compare``,
``tasks.reports.compare_extra``): seeds from run ids, mean / s.e. / 95 % t interval, a run's final value."""

from __future__ import annotations

import math
import re

import polars as pl

T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}
"""97.5 % quantiles of Student's t by degrees of freedom (the next lower tabulated df is used)."""


def seed_of(run_id: str) -> int:
    m = re.search(r"-s(\d+)$", run_id)
    if m is None:
        raise ValueError(f"run id {run_id!r} does not end in -s<seed>")
    return int(m.group(1))


def t975(df: int) -> float:
    return T975[max(k for k in T975 if k <= df)] if df >= 1 else float("nan")


def mean_se_ci(xs: list[float]) -> dict:
    """Mean, standard error and 95 % t interval of ``xs`` (s.e. and interval ``None`` below two values)."""
    n = len(xs)
    if not n:
        return {"n": 0, "mean": None, "se": None, "ci95": None, "values": []}
    m = sum(xs) / n
    if n < 2:
        return {"n": n, "mean": m, "se": None, "ci95": None, "values": list(xs)}
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))
    se = sd / math.sqrt(n)
    half = t975(n - 1) * se
    return {"n": n, "mean": m, "se": se, "sd": sd, "ci95": [m - half, m + half], "values": list(xs)}


def final_values(evals: pl.DataFrame, key: str) -> dict[str, float]:
    """Per run: ``key`` at its last evaluated version."""
    rows = evals.filter(pl.col("key") == key).sort("policy_version").group_by("run_id").agg(pl.col("value").last())
    return dict(zip(rows["run_id"], rows["value"]))


def fmt(x, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def pm(d: dict) -> str:
    if d.get("mean") is None:
        return "-"
    if d.get("se") is None:
        return f"{d['mean']:+.3f}"
    return f"{d['mean']:+.3f} ± {d['se']:.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}]"
