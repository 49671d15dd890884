"""Config slice of the stores (``TrackingConfig``): the MLflow tracking URI and the DuckDB file.

Pydantic only, so flow modules and the CLI read it without loading MLflow or DuckDB.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_serializer


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

    traces_per_step: int = Field(64, ge=0)
    """Trajectories of a step (and of each evaluation mode) logged as MLflow traces: all of a step with at most
    this many, else this many (rolled-back ones first, then a stable hash order); 0 = no traces."""

    background_traces: bool = True
    """Write a training step's traces in a background thread (``tasks.stores.trace_writer``) while the next step
    runs, then mark the step logged; the run waits for every write before it finishes and fails if one failed.
    False: the log stage writes them itself (the previous path). The traces are the same either way."""

    log_models: bool = True
    """Log every evaluated checkpoint as an MLflow logged model (transformers flavour) and, at the end of a
    training run that registers (``register_models``), register its best and final checkpoints under ``registered_model``."""

    register_models: bool | None = None
    """Register the run's best and final evaluated checkpoints (model versions, ``@latest``, maybe ``@best``) at its
    end. None (default): only runs that a deployment (a schedule, the UI) or a comparison started, and the demo;
    a run started from the shell (``cleaner train``, a smoke run) leaves the registry alone — its checkpoints stay
    logged models of its MLflow run. True / False: always / never."""

    registered_model: str | None = None
    """Model registry name; defaults to the run config's ``name``."""

    system_metrics_interval_s: float = Field(10.0, ge=0)
    """Seconds between system metric samples (CPU, memory, disk, network) of a run; 0 = off."""

    ui_url: str | None = None
    """MLflow UI base URL for links (Prefect artifacts, descriptions); default: the tracking server when
    ``mlflow_uri`` is one, else http://127.0.0.1:5000 (what ``mlflow ui`` serves)."""

    arm: str | None = None
    """Arm label of the run (traces are tagged with it; ``cleaner compare`` sets it); default from the config:
    ``cleaner``, ``dapo`` (SAAR off), ``saar_all`` (raw share 0) or the rollout mode (``r3l``)."""

    @model_serializer(mode="wrap")
    def _omit_default_registration(self, handler):
        """``register_models`` left at its default is out of the dump, hence out of every stage's cache key: runs
        made before the field existed keep their keys (``tests/test_stage_keys.py``)."""
        out = handler(self)
        if out.get("register_models", False) is None:
            del out["register_models"]
        return out
