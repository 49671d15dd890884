"""``prefect.yaml`` is a valid deployment file for our flows, and ``cleaner serve`` starts a
Prefect server + process worker + MLflow server that runs a deployment, then stops by group.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SPEC = yaml.safe_load((ROOT / "prefect.yaml").read_text())
DEPLOYMENTS = {d["name"]: d for d in SPEC["deployments"]}


def test_prefect_yaml_validates_with_prefect_models():
    from prefect.cli.deploy._models import PrefectYamlModel, RawScheduleConfig

    model = PrefectYamlModel.model_validate(SPEC)
    assert {d.name for d in model.deployments} == {"train-tiny", "warmup-tiny", "evaluate-tiny", "compare-tiny"}
    for d in SPEC["deployments"]:
        assert d["work_pool"]["name"] == "cleaner-process", d["name"]
        for sched in d.get("schedules", []):
            RawScheduleConfig.model_validate(sched)
            assert sched["active"] is False, f"{d['name']}: example schedules must be inactive"
    assert any(s.get("cron") for d in SPEC["deployments"] for s in d.get("schedules", []))


@pytest.mark.parametrize("name", sorted(DEPLOYMENTS))
def test_deployment_entrypoint_accepts_its_parameters(name):
    from prefect.flows import load_flow_from_entrypoint

    dep = DEPLOYMENTS[name]
    path, func = dep["entrypoint"].split(":")
    if not (ROOT / path).exists():
        pytest.skip(f"{path} is not written yet (entrypoint of {name})")
    flow = load_flow_from_entrypoint(str(ROOT / dep["entrypoint"]))
    accepted = set(flow.parameters.properties)
    assert set(dep["parameters"]) <= accepted, f"{name}: {sorted(set(dep['parameters']) - accepted)} not in {func}"
    assert Path(ROOT / dep["parameters"]["config_path"]).exists()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cli(args: list[str], env: dict, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def _groups_alive(pgids) -> list[int]:
    from flows.cli_serve import _group_alive

    return [p for p in pgids if _group_alive(p)]


def test_stop_groups_ends_whole_groups_and_escalates(tmp_path):
    from flows.cli_serve import _group_alive, stop_groups

    polite = subprocess.Popen(["sh", "-c", "sleep 300 & sleep 300 & wait"], start_new_session=True)
    stubborn = subprocess.Popen(["sh", "-c", "trap '' TERM; sleep 300 & wait; sleep 300"], start_new_session=True)
    pids = {"polite": polite.pid, "stubborn": stubborn.pid}
    try:
        assert _group_alive(polite.pid) and _group_alive(stubborn.pid)
        assert stop_groups(pids, grace_s=1.0) == ["stubborn", "polite"]
        assert not _group_alive(polite.pid) and not _group_alive(stubborn.pid)
        assert stop_groups(pids, grace_s=1.0) == []
    finally:
        for proc in (polite, stubborn):
            proc.wait(timeout=10)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_serve_deploys_runs_and_stops(warm_model_dir, tmp_path):
    from tests.flowrun import tiny_overrides

    serve = tmp_path / "serve"
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect-home"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    py, prefect = sys.executable, str(Path(sys.executable).parent / "prefect")
    ports = [str(free_port()), str(free_port())]
    started = _cli([py, "-m", "flows.cli_serve", "start", "--detach", "--dir", str(serve), "--prefect-port", ports[0],
                    "--mlflow-port", ports[1], "--mlflow-store", f"sqlite:///{tmp_path / 'mlflow-ui.db'}",
                    "--artifacts", str(tmp_path / "ui-artifacts")], env, 420)
    assert started.returncode == 0, started.stdout + started.stderr
    state = json.loads((serve / "pids.json").read_text())
    assert set(state["pids"]) == {"prefect", "worker", "mlflow"}
    assert {p.name for p in (serve / "logs").iterdir()} == {"prefect.log", "worker.log", "mlflow.log"}
    try:
        env["PREFECT_API_URL"] = state["prefect_api"]
        deployed = _cli([prefect, "--no-prompt", "deploy", "--name", "train-tiny"], env, 180)
        assert deployed.returncode == 0, deployed.stdout + deployed.stderr
        params = json.dumps({"overrides": [*tiny_overrides(tmp_path, warm_model_dir, steps=1),
                                           "data.prompts_per_step=2", "rollout.n_samples=2"], "run_id": "served"})
        ran = _cli([prefect, "deployment", "run", "train/train-tiny", "--params", params, "--watch",
                    "--watch-timeout", "360"], env, 420)
        worker_log = (serve / "logs" / "worker.log").read_text()[-3000:]
        assert ran.returncode == 0, ran.stdout + ran.stderr + worker_log
        assert "Completed" in ran.stdout, ran.stdout
        assert (tmp_path / "runs" / "served" / "steps" / "000000" / "logged.json").exists(), worker_log
    finally:
        stopped = _cli([py, "-m", "flows.cli_serve", "stop", "--dir", str(serve)], env, 120)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert "prefect" in stopped.stdout and "worker" in stopped.stdout and "mlflow" in stopped.stdout
    assert not _groups_alive(state["pids"].values())
    assert not (serve / "pids.json").exists()
