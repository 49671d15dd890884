"""A look before Part C's runs: what a larger turn budget does to the warm chain policy, no training.

``python -m flows.budget_look --config configs/regimes/multicall.yaml [--extra 0 2] [--prompts 256] [--samples 4]
[--out FILE]`` rolls the config's policy (``model.path``, default ``assets/tiny-chain-warm``) out on the fresh split's
first ``--prompts`` chains × ``--samples``, SAAR off and on in one paired pass (raw share 0, as every evaluation), once
per budget: each prompt's own turn budget (``extra_info.max_turns`` = calls + 1) plus each ``--extra`` as
``rollout.extra_turns`` (0: calls + 1, 2: calls + 3; ``tasks.rollout.machine.turn_budget``). Per budget and mode it prints
pass@1, first-call success (per trajectory), the share cut at the cap and P(correct | every call clean), each with its
95 % interval over prompts (``tasks.training.eval_measures``), and with ``--out`` writes them as JSON.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import polars as pl

from flows.chain_gate import emit
from flows.config import load_config
from tasks.data.loader import ensure_files, load_prompts
from tasks.training.eval_measures import per_trajectory, prompt_shares
from tasks.training.evaluation import evaluate

MEASURES = ("pass@1", "first_call_success", "turn_cap_share", "p_correct_all_clean")


def look(config: str, overrides: list[str], extras: list[int], prompts: int, samples: int) -> dict:
    """Per budget (``calls+<1 + extra>``) and mode: the four shares with their intervals over prompts."""
    cfg = load_config(config, overrides)
    ensure_files(cfg.data)
    if not cfg.data.fresh_path:
        raise ValueError(f"{config}: data.fresh_path is not set (this look reads the fresh split)")
    base = cfg.setups().eval
    setup = base.model_copy(update={"eval": base.eval.model_copy(update={"samples": samples, "n_prompts": prompts,
                                                                          "modes": ["saar_off", "saar_on"]})})
    items = list(load_prompts(cfg.data.fresh_path))[:prompts]
    out: dict = {"model": cfg.model.path, "fresh_path": cfg.data.fresh_path, "prompts": len(items),
                 "samples": samples, "budgets": {}}
    rollouts = {extra: type(setup.rollout).model_validate(setup.rollout.model_dump() | {"extra_turns": extra})
                for extra in extras}  # validated: a negative --extra is an error naming rollout.extra_turns
    for extra in extras:
        t0, tables = time.time(), {}
        budget = setup.model_copy(update={"rollout": rollouts[extra]})
        evaluate(cfg.model.path, items, budget, on_mode=tables.__setitem__)
        out["budgets"][f"calls+{1 + extra}"] = {
            mode: {**prompt_shares(per_trajectory(t["trajectories"], t["executions"])),
                   **lengths(t["trajectories"], setup.rollout.max_response_tokens)}
            for mode, t in tables.items()} | {"wall_s": round(time.time() - t0, 1)}
    return out


def lengths(trajs: pl.DataFrame, budget: int) -> dict:
    """Response lengths (policy and tool tokens) against ``rollout.max_response_tokens``: their 90th percentile and
    maximum, the share of trajectories that reached the budget (cut there), and the longest prompt + response (the
    positions the model must hold)."""
    n = trajs["response_ids"].list.len()
    return {"response_tokens_p90": float(n.quantile(0.9) or 0), "response_tokens_max": int(n.max() or 0),
            "at_response_budget": float((n >= budget).mean() or 0.0),
            "positions_max": int((trajs["prompt_ids"].list.len() + n).max() or 0)}


def _cell(m: dict) -> str:
    if m["share"] is None:
        return "-"
    lo, hi = m["ci95"] or (float("nan"), float("nan"))
    return f"{m['share']:.3f} [{lo:.3f}, {hi:.3f}]"


def table(report: dict) -> str:
    """The shares as a Markdown table, one row per budget and mode."""
    lines = [f"{report['model']} on {report['fresh_path']} ({report['prompts']} prompts × {report['samples']}), "
             "95 % intervals over prompts:", "",
             "| budget | mode | " + " | ".join(MEASURES) + " | response tokens p90 / max | at the token budget | "
             "prompt + response max |", "| --- | --- | " + " | ".join("---" for _ in MEASURES) + " | --- | --- | --- |"]
    for budget, modes in report["budgets"].items():
        for mode in ("saar_off", "saar_on"):
            m = modes[mode]
            lines.append(f"| {budget} | {mode} | " + " | ".join(_cell(m[k]) for k in MEASURES)
                         + f" | {m['response_tokens_p90']:.0f} / {m['response_tokens_max']} | "
                         f"{m['at_response_budget']:.3f} | {m['positions_max']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/regimes/multicall.yaml")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--extra", type=int, nargs="+", default=[0, 2], help="turns added to calls + 1")
    parser.add_argument("--prompts", type=int, default=256)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    report = look(args.config, args.overrides, args.extra, args.prompts, args.samples)
    return emit(report, args.out, table(report))


if __name__ == "__main__":
    from models.termination import install

    install()
    main()
    sys.exit(0)
