"""Browsing what runs left: ``cleaner ui`` (MLflow's UI over the config's store, in the model-training view) and
``cleaner query`` (SQL over the DuckDB store)."""

from __future__ import annotations

import os
from pathlib import Path

import typer

from flows.cli_common import ConfigOpt, SetOpt, console, experiment_id, load_or_exit


def query(sql: str, config: Path = ConfigOpt, overrides: list[str] | None = SetOpt) -> None:
    """Run SQL against the DuckDB store and print the result."""
    import duckdb
    import polars as pl

    from tasks.stores.db import query as run_query

    cfg = load_or_exit(config, overrides)
    if not Path(cfg.tracking.duckdb_path).exists():
        console.print(f"[red]{cfg.tracking.duckdb_path} does not exist yet[/red]: train first")
        raise typer.Exit(2)
    try:
        df = run_query(cfg.tracking.duckdb_path, sql)
    except duckdb.Error as err:
        console.print(f"[red]query failed:[/red] {err}")
        raise typer.Exit(2) from None
    with pl.Config(tbl_rows=50, fmt_str_lengths=60, tbl_width_chars=200):
        console.print(str(df))


def ui_argv(cfg, host: str, port: int) -> tuple[list[str], dict[str, str]]:
    """The light MLflow UI over the config's store: the stack's own MLflow server (``flows.serve_stack``: one worker,
    no job runner — ~0.6 GB in 2 processes where ``mlflow ui``'s defaults take ~2.2 GB in 15)."""
    from flows.serve_stack import StackConfig

    stack = StackConfig(Path(".serve"), mlflow_port=port, mlflow_store=cfg.tracking.mlflow_uri,
                        artifacts=Path(cfg.tracking.artifact_root), host=host)
    return stack.argv("mlflow"), stack.env("mlflow")


def ui(config: Path = ConfigOpt, overrides: list[str] | None = SetOpt,
       host: str = typer.Option("127.0.0.1", help="Address to listen on."),
       port: int = typer.Option(5000, help="Port to listen on.")) -> None:
    """Browse the runs: MLflow's UI over the config's store, in the model-training view (Ctrl-C stops it)."""
    from tasks.stores.config import TrackingConfig
    from tasks.stores.links import experiment_url, mlflow_ui

    cfg = load_or_exit(config, overrides)
    if cfg.tracking.mlflow_uri.startswith(("http://", "https://")):
        console.print(f"tracking.mlflow_uri is an MLflow server: its UI is {mlflow_ui(cfg.tracking)}")
        raise typer.Exit(0)
    argv, env = ui_argv(cfg, host, port)
    view = TrackingConfig(mlflow_uri=f"http://{host}:{port}")
    exp = experiment_id(cfg)
    where = experiment_url(view, exp) if exp else f"http://{host}:{port}/#/experiments?workflowType=machine_learning"
    console.print(f"MLflow UI over {cfg.tracking.mlflow_uri}: [bold]{where}[/bold] (ready in ~30 s; Ctrl-C stops it)",
                  soft_wrap=True)
    os.execve(argv[0], argv, env)


def register(app: typer.Typer) -> None:
    """Add these commands to the ``cleaner`` app."""
    app.command()(query)
    app.command()(ui)
