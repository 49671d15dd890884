"""The ``cleaner`` command line (typer).

    cleaner demo                     build + warm up the tiny model if absent, train, show where results are
    cleaner build-tiny               build the untrained tiny model (tokenizer + Qwen2) from the corpus
    cleaner warmup                   warm-up SFT of the tiny model into model.path, then its gate
    cleaner warmup-gate [--model D]  measure a warmed-up policy (or LoRA adapter) against the warm-up gate (≥ 500
                                     trajectories; --set gate.start=.. runs a part, --combine merges parts)
    cleaner train [--set k=v]        the Prefect training flow
    cleaner resume RUN               rerun a crashed run: finished stages are skipped (a deployment's run is retried
                                     through Prefect, in its own flow run)
    cleaner ui                       the MLflow UI over the config's store, light, in the model-training view
    cleaner eval [--checkpoint DIR | --model models:/NAME@best]
                                     the evaluate flow: pass@k, first-call failures, recovery, SAAR off and on
    cleaner compare                  CLEANER vs DAPO vs SAAR-everywhere over seeds, with a report
    cleaner query "SQL"              query the DuckDB store
    cleaner bench-rollout            rollout before/after continuous batching, lockstep tool calls (ratios)
    cleaner bench-partial            rollout with APRIL partial rollouts off/on (ratios in one run)
    cleaner bench-step               the compare's RL step with the speed switches off/on (ratio, identical numbers)
    cleaner sandbox ... / data ...   sandbox benchmark, dataset tools
    cleaner runs show RUN            how a flow run ended and why: state message, the failing stage's last log lines
    cleaner serve ...                the project's Prefect server + worker + MLflow server (docs/schedule.md)

Commands live here and in ``cli_eval``, ``cli_bench``, ``cli_browse`` (registered on this app) and the sub-apps
``cli_sandbox``, ``cli_data``, ``cli_serve``, ``cli_runs``; what they share is ``cli_common``. Every command takes
``--config`` (YAML) and repeatable ``--set key.path=value`` overrides; ``cleaner -v COMMAND`` keeps the libraries'
own output (Prefect's task states, weight-loading bars), which commands otherwise leave out (``flows.terminal``).
``PREFECT_HOME`` is the project's ``.prefect`` unless the shell sets one (``flows.prefect_home``): every command,
``make`` and the served stack share one Prefect history; while the project's stack runs (``cleaner serve start``),
commands use its Prefect API unless ``PREFECT_API_URL`` is set.
"""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")

from flows.prefect_home import use_project_home, use_running_stack  # noqa: E402
from flows.terminal import quiet_libraries  # noqa: E402

use_project_home()
if os.path.basename(sys.argv[0]) in ("cleaner", "cli.py"):  # the command line, not a test importing it
    quiet_libraries(sys.argv[1:])  # before Prefect, transformers and MLflow are imported
    use_running_stack()

from pathlib import Path  # noqa: E402

import typer  # noqa: E402

from flows import cli_bench, cli_browse, cli_eval  # noqa: E402
from flows.cli_common import (  # noqa: E402
    WARMUP_COST,
    ConfigOpt,
    SetOpt,
    check_policy,
    check_tracking,
    console,
    experiment_id,
    load_or_exit,
)

# help texts are plain: Rich markup would swallow literal brackets such as `compare.add_arms=[r3l]`
app = typer.Typer(rich_markup_mode=None, add_completion=False, no_args_is_help=True,
                  help="CLEANER: RL for tool-using LLMs with SAAR.")



FLOW_COMMANDS = ("warmup", "warmup-gate", "train", "resume", "eval", "compare", "demo", "bench-engines",
                 "bench-partial", "bench-step", "runs")
"""Commands that run Prefect flows or read flow runs (a temporary Prefect server without ``PREFECT_API_URL``)."""


