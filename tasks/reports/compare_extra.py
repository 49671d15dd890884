"""Two more sections of the compare report (issue 41): the fresh split and the compute each arm spent.

``fresh_split``: when the runs' last evaluation also scored the fresh split (``data.fresh_path``: held-out prompts
nothing was ever selected on; metrics ``eval_fresh/<mode>/…``), per seed its final pass@1 with SAAR off and on, per
arm the seed means, and against the baseline the paired differences by seed — SAAR off − baseline SAAR off
(internalisation) and SAAR on − baseline SAAR off (the paper's headline setting) — with 95 % t intervals, as
``tasks.reports.compare.settings`` does on the usual held-out prompts.

``compute``: per run, the sum over its training steps of ``rollout/sampled_tokens`` (policy tokens sampled, SAAR's
regenerations included, tool responses excluded) and ``rollout/sandbox_calls`` (docs/metrics.md); per arm the seed
mean of those totals and its ratio to the baseline's, so a compute-matched arm can be sized and checked.
"""

from __future__ import annotations

import polars as pl

from tasks.reports.paired import final_values, mean_se_ci, seed_of
from tasks.reports.paired import fmt as _f
from tasks.reports.paired import pm as _pm

FRESH_ACC = "eval_fresh/saar_off/all/pass_at_1"
FRESH_ACC_ON = "eval_fresh/saar_on/all/pass_at_1"
COMPUTE_KEYS = ("rollout/sampled_tokens", "rollout/sandbox_calls")
"""Per-step counters summed into a run's total (``tasks.stores.db.step_totals``)."""


def fresh_split(evals: pl.DataFrame, runs: dict[str, list[str]], baseline: str, initial: dict | None) -> dict:
    """Per seed, per arm and paired against the baseline: final pass@1 on the fresh split (empty without one)."""
    off, on = final_values(evals, FRESH_ACC), final_values(evals, FRESH_ACC_ON)
    if not off:
        return {}
    base = {seed_of(r): off[r] for r in runs[baseline] if r in off}

    def pair(values: dict[str, float], ids: list[str]) -> dict:
        diffs = [(seed_of(r), values[r] - base[seed_of(r)]) for r in ids if r in values and seed_of(r) in base]
        return {**mean_se_ci([d for _, d in diffs]), "seeds": [s for s, _ in diffs]}

    out: dict = {"per_seed": {}, "arms": {}, "paired": {},
                 "initial": ({"saar_off": initial[FRESH_ACC], "saar_on": initial.get(FRESH_ACC_ON)}
                             if initial and FRESH_ACC in initial else None)}
    for arm, ids in runs.items():
        out["per_seed"][arm] = sorted(({"seed": seed_of(r), "saar_off": off.get(r), "saar_on": on.get(r)}
                                       for r in ids if r in off), key=lambda row: row["seed"])
        offs = mean_se_ci([off[r] for r in ids if r in off])
        out["arms"][arm] = {"saar_off": offs["mean"], "saar_off_sd": offs.get("sd"),
                            "saar_on": mean_se_ci([on[r] for r in ids if r in on])["mean"], "seeds": offs["n"]}
        if arm != baseline:
            out["paired"][arm] = {"internalisation": pair(off, ids), "headline": pair(on, ids)}
    return out


def compute(totals: pl.DataFrame | None, runs: dict[str, list[str]], baseline: str) -> dict:
    """Per arm: per-run totals of ``COMPUTE_KEYS`` (``totals``: run_id, key, total, steps), their seed mean and the
    ratio of that mean to the baseline's. Empty without totals."""
    if totals is None or not totals.height:
        return {}
    got = {(r["run_id"], r["key"]): (r["total"], r["steps"]) for r in totals.iter_rows(named=True)}
    out: dict = {}
    for arm, ids in runs.items():
        row: dict = {"runs": {}}
        for key in COMPUTE_KEYS:
            name = key.split("/")[1]
            vals = {r: got[(r, key)][0] for r in ids if (r, key) in got}
            row["runs"].update({r: {**row["runs"].get(r, {}), name: v, "steps": got[(r, key)][1]}
                                for r, v in vals.items()})
            row[name] = sum(vals.values()) / len(vals) if vals else None
        out[arm] = row
    for row in out.values():
        for key in COMPUTE_KEYS:
            name, base = key.split("/")[1], out[baseline][key.split("/")[1]]
            row[f"{name}_ratio"] = row[name] / base if row[name] is not None and base else None
    return out


def markdown_lines(s: dict) -> list[str]:
    """The two sections in Markdown (nothing for a report without them)."""
    b, lines = s["baseline"], []
    fresh = s.get("fresh") or {}
    if fresh:
        lines += ["", "**Fresh split** (held-out prompts nothing was selected on; the last evaluation only), final "
                      f"pass@1 paired by seed against `{b}` with SAAR off:", "",
                  f"| arm | seeds | SAAR off (± seed sd) | SAAR on | internalisation (off − {b} off) | "
                  f"headline (on − {b} off) |", "| --- | --- | --- | --- | --- | --- |"]
        for arm, row in fresh["arms"].items():
            pair = fresh["paired"].get(arm, {})
            lines.append(f"| {arm} | {row['seeds']} | {_f(row['saar_off'])} ± {_f(row['saar_off_sd'])} | "
                         f"{_f(row['saar_on'])} | {_pm(pair.get('internalisation', {}))} | "
                         f"{_pm(pair.get('headline', {}))} |")
        lines += ["", "| arm | seed | fresh SAAR off | fresh SAAR on |", "| --- | --- | --- | --- |"]
        lines += [f"| {arm} | {r['seed']} | {_f(r['saar_off'])} | {_f(r['saar_on'])} |"
                  for arm, rows in fresh["per_seed"].items() for r in rows]
        if fresh.get("initial"):
            lines += ["", f"The starting policy on the fresh split: {_f(fresh['initial']['saar_off'])} SAAR off, "
                          f"{_f(fresh['initial']['saar_on'])} SAAR on."]
    if s.get("compute"):
        lines += ["", "Compute per run (totals over its training steps, seed mean; evaluations not included):", "",
                  f"| arm | sampled policy tokens | × `{b}` | sandbox calls | × `{b}` |", "| --- | --- | --- | --- | --- |"]
        for arm, row in s["compute"].items():
            lines.append(f"| {arm} | {_f(row['sampled_tokens'], '.0f')} | {_f(row['sampled_tokens_ratio'])} | "
                         f"{_f(row['sandbox_calls'], '.0f')} | {_f(row['sandbox_calls_ratio'])} |")
    return lines
