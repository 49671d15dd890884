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

Every command takes ``--config`` (YAML) and repeatable ``--set key.path=value`` overrides. ``PREFECT_HOME`` is the
project's ``.prefect`` unless the shell sets one (``flows.prefect_home``): every command, ``make`` and the served
stack share one Prefect history; while the project's stack runs (``cleaner serve start``), commands use its Prefect
API unless ``PREFECT_API_URL`` is set.
"""

from __future__ import annotations

import os
import signal
import sys

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")

from flows.prefect_home import use_project_home, use_running_stack  # noqa: E402

use_project_home()
if os.path.basename(sys.argv[0]) in ("cleaner", "cli.py"):  # the command line, not a test importing it
    use_running_stack()

from pathlib import Path  # noqa: E402

import typer  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

# help texts are plain: Rich markup would swallow literal brackets such as `compare.add_arms=[r3l]`
app = typer.Typer(rich_markup_mode=None, add_completion=False, no_args_is_help=True,
                  help="CLEANER: RL for tool-using LLMs with SAAR.")
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


def _load(config: Path, overrides: list[str] | None):
    from flows.config import ConfigError, load_config

    try:
        return load_config(config, overrides or [])
    except ConfigError as err:
        console.print(f"[red]config error:[/red] {err}")
        raise typer.Exit(2) from None


def _check_tracking(cfg) -> None:
    """A tracking server that is down is a one-line error before any work (and before an MLflow run exists). The
    DuckDB store is not opened: runs write its row log, never the file (docs/store.md)."""
    from tasks.stores.tracking import TrackingUnavailable, check_server

    try:
        check_server(cfg.tracking.mlflow_uri)
    except TrackingUnavailable as err:
        console.print(f"[red]{err}[/red]", soft_wrap=True)
        raise typer.Exit(2) from None


WARMUP_COST = "about 25 minutes on 2 CPU cores"


def _check_policy(cfg) -> None:
    """A ``model.path`` that does not exist is an error naming it, unless the config asks for the model to be built
    (``model.build``); a build says what it does and how long it takes (``flows.train.ensure_policy``)."""
    from flows.train import missing_policy

    problem = missing_policy(cfg)
    if problem:
        console.print(f"[red]{problem}[/red]", soft_wrap=True)
        raise typer.Exit(2)


FLOW_COMMANDS = ("warmup", "warmup-gate", "train", "resume", "eval", "compare", "demo", "bench-engines",
                 "bench-partial", "bench-step", "runs")
"""Commands that run Prefect flows or read flow runs (a temporary Prefect server without ``PREFECT_API_URL``)."""


@app.callback()
def _before_any_command(ctx: typer.Context) -> None:
    """SIGTERM (``kill``, a CI runner, a process manager) ends any command as Ctrl-C does: its flow run is marked,
    and the temporary Prefect server the process started is stopped on the way out (Prefect stops it at interpreter
    exit, which a default SIGTERM skips) instead of outliving the command; a SIGKILL skips even that, so the server
    is started to die with the command (``guard_temporary_server``). A command that runs flows finds the
    Prefect database migrated, even when others start beside it on a fresh home (``flows.prefect_home``)."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)
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

    cfg = _load(config, overrides)
    out = build_task.fn(cfg, corpus_task.fn(cfg))
    console.print(f"tiny model (untrained) in [bold]{out}[/bold]")


def run_warmup(config: Path, overrides: list[str] | None) -> None:
    """The warm-up flow (shared by ``warmup`` and ``demo``)."""
    from flows.warmup import warmup_flow

    cfg = _load(config, overrides)
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

    from flows.train import start_policy
    from models.lora import is_adapter
    from tasks.training.gate import combine_reports, gate_table, log_gate, run_gate, write_gate

    cfg = _load(config, overrides)
    _check_tracking(cfg)
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
    from flows.train import train as train_flow

    cfg = _load(config, overrides)
    _check_tracking(cfg)
    _check_policy(cfg)
    result = train_flow(str(config), list(overrides or []), run_id, parent_mlflow_run)
    console.print(f"run [bold]{result['run_id']}[/bold] finished; final checkpoint {result['final_checkpoint']}")
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


