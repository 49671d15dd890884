"""The report of ``flows.bench_async``: per side the means a run, the schedule's waits, the ratios against the
synchronous sides, issue 52's goal, and the repeat checks.

``report(results, order, cfgs, load, steps, eval_at, echo)`` prints the tables and returns the JSON report;
``ratios`` and ``goal_met`` are the arithmetic (tests/test_bench_run_async.py pins it on hand-computed figures).
"""

from __future__ import annotations

import os
import statistics

from flows.bench_run import PARTS

GOAL_WALL = 1.5
"""Issue 52's goal: async's wall time a run at least this many times below the fastest synchronous side's ..."""
GOAL_CORE = 0.10
"""... at core-seconds at most this fraction above that side's. One-sided: the band keeps a faster wall from being
bought with more compute; a side that does the run's work in fewer core-seconds than the fastest synchronous one
(whose extra threads spin) has bought nothing. Each side's ratio is printed, so a reader can apply ± as well."""

WAITS = ("perf/wait_for_batch_s", "perf/wait_for_ckpt_s", "perf/trainer_idle_ratio", "perf/rollouter_idle_ratio",
         "perf/eval_wait_s")
ASYNC = "async"


def _mean(runs: list[dict], key: str) -> dict[str, float]:
    return {p: statistics.mean(r[key][p] for r in runs) for p in runs[0][key]}


def summary(runs: list[dict]) -> dict:
    """A side's means a run (wall, core-seconds, each part's, the waits) and each run's wall and core-seconds."""
    return {"wall_s": statistics.mean(r["wall_s"] for r in runs), "core_s": statistics.mean(r["core_s"] for r in runs),
            "runs_wall_s": [r["wall_s"] for r in runs], "runs_core_s": [r["core_s"] for r in runs],
            "parts_core_s": _mean(runs, "parts_core_s"), "parts_wall_s": _mean(runs, "parts_wall_s"),
            "waits": _mean(runs, "waits")}


def ratios(sides: dict[str, dict], cores: int) -> dict:
    """Async against the synchronous sides: each one's wall a run / async's (``wall_vs``), the fastest synchronous
    side (least wall a run), its wall ratio and async's core-seconds / its (``core_ratio``); ``busy``: the cores
    async kept busy on average (core-seconds / wall), and ``ceiling``: the most any overlap could give against the
    fastest side on ``cores`` cores at async's core-seconds (its wall / (async's core-seconds / cores)). Empty
    without async or a synchronous side."""
    sync = [name for name in sides if name != ASYNC]
    if ASYNC not in sides or not sync:
        return {}
    fast = min(sync, key=lambda name: sides[name]["wall_s"])
    mine = sides[ASYNC]
    return {"wall_vs": {name: sides[name]["wall_s"] / mine["wall_s"] for name in sync},
            "core_vs": {name: mine["core_s"] / sides[name]["core_s"] for name in sync}, "fastest_sync": fast,
            "wall_ratio": sides[fast]["wall_s"] / mine["wall_s"], "core_ratio": mine["core_s"] / sides[fast]["core_s"],
            "busy": mine["core_s"] / mine["wall_s"], "ceiling": sides[fast]["wall_s"] * cores / mine["core_s"],
            "cores": cores}


def goal_met(wall_ratio: float, core_ratio: float) -> bool:
    """Issue 52's goal: ≥ ×``GOAL_WALL`` wall a run against the fastest synchronous side, core-seconds at most
    ``GOAL_CORE`` above its (one-sided: see ``GOAL_CORE``)."""
    return wall_ratio >= GOAL_WALL and core_ratio <= 1.0 + GOAL_CORE


def repeat_check(runs: list[dict]) -> dict:
    """Whether every repeat trained on the first one's token ids (step by step), and the largest differences of the
    engine's log-probs and the ``train/*`` figures; whether the evaluations' figures are equal."""
    from flows.bench_step import differences

    diffs: dict[str, float] = {}
    for run in runs[1:]:
        if len(run["rows"]) != len(runs[0]["rows"]):
            diffs["token_ids"] = float("inf")
        for a, b in zip(runs[0]["rows"], run["rows"]):
            for k, v in differences(a, b).items():
                diffs[k] = max(diffs.get(k, 0.0), v)
    return {"token_ids_equal": diffs.get("token_ids", 0.0) == 0.0, "logprobs": diffs.get("rollout_logprobs", 0.0),
            "train": max((v for k, v in diffs.items() if k.startswith("train/")), default=0.0),
            "evals_equal": all(run["evals"] == runs[0]["evals"] for run in runs[1:]), "compared": len(runs) - 1}


