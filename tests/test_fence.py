"""The attempt fence (``tasks.stores.fence``): one writer per run folder.

This process claims a run folder as attempt ``A``; a second process (a real one: ``claim`` in a subprocess) claims
it as ``B``, as a rescheduled or resumed attempt does. Then every write of the train flow into the folder or the
run's row log must raise ``FencedError`` and leave nothing behind: the step files of each stage, the done markers,
the partial-rollout buffer, the checkpoint (copied or trained), the row-log units, the pruning of old checkpoints.
Dropping any one guard fails the test of that write. The lock closes the check-then-write window: a claim waits
for a guarded write in progress, and times out with a clear error when it is held too long.
"""

from __future__ import annotations

import json
import os
import pickle
import socket
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest

from tasks.stores import db, fence, rowlog
from tasks.stores.fence import ATTEMPT, FencedError
from tasks.stores.records import trajectory_frames

ROOT = Path(__file__).resolve().parents[1]
RUN = "r1"
KEYS = {"run_id": [RUN] * 4, "step": [0] * 4, "traj_id": [f"t{i}" for i in range(4)]}
CLAIM = """
import json, sys
from tasks.stores import fence
print(json.dumps(fence.claim(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] or None, float(sys.argv[5]))))
"""


def _claim_elsewhere(run_dir: Path, token: str = "B", flow_run: str = "", wait_s: float = 5.0,
                     **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", CLAIM, str(run_dir), RUN, token, flow_run, str(wait_s)],
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def _replace(run_dir: Path, token: str = "B", flow_run: str = "") -> dict | None:
    """Claim ``run_dir`` from another process; returns the attempt it replaced."""
    proc = _claim_elsewhere(run_dir, token, flow_run)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return json.loads(out)


@pytest.fixture
def run_dir(tmp_path):
    folder = tmp_path / "runs" / RUN
    assert fence.claim(folder, RUN, "A") is None
    (folder / "steps" / "000000").mkdir(parents=True)
    yield folder
    fence.release(folder)


def _message(run_dir: Path) -> str:
    pid = json.loads((run_dir / ATTEMPT).read_text())["pid"]
    return (f"run {RUN}: fenced — attempt B (pid {pid} on {socket.gethostname()}) replaced this attempt A; this "
            "attempt stops without writing")


def test_claim_records_the_attempt_and_names_the_one_it_replaced(run_dir):
    mine = json.loads((run_dir / ATTEMPT).read_text())
    assert (mine["attempt"], mine["pid"], mine["host"]) == ("A", os.getpid(), socket.gethostname())
    assert _replace(run_dir)["attempt"] == "A"
    assert json.loads((run_dir / ATTEMPT).read_text())["attempt"] == "B"
    assert fence.new_token("f1", 2).startswith("f1#2/") and fence.new_token(None, None).startswith("local#0/")
    assert fence.new_token("f1", 2) != fence.new_token("f1", 2)


def test_publish_commits_for_its_attempt_and_never_after_a_replacement(run_dir):
    target = run_dir / "steps" / "000000" / "x.json"
    fence.publish_text(target, "A1")
    assert target.read_text() == "A1" and fence.superseded(run_dir) is None
    _replace(run_dir)
    with pytest.raises(FencedError) as caught:
        fence.publish_text(target, "A2")
    assert str(caught.value) == _message(run_dir)
    assert target.read_text() == "A1"
    assert [p.name for p in target.parent.iterdir()] == ["x.json"], "the fenced write left its temporary file"
    assert str(fence.superseded(run_dir)) == _message(run_dir)


def test_a_process_holds_one_claim_per_run_id(run_dir, tmp_path):
    """A run id trained again in another folder by the same process (another store, a test) is checked there only:
    its row-log units follow the latest claim, and the earlier folder is no longer checked."""
    elsewhere = tmp_path / "other-output" / RUN
    fence.claim(elsewhere, RUN, "A2")
    try:
        assert fence.claim_of_run(RUN).run_dir == str(elsewhere) and fence.claim_of(run_dir) is None
        (run_dir / ATTEMPT).unlink()
        with fence.guarded_run(RUN):
            pass
    finally:
        fence.release(elsewhere)


def test_a_removed_attempt_file_fences_too(run_dir):
    (run_dir / ATTEMPT).unlink()
    with pytest.raises(FencedError, match="no attempt \\(the attempt file is gone"):
        fence.check(run_dir / "steps")


def test_writes_outside_a_claimed_folder_are_not_checked(run_dir, tmp_path):
    other = tmp_path / "runs" / "r2"
    other.mkdir()
    (other / ATTEMPT).write_text(json.dumps({"attempt": "someone else"}))
    _replace(run_dir)
    assert fence.publish_text(other / "f.txt", "ok").read_text() == "ok"
    (tmp_path / "runs" / "r10").mkdir()
    assert fence.publish_text(tmp_path / "runs" / "r10" / "f.txt", "ok").read_text() == "ok"  # a prefix, not a child


def _inputs(step: Path, kept: bool = True) -> None:
    """A step folder's stage inputs: 4 rows of one prompt, rewards 1, 0, 0, 0 (an informative group)."""
    pl.DataFrame({**KEYS, "prompt_id": ["a"] * 4, "raw": [False] * 4, "rollbacks_recovered": [0] * 4,
                  "data_source": ["math"] * 4, "response_text": ["\\boxed{3}", "\\boxed{4}", "", ""],
                  "ground_truth": ["3"] * 4, "num_turns": [1] * 4, "prompt_ids": [[1, 2]] * 4, "response_ids": [[3, 4]] * 4,
                  "response_mask": [[1, 1]] * 4, "messages": ['[{"role": "assistant", "content": "x"}]'] * 4}
                 ).write_parquet(step / "trajectories.parquet")
    trajectory_frames([], "r1", 0, str)["executions"].write_parquet(step / "executions.parquet")
    pl.DataFrame({**KEYS, "reward": [1.0, 0.0, 0.0, 0.0], "graded": [True] * 4,
                  "correct": [True, False, False, False]}).write_parquet(step / "scores.parquet")
    pl.DataFrame({**KEYS, "kept": [kept] * 4, "adv_scale": [1.0] * 4}).write_parquet(step / "mix.parquet")
    pl.DataFrame({**KEYS, "advantage": [1.5, -0.5, -0.5, -0.5], "dropped": [False] * 4}).write_parquet(
        step / "advantages.parquet")
    (step / "mix.metrics.json").write_text(json.dumps({"mix/groups": 1}))


def _marker(step: Path) -> None:
    from tasks.training.stages import _timed

    with _timed(step, "rollout", {}):
        pass


def _tables(step: Path) -> None:
    from tasks.stores.records import write_frames

    write_frames({"turns": pl.DataFrame({"a": [1]})}, step)


def _scores(step: Path) -> None:
    from tasks.rewards.config import RewardConfig, ScoreConfig
    from tasks.rewards.scoring import score_step

    score_step(step, RewardConfig(), ScoreConfig(), 16)


def _mix(step: Path) -> None:
    from tasks.training.config import MixConfig
    from tasks.training.mixing import mix_step

    mix_step(step, MixConfig())


def _advantages(step: Path) -> None:
    from tasks.training.config import MixConfig
    from tasks.training.mixing import advantage_step

    advantage_step(step, MixConfig())


def _buffer(step: Path) -> None:
    from tasks.rollout.buffer import write_buffer
    from tasks.training.partial_stage import partial_rollout  # the stage passes the fence's publish

    assert "fence.publish" in Path(sys.modules[partial_rollout.__module__].__file__).read_text()
    write_buffer(step, pl.DataFrame({"position": [0]}), 3, fence.publish)


def _logged(step: Path) -> None:
    from tasks.training.stages import _mark_logged

    _mark_logged(step, "policy_000001")


def _copied_checkpoint(step: Path, warm: Path) -> None:
    from models.config import TrainerConfig
    from tasks.training.setups import UpdateSetup
    from tasks.training.stages import update_stage

    (step / "mix.parquet").unlink()
    pl.DataFrame({**KEYS, "kept": [False] * 4, "adv_scale": [1.0] * 4}).write_parquet(step / "mix.parquet")
    update_stage(step, str(warm), step.parents[1] / "checkpoints" / "policy_000001",
                 UpdateSetup(trainer=TrainerConfig(), seed=0))


def _trained_checkpoint(step: Path, warm: Path) -> None:
    from models.config import TrainerConfig
    from tasks.training.setups import UpdateSetup
    from tasks.training.stages import update_stage

    update_stage(step, str(warm), step.parents[1] / "checkpoints" / "policy_000001",
                 UpdateSetup(trainer=TrainerConfig(micro_batch=4, mini_batches=1), seed=0))


WRITES = {"done marker": _marker, "step tables": _tables, "scores": _scores, "mix": _mix, "advantages": _advantages,
          "partial buffer": _buffer, "logged marker": _logged}
CHECKPOINTS = {"copied checkpoint": _copied_checkpoint, "trained checkpoint": _trained_checkpoint}


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != ATTEMPT}