@app.callback()
def _before_any_command(ctx: typer.Context, verbose: bool = typer.Option(
        False, "--verbose", "-v", help="Print what Prefect, transformers and MLflow print by default (task run "
                                       "states, weight-loading bars, database messages); without it a command "
                                       "prints its own lines (flows/terminal.py).")) -> None:
    """SIGTERM (``kill``, a CI runner, a process manager) ends any command as Ctrl-C does: its flow run is marked,
    and the temporary Prefect server the process started is stopped on the way out (Prefect stops it at interpreter
    exit, which a default SIGTERM skips) instead of outliving the command; a SIGKILL skips even that, so the server
    is started to die with the command (``guard_temporary_server``). A command that runs flows finds the
    Prefect database migrated, even when others start beside it on a fresh home (``flows.prefect_home``). A SIGTERM
    whose exception is swallowed (it landed in a finaliser) is delivered again (``models.termination``). ``--verbose``
    takes effect before this runs: the libraries' output is chosen when they are imported (``flows.terminal``)."""
    from models.termination import install

    install()
    if ctx.invoked_subcommand in FLOW_COMMANDS:
        from flows.prefect_home import ensure_database, guard_temporary_server

        ensure_database()
        guard_temporary_server()


def _mount_optional(name: str, module: str, help_text: str) -> None:
    import importlib

    try:
        sub = importlib.import_module(module).app
    except ImportError:
        return
    app.add_typer(sub, name=name, help=help_text)


@app.command("build-tiny")
def build_tiny_cmd(config: Path = ConfigOpt, overrides: list[str] | None = SetOpt) -> None:
    """Write the SFT corpus and build the untrained tiny model (tokenizer + Qwen2 weights)."""
    from flows.warmup import build_task, corpus_task

    cfg = load_or_exit(config, overrides)
    out = build_task.fn(cfg, corpus_task.fn(cfg))
    console.print(f"tiny model (untrained) in [bold]{out}[/bold]")


def run_warmup(config: Path, overrides: list[str] | None) -> None:
    """The warm-up flow (shared by ``warmup`` and ``demo``)."""
    from flows.warmup import warmup_flow

    cfg = load_or_exit(config, overrides)
    console.print(f"warm-up of [bold]{cfg.model.path}[/bold]: SFT corpus, model build, SFT, gate — "
                  f"{WARMUP_COST}; progress bars follow")
    warmup_flow(str(config), list(overrides or []))


@app.command()
def warmup(config: Path = ConfigOpt, overrides: list[str] | None = SetOpt) -> None:
    """Build the tiny model if needed and warm it up by SFT into ``model.path``."""
    run_warmup(config, overrides)


@app.command("warmup-gate")
def warmup_gate_cmd(config: Path = ConfigOpt, overrides: list[str] | None = SetOpt,
                    model: Path | None = typer.Option(None, help="Policy folder (default: model.path)."),
                    write: bool = typer.Option(False, help="Write gate.json and the model card's gate section "
                                                           "beside the model (default: only under output_dir)."),
                    combine: list[Path] | None = typer.Option(None, help="Gate part reports (JSON) to merge instead "
                                                                         "of rolling out.")) -> None:
    """Measure first-call failure, recovery and P(correct | clean / recovered) on held-out prompts."""
    import json

    from flows.prepare import start_policy
    from models.lora import is_adapter
    from tasks.training.gate import combine_reports, gate_table, log_gate, run_gate, write_gate

    cfg = load_or_exit(config, overrides)
    check_tracking(cfg)
    folder = Path(model or cfg.model.path)
    if not (folder / "config.json").exists() and not is_adapter(folder):
        console.print(f"[red]model {folder} does not exist[/red] (run `cleaner warmup` or pass --model)")
        raise typer.Exit(2)
    committed = json.loads((folder / "gate.json").read_text()) if (folder / "gate.json").exists() else None
    if combine:
        report = combine_reports([json.loads(p.read_text()) for p in combine])
    else:
        policy = start_policy(cfg, str(folder), Path(cfg.output_dir) / "gate-policies" / folder.name)
        report = run_gate(policy, cfg.gate, cfg.rollout, cfg.engine, cfg.sandbox, chat_cfg=cfg.model.chat)
    report["model"] = str(folder)
    bar = report["bar"]
    part = f"-from{bar['start']}" if bar.get("start") else ""
    out = Path(cfg.output_dir) / "gate" / f"{folder.name}{part}-to{bar['n_prompts']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    if write:
        write_gate(report, folder)
    log_gate(report, cfg.tracking)
    console.print(gate_table(report, committed))
    console.print(f"gate {'passed' if report['passed'] else 'NOT passed'}; figures in {out}")


