"""Registered contrasts of the compare report: signed combinations of arms, paired by seed.

A contrast (``compare.contrasts``: name → {arm: coefficient}) is, per seed that every arm of it ran, the signed sum
of those arms' finals, e.g. the interaction ``(mask_raw0_c3 − dapo_c3) − (mask_raw0_c1 − dapo_c1)`` is
``{mask_raw0_c3: 1, dapo_c3: -1, mask_raw0_c1: -1, dapo_c1: 1}``. Over the seeds it is reported as the pairs are
(``tasks.reports.paired.mean_se_ci``: mean, s.e., paired-t 95 % interval on seeds − 1 degrees of freedom) with a
reading: "higher" when the interval excludes 0 above, "lower" when below, otherwise "not different" with the
half-width the seeds could detect. Each contrast is computed on the final SAAR-off pass@1 of the fresh split (the
registered outcome, ``eval_fresh/saar_off/all/pass_at_1``) and of the usual held-out split, and on the mediators
(``tasks.reports.mediators.MEDIATORS``) of both splits where the runs logged them. ``compare.primary`` names the
registered primary contrast; the report's head states it.
"""

from __future__ import annotations

import polars as pl

from tasks.reports.paired import final_values, mean_se_ci, seed_of

SPLITS = {"fresh": "eval_fresh/saar_off/", "usual": "eval/saar_off/"}
"""Split → the prefix of its final SAAR-off evaluation keys (the fresh split first: the registered outcome)."""

OUTCOME = "all/pass_at_1"


def direction(d: dict) -> str | None:
    """"higher" / "lower" / "not different" from a paired interval (None without one)."""
    if not d.get("ci95"):
        return None
    lo, hi = d["ci95"]
    return "higher" if lo > 0 else "lower" if hi < 0 else "not different"


def combine(finals: dict[str, float], runs: dict[str, list[str]], weights: dict[str, float]) -> list[tuple[int, float]]:
    """(seed, Σ coefficient × the arm's final) for every seed on which each arm of ``weights`` has a final."""
    by_arm = {arm: {seed_of(r): finals[r] for r in runs[arm] if r in finals} for arm in weights}
    seeds = set.intersection(*(set(v) for v in by_arm.values())) if by_arm else set()
    return [(s, sum(w * by_arm[arm][s] for arm, w in weights.items())) for s in sorted(seeds)]


def contrast(finals: dict[str, float], runs: dict[str, list[str]], weights: dict[str, float]) -> dict:
    """One contrast on one measure: ``mean_se_ci`` of its per-seed values, the seeds, the reading and the
    half-width of its interval."""
    per_seed = combine(finals, runs, weights)
    d = {**mean_se_ci([v for _, v in per_seed]), "seeds": [s for s, _ in per_seed]}
    d["reading"] = direction(d)
    d["half_width"] = (d["ci95"][1] - d["ci95"][0]) / 2 if d.get("ci95") else None
    return d


def summarize(evals: pl.DataFrame, runs: dict[str, list[str]], spec: dict[str, dict[str, float]],
              primary: str | None, mediators: dict[str, str] | None = None) -> dict:
    """Every contrast of ``spec`` on the outcome of each split (``outcome``) and on each mediator key
    (``mediators``: name → key under the split's prefix) the runs logged; empty without contrasts."""
    if not spec:
        return {}
    out: dict = {"primary": primary, "outcome": SPLITS["fresh"] + OUTCOME, "by_name": {}}
    for name, weights in spec.items():
        row: dict = {"weights": dict(weights), "outcome": {}, "mediators": {}}
        for split, prefix in SPLITS.items():
            finals = final_values(evals, prefix + OUTCOME)
            if finals:
                row["outcome"][split] = contrast(finals, runs, weights)
            for med, key in (mediators or {}).items():
                values = final_values(evals, prefix + key)
                if values:
                    row["mediators"].setdefault(split, {})[med] = contrast(values, runs, weights)
        out["by_name"][name] = row
    return out


def formula(weights: dict[str, float]) -> str:
    """``+1 a − 1 b`` written out: coefficient ±1 as the sign alone."""
    parts = []
    for arm, w in weights.items():
        sign = "−" if w < 0 else "+"
        size = "" if abs(w) == 1 else f"{abs(w):g}·"
        parts.append(f"{sign} {size}{arm}")
    text = " ".join(parts)
    return text[2:] if text.startswith("+ ") else text


def cell(d: dict) -> str:
    """A paired difference as the report writes it: mean ± s.e. [95 % interval]: reading."""
    if d.get("mean") is None:
        return "-"
    if d.get("se") is None:
        return f"{d['mean']:+.3f}"
    lo, hi = d["ci95"]
    words = d["reading"] if d["reading"] != "not different" or "half_width" not in d \
        else f"not different (±{d['half_width']:.3f})"
    return f"{d['mean']:+.3f} ± {d['se']:.3f} [{lo:+.3f}, {hi:+.3f}]: {words}"


def headline(s: dict) -> list[str]:
    """The registered primary contrast in one line for the report's head (nothing without one)."""
    c = s.get("contrasts") or {}
    name = c.get("primary")
    if not name or name not in c.get("by_name", {}):
        return []
    d = c["by_name"][name]["outcome"].get("fresh", {})
    return ["", f"**Primary (registered): `{name}`** = {formula(c['by_name'][name]['weights'])}, final fresh-split "
                f"SAAR-off pass@1, {d.get('n', 0)} seeds: {cell(d)}."]


def markdown_lines(s: dict) -> list[str]:
    """Every contrast on the outcome of both splits, then on the mediators (nothing for a report without them)."""
    c = s.get("contrasts") or {}
    if not c.get("by_name"):
        return []
    lines = ["", "**Registered contrasts**, paired by seed (per seed the signed sum of the arms' finals; mean ± s.e. "
                 "[paired-t 95 % CI]: reading), final SAAR-off:", "",
             "| contrast | = | measure | split | seeds | value |", "| --- | --- | --- | --- | --- | --- |"]
    for name, row in c["by_name"].items():
        mark = f"**{name}** (primary)" if name == c.get("primary") else name
        for split, d in row["outcome"].items():
            lines.append(f"| {mark} | {formula(row['weights'])} | pass@1 | {split} | {d['n']} | {cell(d)} |")
        for split, meds in row["mediators"].items():
            lines += [f"| {name} | | {med} | {split} | {d['n']} | {cell(d)} |" for med, d in meds.items()]
    return lines
