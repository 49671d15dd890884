"""A paused attempt resumed after its replacement ran leaves one consistent copy (issue 38, item 2).

The first attempt of a run stops itself (SIGSTOP, ``CLEANER_PAUSE_AT=in_update@0``: after its first optimizer
step, before its checkpoint is written) — a machine or network stall long enough for the compare to reschedule
the run. A second attempt of the same run id then trains the run to the end, as the rescheduled flow run does on
another worker. Resumed (SIGCONT), the first attempt must stop with the fencing error at its next write, and the
run folder and the run's row log must be exactly what the replacement left: no file rewritten, the store equal
to the row log, the run ``finished`` in both stores.

Why processes and not a served Prefect stack: the fence depends only on the run folder's ``attempt`` file,
which every attempt of the train flow claims when it starts, whoever starts it; a reschedule's replacement is
such an attempt (the same flow run, a newer run count, on any worker). What differs for a rescheduled flow run —
the replaced attempt aborts without reporting a state instead of failing its flow run — is
``tests/test_fence.py::test_a_replaced_attempt_of_the_same_flow_run_aborts_without_a_state``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tasks.stores import rowlog
from tasks.stores.fence import ATTEMPT
from tasks.stores.tracking import RUN_TAG
from tasks.training.faults import ENV, PAUSE_ENV
from tests import storecheck

ROOT = Path(__file__).resolve().parents[1]
RUN = "fenced"


def _cmd(work: Path, model: Path) -> list[str]:
    sets = [f"model.path={model}", f"output_dir={work / 'runs'}", "train.steps=1",
            f"data.train_path={work / 'tr.parquet'}", f"data.eval_path={work / 'ev.parquet'}",
            "data.n_train=16", "data.n_eval=4", "data.prompts_per_step=2", "data.refill_rounds=3",
            "rollout.n_samples=4", "train.eval_every=0", "rollout.max_new_tokens=48", "trainer.lr=1e-3",
            f"tracking.mlflow_uri=sqlite:///{work / 'm.db'}", f"tracking.artifact_root={work / 'art'}",
            f"tracking.duckdb_path={work / 'c.duckdb'}"]
    cmd = [sys.executable, "-m", "flows.cli", "train", "--config", str(ROOT / "configs/tiny.yaml"), "--run-id", RUN]
    for s in sets:
        cmd += ["--set", s]
    return cmd


def _env(pause: str | None) -> dict[str, str]:
    from prefect.settings import PREFECT_API_URL

    env = {**os.environ, "PYTHONPATH": str(ROOT), "PREFECT_API_URL": PREFECT_API_URL.value()}
    env.pop(ENV, None)
    env.pop(PAUSE_ENV, None)
    if pause:
        env[PAUSE_ENV] = pause
    return env


def _stopped(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"


def _wait_stopped(proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not _stopped(proc.pid):
        if proc.poll() is not None:
            pytest.fail(f"the first attempt ended (rc {proc.returncode}) before its pause point:\n"
                        f"{proc.communicate()[0][-3000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail("the first attempt never reached its pause point")
        time.sleep(0.2)


def _files(*folders: Path) -> dict[str, tuple[int, int, int]]:
    """Every file under ``folders``: (inode, size, mtime in ns) — a rewrite changes one of them."""
    out = {}
    for folder in folders:
        for p in sorted(folder.rglob("*")):
            if p.is_file():
                st = p.stat()
                out[str(p)] = (st.st_ino, st.st_size, st.st_mtime_ns)
    return out


def _flow_runs(work: Path) -> list:
    """The two attempts' flow runs on the test server, oldest first."""
    from prefect import get_client

    with get_client(sync_client=True) as client:
        runs = [r for r in client.read_flow_runs(limit=200)
                if r.parameters.get("run_id") == RUN and str(work) in json.dumps(r.parameters)]
    return sorted(runs, key=lambda r: r.created)


def _flow_run_states(work: Path) -> list[str]:
    return [r.state.type.value for r in _flow_runs(work)]


def _flow_run_messages(work: Path) -> list[str]:
    return [r.state.message or "" for r in _flow_runs(work)]


@pytest.mark.slow
def test_a_paused_attempt_resumed_after_its_replacement_finished_is_fenced(prefect_harness, warm_model_dir,
                                                                           tmp_path):
    first = subprocess.Popen(_cmd(tmp_path, warm_model_dir), cwd=tmp_path, env=_env("in_update@0"),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_stopped(first, 600)
        run_dir = tmp_path / "runs" / RUN
        first_token = json.loads((run_dir / ATTEMPT).read_text())
        assert first_token["pid"] == first.pid

        second = subprocess.run(_cmd(tmp_path, warm_model_dir), cwd=tmp_path, env=_env(None), capture_output=True,
                                text=True, timeout=900)
        assert second.returncode == 0, second.stderr[-3000:]
        assert f"replaces attempt {first_token['attempt']}" in second.stdout + second.stderr
        units = rowlog.rows_dir(tmp_path / "c.duckdb") / "runs" / RUN
        before = _files(run_dir, units)
        assert any("policy_000001" in p for p in before), "the replacement wrote no checkpoint"
    finally:
        os.kill(first.pid, signal.SIGCONT)
    out, _ = first.communicate(timeout=600)

    assert first.returncode != 0, out[-3000:]
    newer = json.loads((run_dir / ATTEMPT).read_text())
    assert f"run {RUN}: fenced — attempt {newer['attempt']}" in out
    assert f"replaced this attempt {first_token['attempt']}; this attempt stops without writing" in out
    after = _files(run_dir, units)
    assert {p: after.get(p) for p in before} == before, "the fenced attempt rewrote or removed a file"
    added = sorted(set(after) - set(before))
    # Prefect's record of the failed task (its exception, under a random key: no stage's cache key) is all it adds
    assert all(Path(p).parent == run_dir / "results" and re.fullmatch("[0-9a-f]{32}", Path(p).name)
               for p in added), added
    assert not [p for p in run_dir.rglob(".*") if p.name.endswith(".tmp")], "a temporary file was left behind"

    assert _flow_run_states(tmp_path) == ["FAILED", "COMPLETED"]
    assert f"FencedError: run {RUN}: fenced — attempt {newer['attempt']}" in _flow_run_messages(tmp_path)[0]

    assert storecheck.differences(tmp_path / "c.duckdb", [RUN]) == {}
    assert rowlog.read_unit(tmp_path / "c.duckdb", RUN, "run")["runs"]["status"].to_list() == ["finished"]
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'm.db'}")
    runs = client.search_runs([client.get_experiment_by_name("tiny").experiment_id],
                              filter_string=f"tags.`{RUN_TAG}` = '{RUN}'")
    assert [r.info.status for r in runs] == ["FINISHED"]