@app.command("eval")
def eval_cmd(config: Path = ConfigOpt, overrides: list[str] | None = SetOpt,
             checkpoint: Path | None = typer.Option(None, help="Policy folder (default: model.path)."),
             model: str | None = typer.Option(None, help="A logged or registered MLflow model instead: "
                                                 "models:/<name>@best, models:/<name>/latest, models:/<name>/<version>, "
                                                 "models:/<model id>.")) -> None:
    """Evaluate a policy on held-out prompts: SAAR off (the policy alone) and on (recovery after errors)."""
    from flows.evaluate import evaluate_flow

    cfg = _load(config, overrides)
    if checkpoint and model:
        console.print("[red]--checkpoint and --model exclude each other[/red]")
        raise typer.Exit(2)
    ckpt = model or str(checkpoint or cfg.model.path)
    if model:
        _check_model(cfg, model)
    elif not Path(ckpt).exists():
        console.print(f"[red]checkpoint {ckpt} does not exist[/red] (run `cleaner warmup` or pass --checkpoint)")
        raise typer.Exit(2)
    metrics = evaluate_flow(str(config), overrides or [], ckpt)
    console.print(eval_table(metrics, cfg.eval.modes, f"{ckpt}: {cfg.eval.n_prompts} held-out prompts × {cfg.eval.samples}"))


def _check_model(cfg, uri: str) -> None:
    """A ``models:/`` URI that names no model is a clear error before any work."""
    from mlflow.exceptions import MlflowException

    from tasks.stores.registry import resolve

    _check_tracking(cfg)
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
    _load(config, overrides)
    if rerun:
        from flows.rerun import rerun_cli

        rerun_cli(str(config), overrides, compare_id, rerun, into, against, console)
        return
    try:
        summary = compare_flow(str(config), overrides, compare_id)
    except DispatchError as err:
        console.print(f"[red]{err}[/red]", soft_wrap=True)
        raise typer.Exit(1) from None
    console.print(f"steps to the baseline's final pass@1: {summary['steps_to_baseline_final']}")


@app.command("bench-engines")
def bench_engines_cmd(model: Path = typer.Option(Path("assets/tiny-warm"), help="Policy folder."),
                      work_dir: Path = typer.Option(Path("runs/bench-engines"), help="Scratch folder."),
                      steps: int = typer.Option(6, help="RL steps per engine.")) -> None:
    """Median RL-step time through the SGLang HTTP engine vs in-process (ratio printed)."""
    from tasks.training.bench_engines import bench_engines

    bench_engines(model, work_dir, steps=steps, echo=console.print)


@app.command("bench-rollout")
def bench_rollout_cmd(model: Path = typer.Option(Path("assets/tiny-warm"), help="Policy folder."),
                      prompts: int = typer.Option(32, help="Held-out prompts."),
                      samples: int = typer.Option(8, help="Samples per prompt."),
                      repeats: int = typer.Option(3, help="Alternating before/after repeats (the first warms up)."),
                      backend: str = typer.Option("local", help="Sandbox backend (local or docker).")) -> None:
    """Rollout wall time and useful tokens/s: static rounds vs continuous batching, and lockstep tool calls'
    price, as ratios."""
    from tasks.training.bench_rollout import bench_rollout

    bench_rollout(model, n_prompts=prompts, n_samples=samples, repeats=repeats, echo=console.print, backend=backend)


@app.command("bench-step")
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


@app.command("bench-partial")
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


@app.command()
def query(sql: str, config: Path = ConfigOpt, overrides: list[str] | None = SetOpt) -> None:
    """Run SQL against the DuckDB store and print the result."""
    import duckdb
    import polars as pl

    from tasks.stores.db import query as run_query

    cfg = _load(config, overrides)
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


