"""Partial rollouts survive a crash: SIGKILL inside a partial-rollout step (after that step's buffer was written,
before its trajectories were), rerun the same run id, and the DuckDB rows prove that every group a step carried
over was trained in exactly one later step (or is still carried at the end), none twice, none lost."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from tasks.training.faults import ENV

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def _run(work: Path, model: Path, crash: str | None) -> subprocess.CompletedProcess:
    from prefect.settings import PREFECT_API_URL

    sets = [f"model.path={model}", f"output_dir={work / 'runs'}", "train.steps=3", "train.eval_every=0",
            f"data.train_path={work / 'tr.parquet'}", f"data.eval_path={work / 'ev.parquet'}", "data.n_train=64",
            "data.n_eval=4", "data.prompts_per_step=4", "rollout.n_samples=4", "rollout.max_new_tokens=64",
            "rollout.partial.enabled=true", "rollout.partial.over_sampling=8",
            # APRIL's own rule judged all 8 groups of step 0 (4 passed, 4 filtered) and carried none; the
            # in_flight rule submits again as groups pass, so steps carry groups for the crash to test
            "rollout.partial.submit_rule=in_flight",
            f"tracking.mlflow_uri=sqlite:///{work / 'm.db'}", f"tracking.artifact_root={work / 'art'}",
            f"tracking.duckdb_path={work / 'c.duckdb'}"]
    cmd = [sys.executable, "-m", "flows.cli", "train", "--config", str(ROOT / "configs/tiny.yaml"), "--run-id", "pr"]
    for s in sets:
        cmd += ["--set", s]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PREFECT_API_URL": PREFECT_API_URL.value()}
    env.pop(ENV, None)
    if crash:
        env[ENV] = crash
    return subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=1500)


def test_kill_inside_a_partial_rollout_step_then_resume_trains_each_carried_group_once(prefect_harness,
                                                                                     warm_model_dir, tmp_path):
    proc = _run(tmp_path, warm_model_dir, "in_partial_rollout@1")
    assert proc.returncode == -9, proc.stderr[-3000:]
    # Carrying needs a policy that fits the task: groups pass the filter only when their rewards differ, and a
    # step carries only what was unjudged when the 4th group passed. The previous warm-up (another tokenizer,
    # trained before the bound-input prompts) measured step 0: 0 of 32 groups passed in 4 submissions, all
    # judged, nothing carried in any step -- "no carried group was ever resumed" further down. The committed
    # tiny-warm measured step 0: 4 passed, 4 filtered, 8 carried (2 submissions); step 1 drained 8, carried 10.
    step0 = json.loads((tmp_path / "runs" / "pr" / "steps" / "000000" / "rollout.metrics.json").read_text())
    counts = {k: v for k, v in step0.items() if k.startswith("partial/")}
    assert counts["partial/passed_groups"] == 4 and counts["partial/buffer_groups"] > 0, (
        f"step 0 carried nothing ({counts}): does the model at {warm_model_dir} fit the synthetic task?")
    step1 = tmp_path / "runs" / "pr" / "steps" / "000001"
    assert (step1 / "partial_buffer.parquet").exists() and not (step1 / "rollout.metrics.json").exists()
    done = _run(tmp_path, warm_model_dir, None)
    assert done.returncode == 0, done.stderr[-3000:]

    con = duckdb.connect(str(tmp_path / "c.duckdb"), read_only=True)
    q = lambda sql: con.execute(sql).fetchall()
    # a group = (prompt, the step it started in); where it was carried, and where it was rolled out to the end
    carried = q("SELECT DISTINCT step, prompt_id, start_step FROM partial_buffer WHERE run_id = 'pr'")
    rolled = q("SELECT step, prompt_id, start_step, count(*), bool_or(kept AND NOT coalesce(dropped, false)) "
               "FROM trajectories WHERE run_id = 'pr' GROUP BY ALL")
    assert carried and any(start < step for step, _, start, _, _ in rolled), "no carried group was ever resumed"
    by_group: dict = {}
    for step, prompt, start, n, trained in rolled:
        assert n == 4, (step, prompt, start)  # every sample of a group, once
        by_group.setdefault((prompt, start), []).append((step, trained))
    assert all(len(steps) == 1 for steps in by_group.values()), "a group was rolled out in two steps"
    last = max(step for step, *_ in carried)
    for step, prompt, start in carried:
        later = [s for s, _ in by_group.get((prompt, start), [])]
        still = (last, prompt, start) in carried
        assert (later and later[0] > step) or still, f"group {prompt}@{start} carried at step {step} was lost"
        if later:  # it was carried by every step in between
            assert all((s, prompt, start) in carried for s in range(step, later[0]))
    for (prompt, start), [(step, _)] in by_group.items():
        if start < step:  # a resumed group came from the previous step's buffer
            assert (step - 1, prompt, start) in carried
    kept = dict(q("SELECT step, count(DISTINCT prompt_id) FROM trajectories WHERE run_id = 'pr' AND kept GROUP BY step"))
    assert sorted(kept) == [0, 1, 2] and all(1 <= n <= 4 for n in kept.values())  # the stop rule's target is 4
    off = dict(q("SELECT step, value FROM metrics WHERE run_id = 'pr' AND key = 'partial/off_policy_tokens'"))
    assert off[0] == 0 and off[1] + off[2] > 0
    rows, distinct = q("SELECT count(*), count(DISTINCT (step, traj_id)) FROM trajectories WHERE run_id = 'pr'")[0]
    assert rows == distinct
    con.close()
