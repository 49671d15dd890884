"""What a failed call costs at evaluation: first-call success, the turn cap, and P(correct | every call clean).

Three measures of one evaluation mode's scored trajectories and their executions, logged by the evaluation
(``tasks.training.evaluation.grade``) under ``eval/<mode>/`` (and ``eval_fresh/<mode>/``) beside its other keys, and
computed the way the multi-call gate (``tasks.training.chain_gate``) measures them with SAAR off:

* ``tools/first_call_success_rate``: of the trajectories that call the tool, the share whose **first** call (its
  first attempt, before any SAAR regeneration) ran cleanly — per trajectory, the complement of the warm-up gate's
  ``first_call_failure``; not ``tools/first_attempt_success_rate``, which counts every first attempt at every
  position (docs/metrics.md, "Two failure rates");
* ``rollout/turn_cap_share``: the share of trajectories the turn budget cut (``finish_reason == "turn_cap"``);
* ``tools/p_correct_all_clean``: of the graded trajectories that made at least one call and whose every call in the
  final trajectory ran cleanly (the last execution at each position: SAAR's earlier attempts were cut out, as the
  chain grader reads them), the share correct; ``tools/all_clean_trajectories`` is its denominator.

``per_trajectory`` gives each trajectory's indicators (the flags behind every share) and ``cluster_ratio`` a share's
95 % interval over prompts (the samples of one prompt are not independent), for ``flows.budget_look``.
"""

from __future__ import annotations

import math

import polars as pl

from tasks.reports.paired import t975

KEYS = ("tools/first_call_success_rate", "rollout/turn_cap_share", "tools/p_correct_all_clean",
        "tools/all_clean_trajectories")
"""The evaluation keys ``measures`` adds (each under ``eval/<mode>/``)."""


def per_trajectory(trajs: pl.DataFrame, execs: pl.DataFrame) -> pl.DataFrame:
    """Per trajectory (``traj_id``, ``prompt_id``, ``finish_reason``, ``graded``, ``correct`` of ``trajs``; ``traj_id``,
    ``exec_idx``, ``position``, ``ok`` of ``execs``): ``called`` (≥ 1 execution), ``first_ok`` (its first execution
    ran), ``all_clean`` (graded, called, and the last execution at every position ran), ``capped`` (cut by the
    turn budget) and ``right`` (graded and correct)."""
    runs: dict[str, list[dict]] = {}
    for e in execs.sort("exec_idx").iter_rows(named=True):
        runs.setdefault(e["traj_id"], []).append(e)
    rows = []
    for t in trajs.iter_rows(named=True):
        run = runs.get(t["traj_id"], [])
        last = {e["position"]: e["ok"] for e in run}
        graded = bool(t["graded"])
        rows.append({"traj_id": t["traj_id"], "prompt_id": t["prompt_id"], "called": bool(run),
                     "first_ok": bool(run) and bool(run[0]["ok"]),
                     "all_clean": graded and bool(run) and all(last.values()),
                     "capped": t["finish_reason"] == "turn_cap", "right": graded and bool(t["correct"])})
    schema = {"traj_id": pl.String, "prompt_id": pl.String, **{k: pl.Boolean for k in
                                                                ("called", "first_ok", "all_clean", "capped", "right")}}
    return pl.DataFrame(rows, schema=schema)


def share(hits: int, n: int) -> float:
    """hits / n, 0 for a share over nothing (as the chain gate reads it)."""
    return hits / n if n else 0.0


def measures(trajs: pl.DataFrame, execs: pl.DataFrame) -> dict[str, float]:
    """The four ``KEYS`` of one mode's trajectories (a share over nothing is 0, as the gate reads it)."""
    flags = per_trajectory(trajs, execs)
    called, clean = flags.filter(pl.col("called")), flags.filter(pl.col("all_clean"))
    return {"tools/first_call_success_rate": share(int(called["first_ok"].sum()), called.height),
            "rollout/turn_cap_share": share(int(flags["capped"].sum()), flags.height),
            "tools/p_correct_all_clean": share(int(clean["right"].sum()), clean.height),
            "tools/all_clean_trajectories": float(clean.height)}


def cluster_ratio(hits: list[float], totals: list[float]) -> dict:
    """A share pooled over prompts, Σ hits / Σ totals (prompt i: ``hits[i]`` of its ``totals[i]`` trajectories), with
    its standard error over prompts (the ratio estimator linearised: residuals hits − r·totals, n/(n−1) corrected)
    and a 95 % t interval on (prompts with a nonzero total) − 1 degrees of freedom."""
    pairs = [(h, x) for h, x in zip(hits, totals) if x > 0]
    n, total = len(pairs), sum(x for _, x in pairs)
    if not n:
        return {"share": None, "se": None, "ci95": None, "prompts": 0, "n": 0}
    r = sum(h for h, _ in pairs) / total
    if n < 2:
        return {"share": r, "se": None, "ci95": None, "prompts": n, "n": total}
    se = math.sqrt(n / (n - 1) * sum((h - r * x) ** 2 for h, x in pairs)) / total
    half = t975(n - 1) * se
    return {"share": r, "se": se, "ci95": [r - half, r + half], "prompts": n, "n": total}


def prompt_shares(flags: pl.DataFrame) -> dict[str, dict]:
    """pass@1, first-call success, share cut at the cap and P(correct | all clean) of ``per_trajectory``'s flags, each
    with its interval over prompts (``cluster_ratio``)."""
    g = flags.group_by("prompt_id").agg(
        pl.len().alias("n"), pl.col("right").sum().alias("right"), pl.col("called").sum().alias("called"),
        (pl.col("called") & pl.col("first_ok")).sum().alias("first_ok"), pl.col("capped").sum().alias("capped"),
        pl.col("all_clean").sum().alias("clean"), (pl.col("all_clean") & pl.col("right")).sum().alias("clean_right"),
    ).sort("prompt_id")
    col = {c: [float(v) for v in g[c]] for c in g.columns if c != "prompt_id"}
    return {"pass@1": cluster_ratio(col["right"], col["n"]),
            "first_call_success": cluster_ratio(col["first_ok"], col["called"]),
            "turn_cap_share": cluster_ratio(col["capped"], col["n"]),
            "p_correct_all_clean": cluster_ratio(col["clean_right"], col["clean"])}
