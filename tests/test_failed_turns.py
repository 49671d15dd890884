"""The filter baseline (issue 41, ``mix.failed_turns: mask``): the assistant turns whose tool call failed and stayed
in the trajectory are taken out of the loss — no rollback, nothing regenerated — by the advantage stage's
``loss_mask``, which the update trains on instead of the response mask.

Run: ``pytest tests/test_failed_turns.py``.
"""

from __future__ import annotations

import polars as pl

from models.chat import render_call
from tasks.rollout.config import RolloutConfig, SAARConfig
from tasks.rollout.machine import Rollout
from tasks.rollout.types import PromptItem
from tasks.stores.records import trajectory_frames, write_frames
from tasks.training.config import MixConfig
from tasks.training.mixing import advantage_step, failed_positions, mask_failed_turns
from tasks.training.stages import training_rows
from tests.local_box import box_fixture
from tests.scripted import ScriptedEngine

ITEM = PromptItem("p0", [{"role": "user", "content": "What is 6 * 7?"}], "synthetic/arith", "42")


box = box_fixture()


def test_mask_failed_turns_by_hand():
    """Response of three assistant turns, each followed by mask-0 tokens (end id / tool response)::

        index     0 1 2 3 4 5 6 7 8 9 10 11
        mask      1 1 1 0 0 1 1 0 0 0 1  1
        turn      0 0 0 . . 1 1 . . . 2  2
    """
    mask = [1, 1, 1, 0, 0, 1, 1, 0, 0, 0, 1, 1]
    assert mask_failed_turns(mask, {1}) == [1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 1, 1]
    assert mask_failed_turns(mask, {0, 2}) == [0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0]
    assert mask_failed_turns(mask, set()) == mask
    assert mask_failed_turns(mask, {3}) == mask  # a turn the response budget cut off: nothing to mask
    assert mask_failed_turns([0, 1, 1, 0, 1], {1}) == [0, 1, 1, 0, 0]  # a response opening with mask 0


def test_failed_positions_are_those_whose_last_attempt_failed():
    """Trajectory a: position 0 failed then recovered on a retry (not masked); position 1 failed twice (exhausted:
    masked). Trajectory b: one failed call at position 0. Trajectory c: one clean call."""
    ex = pl.DataFrame({"traj_id": ["a", "a", "a", "a", "b", "c"], "exec_idx": [0, 1, 2, 3, 0, 0],
                       "position": [0, 0, 1, 1, 0, 0], "ok": [False, True, False, False, False, True]})
    assert failed_positions(ex) == {"a": {1}, "b": {0}}
    assert failed_positions(ex.sample(fraction=1.0, shuffle=True, seed=3)) == {"a": {1}, "b": {0}}


def test_a_dapo_rollouts_failed_turn_leaves_the_loss(chat, box, tmp_path):
    """A SAAR-off rollout (a failed call, its fix, the answer) and a clean one of the same prompt: with
    ``failed_turns: mask`` the update trains the first one's turns 1 and 2 only, the clean one whole; with ``keep``
    it trains both responses' mask."""
    failed = "Go. " + render_call("pritn(6 * 7)")
    fixed, answer = "Go. " + render_call("print(6 * 7)"), "\\boxed{42}"
    cfg = RolloutConfig(n_samples=2, max_turns=4, scheduling="rounds", saar=SAARConfig(enabled=False))
    engine = ScriptedEngine(chat, [[failed, fixed, answer], [fixed, "\\boxed{41}"]])
    trajs = Rollout(cfg, engine, chat, box).run([ITEM], seed=0, step=0, progress=False)
    frames = trajectory_frames(trajs, "r", 0, chat.decode)
    write_frames(frames, tmp_path)
    keys = frames["trajectories"].select("run_id", "step", "traj_id")
    keys.with_columns(pl.Series("reward", [1.0, 0.0]), pl.lit(True).alias("graded"),
                      pl.Series("correct", [True, False])).write_parquet(tmp_path / "scores.parquet")
    keys.with_columns(pl.lit(True).alias("kept"), pl.lit(1.0).alias("adv_scale")).write_parquet(tmp_path / "mix.parquet")
    first_turn = len(chat.encode(failed)) + 1  # its ids and the end-of-turn id it sampled
    mask0, mask1 = (list(m) for m in frames["trajectories"]["response_mask"])
    assert mask0[:first_turn] == [1] * first_turn and mask0[first_turn] == 0

    metrics = advantage_step(tmp_path, MixConfig(failed_turns="mask"))
    rows = {r["traj_id"]: r for r in training_rows(tmp_path).iter_rows(named=True)}
    assert list(rows["0:p0:0"]["response_mask"]) == [0] * first_turn + mask0[first_turn:]
    assert list(rows["0:p0:1"]["response_mask"]) == mask1
    assert metrics["mix/failed_turns_masked"] == 1 and metrics["mix/failed_tokens_masked"] == first_turn

    # the log stage writes the rows with their loss mask to the store (the record of what trained)
    from tasks.stores import db

    keys = ["run_id", "step", "traj_id"]
    logged = (frames["trajectories"].join(pl.read_parquet(tmp_path / "scores.parquet"), on=keys)
              .join(pl.read_parquet(tmp_path / "mix.parquet"), on=keys)
              .join(pl.read_parquet(tmp_path / "advantages.parquet"), on=keys))
    db.replace_step(tmp_path / "store.duckdb", "r", 0, {"trajectories": logged})
    stored = db.query(tmp_path / "store.duckdb", "SELECT loss_mask FROM trajectories WHERE traj_id = '0:p0:0'")
    assert list(stored["loss_mask"][0]) == [0] * first_turn + mask0[first_turn:]

    advantage_step(tmp_path, MixConfig())
    assert "loss_mask" not in pl.read_parquet(tmp_path / "advantages.parquet").columns
    rows = {r["traj_id"]: r for r in training_rows(tmp_path).iter_rows(named=True)}
    assert list(rows["0:p0:0"]["response_mask"]) == mask0


def test_the_switch_off_changes_no_cache_key():
    """``failed_turns: keep`` is left out of the config's dump, so a run that does not use it keeps its keys."""
    assert "failed_turns" not in MixConfig().model_dump()
    assert MixConfig(failed_turns="mask").model_dump()["failed_turns"] == "mask"
    assert MixConfig().model_dump_json() != MixConfig(failed_turns="mask").model_dump_json()
