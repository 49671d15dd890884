"""Prompt sets as MLflow dataset inputs of a run (source path, digest, schema, row count, context).

``log_prompt_sets`` records the training file with context ``training`` and the held-out file with
context ``evaluation`` (MLflow deduplicates: logging them again on a resumed run adds nothing).
``dataset_ref`` gives the (name, digest) that evaluation metrics are linked to, so a logged model's
page says which held-out set its metrics were measured on. ``log_frame`` does the same for a set that is
not a file (an environment's held-out start states) and returns its reference.

Run: called by the train and evaluate flows; the run page's "Datasets used" lists them.
"""

from __future__ import annotations

import warnings
from functools import lru_cache
from pathlib import Path

from tasks.stores.config import TrackingConfig
from tasks.stores.tracking import named_errors


def _name(path: str) -> str:
    p = Path(path)
    return f"{p.parent.name}/{p.stem}" if p.parent.name else p.stem


@lru_cache(maxsize=16)
def _dataset(path: str, mtime_ns: int):
    import polars as pl
    from mlflow.data.polars_dataset import from_polars

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "source can be interpreted in multiple ways": a local file
        return from_polars(pl.read_parquet(path), source=str(Path(path).resolve()), name=_name(path))


def dataset(path: str):
    """The MLflow dataset of a Parquet prompt file (cached while the file is unchanged)."""
    return _dataset(str(path), Path(path).stat().st_mtime_ns)


def dataset_ref(path: str) -> tuple[str, str]:
    """(name, digest) of a prompt file's dataset, as metrics reference it."""
    ds = dataset(path)
    return ds.name, ds.digest


@named_errors
def log_prompt_sets(cfg: TrackingConfig, mlrun: str, files: dict[str, str]) -> None:
    """Log ``{context: parquet path}`` (``training``, ``evaluation``) as dataset inputs of ``mlrun``."""
    from mlflow import MlflowClient
    from mlflow.entities import DatasetInput, InputTag

    inputs = [DatasetInput(dataset(path)._to_mlflow_entity(), tags=[InputTag("mlflow.data.context", context)])
              for context, path in files.items() if Path(path).exists()]
    if inputs:
        MlflowClient(tracking_uri=cfg.mlflow_uri).log_inputs(mlrun, datasets=inputs)


@named_errors
def log_frame(cfg: TrackingConfig, mlrun: str, frame, name: str, context: str) -> tuple[str, str]:
    """Log a polars ``frame`` as dataset ``name`` (input of ``mlrun`` with ``context``); returns (name, digest)."""
    from mlflow import MlflowClient
    from mlflow.data.polars_dataset import from_polars
    from mlflow.entities import DatasetInput, InputTag

    ds = from_polars(frame, name=name)
    MlflowClient(tracking_uri=cfg.mlflow_uri).log_inputs(
        mlrun, datasets=[DatasetInput(ds._to_mlflow_entity(), tags=[InputTag("mlflow.data.context", context)])])
    return ds.name, ds.digest
