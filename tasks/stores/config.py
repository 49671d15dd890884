"""Config slice of the stores (``TrackingConfig``): the MLflow tracking URI and the DuckDB file.

Pydantic only, so flow modules and the CLI read it without loading MLflow or DuckDB.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class TrackingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    mlflow_uri: str = "sqlite:///mlflow.db"
    """MLflow tracking URI: a sqlite file (default) or a tracking server ``http://host:port``."""

    artifact_root: str = "mlartifacts"
    """Folder for MLflow artifacts of new experiments (sqlite store only)."""

    experiment: str | None = None
    """MLflow experiment name; defaults to the run config's ``name``."""

    duckdb_path: str = "cleaner.duckdb"
    """DuckDB file receiving every row."""

    http_retries: int = Field(2, ge=0, le=10)
    """Retries of a failed request to an MLflow tracking server (back-off 1, 2, 4 … s) before the stage fails
    with an error naming ``tracking.mlflow_uri``; MLflow's own default (7 retries, factor 2) stalls ~4 minutes."""

    http_timeout_s: float = Field(20.0, gt=0)
    """Seconds one request to an MLflow tracking server may take."""

    sample_trajectories: int = Field(4, ge=0)
    """Trajectories of each kind (raw, purified) logged as artifacts per step."""