@pytest.mark.parametrize("write", WRITES)
def test_every_step_file_write_is_fenced(run_dir, write):
    step = run_dir / "steps" / "000000"
    _inputs(step)
    WRITES[write](step)  # the claimant writes
    _inputs(step)
    _replace(run_dir)
    before = _snapshot(run_dir)
    with pytest.raises(FencedError, match="fenced — attempt B"):
        WRITES[write](step)
    assert _snapshot(run_dir) == before


@pytest.mark.parametrize("write", CHECKPOINTS)
def test_checkpoint_writes_are_fenced(run_dir, write, warm_model_dir):
    step = run_dir / "steps" / "000000"
    _inputs(step)
    _replace(run_dir)
    with pytest.raises(FencedError, match="fenced — attempt B"):
        CHECKPOINTS[write](step, warm_model_dir)
    assert not (run_dir / "checkpoints").exists() or not list((run_dir / "checkpoints").iterdir()), \
        "the fenced attempt left a checkpoint or its temporary folder"
    fence.release(run_dir)
    CHECKPOINTS[write](step, warm_model_dir)  # the same write, unfenced, makes one: the guard stopped it above
    assert (run_dir / "checkpoints" / "policy_000001" / "trainer_state.json").exists()


def test_row_log_units_are_fenced(run_dir, tmp_path):
    store = tmp_path / "c.duckdb"
    db.upsert_run(store, RUN, "tiny", {}, "ml1", "running")
    db.replace_eval(store, RUN, 0, "ckpt", {"eval/x": 1.0})
    _replace(run_dir)
    before = {str(p): p.read_bytes() for p in rowlog.rows_dir(store).rglob("*") if p.is_file()}
    for write in (lambda: db.set_status(store, RUN, "failed"), lambda: db.replace_eval(store, RUN, 0, "c", {"e": 2.0}),
                  lambda: db.replace_step(store, RUN, 0, {"metrics": pl.DataFrame(
                      {"run_id": [RUN], "step": [0], "key": ["k"], "value": [1.0]})})):
        with pytest.raises(FencedError, match="fenced — attempt B"):
            write()
    assert {str(p): p.read_bytes() for p in rowlog.rows_dir(store).rglob("*") if p.is_file()} == before
    assert rowlog.read_unit(store, RUN, "run")["runs"]["status"].to_list() == ["running"]
    db.upsert_run(store, "another-run", "tiny", {}, "ml2", "running")  # another run's units are not this fence's


