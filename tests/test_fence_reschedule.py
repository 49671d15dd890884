"""A rescheduled flow run's killed attempt: the hooks Prefect's runner runs for it leave the run to the newer run of
the same flow run (issue 50, item 1).

A reschedule is the same flow run with a higher run count: the compare sets it back to Scheduled
(``flows.dispatch``) and a worker runs it again. The flow run here lives on the test Prefect server and goes through
the states a worker's attempts give it: Scheduled → Pending → Running (run 1 claims the run folder) → Scheduled (the
compare's reschedule) → Pending → Running (run 2 claims it). A runner hands the ``on_crashed`` hooks it runs after
an attempt's process exited the copy of the flow run it read when it picked the run up
(``prefect.runner._flow_run_executor``): the test reads those copies from the server at the same moments and runs
the train flow's hooks through the runner's own hook runner (``prefect.runner._hook_runner.HookRunner``). Run 1's
hook must leave the run row and the MLflow run alone; run 2's marks both.
"""

from __future__ import annotations

import subprocess
import sys
import time

import anyio
import pytest
from mlflow import MlflowClient

from tasks.stores import db, fence, rowlog, tracking
from tasks.stores.config import TrackingConfig
from tests.test_fence import ROOT, RUN, _claim_elsewhere, _replace


def _runner_hooks(flow_run, message: str) -> None:
    """The crashed hooks of the train flow, run the way a Prefect runner runs them for an exited process."""
    from prefect.runner._hook_runner import HookRunner
    from prefect.states import Crashed

    from flows.train import train

    async def resolve(_flow_run):
        return train

    anyio.run(HookRunner(resolve_flow=resolve).run_crashed_hooks, flow_run, Crashed(message=message))


def _picked_up_and_started(client, flow_run_id) -> tuple[object, int]:
    """What a worker does with a scheduled flow run: its copy (read now), then Pending and Running; returns the
    copy and the run count the attempt gets."""
    from prefect.states import Pending, Running

    copy = client.read_flow_run(flow_run_id)
    assert copy.state.type.value == "SCHEDULED"
    client.set_flow_run_state(flow_run_id, Pending())
    client.set_flow_run_state(flow_run_id, Running())
    return copy, client.read_flow_run(flow_run_id).run_count


def test_the_old_runs_hook_of_a_rescheduled_flow_run_leaves_the_run_alone(prefect_harness, tmp_path, capsys):
    from prefect import get_client
    from prefect.states import Scheduled

    from flows.train import train

    run_dir, store, mlflow_db = tmp_path / "runs" / RUN, tmp_path / "c.duckdb", tmp_path / "m.db"
    cfg = TrackingConfig(mlflow_uri=f"sqlite:///{mlflow_db}", artifact_root=str(tmp_path / "art"),
                         duckdb_path=str(store))
    mlrun = tracking.open_run(cfg, "tiny", RUN, {}, {})
    db.upsert_run(store, RUN, "tiny", {}, mlrun, "running")
    params = {"config_path": str(ROOT / "configs/tiny.yaml"), "run_id": RUN,
              "overrides": [f"output_dir={run_dir.parent}", f"tracking.duckdb_path={store}",
                            f"tracking.mlflow_uri={cfg.mlflow_uri}"]}
    with get_client(sync_client=True) as client:
        flow_run_id = client.create_flow_run(train, parameters=params, state=Scheduled()).id
        first, count = _picked_up_and_started(client, flow_run_id)
        assert count == 1
        _replace(run_dir, fence.new_token(str(flow_run_id), count), str(flow_run_id))
        client.set_flow_run_state(flow_run_id, Scheduled(message="rescheduled by the compare"), force=True)
        second, count = _picked_up_and_started(client, flow_run_id)
        assert count == 2
        _replace(run_dir, fence.new_token(str(flow_run_id), count), str(flow_run_id))

    _runner_hooks(first, "run 1's process exited with status 1")
    status = rowlog.read_unit(store, RUN, "run")["runs"]["status"].to_list()
    assert status == ["running"], f"run row status after the old attempt's hook: {status[0]}"
    assert MlflowClient(cfg.mlflow_uri).get_run(mlrun).info.status == "RUNNING"
    assert "a newer run of this flow run than the ended one (run 1)" in capsys.readouterr().out

    _runner_hooks(second, "run 2's process exited with status 1")  # the holder's own hook does its job
    assert rowlog.read_unit(store, RUN, "run")["runs"]["status"].to_list() == ["crashed"]
    assert MlflowClient(cfg.mlflow_uri).get_run(mlrun).info.status == "FAILED"


HOOK = """
import pathlib, sys, time
from types import SimpleNamespace
from flows.attempts import ending
with ending(pathlib.Path(sys.argv[1]), SimpleNamespace(id=sys.argv[2], run_count=1, state=None)) as newer:
    print("checked", newer, flush=True)
    time.sleep(float(sys.argv[3]))
"""


def test_an_end_hooks_check_and_writes_are_one_step(tmp_path):
    """While a hook holds ``ending``, a newer attempt's claim waits: it cannot land between the hook's check and
    its writes (and so the hook never marks a run a newer attempt already took)."""
    run_dir = tmp_path / "runs" / RUN
    _replace(run_dir, "f1#1/0badc0de", "f1")
    hook = subprocess.Popen([sys.executable, "-c", HOOK, str(run_dir), "f1", "3"], stdout=subprocess.PIPE,
                            text=True, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    try:
        assert hook.stdout.readline().strip() == "checked None"
        claim = _claim_elsewhere(run_dir, "f1#2/0badf00d", "f1", wait_s=30.0)
        time.sleep(1.0)
        assert claim.poll() is None, "the claim landed while the hook held the run"
        assert fence.holder(run_dir)["attempt"] == "f1#1/0badc0de"
        assert claim.wait(timeout=60) == 0
    finally:
        hook.wait(timeout=60)
    assert fence.holder(run_dir)["attempt"] == "f1#2/0badf00d"


@pytest.mark.parametrize(("holder", "copy_state", "count", "newer"), [
    ("f1#1/aaaaaaaa", "SCHEDULED", 0, False),  # a runner's copy of run 1: the holder is run 1 itself
    ("f1#2/aaaaaaaa", "SCHEDULED", 0, True),  # ... and run 2 holds the folder: newer
    ("f1#2/aaaaaaaa", "CRASHED", 2, False),  # the engine's own copy of run 2
    ("f1#3/aaaaaaaa", "CRASHED", 2, True),
    ("f2#1/aaaaaaaa", "CRASHED", 2, True),  # another flow run
    ("f1#1/aaaaaaaa", None, 0, False),  # a process worker's copy, as its hook subprocess reads it: no state
    ("f1#2/aaaaaaaa", None, 0, True),
])
def test_attempts_are_told_apart_by_flow_run_and_run(tmp_path, holder, copy_state, count, newer):
    from types import SimpleNamespace

    from flows.attempts import ending

    run_dir = tmp_path / "runs" / RUN
    _replace(run_dir, holder, holder.split("#")[0])
    state = SimpleNamespace(type=SimpleNamespace(value=copy_state)) if copy_state else None
    with ending(run_dir, SimpleNamespace(id="f1", run_count=count, state=state)) as why:
        assert (why is not None) is newer, why
