"""The collapse panel: every signal of RAGEN's Echo Trap and RAGEN-2's template collapse in one PNG.

Small multiples over the training step (metric keys as logged), so a glance shows whether reward
variance is falling, gradients spiking, entropy or reasoning-input dependence (MI) vanishing::

    reward std in groups   rollout/in_group_std, in_group_std_max, chosen_in_group_std
    entropy                train/entropy
    gradient norm          train/grad_norm
    clip / KL              train/clip_frac, train/approx_kl
    response length        response_length
    success                <env>/success, <env>/pass_at_k, <env>/valid_action_rate, <env>/hi_arm_rate,
                           <env>/path_agreement
    MI (template collapse) collapse/mi_estimate, collapse/mi_zscore
    retrieval              collapse/retrieval_accuracy, collapse/retrieval_chance_level

Run: ``plot_collapse(metrics, Path("collapse.png"), "run id")`` with a (step, key, value) frame.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

PANELS: dict[str, list[str]] = {
    "reward std in groups": ["rollout/in_group_std", "rollout/in_group_std_max", "rollout/chosen_in_group_std"],
    "entropy": ["train/entropy"],
    "gradient norm": ["train/grad_norm"],
    "clip fraction / approx KL": ["train/clip_frac", "train/approx_kl"],
    "response length": ["response_length"],
    "success": ["/success", "/pass_at_", "/valid_action_rate", "/hi_arm_rate", "/path_agreement"],
    "MI (template collapse)": ["collapse/mi_estimate", "collapse/mi_zscore"],
    "retrieval": ["collapse/retrieval_accuracy", "collapse/retrieval_chance_level"],
}
"""Panel title → metric keys; a key starting with ``/`` matches any ``<env>/...`` metric ending that way
(evaluation metrics under ``eval/`` excluded)."""


def _keys(all_keys: list[str], wanted: list[str]) -> list[str]:
    out = []
    for w in wanted:
        if w.startswith("/"):
            out += sorted(k for k in all_keys if w in k and not k.startswith(("eval/", "collapse/", "rollout/")))
        elif w in all_keys:
            out.append(w)
    return out


def plot_collapse(metrics: pl.DataFrame, out_png: Path, title: str) -> Path:
    """Write the collapse panel PNG (see module docstring); missing signals leave their subplot empty."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = metrics["key"].unique().to_list() if metrics.height else []
    fig, axes = plt.subplots(2, 4, figsize=(17, 7))
    for ax, (name, wanted) in zip(axes.flat, PANELS.items()):
        for key in _keys(keys, wanted):
            part = metrics.filter(pl.col("key") == key).sort("step")
            ax.plot(part["step"].to_list(), part["value"].to_list(), marker="o", ms=2, label=key)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("step", fontsize=8)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6)
    fig.suptitle(f"{title}: collapse signals")
    fig.tight_layout()
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=100)
    plt.close(fig)
    return out_png
