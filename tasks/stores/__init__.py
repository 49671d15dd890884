"""Stores: per-step Parquet tables, the DuckDB store and MLflow tracking."""
