"""Plots of the compare report (matplotlib, Agg): curves, per-seed finals, paired differences.

* ``compare.png``: pass@1 and first-attempt tool success vs RL step, seed mean ± std per arm,
  with the baseline's final pass@1 as a dashed line;
* ``compare_seeds.png``: final pass@1 and first-attempt success of every run, runs of the same
  seed joined across arms, and each arm's paired difference to the baseline with its 95 % interval.

Run: ``plot(summary, folder)`` with a ``tasks.reports.compare.summarize`` result.
"""

from __future__ import annotations

from pathlib import Path


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_curves(summary: dict, out_png: Path) -> Path:
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, (key, title) in zip(axes, (("accuracy", "pass@1, SAAR off at evaluation"),
                                       ("first_attempt_success", "first-attempt tool success"))):
        for arm, c in summary["curves"].items():
            rows = c[key]
            x = [r["policy_version"] for r in rows]
            m = [r["mean"] for r in rows]
            s = [r["std"] for r in rows]
            ax.plot(x, m, marker="o", ms=3, label=f"{arm} ({summary['final'][arm]['seeds']} seeds)")
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


def plot_seeds(summary: dict, out_png: Path) -> Path:
    plt = _pyplot()
    arms = list(summary["per_seed"])
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for ax, (field, title) in zip(axes[:2], (("final_pass_at_1", "final pass@1 per run"),
                                             ("final_first_attempt_success", "final first-attempt success per run"))):
        by_seed: dict[int, list[tuple[int, float]]] = {}
        for i, arm in enumerate(arms):
            for r in summary["per_seed"][arm]:
                if r[field] is not None:
                    by_seed.setdefault(r["seed"], []).append((i, r[field]))
                    ax.scatter([i], [r[field]], s=22, color=f"C{i}", zorder=3)
        for points in by_seed.values():
            ax.plot([p[0] for p in points], [p[1] for p in points], color="grey", lw=0.6, alpha=0.6)
        ax.set_xticks(range(len(arms)), arms)
        ax.set_title(title)
        ax.grid(alpha=0.3, axis="y")
    ax = axes[2]
    diffs = summary["paired_pass_at_1"]
    names = list(diffs)
    for i, arm in enumerate(names):
        d = diffs[arm]
        ax.scatter([i] * len(d["values"]), d["values"], s=14, color="grey", zorder=2)
        if d["mean"] is not None:
            ax.scatter([i], [d["mean"]], s=40, color="C3", zorder=3)
        if d.get("ci95"):
            ax.vlines(i, *d["ci95"], color="C3", lw=2)
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xticks(range(len(names)), [f"{a} − {summary['baseline']}" for a in names])
    ax.set_title("paired difference of final pass@1 (95 % CI)")
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return out_png


def plot(summary: dict, folder: Path) -> list[Path]:
    return [plot_curves(summary, Path(folder) / "compare.png"), plot_seeds(summary, Path(folder) / "compare_seeds.png")]
