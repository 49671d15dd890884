"""The pre-registered regime configs (docs/regimes.md): what each regime and arm is, and the seeds it may use."""

from __future__ import annotations

import pytest

from flows.config import load_config

TAKEN = set(range(8)) | {11, 12, 13, 14}


@pytest.mark.parametrize(("regime", "turns"), [("t4", 4), ("t2", 2)])
def test_regime_configs_register_their_arms_seeds_and_turn_budget(regime, turns):
    cfg = load_config(f"configs/regimes/{regime}.yaml")
    cmp = cfg.compare
    assert cfg.rollout.max_turns == turns
    assert cfg.rollout.tool_lag_steps == 0  # the committed runs' schedule (before lockstep tool calls)
    assert {a: cmp.seeds_of(a) for a in cmp.arms} == {
        "dapo": [21, 22, 23, 24, 25, 26], "cleaner": [21, 22, 23, 24, 25, 26],
        "mask": [21, 22, 23, 24], "truncated_is": [21, 22, 23, 24]}
    assert not TAKEN & {s for a in cmp.arms for s in cmp.seeds_of(a)}, "seeds 0-7 and 11-14 were used before"
    arms = {a: load_config(f"configs/regimes/{regime}.yaml", [*cmp.shared, *ov]) for a, ov in cmp.arms.items()}
    assert [(a, c.rollout.saar.enabled, c.rollout.saar.raw_share, c.trainer.splice) for a, c in arms.items()] == [
        ("dapo", False, 0.3, "full"), ("cleaner", True, 0.3, "full"), ("mask", True, 0.3, "mask"),
        ("truncated_is", True, 0.3, "truncated_is")]
    assert {c.rollout.max_turns for c in arms.values()} == {turns}
    assert (cmp.steps, cmp.eval_every, cmp.probe_prompts) == (24, 4, 128)
