"""A team stack (``cleaner serve start --auth``): anonymous requests get 401 from Prefect and MLflow, the admin
credentials from the 0600 file work, a user made through MLflow's auth API can read, and a deployment run
started with the auth string completes and logs to the auth-enabled MLflow server (the worker hands the
credentials to the flow through its environment)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import pytest

from tests.flowrun import tiny_overrides
from tests.test_serve import free_port
from tests.test_stack import PREFECT, cli, serve

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_auth_stack_rejects_anonymous_requests_and_runs_authenticated_flows(warm_model_dir, tmp_path):
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect-home"), "PYTHONPATH": str(Path(__file__).parents[1])}
    for key in ("PREFECT_API_URL", "PREFECT_API_AUTH_STRING", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        env.pop(key, None)
    folder = tmp_path / "serve"
    started = serve("start", "--detach", "--auth", "--dir", str(folder), "--prefect-port", str(free_port()),
                    "--mlflow-port", str(free_port()), "--mlflow-store", f"sqlite:///{tmp_path / 'mlflow-ui.db'}",
                    "--artifacts", str(tmp_path / "ui-artifacts"), env=env, timeout=600)
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        state = json.loads((folder / "pids.json").read_text())
        creds_file = folder / "credentials.json"
        assert creds_file.stat().st_mode & 0o777 == 0o600 and str(creds_file.resolve()) in started.stdout
        users = folder / "mlflow-auth.db"  # written by the running MLflow auth app (its admin user is in it)
        assert users.stat().st_size > 0 and users.stat().st_mode & 0o777 == 0o600 and folder.stat().st_mode & 0o77 == 0
        creds = json.loads(creds_file.read_text())
        api, mlflow = state["prefect_api"], state["mlflow_uri"]
        admin = tuple(creds["mlflow_admin"])
        search = f"{mlflow}/api/2.0/mlflow/experiments/search?max_results=5"

        assert httpx.post(f"{api}/flow_runs/filter", json={}, timeout=10).status_code == 401
        assert httpx.post(f"{api}/flow_runs/filter", json={}, auth=tuple(creds["prefect"].split(":", 1)),
                          timeout=10).status_code == 200
        assert httpx.get(search, timeout=10).status_code == 401
        assert httpx.get(search, auth=("admin", "wrong"), timeout=10).status_code == 401
        assert httpx.get(search, auth=admin, timeout=10).status_code == 200

        from mlflow.server.auth.client import AuthServiceClient

        os.environ["MLFLOW_TRACKING_USERNAME"], os.environ["MLFLOW_TRACKING_PASSWORD"] = admin
        try:
            AuthServiceClient(mlflow).create_user("alice", "alice-long-password-1")
        finally:
            del os.environ["MLFLOW_TRACKING_USERNAME"], os.environ["MLFLOW_TRACKING_PASSWORD"]
        assert httpx.get(search, auth=("alice", "alice-long-password-1"), timeout=10).status_code == 200

        env.update(PREFECT_API_URL=api, PREFECT_API_AUTH_STRING=creds["prefect"])
        deployed = cli([PREFECT, "--no-prompt", "deploy", "--name", "train-tiny"], env, 240)
        assert deployed.returncode == 0, deployed.stdout + deployed.stderr
        overrides = [*tiny_overrides(tmp_path, warm_model_dir, steps=1), "data.prompts_per_step=2",
                     "rollout.n_samples=2", f"tracking.mlflow_uri={mlflow}"]
        params = json.dumps({"overrides": overrides, "run_id": "team-1"})
        ran = cli([PREFECT, "deployment", "run", "train/train-tiny", "--params", params, "--watch",
                   "--watch-timeout", "420"], env, 480)
        log = (folder / "logs" / "worker.log").read_text()[-3000:]
        assert ran.returncode == 0 and "Completed" in ran.stdout, ran.stdout + ran.stderr + log

        runs = httpx.post(f"{mlflow}/api/2.0/mlflow/runs/search", auth=admin, timeout=10, json={
            "experiment_ids": [e["experiment_id"] for e in httpx.get(search, auth=admin).json()["experiments"]],
            "filter": "tags.`cleaner.run_id` = 'team-1'"}).json()["runs"]
        assert len(runs) == 1 and runs[0]["info"]["status"] == "FINISHED"
        assert any(m["key"] == "rollout/accuracy" for m in runs[0]["data"]["metrics"])
        # the links the run printed open the training view (MLflow's own "View run" line, without it, is off)
        exp, run = runs[0]["info"]["experiment_id"], runs[0]["info"]["run_id"]
        log = (folder / "logs" / "worker.log").read_text()
        assert "View run" not in log, log[-3000:]
        assert f"MLflow run team-1: {mlflow}/#/experiments/{exp}/runs/{run}?workflowType=machine_learning" in log
    finally:
        stopped = serve("stop", "--force", "--dir", str(folder), env=env)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
