"""System metrics of a run (CPU, memory, disk, network) and the sandbox's own statistics per step.

* ``system_metrics``: MLflow's ``SystemMetricsMonitor`` on the run while a flow trains or evaluates
  (``system/cpu_utilization_percentage``, ``system/system_memory_usage_megabytes``, ...; their own
  step counter, one sample every ``tracking.system_metrics_interval_s``); a resumed run continues
  the counter. Each sample is written under the run's fence, so a replaced attempt's monitor stops writing.
* ``sandbox_metrics``: from one stage's executions and the pool's counters before and after it —
  ``sandbox/exec_per_s`` (executions per second of the stage), ``sandbox/p50_ms`` and ``sandbox/p99_ms``
  (execution durations), ``sandbox/infra_retries``, ``sandbox/worker_restarts``, ``sandbox/timeouts``.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext

import polars as pl

from tasks.stores import fence
from tasks.stores.config import TrackingConfig

COUNTERS = ("infra_retries", "infra_errors", "worker_restarts", "worker_kills", "timeouts")


def _fenced_monitor(mlrun: str, run_id: str | None, interval_s: float, uri: str):
    """MLflow's monitor whose every sample is written at once under the run's fence (``tasks.stores.fence``): an
    attempt that a newer one replaced writes no sample after the claim, and its monitor stops."""
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

    class FencedMonitor(SystemMetricsMonitor):
        def publish_metrics(self, metrics):
            with fence.guarded_run(run_id) if run_id else nullcontext():
                super().publish_metrics(metrics)
                self.mlflow_logger.flush()

    return FencedMonitor(mlrun, sampling_interval=interval_s, resume_logging=True, tracking_uri=uri)


@contextmanager
def system_metrics(cfg: TrackingConfig, mlrun: str, run_id: str | None = None):
    """Sample system metrics into ``mlrun`` for the duration of the block (off when the interval is 0); fenced by
    our run ``run_id`` when given."""
    if cfg.system_metrics_interval_s <= 0:
        yield
        return
    import logging

    logging.getLogger("mlflow.system_metrics.system_metrics_monitor").setLevel(logging.WARNING)
    monitor = _fenced_monitor(mlrun, run_id, cfg.system_metrics_interval_s, cfg.mlflow_uri)
    monitor.start()
    try:
        yield
    finally:
        monitor.finish()


def sandbox_metrics(executions: pl.DataFrame, before: dict[str, float], after: dict[str, float],
                    wall_s: float) -> dict[str, float]:
    """``sandbox/*`` metrics of one stage (see the module docstring); counters are differences."""
    durations = executions["duration_s"].drop_nulls() if executions.height else pl.Series([], dtype=pl.Float64)
    out = {
        "sandbox/executions": float(executions.height),
        "sandbox/exec_per_s": executions.height / wall_s if wall_s > 0 else 0.0,
        "sandbox/p50_ms": float(durations.quantile(0.5, "nearest") or 0.0) * 1000 if durations.len() else 0.0,
        "sandbox/p99_ms": float(durations.quantile(0.99, "nearest") or 0.0) * 1000 if durations.len() else 0.0,
    }
    for key in COUNTERS:
        out[f"sandbox/{key}"] = float(after.get(key, 0.0) - before.get(key, 0.0))
    return out
