"""Helpers for tests that need a finished tiny run (the 2-step ``train`` flow into a folder) or what a flow printed."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def tiny_overrides(work: Path, model_dir: Path, steps: int = 2) -> list[str]:
    """Overrides that keep every file of the run (data, stores, checkpoints) inside ``work``."""
    return [
        f"model.path={model_dir}", f"output_dir={work / 'runs'}",
        f"data.train_path={work / 'train.parquet'}", f"data.eval_path={work / 'eval.parquet'}",
        "data.n_train=64", "data.n_eval=8", "data.prompts_per_step=4", "data.refill_rounds=0", "rollout.n_samples=4", "train.eval_every=0",
        f"train.steps={steps}", f"tracking.mlflow_uri=sqlite:///{work / 'mlflow.db'}",
        f"tracking.artifact_root={work / 'mlartifacts'}", f"tracking.duckdb_path={work / 'cleaner.duckdb'}",
    ]


EVAL_OVERRIDES = ["train.eval_every=2", "eval.n_prompts=8", "eval.samples=2", "tracking.system_metrics_interval_s=1"]
"""Held-out evaluations at policies 0 and 2 of a 2-step run (so it has logged models; a registered one with
``tracking.register_models=true``: a run started from the shell registers none by default)."""


def run_tiny_flow(work: Path, model_dir: Path, run_id: str, extra: list[str] | None = None) -> dict:
    from flows.train import train

    return train("configs/tiny.yaml", [*tiny_overrides(work, model_dir), *(extra or [])], run_id)


@contextmanager
def run_log_lines() -> Iterator[list[str]]:
    """The messages flow and task runs log while the block runs — a ``print`` in a flow or task with ``log_prints``
    among them — read from Prefect's run loggers themselves, whatever handlers the process's logging config has."""
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    loggers = [logging.getLogger(name) for name in ("prefect.flow_runs", "prefect.task_runs")]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield lines
    finally:
        for logger in loggers:
            logger.removeHandler(handler)