@app.command()
def demo(config: Path = ConfigOpt, overrides: list[str] | None = SetOpt) -> None:
    """Warm up the tiny model if absent, train it with CLEANER, and say how to browse the results."""
    cfg = _load(config, overrides)
    _check_tracking(cfg)
    if not Path(cfg.model.path).exists():
        console.rule("warm-up: building the tiny model")
        run_warmup(config, overrides)
    console.rule("training")
    overrides = ["tracking.register_models=true", *(overrides or [])]  # the demo's policy is `models:/<name>@best`
    console.print(f"{cfg.train.steps} RL steps with CLEANER, {cfg.data.prompts_per_step} prompts × "
                  f"{cfg.rollout.n_samples} samples each, held-out evaluations every {cfg.train.eval_every} steps: "
                  "about 5 minutes on 2 quiet CPU cores (tiny.yaml); a line per step follows", soft_wrap=True)
    result = run_train(config, overrides)
    console.rule("results")
    from tasks.stores.links import experiment_url

    name = cfg.tracking.registered_model or cfg.name
    console.print(
        f"MLflow UI:  [bold].venv/bin/cleaner ui --config {config}[/bold]"
        f"  → {experiment_url(cfg.tracking, _experiment_id(cfg))}\n"
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


def ui_argv(cfg, host: str, port: int) -> tuple[list[str], dict[str, str]]:
    """The light MLflow UI over the config's store: the stack's own MLflow server (``flows.serve_stack``: one worker,
    no job runner — ~0.6 GB in 2 processes where ``mlflow ui``'s defaults take ~2.2 GB in 15)."""
    from flows.serve_stack import StackConfig

    stack = StackConfig(Path(".serve"), mlflow_port=port, mlflow_store=cfg.tracking.mlflow_uri,
                        artifacts=Path(cfg.tracking.artifact_root), host=host)
    return stack.argv("mlflow"), stack.env("mlflow")


@app.command()
def ui(config: Path = ConfigOpt, overrides: list[str] | None = SetOpt,
       host: str = typer.Option("127.0.0.1", help="Address to listen on."),
       port: int = typer.Option(5000, help="Port to listen on.")) -> None:
    """Browse the runs: MLflow's UI over the config's store, in the model-training view (Ctrl-C stops it)."""
    from tasks.stores.config import TrackingConfig
    from tasks.stores.links import experiment_url, mlflow_ui

    cfg = _load(config, overrides)
    if cfg.tracking.mlflow_uri.startswith(("http://", "https://")):
        console.print(f"tracking.mlflow_uri is an MLflow server: its UI is {mlflow_ui(cfg.tracking)}")
        raise typer.Exit(0)
    argv, env = ui_argv(cfg, host, port)
    view = TrackingConfig(mlflow_uri=f"http://{host}:{port}")
    exp = _experiment_id(cfg)
    where = experiment_url(view, exp) if exp else f"http://{host}:{port}/#/experiments?workflowType=machine_learning"
    console.print(f"MLflow UI over {cfg.tracking.mlflow_uri}: [bold]{where}[/bold] (ready in ~30 s; Ctrl-C stops it)",
                  soft_wrap=True)
    os.execve(argv[0], argv, env)


def _experiment_id(cfg) -> str | None:
    from mlflow import MlflowClient

    exp = MlflowClient(cfg.tracking.mlflow_uri).get_experiment_by_name(cfg.tracking.experiment or cfg.name)
    return exp.experiment_id if exp else None


_mount_optional("sandbox", "flows.cli_sandbox", "Sandbox tools (benchmark).")
_mount_optional("data", "flows.cli_data", "Dataset tools (inspect, grading benchmark).")
_mount_optional("serve", "flows.cli_serve", "Local Prefect server + worker + MLflow server.")
_mount_optional("runs", "flows.cli_runs", "Flow runs: how one ended and why (state message, failing stage's logs).")


if __name__ == "__main__":
    app()
