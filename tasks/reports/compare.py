"""The compare report: CLEANER vs the DAPO baseline (and SAAR-everywhere) over several seeds.

Input: the ``evaluations`` rows of every child run (policy version → ``eval/saar_off/…``) and,
optionally, the trained trajectories grouped by kind (clean first try, purified, errors kept):
their mean reward and advantage show what credit SAAR's purified sequences actually carry.
Output: a JSON summary, a PNG (pass@1 and first-attempt tool success vs step, mean ± std
over seeds per arm) and a short Markdown page. ``steps_to_baseline_final`` is the first
evaluated step at which an arm's seed-mean pass@1 reaches the baseline's final seed-mean
pass@1 (``None`` if never); the baseline's own value is where it first got there.  When the
baseline ends no higher than it started (step 0 already reaches its final value) the
"half the steps" claim cannot be tested and is reported as ``None``, never as a pass.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

ACC = "eval/saar_off/all/pass_at_1"
TOOL = "eval/saar_off/tools/first_attempt_success_rate"


def curves(evals: pl.DataFrame, runs: dict[str, list[str]], key: str) -> dict[str, pl.DataFrame]:
    """Per arm: policy_version, mean, std, n over the arm's seeds for metric ``key``."""
    out = {}
    for arm, run_ids in runs.items():
        part = evals.filter(pl.col("run_id").is_in(run_ids) & (pl.col("key") == key))
        out[arm] = (part.group_by("policy_version")
                    .agg(pl.col("value").mean().alias("mean"), pl.col("value").std(ddof=0).fill_null(0.0).alias("std"),
                         pl.len().alias("n"))
                    .sort("policy_version"))
    return out


def gains(evals: pl.DataFrame, runs: dict[str, list[str]], key: str) -> dict[str, dict[str, float]]:
    """Per arm: mean over seeds of (last − first evaluated value) and its standard error."""
    out = {}
    for arm, run_ids in runs.items():
        part = evals.filter(pl.col("run_id").is_in(run_ids) & (pl.col("key") == key)).sort("policy_version")
        deltas = part.group_by("run_id").agg((pl.col("value").last() - pl.col("value").first()).alias("d"))["d"]
        n = deltas.len()
        se = float(deltas.std(ddof=1)) / n ** 0.5 if n > 1 else None
        out[arm] = {"mean": float(deltas.mean()) if n else None, "se": se, "n": n}
    return out


def first_reaching(curve: pl.DataFrame, target: float) -> int | None:
    hit = curve.filter(pl.col("mean") >= target - 1e-12)
    return int(hit["policy_version"][0]) if hit.height else None


def by_kind(kinds: pl.DataFrame | None, runs: dict[str, list[str]]) -> dict[str, list[dict]]:
    """Per arm: trained trajectories per kind with their mean reward and mean advantage."""
    if kinds is None or not kinds.height:
        return {}
    arm_of = {r: arm for arm, ids in runs.items() for r in ids}
    table = (kinds.with_columns(pl.col("run_id").replace_strict(arm_of).alias("arm"))
             .group_by("arm", "kind")
             .agg(pl.col("n").sum(), ((pl.col("reward") * pl.col("n")).sum() / pl.col("n").sum()).alias("reward"),
                  ((pl.col("advantage") * pl.col("n")).sum() / pl.col("n").sum()).alias("advantage"))
             .sort("arm", "kind"))
    return {arm: table.filter(pl.col("arm") == arm).drop("arm").to_dicts() for arm in runs}


def summarize(evals: pl.DataFrame, runs: dict[str, list[str]], baseline: str, treatment: str,
              kinds: pl.DataFrame | None = None, acc_key: str = ACC, tool_key: str = TOOL) -> dict:
    """``acc_key`` / ``tool_key``: the evaluation metrics compared (environment runs: ``eval/<env>/success`` and
    ``eval/<env>/valid_action_rate``)."""
    acc, tool = curves(evals, runs, acc_key), curves(evals, runs, tool_key)
    base = acc[baseline]
    if not base.height:
        raise ValueError(f"no evaluations of the baseline arm {baseline!r}: set train.eval_every")
    target = float(base["mean"][-1])
    steps = {arm: first_reaching(c, target) for arm, c in acc.items()}
    final = {arm: {"pass_at_1": float(c["mean"][-1]) if c.height else None,
                   "pass_at_1_std": float(c["std"][-1]) if c.height else None,
                   "first_attempt_success": float(tool[arm]["mean"][-1]) if tool[arm].height else None}
             for arm, c in acc.items()}
    base_steps, treat_steps = steps[baseline], steps[treatment]
    faster = None if not base_steps else treat_steps is not None and treat_steps <= base_steps / 2
    better_tools = (final[treatment]["first_attempt_success"] or 0) > (final[baseline]["first_attempt_success"] or 0)
    return {
        "baseline": baseline, "treatment": treatment, "baseline_final_pass_at_1": target,
        "baseline_initial_pass_at_1": float(base["mean"][0]),
        "steps_to_baseline_final": steps, "final": final,
        "gain_pass_at_1": gains(evals, runs, acc_key), "gain_first_attempt_success": gains(evals, runs, tool_key),
        "metrics": {"accuracy": acc_key, "tools": tool_key},
        "trained_by_kind": by_kind(kinds, runs),
        "claim_half_the_steps": faster, "claim_higher_first_attempt_success": bool(better_tools),
        "curves": {arm: {"accuracy": c.to_dicts(), "first_attempt_success": tool[arm].to_dicts()} for arm, c in acc.items()},
        "runs": runs,
    }


