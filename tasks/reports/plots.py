"""Human-facing outputs: sample trajectories (raw vs purified) and run plots.

``sample_texts`` picks a few raw trajectories that met a tool error and a few SAAR
trajectories that were purified (a rollback recovered) and renders them as Markdown and JSON
artifacts, so the MLflow UI shows what SAAR cut. ``plot_run`` draws reward, tool-call rate, policy
loss, accuracy, tool success, rollback rates (rollbacks per tool call, recovery and failure rates) and shallow/deep
counts against the step from the DuckDB metrics in one summary PNG; ``plot_panels`` writes the
same panels as one PNG each. The HTML trajectory viewer lives in ``tasks/reports/viewer.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl


def _render(row: dict) -> str:
    head = (f"### {row['traj_id']} — {'raw' if row['raw'] else 'SAAR'}; reward {row['reward']}; "
            f"rollbacks {row['rollbacks_triggered']} triggered / {row['rollbacks_recovered']} recovered; "
            f"shallow {row['shallow']}, deep {row['deep']}\n")
    turns = [f"**{m['role']}**\n```\n{m['content']}\n```" for m in json.loads(row["messages"])]
    return head + "\n".join(turns) + "\n"


def pick_samples(trajs: pl.DataFrame, n: int) -> dict[str, pl.DataFrame]:
    raw = trajs.filter(pl.col("raw") & (pl.col("tool_calls") > pl.col("tool_success")))
    if raw.height < n:
        raw = pl.concat([raw, trajs.filter(pl.col("raw")).join(raw, on="traj_id", how="anti")]).head(n)
    purified = trajs.filter(pl.col("rollbacks_recovered") > 0).sort("traj_id").head(n)
    return {"raw": raw.sort("traj_id").head(n), "purified": purified}


def sample_texts(trajs: pl.DataFrame, step: int, n: int) -> dict[str, str]:
    """Artifact path → text for ``n`` raw and ``n`` purified trajectories of this step."""
    if n == 0:
        return {}
    picked = pick_samples(trajs, n)
    cols = ["traj_id", "raw", "reward", "messages", "rollbacks_triggered", "rollbacks_recovered", "shallow", "deep"]
    md = [f"# Step {step}: sample trajectories\n"]
    for kind, df in picked.items():
        md.append(f"## {kind} ({df.height})\n")
        md.extend(_render(r) for r in df.select(cols).iter_rows(named=True))
    payload = {kind: df.select(cols).to_dicts() for kind, df in picked.items()}
    return {f"samples/step_{step:06d}.md": "\n".join(md), f"samples/step_{step:06d}.json": json.dumps(payload, indent=1)}


PLOTS = {
    "reward": ["rollout/reward_mean"],
    "tool calls": ["tools/call_rate"],
    "loss": ["train/loss"],
    "accuracy": ["rollout/accuracy", "mix/purified_accuracy", "mix/raw_accuracy"],
    "tool success": ["tools/first_attempt_success_rate", "tools/success_rate"],
    "rollback rates": ["saar/rollback_rate", "saar/global_recovery_rate", "saar/failed_rate"],
    "SAAR decisions": ["saar/shallow", "saar/deep"],
}
"""Panel title → metric keys drawn in it (the rates marked below are derived per step)."""


def with_rates(metrics: pl.DataFrame) -> pl.DataFrame:
    """Add per-step ``saar/rollback_rate`` (rollbacks per tool call) and ``saar/failed_rate``."""
    wide = metrics.pivot(on="key", index="step", values="value", aggregate_function="first")
    need = {"saar/rollbacks_triggered", "saar/rollbacks_failed", "tools/calls"}
    if wide.height == 0 or not need <= set(wide.columns):
        return metrics
    trig, calls = pl.col("saar/rollbacks_triggered"), pl.col("tools/calls")
    rates = wide.select(
        "step",
        pl.when(calls > 0).then(trig / calls).otherwise(0.0).alias("saar/rollback_rate"),
        pl.when(trig > 0).then(pl.col("saar/rollbacks_failed") / trig).otherwise(0.0).alias("saar/failed_rate"),
    ).unpivot(index="step", variable_name="key", value_name="value")
    return pl.concat([metrics.select("step", "key", "value"), rates.cast(metrics.select("step", "key", "value").schema)])


def _draw(ax, metrics: pl.DataFrame, name: str, keys: list[str]) -> None:
    from matplotlib.ticker import MaxNLocator

    for key in keys:
        part = metrics.filter(pl.col("key") == key).sort("step")
        if part.height:
            ax.plot(part["step"].to_list(), part["value"].to_list(), marker="o", ms=3, label=key.split("/", 1)[1])
    ax.set_title(name)
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    ax.grid(alpha=0.3)


def _figure():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_run(metrics: pl.DataFrame, out_png: Path, title: str, panels: list[str] | None = None) -> Path:
    """One PNG with a panel per ``PLOTS`` entry (or per name in ``panels``); ``metrics`` has columns step, key,
    value."""
    unknown = sorted(set(panels or []) - set(PLOTS))
    if unknown:
        raise ValueError(f"panels: unknown {unknown}; valid: {list(PLOTS)}")
    plt = _figure()
    metrics = with_rates(metrics)
    chosen = {name: PLOTS[name] for name in panels} if panels else PLOTS
    fig, axes = plt.subplots(1, len(chosen), figsize=(4.0 * len(chosen), 3.4), squeeze=False)
    for ax, (name, keys) in zip(axes[0], chosen.items()):
        _draw(ax, metrics, name, keys)
    fig.suptitle(title)
    fig.tight_layout()
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return out_png


def plot_panels(metrics: pl.DataFrame, out_dir: Path, title: str) -> list[Path]:
    """One PNG per ``PLOTS`` panel (``reward.png``, ``accuracy.png``, ...) in ``out_dir``."""
    plt = _figure()
    metrics = with_rates(metrics)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, keys in PLOTS.items():
        fig, ax = plt.subplots(figsize=(5, 3.4))
        _draw(ax, metrics, f"{title}: {name}", keys)
        fig.tight_layout()
        path = out_dir / (name.replace(" ", "_").lower() + ".png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths
