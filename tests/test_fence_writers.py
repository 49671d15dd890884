"""The attempt fence on the run folder's other writers: the environment stages' scores, the traces marker, and the
run's config, origin (``prefect.json``) and walltime files.

Each writer is called as the current attempt (it writes), then, after the file is removed and a second process
claimed the run folder, as the replaced attempt: it must raise ``FencedError`` and leave the folder as it was (the
file absent, no temporary file left). Dropping the writer's guard fails its test (see ``tests/test_fence.py`` for the
step stages, the checkpoints and the row log).
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from tasks.stores import fence
from tasks.stores.config import TrackingConfig
from tasks.stores.fence import ATTEMPT, FencedError
from tests.test_fence import RUN, _replace

STEP = Path("steps") / "000000"


@pytest.fixture
def run_dir(tmp_path):
    folder = tmp_path / "runs" / RUN
    fence.claim(folder, RUN, "A")
    (folder / STEP).mkdir(parents=True)
    pl.DataFrame({"run_id": [RUN] * 2, "step": [0] * 2, "traj_id": ["t0", "t1"], "env_score": [1.0, 0.0],
                  "env_success": [True, False], "env_penalty": [0.0, 0.0], "env_actions": [3, 4],
                  "response_mask": [[1, 1], [1]], "num_turns": [1, 2]}).write_parquet(
        folder / STEP / "trajectories.parquet")  # an environment step's episodes (the stages' input)
    yield folder
    fence.release(folder)


@pytest.fixture(scope="module")
def mlflow_run(tmp_path_factory) -> tuple[TrackingConfig, str]:
    """A real sqlite MLflow store and a run in it (the traces' batch is looked up there)."""
    from mlflow import MlflowClient

    work = tmp_path_factory.mktemp("mlflow")
    cfg = TrackingConfig(mlflow_uri=f"sqlite:///{work / 'mlflow.db'}", artifact_root=str(work / "artifacts"),
                         traces_per_step=0)
    client = MlflowClient(tracking_uri=cfg.mlflow_uri)
    exp = client.create_experiment("fence", artifact_location=(work / "artifacts").as_uri())
    return cfg, client.create_run(exp).info.run_id


def _env_scores(run_dir: Path, _mlflow) -> Path:
    from tasks.training.env_stages import env_score_stage

    step = run_dir / STEP
    env_score_stage(step)
    return step / "scores.parquet"


def _traces_marker(run_dir: Path, mlflow) -> Path:
    from tasks.training.stages import TRACES_DONE, _step_traces

    cfg, mlrun = mlflow
    step = run_dir / STEP
    _step_traces(step, 0, mlrun, cfg, {"trajectories": pl.DataFrame({"traj_id": ["t0"]}),
                                       "tool_executions": pl.DataFrame(), "saar_events": pl.DataFrame()}, {}, 0.0)
    return step / TRACES_DONE


def _config(run_dir: Path, _mlflow) -> Path:
    from flows.prepare import write_config

    write_config(run_dir, {"name": "tiny"})
    return run_dir / "config.json"


def _origin(run_dir: Path, _mlflow) -> Path:
    from flows.prepare import ORIGIN, write_origin

    write_origin(run_dir, "flow-1")
    return run_dir / ORIGIN


def _walltime(run_dir: Path, _mlflow) -> Path:
    from flows.train import write_walltime

    write_walltime(run_dir, "flow-1", {0: 1.5})
    return run_dir / "walltime-flow-1.json"


WRITERS = {"env scores": _env_scores, "traces marker": _traces_marker, "config": _config, "origin": _origin,
           "walltime": _walltime}
WRITTEN = {"env scores": None, "traces marker": {"traces": 0}, "config": {"name": "tiny"},
           "origin": {"flow_run_id": "flow-1", "deployment_id": None}, "walltime": {"0": 1.5}}
"""What each writer leaves as the current attempt (None: a Parquet file, checked by its rows)."""


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != ATTEMPT}


@pytest.mark.parametrize("writer", WRITERS)
def test_the_current_attempt_writes_and_a_replaced_one_does_not(run_dir, mlflow_run, writer):
    target = WRITERS[writer](run_dir, mlflow_run)
    if WRITTEN[writer] is None:
        assert pl.read_parquet(target)["reward"].to_list() == [1.0, 0.0]
    else:
        assert json.loads(target.read_text()) == WRITTEN[writer]
    target.unlink()
    _replace(run_dir)
    before = _snapshot(run_dir)
    with pytest.raises(FencedError, match="fenced — attempt B"):
        WRITERS[writer](run_dir, mlflow_run)
    assert _snapshot(run_dir) == before, "the replaced attempt wrote into the run folder"
    assert not target.exists()
