"""Human-facing outputs: sample trajectories (raw vs purified) and run plots.

``sample_texts`` picks a few raw trajectories that met a tool error and a few SAAR
trajectories that were purified (a rollback recovered) and renders them as Markdown and JSON
artifacts, so the MLflow UI shows what SAAR cut. ``plot_run`` draws reward, accuracy,
first-attempt tool success and rollback rates against the step from the DuckDB metrics.
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
    "reward / accuracy": ["rollout/reward_mean", "rollout/accuracy"],
    "tool success": ["tools/first_attempt_success_rate", "tools/success_rate"],
    "SAAR rollbacks": ["saar/rollbacks_triggered", "saar/rollbacks_recovered", "saar/rollbacks_failed"],
    "SAAR decisions": ["saar/shallow", "saar/deep"],
}


def plot_run(metrics: pl.DataFrame, out_png: Path, title: str) -> Path:
    """One PNG with a panel per ``PLOTS`` entry; ``metrics`` has columns step, key, value."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(PLOTS), figsize=(4.2 * len(PLOTS), 3.4))
    for ax, (name, keys) in zip(axes, PLOTS.items()):
        for key in keys:
            part = metrics.filter(pl.col("key") == key).sort("step")
            if part.height:
                ax.plot(part["step"].to_list(), part["value"].to_list(), marker="o", ms=3, label=key.split("/", 1)[1])
        ax.set_title(name)
        ax.set_xlabel("step")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return out_png
