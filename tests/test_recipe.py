"""The recipe (issue 41): ``configs/cleaner-masked.yaml`` loads as masked CLEANER (SAAR on every trajectory, the
spliced tokens out of the loss, lockstep tool calls), and ``cleaner compare`` resolves it against DAPO — every arm ×
seed's config built as the comparison would build it — on the synthetic task and on a user's own files (cheap:
nothing trains), and runs it end to end on a user's files cut to one seed and one step (slow).

Run: ``pytest tests/test_recipe.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli import app
from flows.compare import compare_jobs
from flows.config import ARM_PRESETS, load_config
from tasks.data.loader import questions
from tasks.data.synthetic import write_task_parquet
from tests.flowrun import tiny_overrides

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "configs" / "cleaner-masked.yaml"
TINY = RECIPE.with_name("tiny.yaml")


def test_the_recipe_is_masked_cleaner_on_tinys_settings():
    cfg, tiny = load_config(RECIPE), load_config(TINY)
    assert (cfg.rollout.saar.enabled, cfg.rollout.saar.raw_share, cfg.trainer.splice) == (True, 0.0, "mask")
    assert cfg.rollout.tool_lag_steps == 1
    # the staleness study's non-inferior arm (docs/staleness.md): one step off-policy, evaluations beside training
    assert (cfg.rollout.staleness, cfg.eval.beside_training) == (1, True)
    # everything else as configs/tiny.yaml
    assert cfg.model == tiny.model and cfg.engine == tiny.engine and cfg.data == tiny.data
    assert cfg.eval.model_copy(update={"beside_training": False}) == tiny.eval
    assert cfg.rollout.model_copy(update={"saar": tiny.rollout.saar, "staleness": 0}) == tiny.rollout
    assert cfg.rollout.saar.model_copy(update={"raw_share": 0.3}) == tiny.rollout.saar
    assert cfg.trainer.model_copy(update={"splice": "full"}) == tiny.trainer
    assert cfg.compare.arms["cleaner_masked"] == ARM_PRESETS["cleaner_masked"]


def test_compare_resolves_the_recipe_against_dapo_on_a_users_files(tmp_path):
    user = [f"data.train_path={tmp_path}/rl.parquet", f"data.eval_path={tmp_path}/held.parquet",
            f"data.fresh_path={tmp_path}/fresh.parquet", "data.synthetic=false"]
    cfg = load_config(RECIPE, user)
    jobs = compare_jobs(cfg, user, "cmp")
    assert [(arm, seed) for arm, seed, _, _ in jobs] == [(a, s) for s in range(6) for a in ("dapo", "cleaner_masked")]
    for arm, seed, run_id, overrides in jobs:
        run = load_config(RECIPE, overrides)
        assert run_id == f"cmp-{arm}-s{seed}" and run.seed == seed and run.tracking.arm == arm
        assert run.data.train_path == f"{tmp_path}/rl.parquet" and not run.data.synthetic
        assert (run.train.steps, run.eval.final_prompts, run.data.prompts_per_step) == (24, 128, 16)
        assert run.rollout.saar.enabled is (arm == "cleaner_masked")
        assert run.trainer.splice == "mask" and run.rollout.saar.raw_share == 0.0
    assert (cfg.compare.baseline, cfg.compare.treatment) == ("dapo", "cleaner_masked")


def test_cleaner_compare_accepts_the_recipe():
    """``cleaner compare`` parses, and checks a config before starting anything (a bad value is refused)."""
    result = CliRunner().invoke(app, ["compare", "--help"])
    assert result.exit_code == 0 and "--rerun" in result.output
    bad = CliRunner().invoke(app, ["compare", "--config", str(RECIPE), "--set", "trainer.splice=nope"])
    assert bad.exit_code != 0 and "unknown splice treatment 'nope'" in bad.output  # refused before any flow starts


def test_the_registered_long_study_resolves():
    """configs/regimes/t4_long.yaml (docs/generalisation.md): seeds 51-56, 72 steps evaluated every 24, the fresh
    split at the last evaluation, the filter arm masking failed turns, and dapo_matched added by an override."""
    path = RECIPE.parent / "regimes" / "t4_long.yaml"
    cfg = load_config(path)
    extra = ["compare.arms.dapo_matched=[rollout.saar.enabled=false, data.prompts_per_step=18]"]
    jobs = compare_jobs(load_config(path, extra), extra, "long")
    assert len(jobs) == 24 and {s for _, s, _, _ in jobs} == set(range(51, 57))
    runs = {arm: load_config(path, ov) for arm, seed, _, ov in jobs if seed == 51}
    assert runs["dapo_matched"].data.prompts_per_step == 18 and runs["dapo"].data.prompts_per_step == 16
    assert runs["dapo_filter"].mix.failed_turns == "mask" and runs["dapo"].mix.failed_turns == "keep"
    assert (runs["mask_raw0"].trainer.splice, runs["mask_raw0"].rollout.saar.raw_share) == ("mask", 0.0)
    final = runs["dapo"].setups().eval_setup(final=True)
    assert final.fresh_path == "data/synthetic-v2/fresh.parquet" and (final.eval.fresh_prompts, final.eval.fresh_samples) == (256, 4)
    assert (runs["dapo"].train.steps, runs["dapo"].train.eval_every, cfg.rollout.tool_lag_steps) == (72, 24, 1)


@pytest.mark.slow
def test_cleaner_compare_runs_the_recipe_against_dapo_on_a_users_files(warm_model_dir, tmp_path):
    """What a user types: ``cleaner compare --config configs/cleaner-masked.yaml`` on their own training, held-out
    and fresh files (``data.synthetic=false``), cut to one seed and one step: both arms train, the report pairs
    masked CLEANER with DAPO on both splits, and its settings say what each arm ran."""
    own = {"train": write_task_parquet(tmp_path / "my_rl.parquet", 64, 3, "rl"),
           "eval": write_task_parquet(tmp_path / "my_heldout.parquet", 8, 3, "eval")}
    own["fresh"] = write_task_parquet(tmp_path / "my_fresh.parquet", 8, 4, "eval",
                                      exclude=frozenset(questions(str(own["eval"]))))
    sets = [*tiny_overrides(tmp_path, warm_model_dir, steps=1), "data.synthetic=false",
            f"data.train_path={own['train']}", f"data.eval_path={own['eval']}", f"data.fresh_path={own['fresh']}",
            "sandbox.backend=local", "compare.seeds=[0]", "compare.steps=1", "compare.eval_every=1",
            "compare.parallel=1", "compare.shared=[eval.fresh_prompts=8, eval.fresh_samples=2]",
            "eval.n_prompts=4", "eval.samples=2", "eval.ks=[1,2]", "compare.probe_prompts=3"]
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"), "PYTHONPATH": str(ROOT)}
    env.pop("PREFECT_API_URL", None)
    cmd = [sys.executable, "-m", "flows.cli", "compare", "--config", str(RECIPE), "--compare-id", "mine"]
    done = subprocess.run([*cmd, *(x for s in sets for x in ("--set", s))], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    report = json.loads((tmp_path / "runs" / "mine" / "report" / "compare.json").read_text())
    assert (report["baseline"], report["treatment"]) == ("dapo", "cleaner_masked")
    assert report["runs"] == {"dapo": ["mine-dapo-s0"], "cleaner_masked": ["mine-cleaner_masked-s0"]}
    assert report["paired_pass_at_1"]["cleaner_masked"]["n"] == 1
    assert report["fresh"]["paired"]["cleaner_masked"]["internalisation"]["n"] == 1
    for arm, seed_row in report["per_seed"].items():
        run = json.loads((tmp_path / "runs" / f"mine-{arm}-s0" / "config.json").read_text())
        assert run["data"]["train_path"] == str(own["train"]) and run["data"]["synthetic"] is False
        assert (run["rollout"]["saar"]["enabled"], run["trainer"]["splice"]) == (arm == "cleaner_masked", "mask")
        assert seed_row[0]["final_pass_at_1"] is not None
