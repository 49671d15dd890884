"""Crash-proven resume: SIGKILL the training process at every named crash point, rerun, compare.

One run is killed at each point in turn (each rerun gets one stage further before the next
kill); afterwards there must be exactly one MLflow run, no duplicate metric steps, no
duplicate DuckDB rows, and a final checkpoint equal to an uninterrupted run's, which runs alongside the killed
ones on the same stores. The processes share the session's Prefect test server, so each start is cheap.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from mlflow.tracking import MlflowClient
from safetensors.torch import load_file

from tasks.stores.tracking import RUN_TAG, STEP_SENTINEL
from tasks.training.faults import ENV, POINTS
from tests import storecheck

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def _cmd(work: Path, model: Path, run_id: str) -> list[str]:
    sets = [f"model.path={model}", f"output_dir={work / 'runs'}", "train.steps=2",
            f"data.train_path={work / 'tr.parquet'}", f"data.eval_path={work / 'ev.parquet'}",
            "data.n_train=32", "data.n_eval=4", "data.prompts_per_step=4", "data.refill_rounds=3", "rollout.n_samples=4", "train.eval_every=0",
            "rollout.max_new_tokens=64", "trainer.lr=1e-3",
            f"tracking.mlflow_uri=sqlite:///{work / 'm.db'}", f"tracking.artifact_root={work / 'art'}",
            f"tracking.duckdb_path={work / 'c.duckdb'}"]
    cmd = [sys.executable, "-m", "flows.cli", "train", "--config", str(ROOT / "configs/tiny.yaml"), "--run-id", run_id]
    for s in sets:
        cmd += ["--set", s]
    return cmd


def _start(work: Path, model: Path, run_id: str, crash: str | None) -> subprocess.Popen:
    from prefect.settings import PREFECT_API_URL

    env = {**os.environ, "PYTHONPATH": str(ROOT), "PREFECT_API_URL": PREFECT_API_URL.value()}
    env.pop(ENV, None)
    if crash:
        env[ENV] = crash
    return subprocess.Popen(_cmd(work, model, run_id), cwd=work, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _wait(proc: subprocess.Popen) -> subprocess.CompletedProcess:
    try:
        out, err = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _run(work: Path, model: Path, run_id: str, crash: str | None) -> subprocess.CompletedProcess:
    return _wait(_start(work, model, run_id, crash))


def _weights(work: Path, run_id: str) -> dict:
    return load_file(work / "runs" / run_id / "checkpoints" / "policy_000002" / "model.safetensors")


def test_kill_at_every_crash_point_then_resume(prefect_harness, warm_model_dir, tmp_path):
    # the update's points at step 0, whose groups are informative (at step 1 every group of this seed has equal
    # rewards, the update is skipped and in_update would never fire); after_log at step 1 crosses a step boundary
    chain = [f"{p}@{0 if p != 'after_log' else 1}" for p in POINTS]
    # the uninterrupted reference runs meanwhile, another writer on the same stores (as two users' runs would be)
    reference = _start(tmp_path, warm_model_dir, "reference", None)
    try:
        for crash in chain:
            proc = _run(tmp_path, warm_model_dir, "crashy", crash)
            assert proc.returncode == -9, f"{crash}: expected SIGKILL, got {proc.returncode}\n{proc.stderr[-2000:]}"
        done = _run(tmp_path, warm_model_dir, "crashy", None)
        assert done.returncode == 0, done.stderr[-3000:]
    finally:
        ref = _wait(reference)
    assert ref.returncode == 0, ref.stderr[-3000:]

    a, b = _weights(tmp_path, "crashy"), _weights(tmp_path, "reference")
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
    state0 = load_file(warm_model_dir / "model.safetensors")
    assert any(not (a[k] == state0[k]).all() for k in a), "the policy never changed: nothing was compared"

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'm.db'}")
    exp = client.get_experiment_by_name("tiny")
    runs = client.search_runs([exp.experiment_id], filter_string=f"tags.`{RUN_TAG}` = 'crashy'")
    assert len(runs) == 1
    for key in (STEP_SENTINEL, "rollout/accuracy", "time/update_s"):
        assert sorted(m.step for m in client.get_metric_history(runs[0].info.run_id, key)) == [0, 1], key

    con = duckdb.connect(str(tmp_path / "c.duckdb"), read_only=True)
    rows = dict(con.execute("SELECT step, count(*) FROM trajectories WHERE run_id = 'crashy' GROUP BY step").fetchall())
    assert rows == {0: 16, 1: 16}
    same = con.execute("""SELECT count(*) FROM trajectories a JOIN trajectories b USING (step, traj_id)
                          WHERE a.run_id = 'crashy' AND b.run_id = 'reference' AND a.reward IS NOT DISTINCT FROM b.reward
                          AND a.response_ids = b.response_ids""").fetchone()[0]
    assert same == 32
    assert con.execute("SELECT count(*) FROM metrics WHERE run_id = 'crashy'").fetchone()[0] > 0
    con.close()
    assert storecheck.differences(tmp_path / "c.duckdb", ["crashy", "reference"]) == {}


def _bare(cmd: list[str], work: Path, home: str, crash: str | None = None) -> tuple[int, str]:
    """The CLI as a user's shell runs it: no Prefect server (an ephemeral one), its own PREFECT_HOME.
    A killed CLI leaves its ephemeral Prefect server behind: the whole process group is stopped afterwards."""
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", ENV)}
    env.update(PYTHONPATH=str(ROOT), PREFECT_HOME=str(work / home), **({ENV: crash} if crash else {}))
    log = work / f"{home}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=900)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    return code, log.read_text()


def test_resume_from_a_bare_cli_with_another_prefect_home_skips_finished_stages(warm_model_dir, tmp_path):
    code, out = _bare(_cmd(tmp_path, warm_model_dir, "bare"), tmp_path, "home-a", crash="after_update@0")
    assert code == -9, out[-2000:]
    step0 = tmp_path / "runs" / "bare" / "steps" / "000000"
    # the crash hit inside the update task (after its files, before Prefect recorded its result): update reruns,
    # the four stages before it must not
    before = {p.name: p.stat().st_mtime_ns for p in step0.iterdir() if not p.name.startswith("update")}
    assert {"rollout.metrics.json", "advantage.metrics.json"} <= before.keys() and "logged.json" not in before
    code, out = _bare([sys.executable, "-m", "flows.cli", "resume", "bare", "--output-dir", str(tmp_path / "runs")],
                      tmp_path, "home-b")
    assert code == 0, out[-3000:]
    after = {p.name: p.stat().st_mtime_ns for p in step0.iterdir() if p.name in before}
    assert after == before, "a finished stage of step 0 was recomputed"
    assert (step0 / "logged.json").exists() and (tmp_path / "runs" / "bare" / "results").is_dir()
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'm.db'}")
    runs = client.search_runs([client.get_experiment_by_name("tiny").experiment_id],
                              filter_string=f"tags.`{RUN_TAG}` = 'bare'")
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert sorted(m.step for m in client.get_metric_history(runs[0].info.run_id, STEP_SENTINEL)) == [0, 1]
    con = duckdb.connect(str(tmp_path / "c.duckdb"), read_only=True)
    try:
        assert con.execute("SELECT status FROM runs WHERE run_id = 'bare'").fetchone() == ("finished",)
        assert dict(con.execute("SELECT step, count(*) FROM trajectories WHERE run_id = 'bare' GROUP BY step")
                    .fetchall()) == {0: 16, 1: 16}
    finally:
        con.close()
