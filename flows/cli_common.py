"""What every ``cleaner`` command shares: the console, the ``--config`` / ``--set`` options, and the checks that turn a
bad config, a tracking server that is down or a missing policy into a one-line error before any work."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer
from rich.console import Console

WIDE = 200
"""Columns of tables when the output is not a terminal (a log, a pipe): text is not wrapped at all there."""


def make_console() -> Console:
    """A terminal wraps at its width; a log or a pipe gets lines as long as they are (paths, SQL, links stay whole;
    Rich's default would hard-wrap them at 80 columns) and tables up to ``COLUMNS`` or ``WIDE`` columns."""
    if sys.stdout.isatty():
        return Console()
    return Console(soft_wrap=True, width=int(os.environ.get("COLUMNS") or WIDE))


console = make_console()

ConfigOpt = typer.Option(Path("configs/tiny.yaml"), "--config", "-c", help="Run config YAML.")
SetOpt = typer.Option(None, "--set", "-s", help="Override: key.path=value (repeatable).")


def load_or_exit(config: Path, overrides: list[str] | None):
    from flows.config import ConfigError, load_config

    try:
        return load_config(config, overrides or [])
    except ConfigError as err:
        console.print(f"[red]config error:[/red] {err}")
        raise typer.Exit(2) from None


def check_tracking(cfg) -> None:
    """A tracking server that is down is a one-line error before any work (and before an MLflow run exists). The
    DuckDB store is not opened: runs write its row log, never the file (docs/store.md)."""
    from tasks.stores.tracking import TrackingUnavailable, check_server

    try:
        check_server(cfg.tracking.mlflow_uri)
    except TrackingUnavailable as err:
        console.print(f"[red]{err}[/red]", soft_wrap=True)
        raise typer.Exit(2) from None


WARMUP_COST = "about 25 minutes on 2 CPU cores"


def check_policy(cfg) -> None:
    """A ``model.path`` that does not exist is an error naming it, unless the config asks for the model to be built
    (``model.build``); a build says what it does and how long it takes (``flows.prepare.ensure_policy``)."""
    from flows.prepare import missing_policy

    problem = missing_policy(cfg)
    if problem:
        console.print(f"[red]{problem}[/red]", soft_wrap=True)
        raise typer.Exit(2)


def experiment_id(cfg) -> str | None:
    from mlflow import MlflowClient

    exp = MlflowClient(cfg.tracking.mlflow_uri).get_experiment_by_name(cfg.tracking.experiment or cfg.name)
    return exp.experiment_id if exp else None