def test_pruning_is_fenced(run_dir):
    from flows.train import RunInfo, _prune

    for v in range(3):
        (run_dir / "checkpoints" / f"policy_{v:06d}").mkdir(parents=True)
    info = RunInfo(RUN, str(run_dir), "ml", "start")
    _replace(run_dir)
    with pytest.raises(FencedError):
        _prune(info, 1, run_dir / "checkpoints" / "policy_000000")
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [f"policy_{v:06d}" for v in range(3)]


def test_pruning_removes_the_temporary_checkpoints_other_processes_left(run_dir):
    from flows.train import RunInfo, _prune

    ckpts = run_dir / "checkpoints"
    for name in ("policy_000000", "policy_000001", ".policy_000001.999999-0badc0de.tmp",
                 f".policy_000002.{os.getpid()}-12345678.tmp"):
        (ckpts / name).mkdir(parents=True)
    _prune(RunInfo(RUN, str(run_dir), "ml", "start"), 1, ckpts / "policy_000001")
    assert sorted(p.name for p in ckpts.iterdir()) == [f".policy_000002.{os.getpid()}-12345678.tmp", "policy_000001"]


def test_a_claim_waits_for_a_guarded_write_in_progress(run_dir):
    with fence.guarded(run_dir / "steps"):
        waiting = _claim_elsewhere(run_dir)
        time.sleep(1.0)
        assert waiting.poll() is None, "the claim landed inside a guarded write: the check-then-write window is open"
        assert json.loads((run_dir / ATTEMPT).read_text())["attempt"] == "A"
    assert waiting.wait(timeout=60) == 0
    with pytest.raises(FencedError):
        fence.check(run_dir)


