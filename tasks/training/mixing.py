"""Mix + filter and advantage stages: curriculum statistics, DAPO dynamic sampling, GRPO advantages.

``mix_step`` joins trajectories with their scores and decides which groups train:
* curriculum statistics: how many trajectories are raw vs SAAR-purified, and their accuracy;
* DAPO dynamic sampling: drop groups (same prompt) whose rewards are all equal — their GRPO
  advantage is zero and they only dilute the token-mean;
* the group filter ``group_filter`` (``tasks.envs.filters``): StarPO-S (keep the top ``ratio`` of
  groups by reward std), RAGEN-2's linear top-p, or none — applied to the graded groups before
  dynamic sampling, with RAGEN's reward-std metrics every step. A step whose filter keeps nothing
  trains nothing and counts towards ``empty_stop_steps``; one that keeps fewer trajectories than
  the trainer's mini-batches says so (``mix/filter_shortfall``, and a warning).

``advantage_step`` applies the registered estimator ``mix.advantage`` (``tasks.training.advantages``:
GRPO (reward − group mean) / (group std + ε) by default) per ``group_id``, times the group filter's
loss scaling, broadcast later over the model's own tokens (mask 1) only; rows the estimator drops
(MC-GRPO's pivot) are marked ``dropped`` and never reach the update (``train/dropped_rows``).

``mix.failed_turns: mask`` (the filter baseline of issue 41) writes a ``loss_mask`` beside the advantages: the
row's response mask with every assistant turn whose tool call failed and stayed in the trajectory set to 0
(``mask_failed_turns``); the update trains on it instead of the response mask. The error text after such a turn
is a tool response, mask 0 already; the turns after it still train, in the context the failure left.

``fill_batch`` is the other half of DAPO dynamic sampling, used by the rollout stage: roll out
more prompts until ``want`` groups are informative (rewards not all equal), at most
``max_rounds`` extra rounds — the bound keeps a step's cost finite when the policy solves
(or fails) everything — then trim the batch back to ``want`` groups, as DAPO trims its
accumulated batch to the train batch size.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import polars as pl

from tasks.envs.filters import apply_filter, minibatch_shortfall
from tasks.r3l.grouping import SINGLETON_KINDS
from tasks.stores import fence
from tasks.stores.records import read_table
from tasks.training.advantages import compute_advantages
from tasks.training.config import MixConfig

T = TypeVar("T")


def fill_batch(draw: Callable[[int, int], Sequence], run: Callable[[Sequence, int], list[T]],
               group_rewards: Callable[[list[T]], dict[str, list[float]]], want: int,
               max_rounds: int, group_of: Callable[[T], str]) -> tuple[list[T], dict[str, float]]:
    """Roll out ``draw(round, n)`` prompts (``run(prompts, round)``) until ``want`` informative groups,
    within ``max_rounds`` refills; the batch is then trimmed back to ``want`` groups.

    The trimmed batch holds every informative group (never more than ``want``: each round draws only
    the shortfall) and, when the rounds ran out first, the earliest uninformative groups up to ``want``;
    uninformative groups a refill replaced are dropped (``mix/refill_dropped_groups``).
    """
    out: list[T] = []
    informative: set[str] = set()
    order: list[str] = []
    rounds = 0
    need = want
    while True:
        new = run(draw(rounds, need), rounds)
        out.extend(new)
        rewards = group_rewards(new)
        order += [g for g in dict.fromkeys(group_of(t) for t in new)]
        informative.update(g for g, r in rewards.items() if len(set(r)) > 1)
        if len(informative) >= want or rounds >= max_rounds:
            break
        rounds += 1
        need = want - len(informative)
    keep = set(informative)
    if rounds:
        for g in order:
            if len(keep) >= want:
                break
            keep.add(g)
    else:
        keep = set(order)
    batch = [t for t in out if group_of(t) in keep]
    return batch, {"mix/refill_rounds": rounds, "mix/informative_groups": len(informative),
                   "mix/refill_dropped_groups": len(set(order) - keep)}


def with_roles(df: pl.DataFrame) -> pl.DataFrame:
    """``df`` with ``group_id`` (default: the prompt id) and ``kind`` (default ``rollout``) filled in."""
    if "group_id" not in df.columns:
        df = df.with_columns(pl.col("prompt_id").alias("group_id"))
    if "kind" not in df.columns:
        df = df.with_columns(pl.lit("rollout").alias("kind"))
    return df.with_columns(pl.col("group_id").fill_null(pl.col("prompt_id")), pl.col("kind").fill_null("rollout"))


def mix_rows(df: pl.DataFrame, cfg: MixConfig) -> tuple[pl.DataFrame, dict[str, float]]:
    """Mark ``kept`` rows; return the table and ``mix/*`` metrics.

    Groups are ``group_id`` (one per prompt, or R3L's groups); R3L's reflect/retry rows are groups
    of one that no group filter drops (their reward is fixed, their std always 0).
    """
    df = with_roles(df)
    graded = df.filter(pl.col("graded"))
    groups = graded.group_by("group_id").agg(
        pl.col("reward").std(ddof=0).fill_null(0.0).alias("group_std"),
        pl.col("kind").is_in(list(SINGLETON_KINDS)).all().alias("singleton"))
    keep, exempt = groups.filter(~pl.col("singleton")), groups.filter(pl.col("singleton"))
    filtered = graded.filter(~pl.col("group_id").is_in(exempt["group_id"].to_list()))
    filt = apply_filter(filtered.select(pl.col("group_id").alias("group"), pl.col("reward").alias("score")),
                        cfg.group_filter)
    keep = keep.filter(pl.col("group_id").is_in(filt.kept))
    if cfg.dynamic_sampling:
        keep = keep.filter(pl.col("group_std") > 0)
    kept_ids = set(keep["group_id"].to_list()) | set(exempt["group_id"].to_list())
    out = df.with_columns((pl.col("graded") & pl.col("group_id").is_in(list(kept_ids))).alias("kept"),
                          pl.lit(filt.advantage_scale).alias("adv_scale"))
    purified = graded.filter(pl.col("rollbacks_recovered") > 0)
    raw = graded.filter(pl.col("raw"))
    metrics = {
        "mix/groups": groups.height,
        "mix/groups_kept": len(kept_ids),
        "mix/trajectories_kept": int(out["kept"].sum()),
        "mix/raw": raw.height,
        "mix/purified": purified.height,
        "mix/purified_accuracy": float(purified["correct"].cast(pl.Float64).mean() or 0.0),  # None when empty
        "mix/raw_accuracy": float(raw["correct"].cast(pl.Float64).mean() or 0.0),  # None when empty
        **filt.metrics,
    }
    if exempt.height:
        metrics["mix/singleton_groups"] = exempt.height
    return out, metrics


def grpo_advantages(df: pl.DataFrame, eps: float) -> pl.DataFrame:
    """GRPO group-normalised advantage of every kept row (0 for rows that do not train)."""
    return compute_advantages(with_roles(df), MixConfig(adv_eps=eps))


def mix_step(step_dir: Path, cfg: MixConfig, mini_batches: int | None = None, empty_before: int = 0) -> dict[str, float]:
    """Mix one step; ``empty_before``: consecutive steps before this one whose filter kept nothing."""
    step_dir = Path(step_dir)
    df = read_table(step_dir, "trajectories").join(read_table(step_dir, "scores"), on=["run_id", "step", "traj_id"])
    mixed, metrics = mix_rows(df, cfg)
    fence.publish(step_dir / "mix.parquet", mixed.select(["run_id", "step", "traj_id", "kept", "adv_scale"]).write_parquet)
    empty = metrics["rollout/filter_kept_count"] == 0
    metrics["rollout/consecutive_empty_after_filter_steps"] = empty_before + 1 if empty else 0
    limit = cfg.group_filter.empty_stop_steps
    metrics["early_stopped/empty_filtered_steps"] = float(bool(limit) and empty_before + 1 >= limit and empty)
    short = minibatch_shortfall(metrics["mix/trajectories_kept"], mini_batches) if mini_batches and not empty else None
    metrics["mix/filter_shortfall"] = float(short is not None)
    if empty:
        print(f"step {step_dir.name}: the group filter kept no group ({cfg.group_filter.kind}); this step does not "
              f"train ({metrics['rollout/consecutive_empty_after_filter_steps']} in a row)")
    elif short:
        print(f"step {step_dir.name}: {short}")
    return metrics


def advantage_step(step_dir: Path, cfg: MixConfig) -> dict[str, float]:
    step_dir = Path(step_dir)
    keys = ["run_id", "step", "traj_id"]
    df = (read_table(step_dir, "trajectories").join(read_table(step_dir, "scores"), on=keys)
          .join(read_table(step_dir, "mix"), on=keys))
    adv = compute_advantages(with_roles(df), cfg)
    if "adv_scale" in adv.columns:
        adv = adv.with_columns(pl.col("advantage") * pl.col("adv_scale"))
    columns, metrics = [*keys, "advantage", "dropped"], {}
    if cfg.failed_turns == "mask":
        adv, metrics = with_loss_mask(adv, failed_positions(read_table(step_dir, "executions")))
        columns.append("loss_mask")
    fence.publish(step_dir / "advantages.parquet", adv.select(columns).write_parquet)
    kept = adv.filter(pl.col("kept") & ~pl.col("dropped"))
    return {"train/advantage_abs_mean": float(kept["advantage"].abs().mean() or 0.0) if kept.height else 0.0,
            "train/dropped_rows": int(adv["dropped"].sum()), **metrics}


def failed_positions(executions: pl.DataFrame) -> dict[str, set[int]]:
    """Per trajectory, the assistant turns (positions) whose last call failed: the failure stayed in the trajectory
    (every failed call with SAAR off; a rollback that ran out of retries; never a recovered one)."""
    if not executions.height:
        return {}
    last = executions.sort("exec_idx").group_by("traj_id", "position").agg(pl.col("ok").last())
    out: dict[str, set[int]] = {}
    for row in last.filter(~pl.col("ok")).iter_rows(named=True):
        out.setdefault(row["traj_id"], set()).add(int(row["position"]))
    return out


def mask_failed_turns(mask: list[int], failed: set[int]) -> list[int]:
    """``mask`` with assistant turns ``failed`` set to 0. Turn i is the i-th maximal run of 1s: every assistant turn
    is followed by a tool response or the response's end (mask 0); a failed turn past the last run was cut off by
    the response budget and has nothing to mask."""
    out, turn, inside = list(mask), -1, False
    for i, m in enumerate(mask):
        if m and not inside:
            turn += 1
        inside = bool(m)
        if m and turn in failed:
            out[i] = 0
    return out


def with_loss_mask(adv: pl.DataFrame, failed: dict[str, set[int]]) -> tuple[pl.DataFrame, dict[str, float]]:
    """``adv`` with ``loss_mask`` (``mask_failed_turns`` per row) and how many turns / tokens of kept rows it took out."""
    masks = [mask_failed_turns(list(m), failed.get(t, set())) for t, m in zip(adv["traj_id"], adv["response_mask"])]
    out = adv.with_columns(pl.Series("loss_mask", masks, dtype=pl.List(pl.Int8)))
    kept = out.filter(pl.col("kept") & ~pl.col("dropped"))
    tokens = int((kept["response_mask"].list.sum() - kept["loss_mask"].list.sum()).sum() or 0)
    turns = sum(len(failed.get(t, ())) for t in kept["traj_id"])
    return out, {"mix/failed_turns_masked": turns, "mix/failed_tokens_masked": tokens}
