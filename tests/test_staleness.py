"""Bounded staleness end to end (``rollout.staleness``, ``eval.beside_training``; issue 52), on the tiny model.

* a ``staleness: 1`` run repeated — once with its evaluations in line, once beside training — samples the same
  token ids, ends on the same weights, writes the same evaluation rows and picks the same ``@best``;
* its rollout of step s is what policy version s − 1 samples (rolled out again here from that checkpoint), not
  version s;
* ``staleness: 0`` equals today's run: the flow's trajectories and final weights are those of the stage functions
  called one after another, with no schedule, lane or Prefect in between;
* the run's process group killed while the rollout of step 2 and the update of step 1 are both in flight, then the
  same run id trained again, equals the uninterrupted run.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest
from safetensors.torch import load_file

from tasks.training.faults import ENV, PAUSE_ENV

ROOT = Path(__file__).resolve().parents[1]
STEPS = 3
SMALL = ["rollout.max_new_tokens=64", "trainer.lr=1e-3", "data.prompts_per_step=2"]
EVALS = ["train.eval_every=2", "eval.n_prompts=4", "eval.samples=2", "tracking.register_models=true"]
pytestmark = pytest.mark.slow


def overrides(work: Path, model: Path, run_id: str, extra: list[str], own_stores: bool = False) -> list[str]:
    from tests.flowrun import tiny_overrides

    stores = [f"tracking.mlflow_uri=sqlite:///{work / run_id}.mlflow.db", f"tracking.artifact_root={work / run_id}.art",
              f"tracking.duckdb_path={work / run_id}.duckdb"] if own_stores else []
    return [*tiny_overrides(work, model, steps=STEPS), *SMALL, *stores, *extra]


def flow_run(work: Path, model: Path, run_id: str, extra: list[str], own_stores: bool = False) -> dict:
    from flows.train import train

    return train("configs/tiny.yaml", overrides(work, model, run_id, extra, own_stores), run_id)


def trajectories(work: Path, run_id: str, step: int) -> pl.DataFrame:
    path = work / "runs" / run_id / "steps" / f"{step:06d}" / "trajectories.parquet"
    return pl.read_parquet(path).drop("run_id").sort("traj_id")


def weights(work: Path, run_id: str, version: int = STEPS) -> dict:
    return load_file(work / "runs" / run_id / "checkpoints" / f"policy_{version:06d}" / "model.safetensors")


def same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)


def eval_rows(work: Path, run_id: str, version: int, key: str | None = None):
    """An evaluation's figures (less where and how long it ran: ``time/``), or its figure ``key``."""
    from tasks.stores import rowlog

    rows = rowlog.read_unit(work / f"{run_id}.duckdb", run_id, "eval", version)["evaluations"]
    figures = dict(zip(rows["key"], rows["value"]))
    return figures[key] if key else {k: v for k, v in figures.items() if not k.startswith("time/")}


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("staleness")


@pytest.fixture(scope="module")
def lagged(prefect_harness, warm_model_dir, work) -> dict[str, dict]:
    """Two ``staleness: 1`` runs of the same config: evaluations in line (``inline``) and beside (``beside``)."""
    return {"inline": flow_run(work, warm_model_dir, "inline", ["rollout.staleness=1", *EVALS], own_stores=True),
            "beside": flow_run(work, warm_model_dir, "beside",
                               ["rollout.staleness=1", "eval.beside_training=true", *EVALS], own_stores=True)}


def test_a_lagged_run_repeated_samples_the_same_tokens_and_ends_on_the_same_weights(lagged, work):
    for step in range(STEPS):
        assert trajectories(work, "inline", step).equals(trajectories(work, "beside", step)), step
    assert same_weights(weights(work, "inline"), weights(work, "beside"))
    assert not same_weights(weights(work, "inline"), load_file(Path(lagged["inline"]["start_ckpt"]) /
                                                                "model.safetensors")), "nothing was trained"


def test_evaluations_beside_training_write_the_rows_of_evaluations_in_line(lagged, work):
    assert sorted(lagged["inline"]["evaluations"]) == sorted(lagged["beside"]["evaluations"]) == [0, 2, 3]
    for version in (0, 2, 3):
        assert eval_rows(work, "inline", version) == eval_rows(work, "beside", version), version
    assert lagged["inline"]["registered"] == lagged["beside"]["registered"] != {}
    # the last one beside training was rolled out in four parts by the evaluation and the rollout lane, the others
    # whole
    parts = {(r, v): eval_rows(work, r, v, "time/eval_rollout_parts") for r in ("inline", "beside") for v in (0, 2, 3)}
    assert parts == {("inline", 0): 1.0, ("inline", 2): 1.0, ("inline", 3): 1.0,
                     ("beside", 0): 1.0, ("beside", 2): 1.0, ("beside", 3): 4.0}


def test_waits_are_logged_with_the_step(lagged, work):
    from tasks.training.schedule import PERF
    from tasks.training.stages import stage_metrics

    for step in range(STEPS):
        metrics = stage_metrics(work / "runs" / "inline" / "steps" / f"{step:06d}")
        assert set(PERF) <= metrics.keys() and 0 <= metrics["perf/trainer_idle_ratio"] <= 1


