"""``cleaner runs show RUN``: how a flow run ended and why, where the user is looking.

``prefect deployment run … --watch`` ends with ``Flow run finished in state 'Failed'.`` and no reason; the reason is
the run's state message (``StageFailed: stage 'update' of step 3 failed: …``, ``ConfigError: … unknown key``) and
the logs of the stage that failed. This prints both:

    flow run   train/brave-otter  (0a1b…)   deployment train-tiny
    state      Failed: Flow run encountered an exception: StageFailed: stage 'rollout' of step 0 failed: …
    failed     task run 'rollout-0' (Failed)
    last 20 log lines of task run 'rollout-0':
      12:00:01 ERROR    Task run failed with exception: ValueError(...)
      …

``RUN`` is a flow run id, a flow run name (``brave-otter``, as ``--watch`` prints it) or a training run id (its
``runs/<id>/prefect.json`` names the flow run). The Prefect asked is the project's (``flows.prefect_home.project_api``):
``PREFECT_API_URL``, else the running stack of ``--dir``, else the project's Prefect history. Exit 1 when the run
failed or crashed (so a script can chain it), 2 when no such run exists.
"""

from __future__ import annotations

import json
from pathlib import Path
from uuid import UUID

import typer

app = typer.Typer(rich_markup_mode=None, add_completion=False, no_args_is_help=True,
                  help="Flow runs: how one ended and why.")

BAD = ("FAILED", "CRASHED")


def find_flow_run(client, run: str, output_dir: Path):
    """The flow run ``run`` names (id, name, or training run id); None when there is none."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName
    from prefect.exceptions import ObjectNotFound

    origin = output_dir / run / "prefect.json"
    if origin.exists() and json.loads(origin.read_text()).get("flow_run_id"):
        run = json.loads(origin.read_text())["flow_run_id"]
    try:
        return client.read_flow_run(UUID(run))
    except ValueError:
        pass
    except ObjectNotFound:
        return None
    found = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[run])), limit=1)
    return found[0] if found else None


def failed_task_run(client, flow_run_id):
    """The task run of the flow run that failed last (the failing stage), or None."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.client.schemas.sorting import TaskRunSort

    runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])),
                                 sort=TaskRunSort.EXPECTED_START_TIME_DESC, limit=200)
    return next((t for t in runs if t.state_type and t.state_type.value in BAD), None)


def last_log_lines(client, flow_run_id, task_run_id, n: int) -> list[str]:
    """The last ``n`` lines of the logs of a task run (or of the whole flow run), oldest first."""
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId, LogFilterTaskRunId
    from prefect.client.schemas.sorting import LogSort

    where = LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id]),
                      task_run_id=LogFilterTaskRunId(any_=[task_run_id]) if task_run_id else None)
    logs = list(reversed(client.read_logs(log_filter=where, limit=max(n, 1), sort=LogSort.TIMESTAMP_DESC)))
    lines = []
    for log in logs:
        head, *rest = log.message.splitlines() or [""]
        lines.append(f"{log.timestamp:%H:%M:%S} {_level(log.level):8s} {head}")
        lines += [f"{'':18s}{r}" for r in rest]
    return lines[-n:]


def _level(level: int) -> str:
    import logging

    return logging.getLevelName(level)


def report(client, flow_run, n: int) -> list[str]:
    """The lines ``runs show`` prints for ``flow_run``."""
    state = flow_run.state
    kind = state.type.value if state else "UNKNOWN"
    deployment = client.read_deployment(flow_run.deployment_id).name if flow_run.deployment_id else "-"
    lines = [f"flow run   {flow_run.name}  ({flow_run.id})   deployment {deployment}",
             f"state      {state.name if state else kind}: {(state.message if state else '') or '(no message)'}"]
    task = failed_task_run(client, flow_run.id) if kind in BAD else None
    if task is not None:
        lines.append(f"failed     task run {task.name!r} ({task.state.name})")
        where = f"task run {task.name!r}"
    else:
        where = "the flow run"
    tail = last_log_lines(client, flow_run.id, task.id if task else None, n)
    lines.append(f"last {len(tail)} log lines of {where}:" if tail else f"no log lines of {where}")
    return lines + [f"  {line}" for line in tail]


@app.command()
def show(run: str = typer.Argument(..., help="Flow run id or name, or a training run id."),
         lines: int = typer.Option(20, help="Log lines to print."),
         output_dir: Path = typer.Option(Path("runs"), help="Folder holding the run folders (for a run id)."),
         folder: Path = typer.Option(Path(".serve"), "--dir", help="The stack's folder (its Prefect API).")) -> None:
    """How a flow run ended: its state and message, the failing stage and its last log lines."""
    from prefect.client.orchestration import get_client

    from flows.prefect_home import project_api

    with project_api(folder) as where, get_client(sync_client=True) as client:
        flow_run = find_flow_run(client, run, output_dir)
        if flow_run is None:
            typer.echo(f"no flow run {run!r} in {where}")
            raise typer.Exit(2)
        text = report(client, flow_run, lines)
    typer.echo("\n".join(text))
    if flow_run.state and flow_run.state.type.value in BAD:
        raise typer.Exit(1)