def run_train(config: Path, overrides: list[str] | None, run_id: str | None = None, profile: bool = False,
              parent_mlflow_run: str | None = None) -> dict:
    """The training flow from the command line (shared by ``train`` and ``demo``): config and store checks first,
    then the flow; with ``profile`` a fully cached rerun and the step-time table."""
    from flows.train import model_name
    from flows.train import train as train_flow
    from flows.train_log import train_summary

    cfg = load_or_exit(config, overrides)
    check_tracking(cfg)
    check_policy(cfg)
    t0 = time.perf_counter()
    result = train_flow(str(config), list(overrides or []), run_id, parent_mlflow_run)
    console.print(train_summary(result, model_name(cfg), time.perf_counter() - t0), soft_wrap=True, markup=False)
    if profile:
        from flows.step_profile import profile_table

        rerun = train_flow(str(config), list(overrides or []), result["run_id"])
        console.print(profile_table(cfg.tracking.duckdb_path, result["run_id"], result["step_wall_s"],
                                    rerun["step_wall_s"]))
    return result


@app.command()
def train(config: Path = ConfigOpt, overrides: list[str] | None = SetOpt,
          run_id: str | None = typer.Option(None, help="Run id; an existing one is resumed."),
          profile: bool = typer.Option(False, help="Print where step time goes, then time a fully cached rerun."),
          parent_mlflow_run: str | None = typer.Option(None, hidden=True,
                                                          help="MLflow run to nest this run under (compare).")) -> None:
    """Run the Prefect training flow."""
    run_train(config, overrides, run_id, profile, parent_mlflow_run)


@app.command()
def resume(run_id: str, output_dir: Path = typer.Option(Path("runs"), help="Folder holding the run folders."),
           local: bool = typer.Option(False, help="Resume here in a new flow run even when a deployment started the "
                                                  "run (its deployment history then shows the crashed attempt)."),
           folder: Path = typer.Option(Path(".serve"), "--dir", help="The stack's folder: its Prefect API when "
                                                                     "PREFECT_API_URL is not set.")) -> None:
    """Rerun a crashed or stopped run: finished stages are skipped, training continues where it stopped.

    A run started from a deployment is retried through Prefect (as the UI's Retry does): the same flow run goes back
    to the deployment's work pool, so the deployment's history shows one run that finished. The Prefect API is
    ``PREFECT_API_URL``, else the project's running stack (``--dir``, recorded in ``.serve/pids.json``)."""
    config = output_dir / run_id / "config.json"
    if not config.exists():
        console.print(f"[red]no run {run_id!r}[/red]: {config} does not exist")
        raise typer.Exit(2)
    from flows.prefect_home import project_api
    from flows.resume import deployment_flow_run, retry_flow_run

    origin = None if local else deployment_flow_run(output_dir / run_id)
    if origin:
        try:
            with project_api(folder):
                state = retry_flow_run(origin)
        except RuntimeError as err:
            console.print(f"[red]{err}[/red]", soft_wrap=True)
            raise typer.Exit(2) from None
        console.print(f"run [bold]{run_id}[/bold]: flow run {origin} of its deployment retried ({state}); its work "
                      f"pool's worker resumes it — watch with `prefect flow-run logs {origin}` (--local resumes here)")
        return
    run_train(config, None, run_id)


@app.command()
def compare(config: Path = ConfigOpt, overrides: list[str] | None = SetOpt,
            compare_id: str | None = typer.Option(None, help="Id of the comparison (an existing one resumes)."),
            dispatch: str | None = typer.Option(None, help="Run each arm × seed as a flow run of this train deployment "
                                                           "on its workers (e.g. train/train-tiny-fanout; needs "
                                                           "PREFECT_API_URL; docs/team.md)."),
            rerun: str | None = typer.Option(None, help="ARM:SEED: train that run of the comparison again, alone, "
                                                        "into --into, and compare its final numbers (flows/rerun.py)."),
            into: Path = typer.Option(Path("runs/rerun"), help="Folder of --rerun: each call trains in a fresh RUN-ID-N in it."),
            against: Path | None = typer.Option(None, help="With --rerun: committed numbers to check, a compare "
                                                           "report or JSON holding reports (docs/regimes.json).")) -> None:
    """CLEANER vs the DAPO baseline (and SAAR everywhere; R3L with --set 'compare.add_arms=[r3l]') over seeds."""
    from flows.compare import compare_flow
    from flows.dispatch import DispatchError

    overrides = [*(overrides or []), *([f"compare.dispatch={dispatch}"] if dispatch else [])]
    load_or_exit(config, overrides)
    if rerun:
        from flows.rerun import rerun_cli

        rerun_cli(str(config), overrides, compare_id, rerun, into, against, console)
        return
    try:
        summary = compare_flow(str(config), overrides, compare_id)
    except DispatchError as err:
        console.print(f"[red]{err}[/red]", soft_wrap=True)
        raise typer.Exit(1) from None
    from flows.train_log import duration

    console.print(f"compare finished in {duration(summary['wall_s'])}; steps to the baseline's final pass@1: "
                  f"{summary['steps_to_baseline_final']}", markup=False)


