"""Dispatch runs as flow runs of a deployment to its work pool, wait for them, reschedule the ones a lost worker
took down: how ``cleaner compare`` fans out over Prefect workers on any number of machines (``compare.dispatch``).

What it simplifies: Prefect's own machinery does the distributing — ``run_deployment`` creates each flow run,
the work pool queues it, whichever worker has a free slot (``prefect worker start --limit N``) runs it. Here
we only keep ``parallel`` runs submitted at a time, show progress, and handle loss:

* each dispatched run emits Prefect flow-run heartbeats every ``heartbeat_s`` (``PREFECT_FLOWS_HEARTBEAT_FREQUENCY``
  through the run's job variables) and carries the tag ``TAG``; a Prefect automation (``ensure_lost_run_automation``,
  the documented zombie-flow recipe limited to that tag) marks such a run Crashed when no heartbeat came for
  ``lost_after_s`` — its machine or worker died, or its process was killed;
* a run that ends Crashed or Failed is set back to Scheduled (what ``prefect flow-run retry`` does), up to
  ``retries`` times: any worker takes it and, the run id being a parameter, the train flow resumes the same
  training run from its run folder (stage cache, same MLflow run, rows replaced by key). A run marked lost may
  still be alive (a stall, not a death): the new attempt claims the run folder and the old one stops at its next
  write, aborting without reporting a state (``tasks.stores.fence``, ``flows.attempts.fenced_end``), so the flow run's
  state stays the new attempt's;
* submissions carry an idempotency key (run id + parameters), so the compare rerun with the same id attaches to
  the flow runs it made before instead of making new ones.

Runs must see the same files wherever they run: the project at the path the deployment was made from, and
``output_dir``, the data files and ``tracking.duckdb_path`` on a shared folder (docs/team.md); the compare checks
the paths and each run checks a token file before it trains (``tasks.stores.shared``). Each dispatched run gets
``CLEANER_ROWS_ONLY=1`` (``tasks.stores.db.ROWS_ONLY_ENV``): it writes row-log units only, and the dispatcher
ingests them into the DuckDB file (``on_poll``), so the file has one writer.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

TAG = "cleaner-dispatched"
AUTOMATION = "cleaner: crash dispatched runs that stopped sending heartbeats"
POLL_S = 3.0
DONE, RETRY = {"COMPLETED"}, {"FAILED", "CRASHED"}


class DispatchError(RuntimeError):
    """A deployment that does not exist, or runs that did not complete after their retries."""


@dataclass
class Job:
    """One run to dispatch: its run id and the deployment's parameters."""

    run_id: str
    parameters: dict
    flow_run_id: str | None = None
    attempts: int = 0
    state: str = "WAITING"
    messages: list[str] = field(default_factory=list)


def idempotency_key(job: Job) -> str:
    digest = hashlib.sha256(json.dumps(job.parameters, sort_keys=True).encode()).hexdigest()[:12]
    return f"{job.run_id}-{digest}"


def check_deployment(name: str) -> dict:
    """The deployment ``flow/deployment`` and its pool's workers; a clear error naming the API when missing."""
    from prefect import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            dep = client.read_deployment_by_name(name)
        except (ObjectNotFound, ValueError) as err:
            raise DispatchError(
                f"compare.dispatch: no deployment {name!r} on the Prefect API {client.api_url} ({type(err).__name__}); "
                "deploy it (`prefect deploy --name <deployment>` from the project folder) and set PREFECT_API_URL "
                "to that server") from None
        workers = client.read_workers_for_work_pool(dep.work_pool_name) if dep.work_pool_name else []
    online = [w.name for w in workers if str(getattr(w.status, "value", w.status)).upper() == "ONLINE"]
    return {"id": str(dep.id), "pool": dep.work_pool_name, "online_workers": online}


def ensure_lost_run_automation(lost_after_s: float) -> str:
    """The automation that marks a dispatched run Crashed after ``lost_after_s`` without a heartbeat (created once,
    by name; updated when ``lost_after_s`` changed); returns its id."""
    from prefect.automations import Automation
    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import ChangeFlowRunState
    from prefect.events.schemas.automations import EventTrigger, Posture
    from prefect.events.schemas.events import ResourceSpecification

    trigger = EventTrigger(
        after={"prefect.flow-run.heartbeat"},
        expect={"prefect.flow-run.heartbeat", "prefect.flow-run.Completed", "prefect.flow-run.Failed",
                "prefect.flow-run.Cancelled", "prefect.flow-run.Crashed"},
        match=ResourceSpecification({"prefect.resource.id": ["prefect.flow-run.*"]}),
        match_related=ResourceSpecification({"prefect.resource.role": "tag", "prefect.resource.id": f"prefect.tag.{TAG}"}),
        for_each={"prefect.resource.id"}, posture=Posture.Proactive, threshold=1,
        within=timedelta(seconds=lost_after_s))
    wanted = Automation(name=AUTOMATION, trigger=trigger, actions=[ChangeFlowRunState(
        state=StateType.CRASHED, message=f"no heartbeat for {lost_after_s:g} s: its worker or machine was lost")])
    from prefect import get_client

    with get_client(sync_client=True) as client:
        found = client.read_automations_by_name(name=AUTOMATION)
        if found and found[0].trigger.within == trigger.within:
            return str(found[0].id)
        for old in found:
            client.delete_automation(old.id)
    return str(wanted.create().id)


