"""How an attempt of the train flow takes its run folder, and how an attempt that a newer one replaced ends.

An attempt claims the run folder when it starts (``tasks.stores.fence``); every write of its stages is fenced, so
a replaced attempt — a rescheduled dispatched run whose old process was only stalled, or a ``cleaner resume``
started beside the running attempt — stops at its next write with ``FencedError``. It must end visibly without
disturbing the newer attempt: its stage tasks are not retried, and when the newer attempt is the same Prefect flow
run (a reschedule) it aborts without reporting a state, which would overwrite the newer attempt's.
"""

from __future__ import annotations

from pathlib import Path

from tasks.stores import fence


def claim_run(run_dir: Path, run_id: str, flow_run_id: str) -> None:
    """Make this attempt the run folder's only writer (``tasks.stores.fence``), saying which attempt it replaced."""
    from prefect.runtime import flow_run

    token = fence.new_token(flow_run_id, flow_run.get_run_count())
    before = fence.claim(run_dir, run_id, token, flow_run_id)
    if before:
        print(f"run {run_id}: attempt {token} replaces attempt {before.get('attempt')} (pid {before.get('pid')} on "
              f"{before.get('host')}); that one stops at its next write")


def retry_unless_fenced(task, task_run, state) -> bool:
    """A stage task's retry condition: any failure but ``FencedError`` (a replaced attempt must stop, not retry)."""
    try:
        state.result()
    except fence.FencedError:
        return False
    except Exception:  # noqa: BLE001 - every other failure of the stage is retried
        return True
    return True


def newer_attempt(run_dir: Path, flow_run_id: str) -> str | None:
    """Why the end of flow run ``flow_run_id``'s attempt must leave the run's status alone (a newer attempt holds
    ``run_dir``), or None. Asked by the flow hooks: in the attempt's own process, which holds a claim, or in a worker
    that runs the hooks of a killed attempt, which holds none: then another flow run holding the folder is newer."""
    fenced = fence.superseded(run_dir)
    if fenced is not None:
        return str(fenced)
    now = fence.holder(run_dir) if fence.claim_of(run_dir) is None else None
    if now and now.get("flow_run_id") and now["flow_run_id"] != flow_run_id:
        return f"run folder {run_dir}: held by attempt {now.get('attempt')} of another flow run"
    return None


def fenced_end(err: fence.FencedError, flow_run_id: str) -> BaseException:
    """How a replaced attempt ends: its ``FencedError`` (the flow run fails with it), or — when the newer attempt is
    the same flow run, rescheduled — Prefect's ``Abort``, after logging the message: the engine then reports no
    state, which would overwrite the running newer attempt's (and make the compare reschedule it again)."""
    from prefect.exceptions import Abort

    if flow_run_id and err.newer_flow_run == flow_run_id:
        print(f"{err}; the flow run is the newer attempt's now: this attempt aborts without reporting a state")
        return Abort(str(err))
    return err
