"""Which config field changes which stage's cache key (``tasks.training.setups``), field by field.

A stage's key hashes the setups it reads — its own and every earlier stage's in the step — and,
after step 0, the whole training chain that produced its policy. Fields no stage reads change
no key, so extending ``train.steps`` or renaming a run reuses every finished stage.

Run: ``pytest tests/test_stage_keys.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.config import load_config
from tasks.training.setups import STAGES

TINY = Path(__file__).resolve().parents[1] / "configs" / "tiny.yaml"
ALL = set(STAGES)
TRAIN = {"rollout", "score", "mix", "advantage", "update", "log"}


def keys(overrides: list[str], step: int) -> dict[str, str]:
    setups = load_config(TINY, overrides).setups()
    policy = "tiny-warm" if step == 0 else f"policy_{step:06d}"
    return {stage: setups.key("run", step, stage, policy) for stage in STAGES}


def changed(override: str, step: int) -> set[str]:
    base, new = keys([], step), keys([override], step)
    return {stage for stage in STAGES if base[stage] != new[stage]}


# (override, stages whose key changes at step 0, at step 1)
TABLE = [
    ("train.steps=40", set(), set()),
    ("train.eval_every=3", set(), set()),
    ("train.keep_checkpoints=7", set(), set()),
    ("name=renamed", set(), set()),
    ("output_dir=elsewhere", set(), set()),
    ("compare.seeds=[5]", set(), set()),
    ("tiny.num_layers=2", set(), set()),
    ("warmup.lr=0.01", set(), set()),
    ("data.n_train=99", set(), set()),
    ("eval.fresh_prompts=100", set(), set()),  # read only with data.fresh_path
    ("eval.beside_training=true", set(), set()),  # where an evaluation runs is no part of what it computes
    # the rollout's own key never (its policy argument names the version it samples); every later stage's does
    ("rollout.staleness=1", {"score", "mix", "advantage", "update", "log"}, ALL - {"rollout"}),
    ("mix.failed_turns=mask", {"mix", "advantage", "update", "log"}, ALL),
    ("tracking.duckdb_path=other.duckdb", {"log", "eval"}, {"log", "eval"}),
    ("tracking.sample_trajectories=1", {"log", "eval"}, {"log", "eval"}),
    ("eval.n_prompts=3", {"eval"}, {"eval"}),
    ("data.eval_path=held.parquet", {"eval"}, {"eval"}),
    ("trainer.lr=0.001", {"update", "log"}, ALL),
    ("trainer.behaviour_is_cap=2.0", {"update", "log"}, ALL),
    ("mix.adv_eps=0.001", {"mix", "advantage", "update", "log"}, ALL),
    ("mix.dynamic_sampling=false", {"mix", "advantage", "update", "log"}, ALL),
    ("trainer.mini_batches=4", {"mix", "advantage", "update", "log"}, ALL),
    ("score.overlong_buffer=8", {"score", "mix", "advantage", "update", "log"}, ALL),
    ("data.prompts_per_step=2", TRAIN, ALL),
    ("data.train_path=other.parquet", TRAIN, ALL),
    ("reward.correct_reward=2.0", ALL, ALL),
    ("rollout.max_response_tokens=256", ALL, ALL),
    ("rollout.saar.similarity_threshold=0.7", ALL, ALL),
    ("rollout.extra_turns=2", ALL, ALL),
    ("rollout.saar.retries_cost_turns=true", ALL, ALL),
    ("rollout.saar.decide=importance", ALL, ALL),
    ("rollout.saar.importance_threshold=0.7", ALL, ALL),
    ("engine.temperature=0.7", ALL, ALL),
    ("sandbox.timeout_s=3", ALL, ALL),
    ("model.chat.system_prompt=hi", ALL, ALL),
    ("seed=7", ALL, ALL),
    ("model.path=other-policy", ALL, ALL),
]


@pytest.mark.parametrize("override, at_0, at_1", TABLE, ids=[row[0] for row in TABLE])
def test_field_changes_exactly_these_keys(override, at_0, at_1):
    assert changed(override, 0) == at_0
    assert changed(override, 1) == at_1


def test_key_names_run_step_stage_and_policy_version():
    k = keys([], 3)
    assert k["rollout"].startswith("run:3:rollout:") and k["rollout"].endswith("-policy_000003")
    assert len(set(k.values())) == len(STAGES)
    assert keys([], 4)["rollout"] != k["rollout"]


def test_unknown_stage_names_the_valid_ones():
    setups = load_config(TINY).setups()
    with pytest.raises(ValueError, match="unknown stage 'train'.*'rollout'"):
        setups.key("run", 0, "train", "p")


def test_setups_are_frozen():
    setups = load_config(TINY).setups()
    with pytest.raises(Exception, match="frozen"):
        setups.update.seed = 3


def test_partial_rollouts_read_dynamic_sampling_in_the_rollout_stage():
    partial = ["rollout.partial.enabled=true", "rollout.scheduling=continuous"]
    base, new = keys(partial, 0), keys([*partial, "mix.dynamic_sampling=false"], 0)
    assert {stage for stage in STAGES if base[stage] != new[stage]} == TRAIN


def test_the_final_evaluation_is_keyed_by_its_own_size():
    """``eval.final_prompts`` changes only the last evaluation's key; without final sizes it equals an ordinary one
    (extending such a run reuses the old last evaluation)."""
    plain, bigger = load_config(TINY).setups(), load_config(TINY, ["eval.final_prompts=99"]).setups()
    assert plain.key("run", 4, "eval", "p", final=True) == plain.key("run", 4, "eval", "p")
    assert bigger.key("run", 4, "eval", "p") == plain.key("run", 4, "eval", "p")
    assert bigger.key("run", 4, "eval", "p", final=True) != plain.key("run", 4, "eval", "p", final=True)
    assert bigger.eval_setup(final=True).eval.n_prompts == 99 and bigger.eval_setup().eval.n_prompts == 32


def test_the_fresh_split_changes_the_last_evaluations_key_only():
    """``data.fresh_path`` (issue 41) is scored at a run's last evaluation: it changes that key and no other."""
    base, fresh = load_config(TINY).setups(), load_config(TINY, ["data.fresh_path=fresh.parquet"]).setups()
    assert base.key("run", 5, "eval", "p", final=True) != fresh.key("run", 5, "eval", "p", final=True)
    assert fresh.eval_setup(final=True).fresh_path == "fresh.parquet" and fresh.eval_setup().fresh_path is None
    for stage in STAGES:
        assert base.key("run", 5, stage, "p") == fresh.key("run", 5, stage, "p")
    sized = load_config(TINY, ["data.fresh_path=fresh.parquet", "eval.fresh_samples=2"]).setups()
    assert sized.key("run", 5, "eval", "p", final=True) != fresh.key("run", 5, "eval", "p", final=True)