def shared_files(cfg) -> dict[str, str | None]:
    """The files of a run config (``flows.config.RunConfig``) that every worker must share: config field → path."""
    return {"output_dir": cfg.output_dir, "data.train_path": cfg.data.train_path,
            "data.eval_path": cfg.data.eval_path, "data.fresh_path": cfg.data.fresh_path,
            "tracking.duckdb_path": cfg.tracking.duckdb_path}


def check_storage(cfg, where: str) -> None:
    """Raise ``StorageError`` listing every relative or machine-local store of ``cfg`` (unless
    ``compare.local_storage``); ``where`` names who checks (the compare, or a dispatched run and its host)."""
    from tasks.stores.shared import StorageError, local_storage

    problems = [] if cfg.compare.local_storage else local_storage(shared_files(cfg), cfg.tracking.mlflow_uri)
    if problems:
        raise StorageError(f"{where}: a dispatched run must share its stores with the compare, and these are not "
                           "shared: " + "; ".join(problems) + ". Set them to a folder every worker mounts at the "
                           "same path (docs/team.md), or set compare.local_storage=true when every worker runs on "
                           "this machine in this folder")


def check_worker(cfg, run_id: str, token: dict[str, str]) -> None:
    """A dispatched run's own check, on its worker, before it trains: the same storage contract as the compare's,
    then the compare's token files and data files seen at their paths (``tasks.stores.shared.verify_token``)."""
    import socket

    from tasks.stores.shared import verify_token

    check_storage(cfg, f"dispatched run {run_id} on host {socket.gethostname()}")
    verify_token(run_id, token)


def _submit(deployment: str, job: Job, heartbeat_s: int) -> None:
    from prefect.deployments import run_deployment

    from tasks.stores.db import ROWS_ONLY_ENV

    run = run_deployment(deployment, parameters=job.parameters, timeout=0, flow_run_name=job.run_id, tags=[TAG],
                         idempotency_key=idempotency_key(job),
                         job_variables={"env": {"PREFECT_FLOWS_HEARTBEAT_FREQUENCY": str(heartbeat_s),
                                                ROWS_ONLY_ENV: "1"}})
    job.flow_run_id, job.state = str(run.id), run.state.type.value if run.state else "SCHEDULED"


def _reschedule(client, job: Job, message: str) -> None:
    from prefect.states import Scheduled

    client.set_flow_run_state(job.flow_run_id, Scheduled(message=message), force=True)
    job.attempts += 1
    job.state = "SCHEDULED"


def run_all(deployment: str, jobs: list[Job], parallel: int, retries: int, heartbeat_s: int,
            echo: Callable[[str], None] = print, on_poll: Callable[[], object] = lambda: None) -> list[Job]:
    """Dispatch ``jobs`` (``parallel`` unfinished at a time), wait for all; raise ``DispatchError`` naming the runs
    that did not complete after ``retries`` reschedules each. ``on_poll`` runs after every poll (the compare
    ingests the runs' rows there)."""
    from prefect import get_client

    waiting, active, ended = list(jobs), [], []
    last = ""
    with get_client(sync_client=True) as client:
        while waiting or active:
            while waiting and len(active) < parallel:
                job = waiting.pop(0)
                _submit(deployment, job, heartbeat_s)
                active.append(job)
            time.sleep(POLL_S)
            on_poll()
            for job in list(active):
                run = client.read_flow_run(job.flow_run_id)
                job.state = run.state.type.value if run.state else "SCHEDULED"
                if job.state in DONE | RETRY | {"CANCELLED"}:
                    message = f"{job.run_id}: {run.state.name} ({run.state.message or 'no message'})"
                    if job.state in RETRY and job.attempts < retries:
                        _reschedule(client, job, f"rescheduled by the compare after {run.state.name}")
                        echo(f"{message}; rescheduled, retry {job.attempts} of {retries}")
                        continue
                    if job.state not in DONE:
                        job.messages.append(message)
                        echo(message)
                    active.remove(job)
                    ended.append(job)
            line = _progress(jobs)
            if line != last:
                echo(line)
                last = line
    failed = [j for j in jobs if j.state not in DONE]
    if failed:
        raise DispatchError(f"{len(failed)} of {len(jobs)} dispatched runs did not complete: "
                            + "; ".join(j.messages[-1] if j.messages else f"{j.run_id}: {j.state}" for j in failed))
    return jobs


def _progress(jobs: list[Job]) -> str:
    counts: dict[str, int] = {}
    for job in jobs:
        counts[job.state.lower()] = counts.get(job.state.lower(), 0) + 1
    retried = sum(j.attempts for j in jobs)
    parts = [f"{n} {state}" for state, n in sorted(counts.items())]
    return f"dispatched runs: {', '.join(parts)} (of {len(jobs)}" + (f"; {retried} retried)" if retried else ")")
