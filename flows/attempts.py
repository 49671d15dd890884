"""How an attempt of the train flow takes its run folder, and how an attempt that a newer one replaced ends.

An attempt claims the run folder when it starts (``tasks.stores.fence``); every write of its stages is fenced, so
a replaced attempt — a rescheduled dispatched run whose old process was only stalled, or a ``cleaner resume``
started beside the running attempt — stops at its next write with ``FencedError``. It must end visibly without
disturbing the newer attempt: its stage tasks are not retried, and when the newer attempt is the same Prefect flow
run (a reschedule) it aborts without reporting a state, which would overwrite the newer attempt's. Its end hooks
(``on_crashed``, ``on_cancellation``, ``on_failure``: in its own process, or in the worker that saw it killed) write
nothing once a newer attempt holds the run folder (``ending``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
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


def attempt_number(flow_run) -> int:
    """Which run of ``flow_run`` an end hook is for: its run count, plus one when the copy was read before that run
    started (still Scheduled or Pending: the copy a Prefect runner took when it picked the flow run up, which it
    hands to the on_crashed hooks it runs after the process exited); the engine's own copy is read once running.
    A copy with run count 0 is one read before the first run, whatever its state says (a process worker hands its
    hook subprocess such a copy without a state): every run that started counts from 1."""
    state = getattr(flow_run, "state", None)
    before_start = state is not None and state.type.value in ("SCHEDULED", "PENDING")
    return max(1, int(flow_run.run_count or 0) + (1 if before_start else 0))


def _identity(record: dict) -> tuple[str | None, int | None]:
    """(flow run, run count) of an attempt record: its token is ``<flow run>#<run count>/<random tail>``."""
    head = str(record.get("attempt", "")).rsplit("/", 1)[0]
    flow_run_id, _, count = head.rpartition("#")
    return record.get("flow_run_id") or flow_run_id or None, int(count) if count.isdigit() else None


def _newer(now: dict | None, own: fence.Claim | None, flow_run_id: str, number: int) -> str | None:
    if own is not None:  # this process's attempt claimed the folder: the token itself (with its random tail) says
        if now is None or now.get("attempt") != own.token:
            return str(fence.FencedError(own.run_id, own.token, now))
        return None
    if now is None:
        return None
    holder_run, holder_count = _identity(now)
    if holder_run and holder_run != flow_run_id:
        return f"held by attempt {now.get('attempt')} of another flow run"
    if holder_count is not None and holder_count > number:
        return f"held by attempt {now.get('attempt')}, a newer run of this flow run than the ended one (run {number})"
    return None


@contextmanager
def ending(run_dir: Path, flow_run) -> Iterator[str | None]:
    """For the block of an end hook of ``flow_run``'s attempt: why it must leave the run's status alone (a newer
    attempt holds ``run_dir``), or None — and no claim lands before the block ends (the attempt file's shared lock
    is held), so the hook's writes commit for the attempt it checked.

    Attempts are told apart by their full identity: in the attempt's own process, which holds a claim, by its
    token (flow run, run count and random tail); in a process holding none (a worker running a killed attempt's
    hooks), by flow run and run number (``attempt_number``): another flow run, or a later run of the same one (a
    reschedule), is newer."""
    own = fence.claim_of(run_dir)
    with fence.held(run_dir) as now:
        newer = _newer(now, own, str(flow_run.id), attempt_number(flow_run))
        yield f"run folder {run_dir}: {newer}" if newer and own is None else newer


def fenced_end(err: fence.FencedError, flow_run_id: str) -> BaseException:
    """How a replaced attempt ends: its ``FencedError`` (the flow run fails with it), or — when the newer attempt is
    the same flow run, rescheduled — Prefect's ``Abort``, after logging the message: the engine then reports no
    state, which would overwrite the running newer attempt's (and make the compare reschedule it again)."""
    from prefect.exceptions import Abort

    if flow_run_id and err.newer_flow_run == flow_run_id:
        print(f"{err}; the flow run is the newer attempt's now: this attempt aborts without reporting a state")
        return Abort(str(err))
    return err