def _print_sides(sides: dict, cfgs: dict, echo) -> None:
    echo("side".rjust(8) + "threads".rjust(8) + "k".rjust(3) + "wall/run".rjust(10) + "core/run".rjust(10)
         + "".join(p.rjust(14) for p in PARTS))
    for name, s in sides.items():
        cfg = cfgs[name]
        echo(name.rjust(8) + f"{cfg.engine.threads}+{cfg.trainer.threads}".rjust(8) + str(cfg.rollout.staleness).rjust(3)
             + f"{s['wall_s']:10.1f}{s['core_s']:10.1f}"
             + "".join(f"{s['parts_core_s'][p]:8.1f} ({s['parts_wall_s'][p]:3.0f})" for p in PARTS))
    echo("waits a run (s; idle ratios: mean of the steps):")
    echo("side".rjust(8) + "".join(w.removeprefix("perf/").rjust(22) for w in WAITS))
    for name, s in sides.items():
        beside = cfgs[name].rollout.staleness or cfgs[name].eval.beside_training
        echo(name.rjust(8) + "".join((f"{s['waits'][w]:22.2f}" if beside else "-".rjust(22)) for w in WAITS)
             + ("" if beside else "  (nothing beside: each stage waits for the one before)"))


def _print_ratios(r: dict, echo) -> None:
    if not r:
        echo("ratios: need the async side and a synchronous one")
        return
    echo("wall a run, synchronous / async: " + ", ".join(f"{n} x{v:.2f}" for n, v in r["wall_vs"].items())
         + f"; against the fastest ({r['fastest_sync']}) x{r['wall_ratio']:.2f} at core-seconds x{r['core_ratio']:.2f}"
         + f" -> goal (>= x{GOAL_WALL} wall, core-seconds at most +{GOAL_CORE:.0%}) "
         + ("MET" if r["goal_met"] else "not met"))
    echo("core-seconds a run, async / synchronous: " + ", ".join(f"{n} x{v:.2f}" for n, v in r["core_vs"].items())
         + f" (within +-{GOAL_CORE:.0%} of {r['fastest_sync']}'s: "
         + ("yes" if abs(r["core_ratio"] - 1.0) <= GOAL_CORE else "no") + ")")
    echo(f"async kept {r['busy']:.2f} of {r['cores']} cores busy; at its core-seconds no overlap on {r['cores']} cores "
         f"could beat {r['fastest_sync']} by more than x{r['ceiling']:.2f}")


def report(results: dict[str, list[dict]], order, cfgs: dict, checked: dict[str, bool], load: list, steps: int,
           eval_at: int, echo) -> dict:
    """Print the tables and the checks; return the JSON report (``same``: the repeats of every side ``checked``
    says trained on identical token ids)."""
    sides = {name: summary(runs) for name, runs in results.items()}
    r = ratios(sides, os.cpu_count() or 1)
    if r:
        r["goal_met"] = goal_met(r["wall_ratio"], r["core_ratio"])
    checks = {name: {**repeat_check(runs), "checked": checked[name]} for name, runs in results.items()}
    cfg = next(iter(cfgs.values()))
    echo(f"{cfg.model.path}: {steps} steps of {cfg.data.prompts_per_step} prompts x {cfg.rollout.n_samples} samples, "
         f"SAAR off and on evaluated at {eval_at} ({cfg.eval.n_prompts} x {cfg.eval.samples}) and {steps} (final "
         f"size); {len(order) // max(len(results), 1)} runs a side in the order {', '.join(n for n, _ in order)}")
    echo("seconds a run (mean of the repeats); parts: core-seconds in the process that ran them (wall in brackets)")
    _print_sides(sides, cfgs, echo)
    for name, runs in results.items():
        if cfgs[name].rollout.staleness:
            echo(f"{name}: rollout of step s sampled with version " + ", ".join(
                f"{s}:{v}" for s, v in runs[0]["rollout_versions"]) + "; versions its tokens record " + ", ".join(
                f"{s}:{'/'.join(map(str, t))}" for (s, _), t in zip(runs[0]["rollout_versions"], runs[0]["token_versions"])))
    _print_ratios(r, echo)
    for name, c in checks.items():
        echo(f"{name} repeats: token ids {'equal' if c['token_ids_equal'] else 'DIFFER'}, engine log-probs within "
             f"{c['logprobs']:.1e}, train/* within {c['train']:.1e}, evaluations "
             f"{'equal' if c['evals_equal'] else 'differ'}" + ("" if c["checked"] else " (not checked)")
             + ("" if c["compared"] else " (one run: nothing compared)"))
    echo("load average (1, 5, 15 min): start " + ", ".join(f"{x:.1f}" for x in load[0])
         + "; end " + ", ".join(f"{x:.1f}" for x in load[1]) + f" on {os.cpu_count()} cores")
    same = all(c["token_ids_equal"] for c in checks.values() if c["checked"])
    return {"order": [list(x) for x in order], "sides": sides, "ratios": r, "checks": checks,
            "runs": results, "load_start": load[0], "load_end": load[1], "same": same}