def plot(summary: dict, out_png: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, (key, title) in zip(axes, (("accuracy", "pass@1, SAAR off at evaluation"),
                                       ("first_attempt_success", "first-attempt tool success"))):
        for arm, c in summary["curves"].items():
            rows = c[key]
            x = [r["policy_version"] for r in rows]
            m = [r["mean"] for r in rows]
            s = [r["std"] for r in rows]
            ax.plot(x, m, marker="o", ms=3, label=arm)
            ax.fill_between(x, [a - b for a, b in zip(m, s)], [a + b for a, b in zip(m, s)], alpha=0.2)
        ax.set_title(title)
        ax.set_xlabel("RL step")
        ax.grid(alpha=0.3)
        ax.legend()
    axes[0].axhline(summary["baseline_final_pass_at_1"], color="grey", ls="--", lw=1)
    fig.tight_layout()
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return out_png


def markdown(summary: dict) -> str:
    lines = ["# CLEANER vs DAPO baseline", "",
             f"Baseline `{summary['baseline']}` pass@1 (seed mean): **{summary['baseline_initial_pass_at_1']:.3f}** at step 0, "
             f"**{summary['baseline_final_pass_at_1']:.3f}** at the end", "",
             "| arm | steps to baseline final | final pass@1 (± std) | final first-attempt tool success |",
             "| --- | --- | --- | --- |"]
    for arm, f in summary["final"].items():
        steps = summary["steps_to_baseline_final"][arm]
        lines.append(f"| {arm} | {'never' if steps is None else steps} | {f['pass_at_1']:.3f} ± {f['pass_at_1_std']:.3f} "
                     f"| {f['first_attempt_success']:.3f} |")
    lines += ["", "Change from the first to the last evaluation (mean over seeds ± standard error):", "",
              "| arm | pass@1 | first-attempt tool success |", "| --- | --- | --- |"]
    for arm in summary["final"]:
        a, t = summary["gain_pass_at_1"][arm], summary["gain_first_attempt_success"][arm]
        lines.append(f"| {arm} | {_pm(a)} | {_pm(t)} |")
    base_gain = summary["gain_pass_at_1"][summary["baseline"]]
    if base_gain["se"] is not None and not abs(base_gain["mean"]) > 2 * base_gain["se"]:
        lines += ["", f"Note: the baseline's pass@1 change ({base_gain['mean']:+.3f}) is within two standard errors of "
                      "zero: at this budget the comparison measures seed noise more than learning."]
    if summary.get("trained_by_kind"):
        lines += ["", "Trained trajectories by kind (what credit each kind carried into the update):", "",
                  "| arm | kind | trajectories | mean reward | mean advantage |", "| --- | --- | --- | --- | --- |"]
        for arm, rows in summary["trained_by_kind"].items():
            lines += [f"| {arm} | {r['kind']} | {r['n']} | {r['reward']:.3f} | {r['advantage']:+.3f} |" for r in rows]
    half = summary["claim_half_the_steps"]
    lines += ["", f"- treatment reaches the baseline's final pass@1 in at most half the steps: "
                  f"**{_VERDICT[half]}**",
              f"- treatment ends with a higher first-attempt tool success: "
              f"**{'yes' if summary['claim_higher_first_attempt_success'] else 'no'}**", "",
              "![curves](compare.png)"]
    return "\n".join(lines) + "\n"


def _pm(gain: dict) -> str:
    if gain["mean"] is None:
        return "-"
    return f"{gain['mean']:+.3f}" + ("" if gain["se"] is None else f" ± {gain['se']:.3f}")


_VERDICT = {True: "yes", False: "no",
            None: "not testable (the baseline ended no higher than the initial policy's pass@1)"}


def write_report(summary: dict, folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    js = folder / "compare.json"
    js.write_text(json.dumps(summary, indent=1))
    md = folder / "compare.md"
    md.write_text(markdown(summary))
    return [js, md, plot(summary, folder / "compare.png")]