def test_the_rollout_of_step_s_is_sampled_by_version_s_minus_1(lagged, work, warm_model_dir, tmp_path):
    from flows.config import load_config
    from tasks.training.stages import rollout_stage

    cfg = load_config(ROOT / "configs" / "tiny.yaml", overrides(work, warm_model_dir, "inline", []))
    setup = cfg.setups().rollout
    ckpts = work / "runs" / "inline" / "checkpoints"
    for step, policy, sampled_it in ((0, str(warm_model_dir), True), (1, str(warm_model_dir), True),
                                     (2, str(ckpts / "policy_000001"), True), (2, str(ckpts / "policy_000002"), False)):
        folder = tmp_path / Path(policy).name / f"{step:06d}"  # a stage reads its step from its folder's name
        folder.mkdir(parents=True)
        rollout_stage(folder, step, policy, "inline", setup)
        again = pl.read_parquet(folder / "trajectories.parquet").drop("run_id").sort("traj_id")
        ran = trajectories(work, "inline", step)
        assert (again["response_ids"].to_list() == ran["response_ids"].to_list()) is sampled_it, (step, policy)


def test_staleness_0_is_the_stage_functions_one_after_another(prefect_harness, warm_model_dir, work, tmp_path):
    from flows.config import load_config
    from tasks.training import stages
    from tasks.training.env_stages import previous_empty_steps

    flow_run(work, warm_model_dir, "sync", [])
    cfg = load_config(ROOT / "configs" / "tiny.yaml", overrides(work, warm_model_dir, "sync", []))
    setups, ckpt = cfg.setups(), str(warm_model_dir)
    for step in range(STEPS):
        here = tmp_path / f"{step:06d}"
        here.mkdir()
        stages.rollout_stage(here, step, ckpt, "sync", setups.rollout)
        stages.score_stage(here, setups.score)
        stages.mix_stage(here, setups.mix, previous_empty_steps(here))
        stages.advantage_stage(here, setups.advantage)
        ckpt = str(stages.update_stage(here, ckpt, tmp_path / f"policy_{step + 1:06d}", setups.update))
        assert pl.read_parquet(here / "trajectories.parquet").drop("run_id").sort("traj_id").equals(
            trajectories(work, "sync", step)), step
    assert same_weights(load_file(Path(ckpt) / "model.safetensors"), weights(work, "sync"))
    assert not (work / "runs" / "sync" / "steps" / "000000" / "perf.metrics.json").exists()


def _cli(work: Path, model: Path, run_id: str, env: dict[str, str]) -> subprocess.Popen:
    from prefect.settings import PREFECT_API_URL

    cmd = [sys.executable, "-m", "flows.cli", "train", "--config", str(ROOT / "configs/tiny.yaml"), "--run-id", run_id]
    for item in overrides(work, model, run_id, ["rollout.staleness=1"], own_stores=True):
        cmd += ["--set", item]
    base = {k: v for k, v in os.environ.items() if k not in (ENV, PAUSE_ENV)}
    return subprocess.Popen(cmd, cwd=work, env={**base, "PYTHONPATH": str(ROOT), "PREFECT_API_URL": PREFECT_API_URL.value(),
                                                **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def _stopped(pid: int) -> bool:
    with contextlib.suppress(FileNotFoundError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
    return False


def _lane_of(group: int) -> int | None:
    """The lane worker in process group ``group`` (the run's), if one runs."""
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError):
            if proc.name.isdigit() and os.getpgid(int(proc.name)) == group and \
                    b"tasks.training.lane_worker" in (proc / "cmdline").read_bytes():
                return int(proc.name)
    return None


def _until(check, proc: subprocess.Popen, what: str, timeout: float = 600, every: float = 0.02):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        if proc.poll() is not None:
            raise AssertionError(f"the run ended before {what}: {proc.communicate()[0][-3000:]}")
        time.sleep(every)
    raise AssertionError(f"never {what}")


def test_killed_with_rollout_and_update_in_flight_then_resumed_equals_the_uninterrupted_run(lagged, warm_model_dir,
                                                                                             work):
    """The rollout lane is stopped (SIGSTOP) as soon as step 2's rollout starts, the flow process stops itself inside
    step 1's update (``CLEANER_PAUSE_AT=in_update@1``): both are in flight when the run's process group is killed."""
    steps = work / "runs" / "killed" / "steps"
    proc = _cli(work, warm_model_dir, "killed", {PAUSE_ENV: "in_update@1"})
    try:
        _until(lambda: (steps / "000002").is_dir(), proc, "the rollout of step 2 started")
        os.kill(_until(lambda: _lane_of(proc.pid), proc, "a lane ran"), signal.SIGSTOP)
        _until(lambda: _stopped(proc.pid), proc, "the update of step 1 paused", every=0.1)
        assert not (steps / "000002" / "rollout.metrics.json").exists(), "the rollout of step 2 had ended"
        assert not (steps / "000001" / "update.metrics.json").exists(), "the update of step 1 had ended"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    resumed = _cli(work, warm_model_dir, "killed", {})
    out = resumed.communicate(timeout=900)[0]
    assert resumed.returncode == 0, out[-3000:]
    for step in range(STEPS):
        assert trajectories(work, "killed", step).equals(trajectories(work, "inline", step)), step
    assert same_weights(weights(work, "killed"), weights(work, "inline"))
