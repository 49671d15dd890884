"""``cleaner data``: look at task files and measure code grading.

- ``cleaner data inspect FILE [--rows N]``: the detected format, row count, rows per data
  source, the raw columns and a sample of normalised tasks (id, source, ability, ground
  truth, prompt head) as rich tables. Malformed files end with the loader's error (file,
  row, column) and exit code 1.
- ``cleaner data to-verl FILE... --out OUT.parquet [--format F]``: task files of any supported
  format as one verl RL parquet (``tasks.data.verl_export``: what verl's ``main_ppo`` reads, the
  same tasks when the pipeline reads it back); errors name file, row and column, exit code 1.
- ``cleaner data bench-code [--pairs 100] [--backend local|docker]``: code-grading
  throughput (tests/s) through the sandbox, printed.

Mounted by ``flows/cli.py`` as the ``data`` sub-app (``app = typer.Typer()``).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import typer
from rich.table import Table

app = typer.Typer(rich_markup_mode=None, help="Inspect task files, write verl parquet, benchmark code grading.",
                  no_args_is_help=True)


def _short(value, width: int) -> str:
    text = str(value).replace("\n", " ")
    return text if len(text) <= width else text[: width - 1] + "…"


@app.command()
def inspect(
    file: Path = typer.Argument(..., help="Task file: verl RL / AIME / GPQA / LiveCodeBench (Parquet or JSONL)."),
    rows: int = typer.Option(3, "--rows", "-n", min=0, help="Sample rows to show."),
) -> None:
    """Summarise a task file: format, rows, data sources, columns, a sample."""
    from flows.cli_common import make_console
    from tasks.data.formats import DatasetError, detect_format, load_tasks, read_records

    console = make_console()
    try:
        columns, records = read_records(file)
        fmt = detect_format(columns)
        tasks = load_tasks(file, fmt=fmt)
    except (DatasetError, ValueError) as err:
        console.print(f"[red]error:[/red] {err}")
        raise typer.Exit(1) from None
    console.print(f"[bold]{file}[/bold]: format [cyan]{fmt}[/cyan], {len(tasks)} rows")
    console.print("columns: " + ", ".join(columns))
    sources = Table("data_source", "ability", "rows", title="sources")
    for (source, ability), count in sorted(Counter((t.data_source, t.ability) for t in tasks).items()):
        sources.add_row(source, ability, str(count))
    console.print(sources)
    if rows:
        sample = Table("id", "data_source", "ground_truth", "prompt", title=f"sample ({min(rows, len(tasks))} rows)")
        for task in tasks[:rows]:
            sample.add_row(task.id, task.data_source, _short(task.ground_truth, 40), _short(task.prompt[-1]["content"], 80))
        console.print(sample)


@app.command("to-verl")
def to_verl(
    files: list[Path] = typer.Argument(..., help="Task files: verl RL / AIME / GPQA / LiveCodeBench / HumanEval."),
    out: Path = typer.Option(..., "--out", "-o", help="The verl parquet to write (data.train_files / val_files)."),
    fmt: str | None = typer.Option(None, "--format", help="Override format detection for every file."),
) -> None:
    """Write task files as one verl RL parquet (prompt, data_source, ability, reward_model, extra_info)."""
    from flows.cli_common import make_console
    from tasks.data.formats import DatasetError
    from tasks.data.verl_export import export_verl

    console = make_console()
    try:
        result = export_verl(files, out, fmt)
    except (DatasetError, ValueError) as err:
        console.print(f"[red]error:[/red] {err}")
        raise typer.Exit(1) from None
    kinds = ", ".join(f"{Path(f).name} ({k})" for f, k in result["formats"].items())
    console.print(f"wrote {out}: {result['rows']} rows from {kinds}")


@app.command("bench-code")
def bench_code_cmd(
    pairs: int = typer.Option(100, min=1, help="Snippet x test pairs to grade."),
    backend: str = typer.Option("local", help="Sandbox backend: local or docker."),
    workers: int = typer.Option(4, min=1, help="Sandbox workers (processes or containers)."),
) -> None:
    """Measure code-grading throughput through the sandbox (tests/s)."""
    from tasks.rewards.bench import bench_code

    result = bench_code(pairs=pairs, backend=backend, workers=workers)
    typer.echo(result.summary())
