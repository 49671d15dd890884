"""Stores: per-step Parquet tables, the DuckDB store (schema and parameterised queries) and MLflow: runs and
metrics, traces, logged models and the registry, dataset inputs, system metrics, Prefect links."""
