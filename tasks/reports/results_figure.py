"""The README's results: one figure and one table, both read from the committed study (``docs/regimes.json``).

The figure shows held-out pass@1 (SAAR off) against the RL step for DAPO, the paper's CLEANER and the recommended
setting (``mask_raw0``: every failure purified, spliced tokens out of the loss), seed mean with a ±1 sd band, in
the two regimes of the study and in the registered confirmatory run. ``results_rows`` gives the table's figures
(paired difference to DAPO in final pass@1, its 95 % interval, the pairs); ``tests/test_readme.py`` checks the
README's table against them, so a number in the README cannot drift from the JSON. Redraw the figure with::

    python -m tasks.reports.results_figure            # writes docs/img/results.png
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

STUDY = Path("docs/regimes.json")
FIGURE = Path("docs/img/results.png")
ARMS = {"dapo": ("DAPO (baseline)", "#555555"), "cleaner": ("CLEANER as published", "#d62728"),
        "mask_raw0": ("masked CLEANER: purify all, splice out of the loss", "#1f77b4")}
PANELS = [("t4", "phase2", "4 turns: a failed call costs little (seeds 21–26)"),
          ("t2", "phase2", "2 turns: a failed call costs the answer (seeds 21–26)"),
          ("t4_confirm", None, "4 turns, registered confirm (new seeds 27–32)")]


def report(study: dict, regime: str, phase: str | None) -> dict:
    """The compare report of a regime's phase (phase 2's covers every arm) or of a follow-up."""
    return study[regime]["report"] if phase is None else study[regime][phase]["report_all_arms"]


def results_rows(study: dict) -> list[dict]:
    """One row per (regime, arm) vs DAPO: final SAAR-off pass@1 difference, s.e., 95 % interval, pairs."""
    rows = []
    for regime, phase, title in PANELS:
        paired = report(study, regime, phase)["paired_pass_at_1"]
        for arm in ("cleaner", "mask_raw0"):
            if arm in paired:
                p = paired[arm]
                rows.append({"regime": regime, "arm": arm, "title": title, "pairs": p["n"], "mean": p["mean"],
                             "se": p["se"], "ci95": tuple(p["ci95"])})
    return rows


def draw(study: dict, out: Path) -> Path:
    """The three panels side by side, each arm's seed mean and ±1 sd band of pass@1 (SAAR off) vs step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(PANELS), figsize=(13, 3.8), sharey=True)
    for ax, (regime, phase, title) in zip(axes, PANELS):
        curves = report(study, regime, phase)["curves"]
        for arm, (label, colour) in ARMS.items():
            if arm not in curves:
                continue
            pts = curves[arm]["accuracy"]
            x = [p["policy_version"] for p in pts]
            mean = [p["mean"] for p in pts]
            sd = [p["std"] for p in pts]
            ax.plot(x, mean, color=colour, label=f"{label} ({pts[-1]['n']} seeds)", lw=2)
            ax.fill_between(x, [m - s for m, s in zip(mean, sd)], [m + s for m, s in zip(mean, sd)],
                            color=colour, alpha=0.15, lw=0)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("RL step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    axes[0].set_ylabel("held-out pass@1, SAAR off")
    fig.suptitle("Tiny model, synthetic tool-use task: 128 held-out prompts × 8 samples at step 24", fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


if __name__ == "__main__":
    if len(sys.argv) > 1:
        sys.exit("usage: python -m tasks.reports.results_figure   (reads docs/regimes.json, writes docs/img/results.png)")
    print(draw(json.loads(STUDY.read_text()), FIGURE))
