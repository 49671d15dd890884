"""Mediators of the compare report: what a failed call cost each arm, and what its grader and rollback counted.

``summarize`` (the report's ``mediators`` section):

* **per seed, per arm and paired** — the final evaluation's SAAR-off mediators on the fresh split and the usual
  held-out split (``MEDIATORS``, logged by ``tasks.training.eval_measures``; first-attempt success per call is the
  evaluation's older key): first-call success (per trajectory), first-attempt success (per call), the share of
  trajectories cut at the turn cap and P(correct | every call clean). Each arm is paired by seed against its own
  baseline (``compare.pair_with[arm]``, default ``compare.baseline``): mean, s.e., paired-t 95 % interval and the
  reading (``tasks.reports.contrasts.direction``). A run that did not log a key (made before it existed) has none.
* **training** — per arm, over every training step of every seed (``tasks.stores.db.step_totals``): the chain
  grader's ``score/suspected_hacks/…`` and ``score/right_by_chance`` counts summed (per seed and over seeds); where
  the runs logged them, SAAR's plan-B counts ``rollback/planb_append_count`` / ``rollback/planb_replace_count``
  summed, the append share of the pooled decisions and the step mean of ``rollback/planb_append_rate``; and the
  importance-ratio quantiles ``rollback/is_log_ratio_p10/_p50/_p90`` pooled over seeds as the mean over every step
  of every seed of that step's quantile (the steps' raw ratios are not kept).
"""

from __future__ import annotations

import polars as pl

from tasks.reports.contrasts import SPLITS, cell, direction
from tasks.reports.paired import final_values, mean_se_ci, seed_of
from tasks.reports.paired import fmt as _f

MEDIATORS = {"first_call_success": "tools/first_call_success_rate",
             "first_attempt_success": "tools/first_attempt_success_rate",
             "turn_cap_share": "rollout/turn_cap_share", "p_correct_all_clean": "tools/p_correct_all_clean"}
"""Mediator name → its evaluation key under a split's SAAR-off prefix (``contrasts.SPLITS``)."""

HACK_PREFIX = "score/suspected_hacks/"
CHANCE = "score/right_by_chance"
PLANB = ("rollback/planb_append_count", "rollback/planb_replace_count")
PLANB_RATE = "rollback/planb_append_rate"
IS_QUANTILES = ("rollback/is_log_ratio_p10", "rollback/is_log_ratio_p50", "rollback/is_log_ratio_p90")
TRAIN_KEYS = (CHANCE, *PLANB, PLANB_RATE, *IS_QUANTILES)
"""Per-step training metrics the ``training`` part sums (with every key under ``HACK_PREFIX``)."""


def finals(evals: pl.DataFrame) -> dict[tuple[str, str], dict[str, float]]:
    """(split, mediator) → per run its final value, for the keys the runs logged."""
    out = {}
    for split, prefix in SPLITS.items():
        for med, key in MEDIATORS.items():
            values = final_values(evals, prefix + key)
            if values:
                out[(split, med)] = values
    return out


def _paired(values: dict[str, float], ids: list[str], base_ids: list[str]) -> dict:
    base = {seed_of(r): values[r] for r in base_ids if r in values}
    diffs = [(seed_of(r), values[r] - base[seed_of(r)]) for r in ids if r in values and seed_of(r) in base]
    d = {**mean_se_ci([v for _, v in diffs]), "seeds": [s for s, _ in diffs]}
    return d | {"reading": direction(d)}


def evaluation(evals: pl.DataFrame, runs: dict[str, list[str]], baseline: str, pair_with: dict[str, str]) -> dict:
    """The evaluation part: ``per_seed`` (arm → rows of seed and split → mediator → value), ``arms`` (seed means),
    ``paired`` (arm → ``against`` and split → mediator → the paired difference)."""
    got = finals(evals)
    if not got:
        return {}
    out: dict = {"per_seed": {}, "arms": {}, "paired": {}}
    for arm, ids in runs.items():
        rows = []
        for r in sorted(ids, key=seed_of):
            row: dict = {"seed": seed_of(r)}
            for (split, med), values in got.items():
                row.setdefault(split, {})[med] = values.get(r)
            rows.append(row)
        out["per_seed"][arm] = rows
        means: dict = {}
        for (split, med), values in got.items():
            means.setdefault(split, {})[med] = mean_se_ci([values[r] for r in ids if r in values])["mean"]
        out["arms"][arm] = means
        against = pair_with.get(arm, baseline)
        if against != arm:
            pairs: dict = {"against": against}
            for (split, med), values in got.items():
                pairs.setdefault(split, {})[med] = _paired(values, ids, runs[against])
            out["paired"][arm] = pairs
    return out


