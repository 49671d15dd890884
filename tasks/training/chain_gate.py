"""The multi-call regime's gate: does a warm policy walk a chain call by call, carrying each result forward?

Before any RL run of the regime (docs/regimes.md, "The next regime: multi-call"), the warm policy is rolled out
with SAAR off on held-out chains the compare never evaluates (``skip`` prompts after the start of the held-out
file), each with its own turn budget (calls + 1), and graded by the chain grader. Measures, from the
trajectories and their executions (SAAR off: one execution per assistant turn whose call ran; ``position`` is
the turn, from 0):

* ``next_step_after_clean``: among clean calls, the share followed by the next step. The k-th clean call of a
  trajectory has done step k (a failed call does no step; its retry is the same step): while k < calls the next
  turn must make a call (one the budget cuts counts: it was made), after the last step the next turn must answer
  (a turn of its own that makes no call, ``stop``). Its two parts are ``next_call_after_clean`` and
  ``answer_after_last_clean``. A policy that merges steps answers early and counts as not taking the next step;
* ``binds_previous``: among calls made after a clean call that printed an integer (failed ones and retries
  included), the share whose code binds exactly the integer the latest clean call printed to a name
  (``r = 4334``; ``tasks.rewards.chain.bound_values``);
* ``call_failure_rate``: failed calls over all calls;
* ``p_correct_all_clean``: among graded trajectories that made at least one call and whose every call ran
  cleanly, the share correct;
* beside them ``pass@1``, ``turn_cap`` (cut by the budget), ``calls_mean`` and the counts behind each share.

The gate passes when there are ≥ ``min_trajectories`` trajectories and every measure is within its bar
(``ChainGateConfig``). Run it with ``python -m flows.chain_gate --config configs/regimes/multicall.yaml``.
"""

from __future__ import annotations

import polars as pl

from tasks.data.loader import load_prompts
from tasks.rewards.chain import bound_values
from tasks.training.config import ChainGateConfig
from tasks.training.eval_measures import share
from tasks.training.evaluation import evaluate_mode
from tasks.training.setups import EvalSetup


def _int(text: str | None) -> int | None:
    lines = [ln.strip() for ln in (text or "").strip().splitlines() if ln.strip()]
    return int(lines[-1]) if lines and lines[-1].lstrip("-").isdigit() else None


def chain_gate_metrics(trajs: pl.DataFrame, execs: pl.DataFrame, calls: dict[str, int]) -> dict[str, float]:
    """The gate's measures over a SAAR-off mode's scored trajectories (``traj_id``, ``prompt_id``, ``num_turns``,
    ``finish_reason``, ``graded``, ``correct``) and executions (``traj_id``, ``exec_idx``, ``position``, ``code``,
    ``ok``, ``stdout``); ``calls`` maps a prompt id to its chain's number of calls."""
    if trajs.height == 0:
        raise ValueError("chain gate: no trajectories were rolled out (empty held-out slice?)")
    by_traj: dict[str, list[dict]] = {}
    for e in execs.sort("exec_idx").iter_rows(named=True):
        by_traj.setdefault(e["traj_id"], []).append(e)
    nxt, last, binds, clean = [0, 0], [0, 0], [0, 0], [0, 0]
    for t in trajs.iter_rows(named=True):
        run = by_traj.get(t["traj_id"], [])
        need, done, printed = calls[t["prompt_id"]], 0, None
        for e in run:
            p = e["position"]
            if printed is not None:
                binds[0] += printed in bound_values(e["code"] or "")
                binds[1] += 1
            if not e["ok"]:
                continue
            done += 1
            printed = _int(e["stdout"])
            then = t["num_turns"] == p + 2  # the trajectory's last turn is the one right after this call
            if done < need:
                nxt[0] += any(x["position"] == p + 1 for x in run) or (then and t["finish_reason"] == "turn_cap")
                nxt[1] += 1
            else:
                last[0] += then and t["finish_reason"] == "stop"
                last[1] += 1
        if run and all(e["ok"] for e in run) and t["graded"]:
            clean[0] += bool(t["correct"])
            clean[1] += 1
    graded = trajs.filter(pl.col("graded"))
    n_calls = execs.height
    return {
        "trajectories": float(trajs.height),
        "next_step_after_clean": share(nxt[0] + last[0], nxt[1] + last[1]),
        "next_call_after_clean": share(*nxt), "answer_after_last_clean": share(*last),
        "binds_previous": share(*binds),
        "call_failure_rate": share(int((~execs["ok"]).sum()) if n_calls else 0, n_calls),
        "p_correct_all_clean": share(*clean),
        "pass@1": float(graded["correct"].cast(pl.Float64).mean() or 0.0) if graded.height else 0.0,
        "turn_cap": share(trajs.filter(pl.col("finish_reason") == "turn_cap").height, trajs.height),
        "calls_mean": n_calls / trajs.height,
        "n_clean_calls": float(nxt[1] + last[1]), "n_later_calls": float(binds[1]), "n_calls": float(n_calls),
        "n_all_clean": float(clean[1]), "ungraded": float(trajs.height - graded.height),
    }


def verdict(m: dict[str, float], cfg: ChainGateConfig) -> dict[str, bool]:
    """Whether each measure is within its bar (and there are enough trajectories)."""
    lo_f, hi_f = cfg.call_failure
    lo_c, hi_c = cfg.p_correct_clean
    return {"trajectories": m["trajectories"] >= cfg.min_trajectories,
            "next_step_after_clean": m["next_step_after_clean"] >= cfg.next_step,
            "binds_previous": m["binds_previous"] >= cfg.binds,
            "call_failure_rate": lo_f <= m["call_failure_rate"] <= hi_f,
            "p_correct_all_clean": lo_c <= m["p_correct_all_clean"] <= hi_c}


def run_chain_gate(ckpt: str, setup: EvalSetup, cfg: ChainGateConfig) -> dict:
    """Roll ``ckpt`` out (SAAR off) on held-out prompts ``skip .. skip + prompts`` × ``samples``; measures, bars,
    pass/fail."""
    items = list(load_prompts(setup.eval_path))[cfg.skip: cfg.skip + cfg.prompts]
    if len(items) < cfg.prompts:
        raise ValueError(f"chain gate: {setup.eval_path} holds {len(items) + cfg.skip} prompts, the gate asked for "
                         f"{cfg.skip + cfg.prompts} (skip {cfg.skip} + {cfg.prompts})")
    calls = {}
    for item in items:
        if "calls" not in (item.extra_info or {}):
            raise ValueError(f"chain gate: prompt {item.prompt_id} of {setup.eval_path} has no extra_info.calls "
                             "(not a chain task file: set data.family=chain and its paths)")
        calls[item.prompt_id] = int(item.extra_info["calls"])
    sized = setup.model_copy(update={"eval": setup.eval.model_copy(update={"samples": cfg.samples})})
    _, tables = evaluate_mode(ckpt, items, sized, "saar_off")
    measures = chain_gate_metrics(tables["trajectories"], tables["executions"], calls)
    checks = verdict(measures, cfg)
    return {"measures": measures, "checks": checks, "passed": all(checks.values()), "gate": cfg.model_dump(mode="json"),
            "model": str(ckpt), "eval_path": setup.eval_path}
