"""``cleaner eval``: the evaluate flow on a policy folder or a logged / registered MLflow model, and its table (SAAR off
and on side by side)."""

from __future__ import annotations

import time
from pathlib import Path

import typer
from rich.table import Table

from flows.cli_common import ConfigOpt, SetOpt, check_tracking, console, load_or_exit
from flows.train_log import duration


def eval_cmd(config: Path = ConfigOpt, overrides: list[str] | None = SetOpt,
             checkpoint: Path | None = typer.Option(None, help="Policy folder (default: model.path)."),
             model: str | None = typer.Option(None, help="A logged or registered MLflow model instead: "
                                                 "models:/<name>@best, models:/<name>/latest, models:/<name>/<version>, "
                                                 "models:/<model id>.")) -> None:
    """Evaluate a policy on held-out prompts: SAAR off (the policy alone) and on (recovery after errors)."""
    from flows.evaluate import evaluate_flow

    cfg = load_or_exit(config, overrides)
    if checkpoint and model:
        console.print("[red]--checkpoint and --model exclude each other[/red]")
        raise typer.Exit(2)
    ckpt = model or str(checkpoint or cfg.model.path)
    if model:
        _check_model(cfg, model)
    elif not Path(ckpt).exists():
        console.print(f"[red]checkpoint {ckpt} does not exist[/red] (run `cleaner warmup` or pass --checkpoint)")
        raise typer.Exit(2)
    t0 = time.perf_counter()
    metrics = evaluate_flow(str(config), overrides or [], ckpt)
    console.print(eval_table(metrics, cfg.eval.modes, f"{ckpt}: {cfg.eval.n_prompts} held-out prompts × {cfg.eval.samples}"))
    console.print(f"evaluated in {duration(time.perf_counter() - t0)}; MLflow experiment "
                  f"{(cfg.tracking.experiment or cfg.name) + '-eval'} (`cleaner ui`), rows in the evaluations table of "
                  f"{cfg.tracking.duckdb_path}", markup=False, soft_wrap=True)


def _check_model(cfg, uri: str) -> None:
    """A ``models:/`` URI that names no model is a clear error before any work."""
    from mlflow.exceptions import MlflowException

    from tasks.stores.registry import resolve

    check_tracking(cfg)
    try:
        resolve(cfg.tracking, uri, Path(cfg.output_dir) / "models")
    except (ValueError, MlflowException) as err:
        console.print(f"[red]--model {uri}:[/red] {str(err).splitlines()[0]}")
        raise typer.Exit(2) from None


EVAL_ROWS = [("pass@1", "all/pass_at_1"), ("tool use rate", "rollout/tool_use_rate"),
             ("first-attempt failure rate (per call)", "tools/first_attempt_failure_rate"),
             ("rollbacks triggered", "saar/rollbacks_triggered"), ("rollbacks recovered", "saar/rollbacks_recovered"),
             ("recovery rate after error", "saar/global_recovery_rate"), ("shallow", "saar/shallow"),
             ("deep", "saar/deep"), ("error-and-retry loop share", "rollout/retry_loop_share"),
             ("mean turns", "rollout/turns_mean"), ("mean response tokens", "rollout/response_tokens_mean")]


def eval_table(metrics: dict, modes: list[str], title: str) -> Table:
    table = Table(title=title)
    table.add_column("metric")
    for mode in modes:
        table.add_column(mode, justify="right")
    keys = list(EVAL_ROWS)
    keys += [(k.split("/", 2)[2], k.split("/", 2)[2]) for k in sorted(metrics)
             if k.startswith(f"eval/{modes[0]}/") and ("pass_at_" in k or "failures/" in k) and k.split("/", 2)[2] != "all/pass_at_1"]
    for label, key in keys:
        table.add_row(label, *[f"{metrics.get(f'eval/{m}/{key}', 0):.3g}" for m in modes])
    return table


def register(app: typer.Typer) -> None:
    """Add these commands to the ``cleaner`` app."""
    app.command("eval")(eval_cmd)
