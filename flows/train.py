"""Prefect flow ``train``: RL steps of rollout → score → mix → advantage → update → log.

The flow only sequences stages; each task wraps one function of ``tasks.stages`` and hands
the next one a path (the step folder, a checkpoint folder). A step that finished (its
``logged.json`` marker exists) is skipped when the same run id is trained again, so a rerun
of a crashed run continues at the step that failed, from the last checkpoint.

Run: ``cleaner train --config configs/tiny.yaml`` (ephemeral Prefect; no server needed).
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from flows.config import RunConfig, load_config
from tasks import stages, store, tracking
from tasks.data import ensure_files


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


@task(name="prepare-run", cache_policy=NO_CACHE)
def prepare_run(cfg: RunConfig, run_id: str, flow_run_id: str) -> RunInfo:
    """Data files, the starting policy, the MLflow run (resumed by tag) and the DuckDB run row."""
    ensure_files(cfg.data, cfg.seed)
    if not Path(cfg.model.path).exists():
        from flows.warmup import build_and_warm

        if not cfg.model.build_tiny:
            raise FileNotFoundError(f"model.path: {cfg.model.path} does not exist (and model.build_tiny is off)")
        build_and_warm(cfg)
    run_dir = Path(cfg.output_dir) / run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    config = cfg.model_dump(mode="json")
    (run_dir / "config.json").write_text(json.dumps(config, indent=1))
    tags = {"prefect.flow_run_id": flow_run_id, "cleaner.config_hash": cfg.hash(), "git.commit": _git_commit()}
    mlrun = tracking.open_run(cfg.tracking, cfg.tracking.experiment or cfg.name, run_id, config, tags)
    con = store.connect(cfg.tracking.duckdb_path)
    try:
        store.upsert_run(con, run_id, cfg.name, config, mlrun, "running")
    finally:
        con.close()
    return RunInfo(run_id, str(run_dir), mlrun, cfg.model.path)


def _git_commit() -> str:
    import subprocess

    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


@task(name="rollout", retries=2, retry_delay_seconds=2, cache_policy=NO_CACHE)
def rollout_task(cfg: RunConfig, info: RunInfo, step: int, ckpt: str) -> str:
    return str(stages.rollout_stage(step_dir(info, step), step, cfg.seed, ckpt, info.run_id, cfg.model.system_prompt,
                                    cfg.data, cfg.rollout, cfg.engine, cfg.sandbox))


@task(name="score", retries=2, retry_delay_seconds=2, cache_policy=NO_CACHE)
def score_task(cfg: RunConfig, folder: str) -> str:
    return str(stages.score_stage(Path(folder), cfg.reward, cfg.score, cfg.rollout.max_response_tokens, cfg.sandbox))


@task(name="mix", cache_policy=NO_CACHE)
def mix_task(cfg: RunConfig, folder: str) -> str:
    return str(stages.mix_stage(Path(folder), cfg.mix))


@task(name="advantage", cache_policy=NO_CACHE)
def advantage_task(cfg: RunConfig, folder: str) -> str:
    return str(stages.advantage_stage(Path(folder), cfg.mix))


@task(name="update", cache_policy=NO_CACHE)
def update_task(cfg: RunConfig, folder: str, ckpt: str, out_ckpt: str, step: int) -> str:
    return str(stages.update_stage(Path(folder), ckpt, Path(out_ckpt), cfg.trainer, cfg.seed * 100_003 + step))


@task(name="log", retries=2, retry_delay_seconds=2, cache_policy=NO_CACHE)
def log_task(cfg: RunConfig, info: RunInfo, folder: str, step: int, ckpt: str) -> dict:
    metrics = stages.log_stage(Path(folder), step, info.run_id, info.mlflow_run_id, ckpt, cfg.tracking)
    (Path(folder) / "logged.json").write_text(json.dumps({"checkpoint": ckpt, "at": time.time()}))
    return metrics


@task(name="finish-run", cache_policy=NO_CACHE)
def finish_task(cfg: RunConfig, info: RunInfo) -> str:
    from tasks.reporting import plot_run

    metrics = store.query(cfg.tracking.duckdb_path, f"SELECT step, key, value FROM metrics WHERE run_id = '{info.run_id}'")
    png = plot_run(metrics, Path(info.run_dir) / "plots" / "summary.png", f"{info.run_id}")
    tracking.log_file(cfg.tracking, info.mlflow_run_id, png, "plots")
    tracking.finish_run(cfg.tracking, info.mlflow_run_id)
    con = store.connect(cfg.tracking.duckdb_path)
    try:
        con.execute("UPDATE runs SET status = 'finished' WHERE run_id = ?", [info.run_id])
    finally:
        con.close()
    return str(png)


def _prune(info: RunInfo, keep: int, current: Path) -> None:
    folders = sorted((Path(info.run_dir) / "checkpoints").glob("policy_*"))
    for old in folders[:-keep]:
        if old != current:
            shutil.rmtree(old, ignore_errors=True)


@flow(name="train", log_prints=True)
def train(config_path: str = "configs/tiny.yaml", overrides: list[str] | None = None, run_id: str | None = None) -> dict:
    """Train a policy with CLEANER; returns the run id, MLflow run id and final checkpoint."""
    from prefect.runtime import flow_run

    cfg = load_config(config_path, overrides)
    run_id = run_id or f"{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    info = prepare_run(cfg, run_id, str(flow_run.get_id() or ""))
    ckpt = info.start_ckpt
    for step in range(cfg.train.steps):
        folder = step_dir(info, step)
        marker = folder / "logged.json"
        if marker.exists():
            ckpt = json.loads(marker.read_text())["checkpoint"]
            print(f"step {step}: already logged, skipped (checkpoint {ckpt})")
            continue
        folder.mkdir(parents=True, exist_ok=True)
        f = rollout_task(cfg, info, step, ckpt)
        f = score_task(cfg, f)
        f = mix_task(cfg, f)
        f = advantage_task(cfg, f)
        new_ckpt = update_task(cfg, f, ckpt, str(ckpt_dir(info, step + 1)), step)
        metrics = log_task(cfg, info, f, step, new_ckpt)
        ckpt = new_ckpt
        _prune(info, cfg.train.keep_checkpoints, Path(ckpt))
        print(_summary(step, metrics))
    png = finish_task(cfg, info)
    stages.close_live()
    return {**asdict(info), "final_checkpoint": ckpt, "plot": png}


def _summary(step: int, m: dict) -> str:
    keys = ["rollout/accuracy", "tools/first_attempt_success_rate", "saar/rollbacks_triggered",
            "saar/rollbacks_recovered", "saar/shallow", "saar/deep", "train/loss"]
    return f"step {step}: " + ", ".join(f"{k.split('/', 1)[1]}={m.get(k, float('nan')):.3g}" for k in keys)
