"""Collapse diagnostics: RAGEN-2's mutual-information estimates and per-step group statistics.

**Template collapse** (RAGEN-2, ``CollapseDetector``): reasoning ``z`` (the tokens strictly inside
``<think>…</think>``) that no longer depends on the input ``x``. Given a cross matrix
``L[i, j] = ℓ_j(z_i)`` — the mean per-token log-prob of sample ``i``'s reasoning after prompt
``j`` — and each sample's own prompt column ``c_i``::

    matched_i   = L[i, c_i]
    marginal_i  = logsumexp_j L[i, j] − log N            (N prompts, uniform mixture)
    MI          = mean(matched) − mean(marginal)          (≤ log N; ~0 when z ignores x)
    H(Z|X)      = −mean(matched);  H(Z) ≈ −mean(marginal)
    retrieval   = mean[argmax_j L[i, j] = c_i]             (chance 1/N)
    MI z-score  = mean((matched − marginal) / (std(marginal) + 1e-3))   (population std)

With ``col_keys`` (one key per column, e.g. the prompt ids), columns with identical prompts count
as the same answer for retrieval, and chance is the mean share of columns sharing the true key
(RAGEN-2's column signatures). ``mi_diagnostics`` is pure numpy; building ``L`` with a model is
``tasks.envs.mi_probe``.

**Per-step signals**: ``success_metrics`` gives the success rate and pass@group (any success in a
group) of a trajectory table.
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl


def _logsumexp(a: np.ndarray) -> np.ndarray:
    m = a.max(axis=1, keepdims=True)
    return (m + np.log(np.exp(a - m).sum(axis=1, keepdims=True)))[:, 0]


def mi_diagnostics(cross: np.ndarray, col_ids: np.ndarray, col_keys: list | None = None,
                   std_eps: float = 1e-3, prefix: str = "collapse/") -> dict[str, float]:
    """MI, H(Z|X), H(Z), retrieval accuracy and MI z-score of the cross matrix (see module docstring)."""
    cross = np.asarray(cross, dtype=float)
    col_ids = np.asarray(col_ids, dtype=int)
    n_samples, n = cross.shape
    if n < 2 or n_samples == 0:
        raise ValueError(f"MI diagnostics need ≥ 2 prompts and ≥ 1 sample; got a {n_samples}x{n} matrix")
    if col_ids.shape != (n_samples,) or col_ids.min() < 0 or col_ids.max() >= n:
        raise ValueError(f"col_ids must give each of the {n_samples} samples a column in 0..{n - 1}")
    matched = cross[np.arange(n_samples), col_ids]
    marginal = _logsumexp(cross) - math.log(n)
    predicted = cross.argmax(axis=1)
    if col_keys is None:
        retrieval = float((predicted == col_ids).mean())
        chance = 1.0 / n
    else:
        ids = {k: i for i, k in enumerate(dict.fromkeys(col_keys))}
        key = np.array([ids[k] for k in col_keys])
        retrieval = float((key[predicted] == key[col_ids]).mean())
        chance = float((np.bincount(key)[key[col_ids]] / n).mean())
    diff = matched - marginal
    return {f"{prefix}{k}": float(v) for k, v in {
        "mi_estimate": matched.mean() - marginal.mean(),
        "mi_upper_bound": math.log(n),
        "conditional_entropy_est": -matched.mean(),
        "reasoning_entropy_est": -marginal.mean(),
        "retrieval_accuracy": retrieval,
        "retrieval_chance_level": chance,
        "retrieval_above_chance": retrieval - chance,
        "marginal_std": marginal.std(),
        "mi_zscore": (diff / (marginal.std() + std_eps)).mean(),
        "num_samples": n_samples,
        "num_prompts": n,
    }.items()}


def success_metrics(df: pl.DataFrame, prefix: str) -> dict[str, float]:
    """Success rate and pass@group of a table with ``group`` and ``success`` columns."""
    if df.height == 0:
        return {}
    groups = df.group_by("group").agg(pl.col("success").any().alias("any"), pl.len().alias("n"))
    k = int(groups["n"].max())
    return {f"{prefix}/success": float(df["success"].cast(pl.Float64).mean()),
            f"{prefix}/pass_at_{k}": float(groups["any"].cast(pl.Float64).mean())}
