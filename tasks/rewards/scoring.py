"""Score stage: outcome reward per trajectory, plus DAPO overlong shaping.

Reads ``trajectories.parquet`` and ``executions.parquet`` of a step, grades each response with the reward registry
(``tasks.rewards.registry.compute_reward``, keyed by ``data_source``), adds the overlong penalty and
writes ``scores.parquet`` (keys + ``score``, ``correct``, ``overlong_penalty``, ``reward``,
``graded``). A grader that raises is counted (``score/grader_errors``; ``score/grader_errors_infra``
those caused by a sandbox that stayed broken) and its trajectory is marked ``graded = false`` so it
never trains — it is not scored 0. No answer causes one: whatever a response holds, the graders give
it a reward (a failure, or the format-error reward); only infrastructure and malformed ground truths do. A row whose method fixed its
reward (``fixed_reward``: R3L's reflect and retry rows, 1.0) is not graded. The ``rollout/*``
metrics describe the policy's first attempts only (kinds ``rollout`` and R3L ``base``).
``score/suspected_hacks/<kind>`` counts the responses whose grading saw a failure of that kind
suggesting an attempt on the grader (a code answer that exits, forges a verdict, returns a fake
value, ...; see ``tasks.rewards.harness.SUSPECTED``), and ``score/suspected_hacks/total`` those with
any: present whenever the step graded a reward that reports them (0 when no response tried);
``score/right_by_chance`` likewise counts the chain grader's right answers reached through a wrong step.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from tasks.rewards.config import RewardConfig, ScoreConfig
from tasks.rewards.record import row_info
from tasks.rewards.registry import GraderError, compute_reward, overlong_penalty
from tasks.stores import fence
from tasks.stores.records import read_table

FIRST_ATTEMPT_KINDS = ("rollout", "base")
"""Rows that are the policy's own first attempts: the ``rollout/*`` metrics describe these only."""


def score_rows(trajs: pl.DataFrame, reward_cfg: RewardConfig, cfg: ScoreConfig, max_response_tokens: int,
               sandbox=None, executions: pl.DataFrame | None = None) -> tuple[pl.DataFrame, dict[str, float]]:
    """Grade every trajectory; returns the scores table and ``score/*`` metrics. With the step's ``executions``
    table each grader also gets the trajectory's record (``tasks.rewards.record.row_info``: its prompt's
    ``extra_info``, structured turns and executions), which the chain grader needs."""
    rows, errors, infra, hacks = [], 0, 0, {}
    runs = _runs_by_traj(executions)
    for t in trajs.iter_rows(named=True):
        base = {"run_id": t["run_id"], "step": t["step"], "traj_id": t["traj_id"]}
        if t.get("fixed_reward") is not None:
            rows.append({**base, "score": t["fixed_reward"], "correct": None, "overlong_penalty": 0.0,
                         "reward": t["fixed_reward"], "graded": True, "reward_metrics": '{"fixed": true}'})
            continue
        try:
            info = row_info(t, runs.get(t["traj_id"], [])) if runs is not None else None
            res = compute_reward(t["data_source"], t["response_text"], t["ground_truth"], info,
                                 sandbox=sandbox, cfg=reward_cfg)
        except GraderError as err:
            errors += 1
            infra += err.infra
            rows.append({**base, "score": None, "correct": None, "overlong_penalty": 0.0, "reward": None,
                         "graded": False, "reward_metrics": json.dumps({"grader_error": 1.0, "infra": float(err.infra)})})
            continue
        pen = 0.0
        if cfg.overlong_buffer:
            pen = overlong_penalty(len(t["response_ids"]), max_response_tokens, cfg.overlong_buffer,
                                   cfg.overlong_penalty_factor)
        rows.append({**base, "score": res.reward, "correct": res.correct, "overlong_penalty": pen,
                     "reward": res.reward + pen, "graded": True, "reward_metrics": json.dumps(res.metrics)})
        _count_hacks(res.metrics, hacks)
    df = pl.DataFrame(rows, schema={"run_id": pl.String, "step": pl.Int64, "traj_id": pl.String,
                                    "score": pl.Float64, "correct": pl.Boolean, "overlong_penalty": pl.Float64,
                                    "reward": pl.Float64, "graded": pl.Boolean, "reward_metrics": pl.String})
    joined = trajs.join(df, on=["run_id", "step", "traj_id"])
    if "kind" in joined.columns:
        joined = joined.filter(pl.col("kind").is_in(list(FIRST_ATTEMPT_KINDS)))
    graded = joined.filter(pl.col("graded"))
    metrics = {"score/grader_errors": errors, "score/grader_errors_infra": infra, "rollout/reward_mean": _mean(graded["reward"]),
               "rollout/accuracy": _mean(graded["correct"].cast(pl.Float64)),
               "rollout/response_tokens_mean": _mean(joined["response_ids"].list.len()),
               "rollout/turns_mean": _mean(joined["num_turns"])}
    for raw, name in ((True, "raw"), (False, "saar")):
        part = graded.filter(pl.col("raw") == raw)
        if part.height:
            metrics[f"rollout/accuracy_{name}"] = _mean(part["correct"].cast(pl.Float64))
    metrics.update({f"score/{key}": float(n) for key, n in sorted(hacks.items())})
    return df, metrics


def _runs_by_traj(executions: pl.DataFrame | None) -> dict[str, list[dict]] | None:
    if executions is None:
        return None
    out: dict[str, list[dict]] = {}
    for e in executions.sort("traj_id", "exec_idx").iter_rows(named=True):
        out.setdefault(e["traj_id"], []).append(e)
    return out


def _count_hacks(reward_metrics: dict[str, float], counts: dict[str, int]) -> None:
    """Add one response's ``suspected_hacks/<kind>`` test counts to per-kind response counts, and its
    ``right_by_chance`` (the chain grader's) to theirs."""
    if "right_by_chance" in reward_metrics:
        counts["right_by_chance"] = counts.get("right_by_chance", 0) + (reward_metrics["right_by_chance"] > 0)
    kinds = [k for k in reward_metrics if k.startswith("suspected_hacks/")]
    if not kinds:
        return
    for key in [*kinds, "suspected_hacks/total"]:
        counts.setdefault(key, 0)
    for key in kinds:
        counts[key] += reward_metrics[key] > 0
    counts["suspected_hacks/total"] += any(reward_metrics[k] > 0 for k in kinds)


def _mean(s: pl.Series) -> float:
    return float(s.mean()) if s.len() else 0.0


def score_step(step_dir: Path, reward_cfg: RewardConfig, cfg: ScoreConfig, max_response_tokens: int,
               sandbox=None) -> dict[str, float]:
    df, metrics = score_rows(read_table(step_dir, "trajectories"), reward_cfg, cfg, max_response_tokens, sandbox,
                             read_table(step_dir, "executions"))
    fence.publish(Path(step_dir) / "scores.parquet", df.write_parquet)
    return metrics
