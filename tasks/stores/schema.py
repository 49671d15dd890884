"""The DuckDB store's tables (DDL) and the units rows are written in: pydantic-free constants, no I/O.

Schema (primary keys in brackets)::

    runs            [run_id]                                  name, config, MLflow run id, status
    steps           [run_id, step]                            checkpoint, policy version, seconds
    trajectories    [run_id, step, traj_id]                   ids, mask (and loss_mask), reward, advantage, dropped, SAAR stats, kind
    r3l_reflections [run_id, step, traj_id]                   R3L: report, validity, pivot, retry reward, replays
    turns           [run_id, step, traj_id, turn_idx]         final (purified) conversation
    tool_executions [run_id, step, traj_id, exec_idx]         every execution, failed attempts included
    saar_events     [run_id, step, traj_id, event_idx]        triggered / shallow / deep / replace / append / recovered / ... (is_log_ratio)
    metrics         [run_id, step, key]                       every logged metric
    env_steps       [run_id, step, traj_id, turn_idx]         environment mode: state, answer, actions, reward
    partial_buffer  [run_id, step, traj_id]                   partial rollouts: what step carried to the next
    evaluations     [run_id, policy_version, key]             held-out evaluation of a policy version

A run writes its rows in **units**, each replaced whole: the run's ``runs`` row, one step's rows of every step
table, one policy version's evaluation rows (``UNITS``; see ``tasks.stores.rowlog``).
"""

from __future__ import annotations

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id VARCHAR PRIMARY KEY, name VARCHAR, config JSON, mlflow_run_id VARCHAR,
    status VARCHAR, created_at TIMESTAMP DEFAULT current_timestamp);
CREATE TABLE IF NOT EXISTS steps (
    run_id VARCHAR, step BIGINT, checkpoint VARCHAR, policy_version VARCHAR, seconds DOUBLE,
    logged_at TIMESTAMP DEFAULT current_timestamp, PRIMARY KEY (run_id, step));
CREATE TABLE IF NOT EXISTS trajectories (
    run_id VARCHAR, step BIGINT, traj_id VARCHAR, prompt_id VARCHAR, sample_idx BIGINT, raw BOOLEAN,
    data_source VARCHAR, ground_truth VARCHAR, prompt_ids INTEGER[], response_ids INTEGER[],
    response_mask TINYINT[], rollout_logprobs FLOAT[], response_text VARCHAR, messages JSON,
    finish_reason VARCHAR, num_turns BIGINT, tool_calls BIGINT, tool_success BIGINT,
    first_attempt_total BIGINT, first_attempt_success BIGINT, rollbacks_triggered BIGINT,
    rollbacks_recovered BIGINT, rollbacks_failed BIGINT, shallow BIGINT, deep BIGINT, tool_rounds BIGINT,
    errors_kept BIGINT, retry_loops BIGINT,
    failure_reasons JSON, score DOUBLE, correct BOOLEAN, overlong_penalty DOUBLE, reward DOUBLE,
    graded BOOLEAN, reward_metrics JSON, kept BOOLEAN, advantage DOUBLE,
    kind VARCHAR, group_id VARCHAR, fixed_reward DOUBLE, masked_turns BIGINT, parent VARCHAR, adv_scale DOUBLE,
    env_score DOUBLE, env_success BOOLEAN, env_penalty DOUBLE, env_actions BIGINT, dropped BOOLEAN,
    start_step BIGINT, token_versions INTEGER[], PRIMARY KEY (run_id, step, traj_id));
ALTER TABLE trajectories ADD COLUMN IF NOT EXISTS adv_scale DOUBLE;
ALTER TABLE trajectories ADD COLUMN IF NOT EXISTS env_score DOUBLE;
ALTER TABLE trajectories ADD COLUMN IF NOT EXISTS env_success BOOLEAN;
ALTER TABLE trajectories ADD COLUMN IF NOT EXISTS env_penalty DOUBLE;
ALTER TABLE trajectories ADD COLUMN IF NOT EXISTS env_actions BIGINT;
ALTER TABLE trajectories ADD COLUMN IF NOT EXISTS dropped BOOLEAN;
ALTER TABLE trajectories ADD COLUMN IF NOT EXISTS start_step BIGINT;
ALTER TABLE trajectories ADD COLUMN IF NOT EXISTS token_versions INTEGER[];
ALTER TABLE trajectories ADD COLUMN IF NOT EXISTS spliced TINYINT[];
ALTER TABLE trajectories ADD COLUMN IF NOT EXISTS sampled_tokens BIGINT;
ALTER TABLE trajectories ADD COLUMN IF NOT EXISTS sandbox_calls BIGINT;
ALTER TABLE trajectories ADD COLUMN IF NOT EXISTS loss_mask TINYINT[];
ALTER TABLE trajectories ADD COLUMN IF NOT EXISTS extra_info JSON;
CREATE TABLE IF NOT EXISTS env_steps (
    run_id VARCHAR, step BIGINT, traj_id VARCHAR, turn_idx BIGINT, env VARCHAR, seed BIGINT, state VARCHAR,
    response VARCHAR, think VARCHAR, parsed BOOLEAN, actions JSON, executed JSON, invalid JSON, reward DOUBLE,
    penalty DOUBLE, done BOOLEAN, effective BOOLEAN, actions_left BIGINT,
    PRIMARY KEY (run_id, step, traj_id, turn_idx));
