"""Store failures are clear errors, raised before any work, and never corrupt what exists.

* MLflow server unreachable → ``TrackingUnavailable`` naming the URL (library and CLI);
* the DuckDB file held by another process (a writer or a read-only notebook) → opening it waits up to
  ``db.LOCK_WAIT_S`` (another ingest ends), then ``StoreLockedError`` naming it; training is not held up
  (runs write the row log, docs/store.md); a tracking server that dies mid-run fails after ``tracking.http_retries``;
* a crash while a checkpoint is written → the previous checkpoint still loads.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tasks.stores import db, rowlog, tracking
from tasks.stores.config import TrackingConfig
from tests.flowrun import tiny_overrides

ROOT = Path(__file__).resolve().parents[1]


def closed_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_check_server_names_the_url():
    url = f"http://127.0.0.1:{closed_port()}"
    with pytest.raises(tracking.TrackingUnavailable, match=f"tracking.mlflow_uri: MLflow server {url} is unreachable"):
        tracking.check_server(url, timeout_s=2.0)


def test_open_run_fails_before_creating_anything(tmp_path):
    url = f"http://127.0.0.1:{closed_port()}"
    cfg = TrackingConfig(mlflow_uri=url, artifact_root=str(tmp_path / "art"))
    with pytest.raises(tracking.TrackingUnavailable, match=url):
        tracking.open_run(cfg, "exp", "run", {"a": 1}, {})
    assert not (tmp_path / "art").exists()


def test_cli_train_exits_with_the_url_before_any_rollout(warm_model_dir, tmp_path):
    url = f"http://127.0.0.1:{closed_port()}"
    args = [a for o in tiny_overrides(tmp_path, warm_model_dir, steps=1) for a in ("--set", o)]
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_HOME": str(tmp_path / "prefect")}
    done = subprocess.run(
        [sys.executable, "-m", "flows.cli", "train", "--config", "configs/tiny.yaml", *args,
         "--set", f"tracking.mlflow_uri={url}", "--run-id", "nomlflow"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    out = done.stdout + done.stderr
    assert done.returncode != 0, out[-2000:]
    assert f"MLflow server {url} is unreachable" in out, out[-2000:]
    assert "Traceback" not in out, out[-2000:]
    assert not list(tmp_path.rglob("rollout.metrics.json")), "a rollout ran although MLflow was down"
    assert not (tmp_path / "cleaner.duckdb").exists()


HOLDER = """
import sys, time, duckdb
duckdb.connect(sys.argv[1]).execute("CREATE TABLE IF NOT EXISTS t (x INT)").close()
con = duckdb.connect(sys.argv[1], read_only=sys.argv[2] == "ro")
print("holding", flush=True)
time.sleep(120)
"""


def _hold(path: Path, mode: str) -> subprocess.Popen:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(path), mode, "notebook-marker"],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "holding"
    return holder


@pytest.mark.parametrize("mode", ["rw", "ro"])
def test_duckdb_held_by_another_process_names_it(tmp_path, mode):
    path = tmp_path / "held.duckdb"
    holder = _hold(path, mode)
    try:
        with pytest.raises(db.StoreLockedError) as err:
            db.connect(path, wait_s=0.5)
        msg = str(err.value)
        assert msg.startswith(f"tracking.duckdb_path: {path} is open in PID {holder.pid} (")
        assert "(waited 0.5 s)" in msg
        assert "notebook-marker" in msg and "\n" not in msg and "even a read-only one" in msg
        assert "writer" not in msg
    finally:
        holder.kill()
        holder.wait(timeout=30)
    db.connect(path).close()


def test_a_session_held_briefly_elsewhere_is_waited_for(tmp_path):
    """Parallel runs on one store: a file another process holds for 1 s opens once it is released."""
    path = tmp_path / "brief.duckdb"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER.replace("time.sleep(120)", "time.sleep(1)"), str(path),
                               "rw"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        start = time.monotonic()
        db.connect(path, wait_s=30).close()
        assert 0.5 < time.monotonic() - start < 30  # it waited for the holder, which slept 1 s
    finally:
        holder.kill()
        holder.wait(timeout=30)


def test_cli_train_with_the_store_held_by_a_notebook_trains_and_its_rows_arrive_later(warm_model_dir, tmp_path):
    """A notebook holding the store (read-only) blocks no run: training writes the row log and finishes; a query
    while the notebook holds the file names it; once it is closed, the query ingests the run's rows."""
    store = tmp_path / "cleaner.duckdb"
    holder = _hold(store, "ro")
    try:
        args = [a for o in tiny_overrides(tmp_path, warm_model_dir, steps=1) for a in ("--set", o)]
        env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_HOME": str(tmp_path / "prefect")}
        done = subprocess.run([sys.executable, "-m", "flows.cli", "train", "--config", "configs/tiny.yaml", *args,
                               "--run-id", "held"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=400,
                              check=False)
        out = (done.stdout + done.stderr).strip()
        assert done.returncode == 0, out[-2000:]
        assert "run held finished" in out
        assert rowlog.pending(store), "the rows reached a file the notebook holds"
        with pytest.raises(db.StoreLockedError, match=f"is open in PID {holder.pid} "):
            db.query(store, "SELECT count(*) FROM trajectories")
    finally:
        holder.kill()
        holder.wait(timeout=30)
    # data.prompts_per_step=4 × rollout.n_samples=4 trajectories in step 0; the run row says finished
    assert db.query(store, "SELECT count(*) FROM trajectories WHERE run_id = 'held'").item() == 16
    assert db.query(store, "SELECT status FROM runs WHERE run_id = 'held'").item() == "finished"
    assert not rowlog.pending(store)


def test_dead_tracking_server_fails_the_stage_after_bounded_retries(tmp_path):
    """MLflow's client retries 7 times with factor 2 (~4 min here); ours ``http_retries`` times, then names the key."""
    import time

    url = f"http://127.0.0.1:{closed_port()}"
    cfg = TrackingConfig(mlflow_uri=url, http_retries=1, http_timeout_s=5)
    t0 = time.perf_counter()
    with pytest.raises(tracking.TrackingUnavailable) as err:
        tracking.log_step(cfg, "0" * 32, 0, {"a": 1.0}, {})
    print(f"log_step against a dead server failed after {time.perf_counter() - t0:.1f} s")
    assert str(err.value).startswith(f"tracking.mlflow_uri: MLflow server {url} did not answer after 1 retries (")
    bad = TrackingConfig(mlflow_uri=f"sqlite:///{tmp_path / 'm.db'}")
    with pytest.raises(Exception) as other:
        tracking.log_step(bad, "no-such-run", 0, {"a": 1.0}, {})
    assert not isinstance(other.value, tracking.TrackingUnavailable), "a bad request is not an unreachable server"


@pytest.fixture
def policy(warm_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(warm_model_dir)


def _params(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _load(folder: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder)


def _crash(*_a, **_k):
    raise OSError("No space left on device (simulated)")


def test_crash_while_writing_the_next_checkpoint_keeps_the_previous(policy, warm_model_dir, tmp_path, monkeypatch):
    from models import checkpoint

    prev, nxt = tmp_path / "policy_000001", tmp_path / "policy_000002"
    checkpoint.save_checkpoint(policy, warm_model_dir, prev, torch.optim.AdamW(policy.parameters()))
    before = _params(policy)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(1.0)
    monkeypatch.setattr(checkpoint.torch, "save", _crash)
    with pytest.raises(OSError, match="simulated"):
        checkpoint.save_checkpoint(policy, warm_model_dir, nxt, torch.optim.AdamW(policy.parameters()))
    assert not nxt.exists(), "a half-written checkpoint sits under the final name"
    loaded = _params(_load(prev))
    assert loaded.keys() == before.keys()
    assert all(torch.equal(loaded[k], before[k]) for k in before)
    assert (prev / "optimizer.pt").exists()


def test_crash_while_overwriting_a_checkpoint_keeps_the_old_one(policy, warm_model_dir, tmp_path, monkeypatch):
    from models import checkpoint

    folder = tmp_path / "policy_000003"
    checkpoint.save_checkpoint(policy, warm_model_dir, folder)
    before = _params(policy)
    with torch.no_grad():
        for p in policy.parameters():
            p.mul_(0.0)
    monkeypatch.setattr(checkpoint.shutil, "copy2", _crash)
    with pytest.raises(OSError, match="simulated"):
        checkpoint.save_checkpoint(policy, warm_model_dir, folder)
    loaded = _params(_load(folder))
    assert all(torch.equal(loaded[k], before[k]) for k in before)
    monkeypatch.undo()
    checkpoint.save_checkpoint(policy, warm_model_dir, folder)
    assert all(not v.any() for v in _params(_load(folder)).values() if v.is_floating_point())


def test_crash_between_removing_and_renaming_keeps_a_checkpoint(policy, warm_model_dir, tmp_path, monkeypatch):
    from models import checkpoint

    folder = tmp_path / "policy_000004"
    checkpoint.save_checkpoint(policy, warm_model_dir, folder)
    real_rename = Path.rename

    def rename(self, target):
        if self.name.endswith(".tmp"):
            raise OSError("killed during the swap (simulated)")
        return real_rename(self, target)

    monkeypatch.setattr(Path, "rename", rename)
    with pytest.raises(OSError, match="simulated"):
        checkpoint.save_checkpoint(policy, warm_model_dir, folder)
    monkeypatch.undo()
    survivors = [p for p in (folder, folder.with_name(f".{folder.name}.old")) if (p / "config.json").exists()]
    assert survivors, "no loadable checkpoint left after a crash mid-swap"
    _load(survivors[0])
