"""Mix + filter and advantage stages: curriculum statistics, DAPO dynamic sampling, GRPO advantages.

``mix_step`` joins trajectories with their scores and decides which groups train:
* curriculum statistics: how many trajectories are raw vs SAAR-purified, and their accuracy;
* DAPO dynamic sampling: drop groups (same prompt) whose rewards are all equal — their GRPO
  advantage is zero and they only dilute the token-mean;
* optional StarPO-S: keep the top ``starpo_keep`` share of groups by reward std.

``advantage_step`` computes the GRPO outcome advantage (reward − group mean) / (group std + ε),
broadcast later over the model's own tokens (mask 1) only.

``fill_batch`` is the other half of DAPO dynamic sampling, used by the rollout stage: roll out
more prompts until ``want`` groups are informative (rewards not all equal), at most
``max_rounds`` extra rounds — the bound keeps a step's cost finite when the policy solves
(or fails) everything.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence, TypeVar

import polars as pl

from tasks.stores.records import read_table
from tasks.training.config import MixConfig

T = TypeVar("T")


def fill_batch(draw: Callable[[int, int], Sequence], run: Callable[[Sequence], list[T]],
               group_rewards: Callable[[list[T]], dict[str, list[float]]], want: int,
               max_rounds: int) -> tuple[list[T], dict[str, float]]:
    """Roll out ``draw(round, n)`` prompts until ``want`` informative groups, within ``max_rounds`` refills."""
    out: list[T] = []
    informative = 0
    rounds = 0
    need = want
    while True:
        new = run(draw(rounds, need))
        out.extend(new)
        informative += sum(len(set(r)) > 1 for r in group_rewards(new).values())
        if informative >= want or rounds >= max_rounds:
            break
        rounds += 1
        need = want - informative
    return out, {"mix/refill_rounds": rounds, "mix/informative_groups": informative}


def mix_rows(df: pl.DataFrame, cfg: MixConfig) -> tuple[pl.DataFrame, dict[str, float]]:
    """Mark ``kept`` rows; return the table and ``mix/*`` metrics."""
    graded = df.filter(pl.col("graded"))
    groups = graded.group_by("prompt_id").agg(
        pl.col("reward").std(ddof=0).fill_null(0.0).alias("group_std"), pl.len().alias("group_n")
    )
    keep = groups
    if cfg.dynamic_sampling:
        keep = keep.filter(pl.col("group_std") > 0)
    if cfg.starpo_keep < 1.0 and keep.height:
        n = max(1, round(keep.height * cfg.starpo_keep))
        keep = keep.sort(["group_std", "prompt_id"], descending=[True, False]).head(n)
    kept_ids = set(keep["prompt_id"].to_list())
    out = df.with_columns((pl.col("graded") & pl.col("prompt_id").is_in(list(kept_ids))).alias("kept"))
    purified = graded.filter(pl.col("rollbacks_recovered") > 0)
    raw = graded.filter(pl.col("raw"))
    metrics = {
        "mix/groups": groups.height,
        "mix/groups_kept": len(kept_ids),
        "mix/trajectories_kept": int(out["kept"].sum()),
        "mix/raw": raw.height,
        "mix/purified": purified.height,
        "mix/purified_accuracy": float(purified["correct"].cast(pl.Float64).mean() or 0.0) if purified.height else 0.0,
        "mix/raw_accuracy": float(raw["correct"].cast(pl.Float64).mean() or 0.0) if raw.height else 0.0,
    }
    return out, metrics


def grpo_advantages(df: pl.DataFrame, eps: float) -> pl.DataFrame:
    """GRPO group-normalised advantage of every kept row (0 for rows that do not train)."""
    stats = df.filter(pl.col("kept")).group_by("prompt_id").agg(
        pl.col("reward").mean().alias("g_mean"), pl.col("reward").std(ddof=1).alias("g_std"), pl.len().alias("g_n")
    )
    out = df.join(stats, on="prompt_id", how="left")
    adv = pl.when(pl.col("kept") & (pl.col("g_n") > 1)).then(
        (pl.col("reward") - pl.col("g_mean")) / (pl.col("g_std").fill_null(0.0) + eps)
    ).otherwise(0.0)
    return out.with_columns(adv.alias("advantage")).drop(["g_mean", "g_std", "g_n"])


def mix_step(step_dir: Path, cfg: MixConfig) -> dict[str, float]:
    step_dir = Path(step_dir)
    df = read_table(step_dir, "trajectories").join(read_table(step_dir, "scores"), on=["run_id", "step", "traj_id"])
    mixed, metrics = mix_rows(df, cfg)
    mixed.select(["run_id", "step", "traj_id", "kept"]).write_parquet(step_dir / "mix.parquet")
    return metrics


def advantage_step(step_dir: Path, cfg: MixConfig) -> dict[str, float]:
    step_dir = Path(step_dir)
    keys = ["run_id", "step", "traj_id"]
    df = (read_table(step_dir, "trajectories").join(read_table(step_dir, "scores"), on=keys)
          .join(read_table(step_dir, "mix"), on=keys))
    adv = grpo_advantages(df, cfg.adv_eps)
    adv.select([*keys, "advantage"]).write_parquet(step_dir / "advantages.parquet")
    kept = adv.filter(pl.col("kept"))
    return {"train/advantage_abs_mean": float(kept["advantage"].abs().mean() or 0.0) if kept.height else 0.0}
