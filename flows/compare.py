"""Prefect flow ``compare``: CLEANER vs the DAPO baseline vs SAAR-everywhere, over several seeds.

Every arm trains every seed on the same data order (a child ``train`` flow run and a child
MLflow run under one parent run), evaluating the policy with SAAR **off** every
``compare.eval_every`` steps. The report (JSON, PNG, Markdown) goes to the parent run's
``report/`` artifacts and to ``<output_dir>/<compare id>/report/``.

Run: ``cleaner compare --config configs/tiny.yaml``; ``--set 'compare.add_arms=[r3l]'`` adds R3L as an arm
(``flows.config.ARM_PRESETS``; docs/methods.md).
"""

from __future__ import annotations

import time
from pathlib import Path

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from flows.config import load_config
from flows.train import train
from tasks.reports.compare import summarize, write_report
from tasks.stores import db, links, tracking


def arm_overrides(shared: list[str], arm: list[str], steps: int, every: int) -> list[str]:
    return [*shared, *arm, f"train.steps={steps}", f"train.eval_every={every}", "eval.modes=[saar_off]"]


@task(name="compare-report", cache_policy=NO_CACHE)
def report_task(duckdb_path: str, runs: dict[str, list[str]], baseline: str, treatment: str, folder: str,
                keys: tuple[str, str] | None = None) -> dict:
    ids = ", ".join(f"'{r}'" for ids in runs.values() for r in ids)
    evals = db.query(duckdb_path, f"SELECT run_id, policy_version, key, value FROM evaluations WHERE run_id IN ({ids})")
    kinds = db.query(duckdb_path, f"""
        SELECT run_id, CASE WHEN coalesce(kind, 'rollout') NOT IN ('rollout', 'base') THEN 'R3L ' || kind
                            WHEN errors_kept > 0 THEN 'errors kept' WHEN rollbacks_recovered > 0 THEN 'purified'
                            ELSE 'clean first try' END AS kind, count(*) AS n, avg(reward) AS reward,
               avg(advantage) AS advantage
        FROM trajectories WHERE kept AND run_id IN ({ids}) GROUP BY ALL""")
    summary = summarize(evals, runs, baseline, treatment, kinds, *(keys or ()))
    write_report(summary, Path(folder))
    return summary


@flow(name="compare", log_prints=True)
def compare_flow(config_path: str = "configs/tiny.yaml", overrides: list[str] | None = None,
                 compare_id: str | None = None) -> dict:
    """Train every arm × seed, evaluate with SAAR off, and write the comparison report."""
    cfg = load_config(config_path, overrides)
    cmp = cfg.compare
    compare_id = compare_id or f"compare-{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    arm_sets = {arm: [*(overrides or []), *arm_overrides(cmp.shared, arm_set, cmp.steps, cmp.eval_every),
                      f"tracking.arm={arm}"] for arm, arm_set in cmp.arms.items()}
    for arm_set in arm_sets.values():
        load_config(config_path, arm_set)  # a bad arm or shared override fails now, not after hours of training
    parent = tracking.open_run(cfg.tracking, cfg.tracking.experiment or cfg.name, compare_id,
                               cfg.model_dump(mode="json"), {"cleaner.kind": "compare"})
    links.set_description(cfg.tracking, parent, links.describe_compare(compare_id, cfg.name, None, cmp.seeds,
                                                                       list(cmp.arms)))
    runs: dict[str, list[str]] = {arm: [] for arm in cmp.arms}
    for seed in cmp.seeds:
        for arm, arm_set in arm_sets.items():
            run_id = f"{compare_id}-{arm}-s{seed}"
            train(config_path, [*arm_set, f"seed={seed}"], run_id, parent)
            runs[arm].append(run_id)
    folder = Path(cfg.output_dir) / compare_id / "report"
    keys = None
    if cfg.env is not None:
        played = cfg.env.eval_name or cfg.env.name
        keys = (f"eval/{played}/success", f"eval/{played}/valid_action_rate")
    summary = report_task(cfg.tracking.duckdb_path, runs, cmp.baseline, cmp.treatment, str(folder), keys)
    for f in sorted(folder.iterdir()):
        tracking.log_file(cfg.tracking, parent, f, "report")
    links.set_description(cfg.tracking, parent, links.describe_compare(compare_id, cfg.name, summary, cmp.seeds))
    tracking.finish_run(cfg.tracking, parent)
    print((folder / "compare.md").read_text())
    return summary
