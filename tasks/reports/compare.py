"""The compare report: CLEANER vs the DAPO baseline (and side arms), per seed and paired across arms.

Input: the ``evaluations`` rows of every child run (policy version → ``eval/saar_off/…``),
run ids ending in ``-s<seed>`` (arms share seeds: the same seed means the same data order and
the same initial policy, so runs pair up by seed), optionally one shared initial evaluation
(every run starts from the same policy, so step 0 is evaluated once for all) and the trained
trajectories grouped by kind (clean first try, purified, errors kept).

Output (``summarize``): per run — final pass@1, final first-attempt tool success, the change
from the initial evaluation and ``steps_to_baseline_final`` (the first evaluated step at which
the run reaches the baseline's final seed-mean pass@1; ``None`` if never); per arm — seed mean,
**training-seed spread** (std over seeds) and the seed-mean curves; per arm against the
baseline — the **paired difference** over common seeds (mean, standard error, 95 % t interval);
the evaluation's own sampling noise (binomial s.e. of one final evaluation) to compare the
spread with; and a verdict in words. ``write_report`` writes JSON, Markdown and plots (curves
mean ± std, per-seed finals with pairs joined, paired differences with their intervals).

Both evaluation settings side by side (``settings``, when the runs evaluated SAAR on too): the
**internalisation test** (every arm with SAAR off against the baseline with SAAR off: what the policy
learnt on its own) and the paper's **headline setting** (the arm with SAAR on — rollback at evaluation,
as the paper's evaluation scripts do — against the baseline with SAAR off), each paired by seed.

The fresh split and each arm's compute (sampled tokens, sandbox calls) are ``tasks.reports.compare_extra``'s; the
registered contrasts (``compare.contrasts``) ``tasks.reports.contrasts``' and the mediators (first-call success, the
turn cap, P(correct | every call clean), grader and rollback counters) ``tasks.reports.mediators``'.

When the baseline ends no higher than it started, the "half the steps" claim cannot be tested
and is reported as ``None``, never as a pass.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import polars as pl

from tasks.reports import compare_extra, contrasts, mediators
from tasks.reports.compare_plots import plot
from tasks.reports.paired import final_values, mean_se_ci, seed_of
from tasks.reports.paired import fmt as _f
from tasks.reports.paired import pm as _pm

ACC = "eval/saar_off/all/pass_at_1"
ACC_ON = "eval/saar_on/all/pass_at_1"
TOOL = "eval/saar_off/tools/first_attempt_success_rate"
GRADED = "eval/saar_off/eval/graded"
def run_curves(evals: pl.DataFrame, key: str, initial: dict | None) -> dict[str, list[tuple[int, float]]]:
    """Per run: [(policy version, value)] sorted, with the shared initial value at version 0 when given."""
    out: dict[str, list[tuple[int, float]]] = {}
    for row in evals.filter(pl.col("key") == key).sort("policy_version").iter_rows(named=True):
        out.setdefault(row["run_id"], []).append((int(row["policy_version"]), float(row["value"])))
    if initial is not None and key in initial:
        for points in out.values():
            if not points or points[0][0] != 0:
                points.insert(0, (0, float(initial[key])))
    return out


def mean_curve(curves: dict[str, list[tuple[int, float]]], run_ids: list[str]) -> list[dict]:
    """Seed mean and std per evaluated version over ``run_ids``."""
    by_version: dict[int, list[float]] = {}
    for r in run_ids:
        for v, x in curves.get(r, []):
            by_version.setdefault(v, []).append(x)
    rows = []
    for v in sorted(by_version):
        xs = by_version[v]
        m = sum(xs) / len(xs)
        rows.append({"policy_version": v, "mean": m, "std": math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs)),
                     "n": len(xs)})
    return rows


def first_reaching(points: list[tuple[int, float]], target: float) -> int | None:
    return next((v for v, x in points if x >= target - 1e-12), None)


def per_seed(acc: dict, tool: dict, runs: dict[str, list[str]], target: float,
             acc_on: dict[str, float] | None = None) -> dict[str, list[dict]]:
    """Per arm and seed: the final pass@1 (and, given ``acc_on``, with SAAR on), first-attempt success, gain from
    the start and the first evaluated step reaching ``target``."""
    out = {}
    for arm, run_ids in runs.items():
        rows = []
        for r in run_ids:
            pts, tpts = acc.get(r, []), tool.get(r, [])
            on = {"final_pass_at_1_saar_on": acc_on.get(r)} if acc_on else {}
            rows.append({"run_id": r, "seed": seed_of(r), "final_pass_at_1": pts[-1][1] if pts else None, **on,
                         "final_first_attempt_success": tpts[-1][1] if tpts else None,
                         "gain_pass_at_1": pts[-1][1] - pts[0][1] if len(pts) > 1 else None,
                         "steps_to_baseline_final": first_reaching(pts, target) if pts else None})
        out[arm] = sorted(rows, key=lambda x: x["seed"])
    return out


def paired(seeds: dict[str, list[dict]], baseline: str, field: str) -> dict[str, dict]:
    """Per arm: the paired difference arm − baseline of ``field`` over the seeds both ran."""
    base = {r["seed"]: r[field] for r in seeds[baseline] if r[field] is not None}
    out = {}
    for arm, rows in seeds.items():
        if arm == baseline:
            continue
        diffs = [(r["seed"], r[field] - base[r["seed"]]) for r in rows if r["seed"] in base and r[field] is not None]
        out[arm] = {**mean_se_ci([d for _, d in diffs]), "seeds": [s for s, _ in diffs]}
    return out


def settings(evals: pl.DataFrame, runs: dict[str, list[str]], baseline: str) -> dict[str, dict]:
    """Per arm other than the baseline, paired by seed against the baseline's final SAAR-off pass@1: the arm's
    final SAAR-off pass@1 (``internalisation``) and its final SAAR-on pass@1 (``headline``, the paper's setting);
    per arm, the seed-mean final pass@1 in both modes. Empty when no run evaluated SAAR on."""
    off, on = final_values(evals, ACC), final_values(evals, ACC_ON)
    if not on:
        return {}
    base = {seed_of(r): off[r] for r in runs[baseline] if r in off}

    def pair(values: dict[str, float], ids: list[str]) -> dict:
        diffs = [(seed_of(r), values[r] - base[seed_of(r)]) for r in ids if r in values and seed_of(r) in base]
        return {**mean_se_ci([d for _, d in diffs]), "seeds": [s for s, _ in diffs]}

    out: dict[str, dict] = {}
    for arm, ids in runs.items():
        out[arm] = {"saar_off": mean_se_ci([off[r] for r in ids if r in off])["mean"],
                    "saar_on": mean_se_ci([on[r] for r in ids if r in on])["mean"]}
        if arm != baseline:
            out[arm] |= {"internalisation": pair(off, ids), "headline": pair(on, ids)}
    return out


def probe_summary(probe: dict[str, dict], runs: dict[str, list[str]], baseline: str) -> dict[str, dict]:
    """Per arm: the seed mean of the final checkpoints' fixed-probe entropy and, against the baseline, its ratio
    and the paired difference by seed."""
    base = {seed_of(r): probe[r]["entropy"] for r in runs[baseline] if r in probe}
    out = {}
    for arm, ids in runs.items():
        values = [probe[r]["entropy"] for r in ids if r in probe]
        row = {**mean_se_ci(values), "tokens": probe[ids[0]]["tokens"] if ids and ids[0] in probe else None}
        if arm != baseline and base and values:
            diffs = [probe[r]["entropy"] - base[seed_of(r)] for r in ids if r in probe and seed_of(r) in base]
            row["paired"] = mean_se_ci(diffs)
            row["ratio_to_baseline"] = row["mean"] / (sum(base.values()) / len(base))
        out[arm] = row
    return out


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


def eval_noise(evals: pl.DataFrame, p: float | None) -> dict:
    """Binomial s.e. of pass@1 for one final evaluation (its graded trajectories at the final version)."""
    graded = evals.filter(pl.col("key") == GRADED).sort("policy_version")
    if p is None or not graded.height:
        return {"trajectories": None, "se": None}
    n = int(graded.group_by("run_id").agg(pl.col("value").last())["value"].median())
    return {"trajectories": n, "se": math.sqrt(p * (1 - p) / n) if n else None}


def summarize(evals: pl.DataFrame, runs: dict[str, list[str]], baseline: str, treatment: str,
              kinds: pl.DataFrame | None = None, initial: dict | None = None, acc_key: str = ACC,
              tool_key: str = TOOL, probe: dict[str, dict] | None = None, totals: pl.DataFrame | None = None) -> dict:
    """``initial``: the shared initial evaluation's metrics (step 0 of every run); ``acc_key`` / ``tool_key``: the
    evaluation metrics compared (environment runs: ``eval/<env>/success`` and ``eval/<env>/valid_action_rate``);
    ``probe``: per run, the fixed-probe entropy of its final checkpoint (``tasks.training.probe``); ``totals``:
    per run the summed per-step compute counters (``tasks.stores.db.step_totals``)."""
    acc, tool = run_curves(evals, acc_key, initial), run_curves(evals, tool_key, initial)
    base_curve = mean_curve(acc, runs[baseline])
    if not base_curve:
        raise ValueError(f"no evaluations of the baseline arm {baseline!r}: set train.eval_every")
    target = base_curve[-1]["mean"]
    curves = {arm: {"accuracy": mean_curve(acc, ids), "first_attempt_success": mean_curve(tool, ids)}
              for arm, ids in runs.items()}
    steps = {arm: first_reaching([(c["policy_version"], c["mean"]) for c in curves[arm]["accuracy"]], target)
             for arm in runs}
    seeds = per_seed(acc, tool, runs, target, final_values(evals, ACC_ON) if acc_key == ACC else None)
    final = {}
    for arm, rows in seeds.items():
        finals = [r["final_pass_at_1"] for r in rows if r["final_pass_at_1"] is not None]
        tools = [r["final_first_attempt_success"] for r in rows if r["final_first_attempt_success"] is not None]
        final[arm] = {"pass_at_1": mean_se_ci(finals)["mean"], "pass_at_1_std": _std(finals),
                      "first_attempt_success": mean_se_ci(tools)["mean"], "first_attempt_success_std": _std(tools),
                      "seeds": len(rows)}
    base_steps, treat_steps = steps[baseline], steps[treatment]
    faster = None if not base_steps else treat_steps is not None and treat_steps <= base_steps / 2
    third = None if not base_steps else treat_steps is not None and treat_steps <= base_steps / 3
    summary = {
        "baseline": baseline, "treatment": treatment, "baseline_final_pass_at_1": target,
        "baseline_initial_pass_at_1": base_curve[0]["mean"], "initial": initial,
        "steps_to_baseline_final": steps, "final": final, "per_seed": seeds,
        "paired_pass_at_1": paired(seeds, baseline, "final_pass_at_1"),
        "paired_first_attempt_success": paired(seeds, baseline, "final_first_attempt_success"),
        "settings": settings(evals, runs, baseline) if acc_key == ACC else {},
        "probe_entropy": probe_summary(probe, runs, baseline) if probe else {},
        "gain_pass_at_1": {arm: mean_se_ci([r["gain_pass_at_1"] for r in rows if r["gain_pass_at_1"] is not None])
                           for arm, rows in seeds.items()},
        "eval_noise": eval_noise(evals, target),
        "metrics": {"accuracy": acc_key, "tools": tool_key},
        "trained_by_kind": by_kind(kinds, runs),
        "fresh": compare_extra.fresh_split(evals, runs, baseline, initial) if acc_key == ACC else {},
        "compute": compare_extra.compute(totals, runs, baseline),
        "claim_half_the_steps": faster,
        "claim_third_of_the_steps": third,
        "initial_settings": ({"saar_off": initial[ACC], "saar_on": initial[ACC_ON]}
                             if initial and ACC in initial and ACC_ON in initial else None),
        "claim_higher_first_attempt_success": bool((final[treatment]["first_attempt_success"] or 0)
                                                   > (final[baseline]["first_attempt_success"] or 0)),
        "curves": curves, "runs": runs,
    }
    summary["verdict"] = verdict(summary)
    return summary


def _std(xs: list[float]) -> float | None:
    return mean_se_ci(xs).get("sd") if len(xs) > 1 else (0.0 if xs else None)


def labels(s: dict) -> dict[str, str]:
    """What the two compared metrics are called: tool use (pass@1, first-attempt tool success) or an environment
    (``eval/<env>/success``: success, valid-action rate), and the report's title."""
    key = (s.get("metrics") or {}).get("accuracy", ACC)
    if key == ACC or not key.endswith("/success"):
        return {"acc": "pass@1", "tool": "first-attempt success", "tool_long": "first-attempt tool success",
                "title": "CLEANER vs DAPO baseline"}
    env = key.split("/")[1]
    return {"acc": "success", "tool": "valid-action rate", "tool_long": "valid-action rate",
            "title": f"{s['treatment']} vs {s['baseline']} on {env} (held-out episodes)"}


def verdict(s: dict) -> str:
    """The result in words: the paired difference, its interval, what the run could have detected."""
    t, b = s["treatment"], s["baseline"]
    name = labels(s)
    d, g = s["paired_pass_at_1"].get(t, {}), s["gain_pass_at_1"][b]
    if not d or d.get("se") is None:
        return f"{t} − {b}: too few paired seeds for a standard error."
    lo, hi = d["ci95"]
    words = (f"{t} − {b} final {name['acc']} = {d['mean']:+.3f} ± {d['se']:.3f} (s.e., {d['n']} paired seeds, "
             f"95 % CI [{lo:+.3f}, {hi:+.3f}]): ")
    if lo > 0:
        words += f"{t} ends higher."
    elif hi < 0:
        words += f"{t} ends lower."
    else:
        words += (f"no difference detectable; this run could detect about ±{(hi - lo) / 2:.3f}.")
    if g.get("se") is not None and abs(g["mean"]) <= 2 * g["se"]:
        words += f" The baseline's own gain ({g['mean']:+.3f} ± {g['se']:.3f}) is within two s.e. of zero."
    tool = s["paired_first_attempt_success"].get(t, {})
    if tool.get("se") is not None:
        lo, hi = tool["ci95"]
        sign = "higher" if lo > 0 else "lower" if hi < 0 else "not different"
        words += f" {name['tool_long'].capitalize()}: {tool['mean']:+.3f} ± {tool['se']:.3f} ({sign})."
    return words


def _settings_lines(s: dict, b: str, acc: str) -> list[str]:
    """Both evaluation settings (SAAR off and on) paired by seed against the baseline with SAAR off, and the
    starting policy's two figures."""
    if not s.get("settings"):
        return []
    lines = ["", f"Both evaluation settings, final {acc} paired by seed against `{b}` with SAAR off "
             "(internalisation: the arm with SAAR off; the paper's headline: the arm with SAAR on):", "",
             f"| arm | SAAR off | SAAR on | internalisation (off − {b} off) | headline (on − {b} off) |",
             "| --- | --- | --- | --- | --- |"]
    for arm, row in s["settings"].items():
        lines.append(f"| {arm} | {_f(row['saar_off'])} | {_f(row['saar_on'])} | "
                     f"{_pm(row.get('internalisation', {}))} | {_pm(row.get('headline', {}))} |")
    start = s.get("initial_settings")
    if start:
        lines += ["", f"The starting policy (shared initial evaluation): {acc} {start['saar_off']:.3f} SAAR off, "
                      f"{start['saar_on']:.3f} SAAR on: rollback alone gives "
                      f"{start['saar_on'] - start['saar_off']:+.3f} before any training."]
    return lines


def _entropy_lines(s: dict, b: str) -> list[str]:
    """Fixed-probe entropy of the final checkpoints per arm, its ratio and paired difference to the baseline."""
    if not s.get("probe_entropy"):
        return []
    any_row = next(iter(s["probe_entropy"].values()))
    lines = ["", f"Fixed-probe entropy of the final checkpoints (nats a token, the same {any_row['tokens']:.0f} "
             "tokens of the starting policy scored by every checkpoint; replaces `train/entropy`, which is "
             "measured on each arm's own tokens):", "",
             f"| arm | entropy (seed mean) | × `{b}` | paired − `{b}` |", "| --- | --- | --- | --- |"]
    for arm, row in s["probe_entropy"].items():
        lines.append(f"| {arm} | {_f(row['mean'], '.4f')} | {_f(row.get('ratio_to_baseline'))} | "
                     f"{_pm(row.get('paired', {}))} |")
    return lines


def headline(s: dict) -> list[str]:
    """The report's head (what ``cleaner compare`` prints at its end): title, verdict, the baseline's start and end,
    and the table of arms (steps to the baseline's final, final score and first-attempt success ± seed std)."""
    b = s["baseline"]
    name = labels(s)
    acc, tool = name["acc"], name["tool"]
    lines = [f"# {name['title']}", "", f"**Verdict.** {s['verdict']}", "",
             f"Baseline `{b}` {acc} (seed mean): **{s['baseline_initial_pass_at_1']:.3f}** at step 0 (shared initial "
             f"evaluation), **{s['baseline_final_pass_at_1']:.3f}** at the end.", *contrasts.headline(s), "",
             f"| arm | seeds | steps to baseline final | final {acc} (± seed std) | final {tool} (± std) |",
             "| --- | --- | --- | --- | --- |"]
    for arm, f in s["final"].items():
        steps = s["steps_to_baseline_final"][arm]
        lines.append(f"| {arm} | {f['seeds']} | {'never' if steps is None else steps} | {_f(f['pass_at_1'])} ± "
                     f"{_f(f['pass_at_1_std'])} | {_f(f['first_attempt_success'])} ± {_f(f['first_attempt_success_std'])} |")
    return lines


def markdown(s: dict) -> str:
    b, t = s["baseline"], s["treatment"]
    name = labels(s)
    acc, tool = name["acc"], name["tool"]
    lines = headline(s)
    noise = s["eval_noise"]
    if noise["se"] is not None:
        lines += ["", f"Evaluation sampling noise of one final evaluation ({noise['trajectories']} trajectories): "
                      f"s.e. ≤ {noise['se']:.3f}; the training-seed spread is the std column."]
    lines += ["", "Per seed:", "", f"| arm | seed | final {acc} | {tool} | change from step 0 | "
              "steps to baseline final |", "| --- | --- | --- | --- | --- | --- |"]
    for arm, rows in s["per_seed"].items():
        for r in rows:
            steps = r["steps_to_baseline_final"]
            lines.append(f"| {arm} | {r['seed']} | {_f(r['final_pass_at_1'])} | {_f(r['final_first_attempt_success'])} | "
                         f"{_f(r['gain_pass_at_1'], '+.3f')} | {'never' if steps is None else steps} |")
    lines += ["", f"Paired differences against `{b}` (same seed = same data order), mean ± s.e. [95 % CI]:", "",
              f"| arm | pairs | final {acc} | {tool} |", "| --- | --- | --- | --- |"]
    for arm, d in s["paired_pass_at_1"].items():
        lines.append(f"| {arm} − {b} | {d['n']} | {_pm(d)} | {_pm(s['paired_first_attempt_success'][arm])} |")
    lines += _settings_lines(s, b, acc) + _entropy_lines(s, b)
    lines += ["", "Change from the initial evaluation (mean over seeds ± s.e.):", "", f"| arm | {acc} |", "| --- | --- |"]
    lines += [f"| {arm} | {_pm(g)} |" for arm, g in s["gain_pass_at_1"].items()]
    if s.get("trained_by_kind"):
        lines += ["", "Trained trajectories by kind (what credit each kind carried into the update):", "",
                  "| arm | kind | trajectories | mean reward | mean advantage |", "| --- | --- | --- | --- | --- |"]
        for arm, rows in s["trained_by_kind"].items():
            lines += [f"| {arm} | {r['kind']} | {r['n']} | {r['reward']:.3f} | {r['advantage']:+.3f} |" for r in rows]
    lines += compare_extra.markdown_lines(s) + contrasts.markdown_lines(s) + mediators.markdown_lines(s)
    half, third = s["claim_half_the_steps"], s.get("claim_third_of_the_steps")
    lines += ["", f"- {t} reaches the baseline's final {acc} in at most half the steps: **{_VERDICT[half]}**",
              f"- {t} reaches it in at most a third of the steps (the paper's claim): **{_VERDICT[third]}**",
              f"- {t} ends with a higher {name['tool_long']} (seed means): "
              f"**{'yes' if s['claim_higher_first_attempt_success'] else 'no'}**", "",
              "![curves](compare.png)", "", "![per seed](compare_seeds.png)"]
    return "\n".join(lines) + "\n"


_VERDICT = {True: "yes", False: "no",
            None: "not testable (the baseline ended no higher than the initial policy's pass@1)"}


def write_report(summary: dict, folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    js = folder / "compare.json"
    js.write_text(json.dumps(summary, indent=1))
    md = folder / "compare.md"
    md.write_text(markdown(summary))
    return [js, md, *plot(summary, folder)]
