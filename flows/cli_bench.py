"""``cleaner bench-*``: benchmarks that print before/after ratios measured in one process (rollout, RL step, a run's
slice, APRIL partial rollouts, engines)."""

from __future__ import annotations

from pathlib import Path

import typer

from flows.cli_common import ConfigOpt, SetOpt, console


def bench_engines_cmd(model: Path = typer.Option(Path("assets/tiny-warm"), help="Policy folder."),
                      work_dir: Path = typer.Option(Path("runs/bench-engines"), help="Scratch folder."),
                      steps: int = typer.Option(6, help="RL steps per engine.")) -> None:
    """Median RL-step time through the SGLang HTTP engine vs in-process (ratio printed)."""
    from tasks.training.bench_engines import bench_engines

    bench_engines(model, work_dir, steps=steps, echo=console.print)


def bench_rollout_cmd(model: Path = typer.Option(Path("assets/tiny-warm"), help="Policy folder."),
                      prompts: int = typer.Option(32, help="Held-out prompts."),
                      samples: int = typer.Option(8, help="Samples per prompt."),
                      repeats: int = typer.Option(3, help="Alternating before/after repeats (the first warms up)."),
                      backend: str = typer.Option("local", help="Sandbox backend (local or docker).")) -> None:
    """Rollout wall time and useful tokens/s: static rounds vs continuous batching, and lockstep tool calls'
    price, as ratios."""
    from tasks.training.bench_rollout import bench_rollout

    bench_rollout(model, n_prompts=prompts, n_samples=samples, repeats=repeats, echo=console.print, backend=backend)


def bench_step_cmd(config: Path = ConfigOpt, overrides: list[str] | None = SetOpt,
                   sides: str = typer.Option("before,after", help="Sides: before (every speed switch off), after (all "
                                                                   "on), or one switch's name (only it on)."),
                   repeats: int = typer.Option(3, help="Alternating blocks per side (the first warms up)."),
                   steps: int = typer.Option(2, help="RL steps per block."),
                   work_dir: Path = typer.Option(Path("runs/bench-step"), help="Scratch folder (emptied)."),
                   out: Path = typer.Option(Path("runs/bench_step.json"), help="Where the JSON report goes.")) -> None:
    """The compare's RL step with the speed switches off vs on: seconds per part, ratio, largest differences."""
    from flows.bench_step import bench_step, write_json

    try:
        report = bench_step(config, work_dir, tuple(x.strip() for x in sides.split(",") if x.strip()), repeats, steps,
                            overrides or [], echo=console.print)
    except ValueError as err:
        console.print(f"[red]{err}[/red]")
        raise typer.Exit(2) from None
    console.print(f"wrote {write_json(report, out)}")
    if not report["same"]:
        raise typer.Exit(1)


def bench_run_cmd(config: Path = typer.Option(Path("configs/regimes/t4.yaml"), "--config", "-c",
                                           help="The run's config (its compare.shared applies)."),
                  overrides: list[str] | None = SetOpt,
                  sides: str = typer.Option("sync-1t,sync-2t,async", help="Sides, comma-separated: whole runs of "
                                            "sync-1t, sync-2t, async (flows.bench_async.SIDES), or before,after "
                                            "(one-pass vs two-pass evaluations, step by step: flows.bench_run)."),
                  repeats: int = typer.Option(2, help="Runs a side (the order reversed every other time); "
                                                      "not for before,after."),
                  steps: int = typer.Option(6, help="RL steps per side."),
                  eval_at: int = typer.Option(3, help="Evaluate SAAR off and on after this step (and after the last, "
                                                       "at the final size)."),
                  arm: str = typer.Option("", help="The arm's overrides, comma-separated (default: the t4 study's "
                                                   "mask_raw0, flows.bench_run.MASK_RAW0)."),
                  work_dir: Path = typer.Option(Path("runs/bench-run"), help="Scratch folder (emptied)."),
                  out: Path = typer.Option(Path("runs/bench_run.json"), help="Where the JSON report goes.")) -> None:
    """A slice of a compare run in one process: synchronous vs bounded staleness (wall and core-seconds a run and
    per part, waits, ratios; exits 1 when a checked side's repeats differ), or today's evaluation paths vs the
    defaults (exits 1 when the training steps or the evaluations differ between the sides)."""
    from flows import bench_async, bench_run
    from flows.bench_step import write_json

    names = [x.strip() for x in sides.split(",") if x.strip()]
    arm_list = [a for a in arm.split(",") if a] or None
    if names and set(names) <= set(bench_run.SIDES):
        report = bench_run.bench_run(config, work_dir, steps, eval_at, arm_list, overrides or [], echo=console.print)
    else:
        try:
            bench_async.check_sides(names)
        except ValueError as err:
            console.print(f"[red]{err} (or before, after on their own)[/red]")
            raise typer.Exit(2) from None
        report = bench_async.bench_async(config, work_dir, tuple(names), repeats, steps, eval_at, arm_list,
                                         overrides or [], echo=console.print)
    console.print(f"wrote {write_json(report, out)}")
    if not report["same"]:
        raise typer.Exit(1)


def bench_partial_cmd(model: Path = typer.Option(Path("assets/tiny-warm"), help="Policy folder."),
                      work_dir: Path = typer.Option(Path("runs/bench-partial"), help="Scratch folder."),
                      steps: int = typer.Option(4, help="Consecutive rollout steps per side."),
                      prompts_per_step: int = typer.Option(4, help="Complete groups a step needs."),
                      over_sampling: int = typer.Option(8, help="Groups submitted at a time with partial rollouts."),
                      repeats: int = typer.Option(2, help="Alternating off/on repeats."),
                      submit_rule: str = typer.Option("april", help="rollout.partial.submit_rule of the on side.")
                      ) -> None:
    """Passing groups/s and their tokens/s with APRIL partial rollouts on vs off, as ratios."""
    from tasks.training.bench_partial import bench_partial

    bench_partial(model, work_dir, steps=steps, prompts_per_step=prompts_per_step, over_sampling=over_sampling,
                  repeats=repeats, submit_rule=submit_rule, echo=console.print)


def register(app: typer.Typer) -> None:
    """Add these commands to the ``cleaner`` app."""
    app.command("bench-engines")(bench_engines_cmd)
    app.command("bench-rollout")(bench_rollout_cmd)
    app.command("bench-step")(bench_step_cmd)
    app.command("bench-run")(bench_run_cmd)
    app.command("bench-partial")(bench_partial_cmd)
