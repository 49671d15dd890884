"""Environment rollouts as the step tables every later stage reads, plus the ``env_steps`` table.

``env_frames`` turns finished ``EnvTrajectory`` objects into::

    trajectories   one row per episode, the tool rollout's columns (SAAR counters 0, data_source = the
                   environment, ground_truth = the start seed, prompt_id = group_id = "<env>:<seed>")
                   plus env_score, env_success, env_penalty, env_actions
    turns          the conversation (system, user, assistant, user, …)
    executions, saar_events   empty (environments run no code)
    env_steps      one row per assistant turn: state shown, response, thought, parsed / executed / invalid
                   actions, reward, penalty, done, effective, actions left

``env_scores`` is the score stage of environment runs: the episode score (game rewards + format
penalties) is the reward, success is ``correct``; nothing is re-graded from text.
"""

from __future__ import annotations

import json

import polars as pl

ENV_STEPS = {
    "run_id": pl.String, "step": pl.Int64, "traj_id": pl.String, "turn_idx": pl.Int64, "env": pl.String,
    "seed": pl.Int64, "state": pl.String, "response": pl.String, "think": pl.String, "parsed": pl.Boolean,
    "actions": pl.String, "executed": pl.String, "invalid": pl.String, "reward": pl.Float64,
    "penalty": pl.Float64, "done": pl.Boolean, "effective": pl.Boolean, "actions_left": pl.Int64,
}


def env_frames(trajs, run_id: str, step: int, decode, traj_row_extra: dict | None = None) -> dict[str, pl.DataFrame]:
    """The step tables of an environment rollout (see module docstring).

    ``traj_row_extra``: constant columns every trajectory row gets (the tool rollout's counters, as 0).
    """
    key = {"run_id": run_id, "step": step}
    rows, turns, steps = [], [], []
    for t in trajs:
        ep = t.episode
        msgs = t.messages
        rows.append({
            **key, "traj_id": t.traj_id, "prompt_id": t.group, "sample_idx": t.sample_idx,
            "raw": False, "data_source": ep.env.name, "ground_truth": str(ep.seed), "prompt_ids": t.prompt_ids,
            "response_ids": t.response_ids, "response_mask": t.response_mask, "rollout_logprobs": t.logprobs,
            "response_text": decode(t.response_ids), "messages": json.dumps(msgs, ensure_ascii=False),
            "finish_reason": t.finish_reason, "num_turns": len(ep.turns), **(traj_row_extra or {}),
            "env_score": ep.score, "env_success": ep.success, "env_penalty": ep.penalty,
            "env_actions": ep.actions_used,
        })
        turns += [{**key, "traj_id": t.traj_id, "turn_idx": i, "role": m["role"], "content": m["content"]}
                  for i, m in enumerate(msgs)]
        for i, r in enumerate(ep.turns):
            steps.append({**key, "traj_id": t.traj_id, "turn_idx": i, "env": ep.env.name, "seed": ep.seed,
                          "state": r.state, "response": r.response, "think": r.parsed.think,
                          "parsed": r.parsed.matched, "actions": json.dumps(r.parsed.actions),
                          "executed": json.dumps(r.executed), "invalid": json.dumps(r.invalid), "reward": r.reward,
                          "penalty": r.penalty, "done": r.done, "effective": r.effective,
                          "actions_left": r.actions_left})
    ids = {"prompt_ids": pl.List(pl.Int32), "response_ids": pl.List(pl.Int32), "response_mask": pl.List(pl.Int8),
           "rollout_logprobs": pl.List(pl.Float32)}
    return {
        "trajectories": pl.DataFrame(rows, schema_overrides=ids),
        "turns": pl.DataFrame(turns, schema={"run_id": pl.String, "step": pl.Int64, "traj_id": pl.String,
                                             "turn_idx": pl.Int64, "role": pl.String, "content": pl.String}),
        "env_steps": pl.DataFrame(steps, schema=ENV_STEPS),
    }


def env_scores(trajs: pl.DataFrame) -> tuple[pl.DataFrame, dict[str, float]]:
    """Scores table of an environment step (reward = episode score) and ``rollout/*`` metrics."""
    df = trajs.select(
        "run_id", "step", "traj_id", pl.col("env_score").alias("score"), pl.col("env_success").alias("correct"),
        pl.lit(0.0).alias("overlong_penalty"), pl.col("env_score").alias("reward"), pl.lit(True).alias("graded"),
        pl.struct(success="env_success", penalty="env_penalty", actions="env_actions")
        .map_elements(json.dumps, return_dtype=pl.String).alias("reward_metrics"),
    )
    n = trajs.height or 1
    metrics = {
        "rollout/reward_mean": float(trajs["env_score"].sum()) / n,
        "rollout/accuracy": float(trajs["env_success"].cast(pl.Float64).sum()) / n,
        "rollout/response_tokens_mean": float(trajs["response_mask"].list.sum().sum()) / n,
        "rollout/turns_mean": float(trajs["num_turns"].sum()) / n,
        "rollout/format_penalty_mean": float(trajs["env_penalty"].sum()) / n,
    }
    return df, metrics
