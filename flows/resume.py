"""``cleaner resume`` of a run that a deployment started: retry its flow run through Prefect.

A run started from a deployment (a schedule, the UI, ``prefect deployment run``) records its flow run and deployment
in ``runs/<id>/prefect.json`` (``flows.prepare.write_origin``). Resuming it in a new flow run here would finish the
training but leave the deployment's history with a Crashed run for a run that finished. Instead the flow run itself
is put back to Scheduled — what Prefect's UI Retry and ``prefect flow-run retry`` do — so the deployment's work pool
picks it up, the flow resumes the same run id (stage cache, same MLflow run) and the one flow run ends Completed.

Only terminal flow runs are retried (a Running one is still training somewhere). The Prefect API is the one the
shell is configured with (``PREFECT_API_URL``), else that of the project's running stack (``.serve/pids.json``,
``flows.prefect_home.project_api``); without either there is nothing to retry through, which is an error naming
the flow run (``--local`` resumes here instead).
"""

from __future__ import annotations

import json
from pathlib import Path

TERMINAL = ("COMPLETED", "FAILED", "CANCELLED", "CRASHED")


def deployment_flow_run(run_dir: Path) -> str | None:
    """The flow run that started the run in ``run_dir``, when a deployment created it; else None."""
    path = run_dir / "prefect.json"
    if not path.exists():
        return None
    origin = json.loads(path.read_text())
    return origin.get("flow_run_id") if origin.get("deployment_id") else None


def retry_flow_run(flow_run_id: str) -> str:
    """Put a terminal flow run of a deployment back to Scheduled; returns the state it left. Raises RuntimeError
    with a one-line reason (no API configured, unknown flow run, still active, refused by Prefect)."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound
    from prefect.settings import PREFECT_API_URL
    from prefect.states import Scheduled

    if not PREFECT_API_URL.value():
        raise RuntimeError(f"flow run {flow_run_id} was started by a deployment, but no stack is running here "
                           "(`cleaner serve start`; --dir) and no PREFECT_API_URL is set to retry it through; start "
                           "the stack, or pass --local")
    with get_client(sync_client=True) as client:
        try:
            run = client.read_flow_run(flow_run_id)
        except ObjectNotFound:
            raise RuntimeError(f"flow run {flow_run_id} is unknown to the Prefect API at {PREFECT_API_URL.value()}; "
                               "pass --local to resume in a new flow run") from None
        state = run.state.type.value if run.state else "UNKNOWN"
        if state not in TERMINAL:
            raise RuntimeError(f"flow run {flow_run_id} is {state}: it is still being run, nothing to resume")
        answer = client.set_flow_run_state(flow_run_id, Scheduled(message="cleaner resume"), force=True)
    if answer.status.value != "ACCEPT":
        raise RuntimeError(f"Prefect refused to reschedule flow run {flow_run_id}: {answer.status.value} "
                           f"{answer.details}")
    return state