@app.command()
def demo(config: Path = ConfigOpt, overrides: list[str] | None = SetOpt) -> None:
    """Warm up the tiny model if absent, train it with CLEANER, and say how to browse the results."""
    cfg = load_or_exit(config, overrides)
    check_tracking(cfg)
    if not Path(cfg.model.path).exists():
        console.rule("warm-up: building the tiny model")
        run_warmup(config, overrides)
    console.rule("training")
    overrides = ["tracking.register_models=true", *(overrides or [])]  # the demo's policy is `models:/<name>@best`
    console.print(f"{cfg.train.steps} RL steps with CLEANER, {cfg.data.prompts_per_step} prompts × "
                  f"{cfg.rollout.n_samples} samples each, held-out evaluations every {cfg.train.eval_every} steps: "
                  "about 2 minutes on 2 quiet CPU cores (tiny.yaml); a line per step follows", soft_wrap=True)
    result = run_train(config, overrides)
    console.rule("results")
    from tasks.stores.links import experiment_url

    name = cfg.tracking.registered_model or cfg.name
    console.print(
        f"MLflow UI:  [bold].venv/bin/cleaner ui --config {config}[/bold]"
        f"  → {experiment_url(cfg.tracking, experiment_id(cfg))}\n"
        "            runs, traces (filter tags.rollback = 'true'), logged models; docs/mlflow.md\n"
        f"Policy:     [bold]mlflow.transformers.load_model(\"models:/{name}@best\")[/bold]  or  "
        f"[bold].venv/bin/cleaner eval --model models:/{name}@best[/bold]\n"
        f"DuckDB:     [bold]{cfg.tracking.duckdb_path}[/bold]  e.g. "
        "[bold].venv/bin/cleaner query \"SELECT step, kind, count(*) FROM saar_events GROUP BY ALL ORDER BY ALL\"[/bold]\n"
        f"{prefect_line(Path(cfg.output_dir) / result['run_id'])}",
        soft_wrap=True)


def prefect_line(run_dir: Path) -> str:
    """Where the flow run of a run ended by a temporary Prefect server can be opened: the project's Prefect server
    (``cleaner serve start`` over the same ``PREFECT_HOME``) serves it at the link the run's description carries."""
    import json

    from tasks.stores.links import flow_run_url

    origin = run_dir / "prefect.json"
    flow_run = json.loads(origin.read_text()).get("flow_run_id") if origin.exists() else None
    where = f"its flow run {flow_run_url(flow_run)}" if flow_run else "its flow runs"
    if os.environ.get("PREFECT_API_URL"):
        return f"Prefect:    {where}"
    return (f"Prefect:    [bold].venv/bin/cleaner serve start[/bold] serves this project's Prefect history "
            f"({os.environ['PREFECT_HOME']}) → {where}")


for _module in (cli_eval, cli_bench, cli_browse):
    _module.register(app)
_mount_optional("sandbox", "flows.cli_sandbox", "Sandbox tools (benchmark).")
_mount_optional("data", "flows.cli_data", "Dataset tools (inspect, verl parquet export, grading benchmark).")
_mount_optional("serve", "flows.cli_serve", "Local Prefect server + worker + MLflow server.")
_mount_optional("runs", "flows.cli_runs", "Flow runs: how one ended and why (state message, failing stage's logs).")


if __name__ == "__main__":
    app()
