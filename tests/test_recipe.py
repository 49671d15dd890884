"""The recipe (issue 41): ``configs/cleaner-masked.yaml`` loads as masked CLEANER (SAAR on every trajectory, the
spliced tokens out of the loss, lockstep tool calls), and ``cleaner compare`` resolves it against DAPO — every arm ×
seed's config built as the comparison would build it — on the synthetic task and on a user's own files. Cheap:
nothing trains.

Run: ``pytest tests/test_recipe.py``.
"""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from flows.cli import app
from flows.compare import compare_jobs
from flows.config import ARM_PRESETS, load_config

RECIPE = Path(__file__).resolve().parents[1] / "configs" / "cleaner-masked.yaml"
TINY = RECIPE.with_name("tiny.yaml")


def test_the_recipe_is_masked_cleaner_on_tinys_settings():
    cfg, tiny = load_config(RECIPE), load_config(TINY)
    assert (cfg.rollout.saar.enabled, cfg.rollout.saar.raw_share, cfg.trainer.splice) == (True, 0.0, "mask")
    assert cfg.rollout.tool_lag_steps == 1
    # everything else as configs/tiny.yaml
    assert cfg.model == tiny.model and cfg.engine == tiny.engine and cfg.eval == tiny.eval and cfg.data == tiny.data
    assert cfg.rollout.model_copy(update={"saar": tiny.rollout.saar}) == tiny.rollout
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