def test_a_claim_held_off_too_long_fails_clearly(run_dir):
    with fence.guarded(run_dir / "steps"):
        proc = _claim_elsewhere(run_dir, wait_s=0.3)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert "attempt: still locked by a write of the attempt being replaced after 0.3 s" in err
    fence.check(run_dir)  # A still holds the folder


def test_a_replaced_attempt_of_the_same_flow_run_aborts_without_a_state(run_dir):
    from prefect.exceptions import Abort

    from flows.attempts import fenced_end

    _replace(run_dir, flow_run="flow-1")
    err = fence.superseded(run_dir)
    assert err.newer_flow_run == "flow-1"
    ending = fenced_end(err, "flow-1")
    assert isinstance(ending, Abort) and str(ending) == str(err)
    assert fenced_end(err, "flow-2") is err  # another flow run's attempt: this one fails with the fencing error


def test_an_aborted_attempt_leaves_the_flow_run_state_to_the_newer_attempt(prefect_harness):
    """What ``Abort`` buys: the engine reports no state, so the flow run stays Running (the newer attempt's)
    instead of turning Failed, which the compare would reschedule once more, fencing the newer attempt in turn."""
    from prefect import flow, get_client
    from prefect.exceptions import Abort
    from prefect.runtime import flow_run

    from flows.attempts import fenced_end

    seen = []

    @flow
    def attempt():
        seen.append(str(flow_run.get_id()))
        raise fenced_end(FencedError(RUN, "A", {"attempt": "B", "flow_run_id": seen[0]}), seen[0])

    with pytest.raises(Abort, match="fenced — attempt B"):
        attempt()
    with get_client(sync_client=True) as client:
        assert client.read_flow_run(seen[0]).state.type.value == "RUNNING"


def test_stage_tasks_do_not_retry_a_fenced_attempt():
    from prefect.states import Failed

    from flows.attempts import retry_unless_fenced
    from flows.train import STAGE

    assert STAGE["retry_condition_fn"] is retry_unless_fenced
    assert retry_unless_fenced(None, None, Failed(data=FencedError(RUN, "A", {"attempt": "B"}))) is False
    assert retry_unless_fenced(None, None, Failed(data=OSError("disk full"))) is True
    err = FencedError(RUN, "A", {"attempt": "B", "flow_run_id": "f"})
    back = pickle.loads(pickle.dumps(err))  # how Prefect stores a failed task's exception, then reads it back
    assert type(back) is FencedError and str(back) == str(err) and back.newer_flow_run == "f"


