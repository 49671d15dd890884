"""Prefect flow ``evaluate``: a policy on held-out prompts, SAAR off and on, into MLflow and DuckDB.

Each call is one MLflow run in the ``<name>-eval`` experiment (tagged with the checkpoint)
and rows in DuckDB's ``evaluations`` table. Training runs evaluate themselves every
``train.eval_every`` steps with the same stage.

A LoRA adapter (``model.base`` set) is evaluated on that base: a copy pointing at it is made under
``<output_dir>/eval-policies/``, and the base is converted first when missing.

Run: ``cleaner eval --config configs/tiny.yaml [--checkpoint DIR]``.
"""

from __future__ import annotations

import time
from pathlib import Path

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from flows.config import RunConfig, load_config
from flows.train import start_policy
from tasks.data.loader import ensure_files
from tasks.stores import tracking
from tasks.training import live, stages


@task(name="evaluate-policy", cache_policy=NO_CACHE)
def evaluate_task(cfg: RunConfig, run_id: str, ckpt: str, mlrun: str) -> dict:
    return stages.eval_stage(run_id, 0, ckpt, mlrun, cfg.seed, cfg.model.chat, cfg.data, cfg.rollout,
                             cfg.engine, cfg.sandbox, cfg.reward, cfg.eval, cfg.tracking)


@flow(name="evaluate", log_prints=True)
def evaluate_flow(config_path: str = "configs/tiny.yaml", overrides: list[str] | None = None,
                  checkpoint: str | None = None, run_id: str | None = None) -> dict:
    """Evaluate ``checkpoint`` (default ``model.path``); returns ``eval/<mode>/<metric>``."""
    cfg = load_config(config_path, overrides)
    ckpt = checkpoint or cfg.model.path
    if not Path(ckpt).exists():
        raise FileNotFoundError(f"checkpoint {ckpt} does not exist")
    ensure_files(cfg.data, cfg.seed)
    run_id = run_id or f"eval-{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    ckpt = start_policy(cfg, str(ckpt), Path(cfg.output_dir) / "eval-policies" / run_id)
    experiment = (cfg.tracking.experiment or cfg.name) + "-eval"
    mlrun = tracking.open_run(cfg.tracking, experiment, run_id, cfg.model_dump(mode="json"),
                              {"cleaner.kind": "evaluate", "cleaner.checkpoint": str(ckpt)})
    try:
        metrics = evaluate_task(cfg, run_id, str(ckpt), mlrun)
    finally:
        live.close_live()
    tracking.finish_run(cfg.tracking, mlrun)
    return metrics