def training(totals: pl.DataFrame | None, runs: dict[str, list[str]]) -> dict:
    """The training part per arm (``totals``: run_id, key, total, steps); arms with none of the keys are left out."""
    if totals is None or not totals.height:
        return {}
    got = {(r["run_id"], r["key"]): (float(r["total"]), int(r["steps"])) for r in totals.iter_rows(named=True)}
    out: dict = {}
    for arm, ids in runs.items():
        keys = sorted({k for r, k in got if r in ids})
        if not keys:
            continue
        row: dict = {"counts": {}}
        for key in [k for k in keys if k.startswith(HACK_PREFIX) or k == CHANCE or k in PLANB]:
            per_seed = {seed_of(r): got[(r, key)][0] for r in ids if (r, key) in got}
            row["counts"][key] = {"total": sum(per_seed.values()), "per_seed": per_seed}
        if all(k in row["counts"] for k in PLANB):
            n = sum(row["counts"][k]["total"] for k in PLANB)
            row["planb_append_share"] = row["counts"][PLANB[0]]["total"] / n if n else None
        for key in [k for k in keys if k in IS_QUANTILES or k == PLANB_RATE]:
            parts = [got[(r, key)] for r in ids if (r, key) in got]
            row[key] = sum(t for t, _ in parts) / sum(n for _, n in parts)
        out[arm] = row
    return out


def summarize(evals: pl.DataFrame, runs: dict[str, list[str]], baseline: str, pair_with: dict[str, str] | None,
              totals: pl.DataFrame | None) -> dict:
    """Both parts (``evaluation``, ``training``); empty when the runs logged neither."""
    out = {"evaluation": evaluation(evals, runs, baseline, pair_with or {}), "training": training(totals, runs)}
    return out if out["evaluation"] or out["training"] else {}


def _evaluation_lines(ev: dict) -> list[str]:
    meds = [m for m in MEDIATORS if any(m in split for arm in ev["arms"].values() for split in arm.values())]
    splits = [s for s in SPLITS if any(s in arm for arm in ev["arms"].values())]
    cols = [(s, m) for s in splits for m in meds]
    head = " | ".join(f"{m} ({s})" for s, m in cols)
    lines = ["", "**Mediators** (final evaluation, SAAR off; first-call success per trajectory, first-attempt "
                 "success per call, share cut at the turn cap, P(correct | every call clean)), seed means:", "",
             f"| arm | {head} |", "| --- | " + " | ".join("---" for _ in cols) + " |"]
    lines += [f"| {arm} | " + " | ".join(_f(row.get(s, {}).get(m)) for s, m in cols) + " |"
              for arm, row in ev["arms"].items()]
    lines += ["", "Per seed:", "", f"| arm | seed | {head} |", "| --- | --- | " + " | ".join("---" for _ in cols) + " |"]
    lines += [f"| {arm} | {r['seed']} | " + " | ".join(_f(r.get(s, {}).get(m)) for s, m in cols) + " |"
              for arm, rows in ev["per_seed"].items() for r in rows]
    lines += ["", "Mediators paired by seed against each arm's baseline, mean ± s.e. [95 % CI]: reading:", "",
              "| arm − baseline | split | mediator | difference |", "| --- | --- | --- | --- |"]
    for arm, pairs in ev["paired"].items():
        lines += [f"| {arm} − {pairs['against']} | {s} | {m} | {cell(pairs[s][m])} |"
                  for s in splits for m in meds if m in pairs.get(s, {})]
    return lines


def _training_lines(tr: dict) -> list[str]:
    seen = {k for row in tr.values() for k in row["counts"]}
    counts = sorted(k for k in seen if k.startswith(HACK_PREFIX)) + [k for k in (CHANCE, *PLANB) if k in seen]
    extra = [k for k in ("planb_append_share", PLANB_RATE, *IS_QUANTILES) if any(k in row for row in tr.values())]
    cols = counts + extra
    lines = ["", "Training counters per arm (counts summed over every step of every seed; `planb_append_share` the "
                 "pooled appends over appends + replaces; the rate and quantiles the mean over every step of every "
                 "seed):", "", "| arm | " + " | ".join(f"`{c}`" for c in cols) + " |",
             "| --- | " + " | ".join("---" for _ in cols) + " |"]
    for arm, row in tr.items():
        cells = [_f(row["counts"][k]["total"], ".0f") if k in row["counts"] else "-" for k in counts]
        cells += [_f(row.get(k)) for k in extra]
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return lines


def markdown_lines(s: dict) -> list[str]:
    """Both parts in Markdown (nothing for a report without them)."""
    m = s.get("mediators") or {}
    return (_evaluation_lines(m["evaluation"]) if m.get("evaluation") else []) + (
        _training_lines(m["training"]) if m.get("training") else [])