CREATE TABLE IF NOT EXISTS turns (
    run_id VARCHAR, step BIGINT, traj_id VARCHAR, turn_idx BIGINT, role VARCHAR, content VARCHAR,
    PRIMARY KEY (run_id, step, traj_id, turn_idx));
CREATE TABLE IF NOT EXISTS tool_executions (
    run_id VARCHAR, step BIGINT, traj_id VARCHAR, exec_idx BIGINT, position BIGINT, attempt BIGINT,
    code VARCHAR, ok BOOLEAN, error_kind VARCHAR, exit_code BIGINT, timed_out BOOLEAN,
    memory_exceeded BOOLEAN, duration_s DOUBLE, stdout VARCHAR, stderr VARCHAR,
    PRIMARY KEY (run_id, step, traj_id, exec_idx));
CREATE TABLE IF NOT EXISTS saar_events (
    run_id VARCHAR, step BIGINT, traj_id VARCHAR, event_idx BIGINT, position BIGINT, attempt BIGINT,
    kind VARCHAR, similarity DOUBLE, error_kind VARCHAR, error_text VARCHAR, failed_turn VARCHAR,
    new_turn VARCHAR, PRIMARY KEY (run_id, step, traj_id, event_idx));
CREATE TABLE IF NOT EXISTS r3l_reflections (
    run_id VARCHAR, step BIGINT, traj_id VARCHAR, prompt_id VARCHAR, sample_idx BIGINT, base_reward DOUBLE,
    base_steps BIGINT, reflection_text VARCHAR, reflection_tokens BIGINT, finish_reason VARCHAR, report JSON,
    valid BOOLEAN, perfect BOOLEAN, reason VARCHAR, retry_from_step BIGINT, retry_traj_id VARCHAR,
    distill_traj_id VARCHAR, retry_reward DOUBLE, retry_steps BIGINT, retry_succeeded BOOLEAN, replays JSON,
    replay_changed BIGINT, note VARCHAR, retry_messages JSON, PRIMARY KEY (run_id, step, traj_id));
CREATE TABLE IF NOT EXISTS partial_buffer (
    run_id VARCHAR, step BIGINT, position BIGINT, prompt_id VARCHAR, sample_idx BIGINT, traj_id VARCHAR,
    start_step BIGINT, state VARCHAR, finish_reason VARCHAR, prompt_ids INTEGER[], response_ids INTEGER[],
    response_mask TINYINT[], logprobs DOUBLE[], token_versions INTEGER[], carry_ids INTEGER[], carry_logprobs DOUBLE[],
    carry_versions INTEGER[], max_version BIGINT, record JSON, PRIMARY KEY (run_id, step, traj_id));
CREATE TABLE IF NOT EXISTS metrics (
    run_id VARCHAR, step BIGINT, key VARCHAR, value DOUBLE, PRIMARY KEY (run_id, step, key));
ALTER TABLE trajectories ADD COLUMN IF NOT EXISTS kind VARCHAR;
ALTER TABLE trajectories ADD COLUMN IF NOT EXISTS group_id VARCHAR;
ALTER TABLE trajectories ADD COLUMN IF NOT EXISTS fixed_reward DOUBLE;
ALTER TABLE trajectories ADD COLUMN IF NOT EXISTS masked_turns BIGINT;
ALTER TABLE trajectories ADD COLUMN IF NOT EXISTS parent VARCHAR;
ALTER TABLE trajectories ADD COLUMN IF NOT EXISTS planb_append BIGINT;
ALTER TABLE trajectories ADD COLUMN IF NOT EXISTS planb_replace BIGINT;
ALTER TABLE saar_events ADD COLUMN IF NOT EXISTS is_log_ratio DOUBLE;
CREATE TABLE IF NOT EXISTS evaluations (
    run_id VARCHAR, policy_version BIGINT, checkpoint VARCHAR, key VARCHAR, value DOUBLE,
    PRIMARY KEY (run_id, policy_version, key));
"""

STEP_TABLES = ("trajectories", "turns", "tool_executions", "saar_events", "r3l_reflections", "env_steps", "metrics",
               "steps", "partial_buffer")

UNITS: dict[str, tuple[tuple[str, ...], str | None]] = {
    "run": (("runs",), None),
    "step": (STEP_TABLES, "step"),
    "eval": (("evaluations",), "policy_version"),
}
"""Unit kind → (its tables, the key column besides ``run_id`` that selects its rows; None: the whole run)."""
