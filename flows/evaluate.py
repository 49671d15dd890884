"""Prefect flow ``evaluate``: a policy on held-out prompts, SAAR off and on, into MLflow and DuckDB.

Each call is one MLflow run in the ``<name>-eval`` experiment (tagged with the checkpoint), with the
held-out set as a dataset input, the trajectories as traces, and rows in DuckDB's ``evaluations``
table. The policy is a checkpoint folder or a logged model (``models:/<name>@best``,
``models:/<name>/latest``, ``models:/m-…``): then the metrics are linked to that logged model too, so
its page lists every evaluation of it. Training runs evaluate themselves every ``train.eval_every``
steps with the same stage.

A LoRA adapter (``model.base`` set) is evaluated on that base: a copy pointing at it is made under
``<output_dir>/eval-policies/``, and the base is converted first when missing.

Run: ``cleaner eval --config configs/tiny.yaml [--checkpoint DIR | --model models:/tiny@best]``.
"""

from __future__ import annotations

import time
from pathlib import Path

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from flows.config import RunConfig, load_config
from flows.prepare import start_policy
from flows.train_log import eval_line
from models.termination import arm
from tasks.data.loader import ensure_files
from tasks.stores import links, registry, tracking
from tasks.stores.registry import ModelRef
from tasks.stores.system import system_metrics
from tasks.training import live


@task(name="evaluate-policy", cache_policy=NO_CACHE)
def evaluate_task(cfg: RunConfig, run_id: str, ckpt: str, mlrun: str, model: ModelRef | None) -> dict:
    from tasks.training import stages

    return stages.eval_stage(run_id, 0, ckpt, mlrun, cfg.setups().eval, model, {"arm": "evaluate"})


def resolve_policy(cfg: RunConfig, checkpoint: str | None) -> tuple[str, ModelRef | None]:
    """A checkpoint folder (default ``model.path``) or a ``models:/`` URI → local folder and logged model."""
    if checkpoint and checkpoint.startswith("models:/"):
        folder, model_id = registry.resolve(cfg.tracking, checkpoint, Path(cfg.output_dir) / "models")
        return str(folder), ModelRef(model_id=model_id)
    ckpt = checkpoint or cfg.model.path
    if not Path(ckpt).exists():
        raise FileNotFoundError(f"checkpoint {ckpt} does not exist")
    return ckpt, None


@flow(name="evaluate", log_prints=True, on_running=[arm])
def evaluate_flow(config_path: str = "configs/tiny.yaml", overrides: list[str] | None = None,
                  checkpoint: str | None = None, run_id: str | None = None) -> dict:
    """Evaluate ``checkpoint`` (a folder or a ``models:/`` URI; default ``model.path``); returns
    ``eval/<mode>/<metric>``."""
    from prefect.runtime import flow_run

    cfg = load_config(config_path, overrides)
    ckpt, model = resolve_policy(cfg, checkpoint)
    ensure_files(cfg.data)
    run_id = run_id or f"eval-{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    ckpt = start_policy(cfg, str(ckpt), Path(cfg.output_dir) / "eval-policies" / run_id)
    experiment = (cfg.tracking.experiment or cfg.name) + "-eval"
    tags = {"cleaner.kind": "evaluate", "cleaner.checkpoint": str(checkpoint or ckpt)}
    mlrun = tracking.open_run(cfg.tracking, experiment, run_id, cfg.model_dump(mode="json"),
                              {**tags, **({"cleaner.model_id": model.model_id} if model else {})})
    flow_run_id = str(flow_run.get_id() or "")
    text = (f"**Evaluation `{run_id}`** of `{checkpoint or ckpt}` on {cfg.eval.n_prompts} held-out prompts × "
            f"{cfg.eval.samples} samples, modes {', '.join(cfg.eval.modes)}.")
    links.annotate_run(cfg.tracking, mlrun, {"evaluation": cfg.data.eval_path}, text, flow_run_id)
    try:
        with system_metrics(cfg.tracking, mlrun):
            metrics = evaluate_task(cfg, run_id, str(ckpt), mlrun, model)
    finally:
        live.close_live()
    tracking.finish_run(cfg.tracking, mlrun)
    print(eval_line(0, metrics, policy=str(checkpoint or ckpt)))
    return metrics
