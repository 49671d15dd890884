"""The turn-budget gate: does a policy still answer when its turn budget leaves one call and one answer?

Issue 32's costly-failure regime trains and evaluates with ``rollout.max_turns=2``: turn 1 calls the tool,
turn 2 must answer. The regime only means something if the warm policy answers in turn 2 when its first
call worked; a policy that always calls again would end every trajectory at the turn cap with no answer.
``turn_gate`` rolls the policy out on held-out prompts it is never evaluated on (``skip`` prompts after the
start of the held-out file: the compare's evaluations use the first ``eval.final_prompts``) with SAAR off
and on, grades them, and measures per mode:

* ``answered``: share of trajectories that end with a turn of their own that makes no call (``stop``);
* ``answered_turn2``: share that answer in turn 2 exactly (one call, then the answer);
* ``answered_after_ok_call``: among trajectories whose first call ran cleanly (``ok_first_call``), the share
  answered in turn 2;
* ``turn_cap``: share cut by the turn budget (a second call where the answer had to be);
* ``pass@1`` and the first-call failure rate.

The gate passes when ``answered_after_ok_call`` ≥ ``threshold`` with SAAR off. Run it with
``python -m flows.turn_gate --config configs/tiny.yaml --set rollout.max_turns=2``.
"""

from __future__ import annotations

import polars as pl

from tasks.data.loader import load_prompts
from tasks.training.evaluation import evaluate_mode
from tasks.training.setups import EvalSetup


def gate_metrics(trajs: pl.DataFrame, execs: pl.DataFrame) -> dict[str, float]:
    """The gate's shares over a mode's scored trajectories table (``traj_id``, ``num_turns``, ``finish_reason``,
    ``tool_calls``, ``graded``, ``correct``) and its executions (``traj_id``, ``exec_idx``, ``ok``): a trajectory's
    first call is its first execution."""
    n = trajs.height
    if n == 0:
        raise ValueError("turn gate: no trajectories were rolled out (empty held-out slice?)")
    stop = pl.col("finish_reason") == "stop"
    first_ok = execs.sort("exec_idx").group_by("traj_id").agg(pl.col("ok").first()).filter(pl.col("ok"))
    ok_first = trajs.filter(pl.col("traj_id").is_in(first_ok["traj_id"].to_list()))
    return {
        "trajectories": float(n),
        "answered": trajs.filter(stop).height / n,
        "answered_turn2": trajs.filter(stop & (pl.col("num_turns") == 2)).height / n,
        "answered_after_ok_call": (ok_first.filter(stop & (pl.col("num_turns") == 2)).height / ok_first.height
                                   if ok_first.height else 0.0),
        "ok_first_call": ok_first.height / n,
        "turn_cap": trajs.filter(pl.col("finish_reason") == "turn_cap").height / n,
        "no_call": trajs.filter(pl.col("tool_calls") == 0).height / n,
        "pass@1": _pass_at_1(trajs),
        "ungraded": float(trajs.filter(~pl.col("graded")).height),
    }


def _pass_at_1(trajs: pl.DataFrame) -> float:
    """Share correct among graded trajectories (a grader failure is never counted as a wrong answer)."""
    graded = trajs.filter(pl.col("graded"))
    if graded.height == 0:
        raise ValueError(f"turn gate: none of {trajs.height} trajectories was graded (grader failures)")
    return float(graded["correct"].cast(pl.Float64).mean())


def turn_gate(ckpt: str, setup: EvalSetup, skip: int, n_prompts: int,
              modes: tuple[str, ...] = ("saar_off", "saar_on")) -> dict[str, dict[str, float]]:
    """Gate metrics per mode on held-out prompts ``skip .. skip + n_prompts`` × ``setup.eval.samples``."""
    items = list(load_prompts(setup.eval_path))[skip: skip + n_prompts]
    if len(items) < n_prompts:
        raise ValueError(f"turn gate: {setup.eval_path} holds {len(items) + skip} prompts, the gate asked for "
                         f"{skip + n_prompts} (skip {skip} + {n_prompts})")
    out = {}
    for mode in modes:
        metrics, tables = evaluate_mode(ckpt, items, setup, mode)
        out[mode] = {**gate_metrics(tables["trajectories"], tables["executions"]),
                     "first_attempt_failure_rate": metrics["tools/first_attempt_failure_rate"]}
    return out
