"""The README's results: one figure and two tables, all read from the committed studies.

The regime study (``docs/regimes.json``) and the generalisation study (``docs/generalisation/*.json``, issue 41's
registered follow-up) each hold compare reports. The figure shows held-out pass@1 (SAAR off) against the RL step for
DAPO, the paper's CLEANER, the recommended setting (``mask_raw0``: every failure purified, spliced tokens out of the
loss) and the filter-only DAPO where a study ran it, seed mean with a ±1 sd band: the regime study's two regimes
and its confirm on the top row, the follow-up's studies below. ``results_rows`` gives the regime table's figures
(paired difference to DAPO in final pass@1, its 95 % interval, the pairs) and ``fresh_rows`` the follow-up's (the
same on the fresh split nothing was selected on, beside the usual held-out split); ``tests/test_readme.py`` checks
the README's tables against them, so a number in the README cannot drift from the JSON. Redraw the figure with::

    python -m tasks.reports.results_figure            # writes docs/img/results.png
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

STUDY = Path("docs/regimes.json")
FOLLOW_UP = {"t4_long": Path("docs/generalisation/t4_long.json"),
             "multicall": Path("docs/generalisation/multicall.json")}
"""The follow-up's studies that exist (a study not yet run has no file and no panel)."""
SHORT = {"t4_long": "4 turns, 72 steps", "multicall": "chains", "cleaner": "CLEANER as published",
         "mask_raw0": "masked CLEANER", "dapo_filter": "DAPO, filter only"}
FIGURE = Path("docs/img/results.png")
ARMS = {"dapo": ("DAPO (baseline)", "#555555"), "cleaner": ("CLEANER as published", "#d62728"),
        "mask_raw0": ("masked CLEANER: purify all, splice out of the loss", "#1f77b4"),
        "dapo_filter": ("DAPO, failed attempts out of the loss", "#2ca02c")}
PANELS = [("t4", "phase2", "4 turns: a failed call costs little (seeds 21–26)"),
          ("t2", "phase2", "2 turns: a failed call costs the answer (seeds 21–26)"),
          ("t4_confirm", None, "4 turns, registered confirm (new seeds 27–32)")]
FOLLOW_UP_TITLES = {"t4_long": "4 turns, 72 steps (seeds 51–56)",
                    "multicall": "chains of 2–3 dependent calls (seeds 61–66)"}


def report(study: dict, regime: str, phase: str | None) -> dict:
    """The compare report of a regime's phase (phase 2's covers every arm) or of a follow-up."""
    return study[regime]["report"] if phase is None else study[regime][phase]["report_all_arms"]


def _interval(p: dict) -> dict:
    return {"pairs": p["n"], "mean": p["mean"], "se": p["se"], "ci95": tuple(p["ci95"])}


def results_rows(study: dict) -> list[dict]:
    """One row per (regime, arm) vs DAPO: final SAAR-off pass@1 difference, s.e., 95 % interval, pairs."""
    rows = []
    for regime, phase, title in PANELS:
        paired = report(study, regime, phase)["paired_pass_at_1"]
        for arm in ("cleaner", "mask_raw0"):
            if arm in paired:
                rows.append({"regime": regime, "arm": arm, "title": title, **_interval(paired[arm])})
    return rows


def fresh_rows(name: str, compare: dict) -> list[dict]:
    """One row per arm vs DAPO of a follow-up study: final SAAR-off pass@1 difference on the fresh split
    (``fresh``) and on the usual held-out split (``usual``), each with its interval and pairs."""
    fresh = compare["fresh"]["paired"]
    return [{"study": name, "arm": arm, "fresh": _interval(fresh[arm]["internalisation"]),
             "usual": _interval(compare["paired_pass_at_1"][arm])} for arm in fresh]


def follow_ups(root: Path = Path(".")) -> dict[str, dict]:
    """The follow-up studies committed so far, by name."""
    return {name: json.loads((root / path).read_text()) for name, path in FOLLOW_UP.items()
            if (root / path).exists()}


def _panel(ax, curves: dict, title: str) -> None:
    for arm, (label, colour) in ARMS.items():
        if arm not in curves:
            continue
        pts = curves[arm]["accuracy"]
        x = [p["policy_version"] for p in pts]
        mean = [p["mean"] for p in pts]
        sd = [p["std"] for p in pts]
        ax.plot(x, mean, color=colour, label=f"{label} ({pts[-1]['n']} seeds)", lw=2, marker=".")
        ax.fill_between(x, [m - s for m, s in zip(mean, sd)], [m + s for m, s in zip(mean, sd)],
                        color=colour, alpha=0.15, lw=0)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("RL step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")


def _intervals(ax, later: dict[str, dict]) -> None:
    """Each follow-up arm's final pass@1 − DAPO on the fresh split, with its 95 % interval."""
    rows = [row for name, compare in later.items() for row in fresh_rows(name, compare)]
    for y, row in enumerate(reversed(rows)):
        lo, hi = row["fresh"]["ci95"]
        ax.errorbar(row["fresh"]["mean"], y, xerr=[[row["fresh"]["mean"] - lo], [hi - row["fresh"]["mean"]]],
                    fmt="o", color=ARMS[row["arm"]][1], capsize=3, lw=2)
    ax.axvline(0, color=ARMS["dapo"][1], lw=1)
    ax.set_yticks(range(len(rows)), [f"{SHORT[row['study']]}:\n{SHORT[row['arm']]}" for row in reversed(rows)],
                  fontsize=8)
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.set_title("final pass@1 − DAPO, fresh split (95 % CI)", fontsize=10)
    ax.set_xlabel("paired difference over seeds")
    ax.grid(alpha=0.3, axis="x")


def draw(study: dict, later: dict[str, dict], out: Path) -> Path:
    """The regime study's panels on the top row, the follow-up's below: each arm's seed mean and ±1 sd band of
    held-out pass@1 (SAAR off) vs step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = 2 if later else 1
    fig, axes = plt.subplots(rows, len(PANELS), figsize=(13, 3.8 * rows), squeeze=False)
    for ax, (regime, phase, title) in zip(axes[0], PANELS):
        _panel(ax, report(study, regime, phase)["curves"], title)
    if later:
        for ax, (name, compare) in zip(axes[1], later.items()):
            _panel(ax, compare["curves"], FOLLOW_UP_TITLES[name])
        _intervals(axes[1][len(later)], later)
        for ax in axes[1][len(later) + 1:]:
            ax.set_visible(False)
    for row in axes:
        row[0].set_ylabel("held-out pass@1, SAAR off")
    fig.suptitle("Tiny model, synthetic tool-use tasks: held-out pass@1 (128 prompts × 8 at the last step)",
                 fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


if __name__ == "__main__":
    if len(sys.argv) > 1:
        sys.exit("usage: python -m tasks.reports.results_figure   (reads docs/regimes.json and "
                 "docs/generalisation/*.json, writes docs/img/results.png)")
    print(draw(json.loads(STUDY.read_text()), follow_ups(), FIGURE))