def test_the_end_hooks_of_a_replaced_attempt_leave_the_run_to_the_newer_one(run_dir, tmp_path, capsys):
    from types import SimpleNamespace

    from flows.train import _ended

    store = tmp_path / "c.duckdb"
    overrides = [f"output_dir={run_dir.parent}", f"tracking.duckdb_path={store}",
                 f"tracking.mlflow_uri=sqlite:///{tmp_path / 'never.db'}"]
    db.upsert_run(store, RUN, "tiny", {}, "ml1", "running")
    _replace(run_dir)
    flow_run = SimpleNamespace(id="f", name="n", run_count=1, state=None, parameters={
        "config_path": str(ROOT / "configs/tiny.yaml"), "overrides": overrides, "run_id": RUN})
    _ended("FAILED", "failed")(None, flow_run, None)
    assert rowlog.read_unit(store, RUN, "run")["runs"]["status"].to_list() == ["running"]
    assert not (tmp_path / "never.db").exists(), "the replaced attempt touched the MLflow run"
    assert "the run's status is left to the newer attempt" in capsys.readouterr().out


def test_a_workers_end_hook_for_a_killed_attempt_leaves_the_run_to_another_flow_runs_attempt(tmp_path, capsys):
    """The worker runs the hooks of an attempt it saw killed, in a process that holds no claim: the attempt file
    naming another flow run says a newer attempt holds the run."""
    from types import SimpleNamespace

    from flows.attempts import ending
    from flows.train import _ended

    run_dir, store = tmp_path / "runs" / RUN, tmp_path / "c.duckdb"
    db.upsert_run(store, RUN, "tiny", {}, "ml1", "running")
    _replace(run_dir, token="flow-2#1/0badc0de", flow_run="flow-2")
    with ending(run_dir, SimpleNamespace(id="flow-2", run_count=1, state=None)) as newer:
        assert newer is None  # its own flow run's attempt: the hook does its job
    overrides = [f"output_dir={run_dir.parent}", f"tracking.duckdb_path={store}",
                 f"tracking.mlflow_uri=sqlite:///{tmp_path / 'never.db'}"]
    flow_run = SimpleNamespace(id="flow-1", name="n", run_count=1, state=None, parameters={
        "config_path": str(ROOT / "configs/tiny.yaml"), "overrides": overrides, "run_id": RUN})
    _ended("FAILED", "crashed")(None, flow_run, None)
    assert rowlog.read_unit(store, RUN, "run")["runs"]["status"].to_list() == ["running"]
    assert not (tmp_path / "never.db").exists()
    assert "held by attempt flow-2#1/0badc0de of another flow run" in capsys.readouterr().out


def test_the_guard_costs_one_small_read(run_dir, monkeypatch):
    """A guarded write reads the attempt file once (at most 4 KiB, under its lock); an unclaimed folder's write reads
    nothing. The guard's cost beside an unguarded rename of the same file is printed (not a timed assertion)."""
    reads = []
    real_pread = os.pread
    monkeypatch.setattr(fence.os, "pread", lambda fd, n, at: reads.append(n) or real_pread(fd, n, at))
    target = run_dir / "steps" / "000000" / "f"
    n = 300
    t0 = time.perf_counter()
    for _ in range(n):
        fence.publish_text(target, "x")
    guarded = time.perf_counter() - t0
    assert reads == [4096] * n
    fence.release(run_dir)
    t0 = time.perf_counter()
    for _ in range(n):
        fence.publish_text(target, "x")
    plain = time.perf_counter() - t0
    assert len(reads) == n and target.read_text() == "x"
    print(f"publish: {guarded / n * 1e6:.0f} µs guarded, {plain / n * 1e6:.0f} µs unguarded "
          f"({guarded / plain:.2f}×)")
