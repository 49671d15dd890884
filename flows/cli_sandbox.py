"""``cleaner sandbox`` sub-commands (a typer app mounted by ``flows/cli.py``).

    cleaner sandbox bench [--backends docker,local,subprocess] [--concurrency 1,8,32]
                          [--snippets trivial,cpu_50ms,numpy] [-n 200] [--reps 2] [--workers CORES]
                          [--preimport math] [--runs-per-container N] [--long-factor 2]
                          [--out runs/sandbox_bench.json]

Prints tables of executions/s and p50/p95/p99 latency (each pool against a plain interpreter of
its own build, see ``sandbox/bench.py``) and writes the same data as JSON.
"""

from __future__ import annotations

from pathlib import Path

import typer

app = typer.Typer(rich_markup_mode=None, add_completion=False, no_args_is_help=True, help="Sandbox tools.")


@app.callback()
def main() -> None:
    """Sandbox tools: benchmark the execution backends."""


def _csv(value: str, name: str) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    if not items:
        raise typer.BadParameter(f"--{name}: give a comma-separated list")
    return items


@app.command("bench")
def bench(
    backends: str = typer.Option("docker,local,subprocess", help="Backends to measure (comma-separated)."),
    concurrency: str = typer.Option("1,8,32", help="Client concurrency levels (comma-separated)."),
    snippets: str = typer.Option("trivial,cpu_50ms,numpy", help="Snippets (comma-separated)."),
    n: int = typer.Option(200, "-n", min=1, help="Executions per (backend, snippet, concurrency), over all reps."),
    reps: int = typer.Option(2, min=1, help="Interleaved repetitions of every cell (runners in rotated order)."),
    workers: int = typer.Option(0, min=0, help="Executors / containers in each pool (0: one per CPU core)."),
    preimport: str = typer.Option("math", help="Modules the pools pre-import (the plain runners import them too)."),
    runs_per_container: int = typer.Option(
        0, min=0, help="Snippets a worker serves before it is replaced (0: the config default)."),
    long_factor: float = typer.Option(2.0, min=0, help="Long run: this many times runs_per_container x workers."),
    out: Path = typer.Option(Path("runs/sandbox_bench.json"), help="Where the JSON report goes."),
) -> None:
    """Measure executions/s and p50/p95/p99 latency of the sandbox backends vs plain interpreters."""
    import logging
    import os

    from sandbox.bench import BACKENDS, SNIPPETS, render, run_bench, write_json
    from sandbox.config import SandboxConfig

    logging.basicConfig(level=logging.WARNING)
    try:
        levels = [int(c) for c in _csv(concurrency, "concurrency")]
    except ValueError:
        raise typer.BadParameter(f"--concurrency: integers expected, got {concurrency!r}") from None
    names = _csv(snippets, "snippets")
    unknown = sorted(set(names) - set(SNIPPETS))
    if unknown:
        raise typer.BadParameter(f"--snippets: unknown {unknown}; valid: {sorted(SNIPPETS)}")
    chosen = _csv(backends, "backends")
    bad = sorted(set(chosen) - set(BACKENDS))
    if bad:
        raise typer.BadParameter(f"--backends: unknown {bad}; valid: {', '.join(BACKENDS)}")
    cfg = SandboxConfig(workers=workers or os.cpu_count() or 1, timeout_s=30,
                        preimport=[m for m in preimport.split(",") if m.strip()],
                        **({"runs_per_container": runs_per_container} if runs_per_container else {}))
    report = run_bench(backends=chosen, snippets=names, concurrency=levels, n=n, cfg=cfg, reps=reps,
                       long_factor=long_factor)
    render(report)
    typer.echo(f"wrote {write_json(report, out)}")


if __name__ == "__main__":
    from models.termination import install

    install()  # SIGTERM ends it as Ctrl-C does, also when swallowed in a finaliser
    app()