def test_fields_added_off_are_not_hashed():
    """A config that does not use issue 41's fields dumps none of them: its stage keys are the ones it had before
    they existed (the setups hash the dump)."""
    dumped = load_config(TINY).setups().model_dump_json()
    assert all(name not in dumped for name in ("failed_turns", "fresh_path", "fresh_prompts", "fresh_samples",
                                               "wall_timeout_s", "register_models", "extra_turns",
                                               "retries_cost_turns", "decide", "importance_threshold",
                                               "behaviour_is_cap"))
    assert "wall_timeout_s" in load_config(TINY, ["sandbox.wall_timeout_s=30"]).setups().model_dump_json()


def test_the_committed_study_keeps_the_keys_its_runs_were_made_with():
    """``configs/regimes/t4.yaml``'s stage hashes, recorded by hand at the commit its study's runs used the code of
    (ffd00c3, before issues 38-41 added fields): a field added since must be left out of the dump while it is off
    (``OffFieldsOmitted``, ``SandboxConfig``), or resuming the study's compare ids would redo all 28 runs."""
    s = load_config(TINY.parent / "regimes" / "t4.yaml").setups()
    assert {st: s.config_hash(st) for st in ("rollout", "score", "mix", "advantage", "update", "eval", "log")} == {
        "rollout": "3dd8d8e97f6e", "score": "ab780f8db279", "mix": "2ac15f09f37e", "advantage": "37b23af45af3",
        "update": "b15b0029deaa", "eval": "b4f31a44047c", "log": "eff35c9ee2dd"}
