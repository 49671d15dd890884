"""Every sampled token records the policy version that sampled it (issue 52, item 1): ``models.checkpoint.policy_version``
read from a checkpoint folder, the rollout's ``sampled_version`` column (the version on sampled and spliced tokens,
−1 on tool responses), APRIL's carried tokens keeping the older version, and step folders / row-log units written
before the column still loading.

Run: ``PYTHONPATH=$PWD .venv/bin/pytest -q tests/test_staleness_stamps.py``
"""

from __future__ import annotations

import json

import polars as pl
import pytest

from models.chat import render_call
from models.checkpoint import copy_checkpoint, policy_version
from sandbox.result import ExecutionResult
from tasks.rollout.buffer import read_buffer
from tasks.rollout.config import PartialConfig, RolloutConfig, SAARConfig
from tasks.rollout.machine import Rollout
from tasks.rollout.partial import PartialRollout
from tasks.rollout.types import PromptItem
from tasks.stores.records import sampled_versions, trajectory_frames
from tests.paced import PacedEngine
from tests.scripted import ScriptedEngine
from tests.test_partial_rollout import SCRIPTS, in_order, items

ITEM = PromptItem("p0", [{"role": "user", "content": "What is 6 * 7?"}], "synthetic/arith", "42")


class Box:
    """A sandbox double: ``pritn`` fails with a NameError, any other code prints 42."""

    def run(self, code, setup=None):
        if "pritn" in code:
            return ExecutionResult(False, 1, "", "NameError: name 'pritn' is not defined", "NameError", False, False, 0.001)
        return ExecutionResult(True, 0, "42\n", "", None, False, False, 0.001)

    def run_many(self, codes, setups=None):
        return [self.run(c) for c in codes]


def test_policy_version_from_the_trainer_state_the_folder_name_or_the_start_policy(tmp_path):
    src = tmp_path / "start"
    src.mkdir()
    (src / "config.json").write_text("{}")
    assert policy_version(src) == 0  # a model folder no update wrote: the run's start policy
    ckpts = tmp_path / "checkpoints"
    written = copy_checkpoint(src, ckpts / "policy_000007", {"step": 6, "policy_version": "policy_000007"})
    assert policy_version(written) == 7 and policy_version(str(written)) == 7
    moved = ckpts / "best"
    written.rename(moved)  # the state says 7 whatever the folder is called now
    assert policy_version(moved) == 7
    bare = ckpts / "policy_000012"
    bare.mkdir()
    assert policy_version(bare) == 12  # no trainer state: the folder's name


@pytest.mark.parametrize(("name", "state", "error"), [
    ("policy_000003", {"policy_version": "policy_000004"}, r"disagrees with the folder's name 'policy_000003'"),
    ("ckpt", {"policy_version": "v4"}, r"policy_version 'v4' is not of the form policy_NNNNNN"),
    ("ckpt", {"step": 4}, r"no policy_version, and the folder is not named policy_NNNNNN"),
    ("ckpt", ["policy_000004"], r"not a JSON object"),
])
def test_a_checkpoint_whose_version_cannot_be_read_is_an_error_naming_the_path(tmp_path, name, state, error):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "trainer_state.json").write_text(json.dumps(state))
    with pytest.raises(ValueError, match=error) as err:
        policy_version(folder)
    assert str(folder) in str(err.value)
    with pytest.raises(ValueError, match=r"no checkpoint folder there") as err:
        policy_version(tmp_path / "gone")
    assert str(tmp_path / "gone") in str(err.value)


def test_a_stale_rollout_stamps_the_checkpoints_version_and_minus_one_on_tool_tokens(chat, tmp_path):
    """Step 7 sampled by policy_000005 (staleness 2): turn 1 (a call) and turn 2 (the answer) carry 5, the tool
    response between them −1; ``token_versions`` (the buffer's bookkeeping) says 5 throughout."""
    ckpt = tmp_path / "policy_000005"
    ckpt.mkdir()
    (ckpt / "trainer_state.json").write_text(json.dumps({"policy_version": "policy_000005"}))
    call, answer = "Go. " + render_call("print(6 * 7)"), "\\boxed{42}"
    cfg = RolloutConfig(n_samples=1, max_turns=3, scheduling="rounds", saar=SAARConfig(enabled=False))
    runner = Rollout(cfg, ScriptedEngine(chat, [[call, answer]]), chat, Box())
    runner.policy_version = policy_version(ckpt)
    t = runner.run([ITEM], seed=0, step=7, progress=False)[0]
    turn1, turn2 = len(chat.encode(call)) + 1, len(chat.encode(answer)) + 1
    tool = len(t.response_ids) - turn1 - turn2
    assert tool > 0 and t.response_mask == [1] * turn1 + [0] * tool + [1] * turn2
    row = trajectory_frames([t], "r", 7, chat.decode)["trajectories"].row(0, named=True)
    assert row["sampled_version"] == [5] * turn1 + [-1] * tool + [5] * turn2
    assert row["token_versions"] == [5] * len(t.response_ids) and row["traj_id"] == "7:p0:0"


def test_spliced_tokens_are_sampled_tokens(chat):
    """SAAR on: a failed call, its fix spliced over it, the answer; the spliced ids carry the version, not −1."""
    failed, fixed = "Go. " + render_call("pritn(6 * 7)"), "Fix. " + render_call("print(6 * 7)")
    cfg = RolloutConfig(n_samples=1, max_turns=3, scheduling="rounds", saar=SAARConfig(raw_share=0.0))
    runner = Rollout(cfg, ScriptedEngine(chat, [[failed, fixed, "\\boxed{42}"]]), chat, Box())
    runner.policy_version = 3
    t = runner.run([ITEM], seed=0, step=4, progress=False)[0]
    stamps = sampled_versions(t)
    assert any(t.spliced) and all(stamps[i] == 3 for i, f in enumerate(t.spliced) if f)
    assert stamps == [3 if m else -1 for m in t.response_mask] and -1 in stamps


def test_misaligned_bookkeeping_is_an_error_naming_the_trajectory(chat):
    cfg = RolloutConfig(n_samples=1, max_turns=1, scheduling="rounds", saar=SAARConfig(enabled=False))
    t = Rollout(cfg, ScriptedEngine(chat, [["\\boxed{42}"]]), chat, Box()).run([ITEM], seed=0, step=0,
                                                                                progress=False)[0]
    t.versions = t.versions[:-1]
    with pytest.raises(ValueError, match=r"0:p0:0: \d+ token versions for \d+ response tokens"):
        sampled_versions(t)


def partial_setup(chat):
    cfg = RolloutConfig(n_samples=2, max_turns=3, max_new_tokens=96, max_response_tokens=400,
                        partial=PartialConfig(enabled=True, over_sampling=4, submit_rule="in_flight"))
    grade = lambda t: 1.0 if "yes" in chat.decode(t.response_ids) else 0.0  # noqa: E731
    return cfg, Rollout(cfg, PacedEngine(chat, SCRIPTS), chat, Box()), grade


def test_april_continuation_keeps_the_version_that_sampled_each_token(chat):
    """``tests/test_partial_rollout.py``'s hand-computed timeline, sampled by versions 3 and 4 (a stale run: not the
    step index): p3, cut after 14 tokens in step 0 and finished in step 1, has 14 tokens at 3 then 48 (and 19) at 4,
    in ``token_versions`` and ``sampled_version`` alike (no tool turn)."""
    cfg, runner, grade = partial_setup(chat)
    fresh = in_order(items())
    runner.policy_version = 3
    r0 = PartialRollout(runner, cfg.partial, 2, grade).run([], fresh, 0, 0)
    assert [t.carry.versions for t in r0.buffer[0].trajs] == [[3] * 14] * 2
    runner.policy_version = 4
    r1 = PartialRollout(runner, cfg.partial, 2, grade).run(r0.buffer, fresh, 0, 1)
    p3 = r1.batch[0].trajs
    assert [t.versions for t in p3] == [[3] * 14 + [4] * 48, [3] * 14 + [4] * 19]
    rows = trajectory_frames(p3, "r", 1, chat.decode)["trajectories"]
    assert rows["sampled_version"].to_list() == [[3] * 14 + [4] * 48, [3] * 14 + [4] * 19]
    assert rows["start_step"].to_list() == [0, 0]


def test_the_partial_stage_checks_and_measures_against_the_checkpoints_version(chat, tmp_path):
    """The stage, seed 0, versions 3 then 4: p5 (a call, then a long turn) is cut after 35 tokens in step 0 and again
    after 49 in step 1; its carry keeps 35 tokens at 3 and 14 at 4 through both buffers; a buffer read under a version
    older than its tokens is refused; step 1's trained batch is all version 4 (lag 0)."""
    from tasks.training.partial_stage import partial_rollout

    for step in ("000000", "000001"):
        (tmp_path / step).mkdir()
    cfg, runner, grade = partial_setup(chat)
    pool = items()
    runner.policy_version = 3
    batch0, _ = partial_rollout(tmp_path / "000000", 0, 0, "r", runner, tuple(pool.values()), cfg, 2, grade, True)
    assert {v for t in batch0 for v in t.versions} == {3}
    buffered, _, _ = read_buffer(tmp_path / "000000", pool, version=3)
    assert [t.carry.versions if t.carry else None for g in buffered for t in g.trajs] == [[3] * 35, None]
    with pytest.raises(ValueError, match="newer than the current policy version 2"):
        read_buffer(tmp_path / "000000", pool, version=2)
    runner.policy_version = 4
    batch1, metrics = partial_rollout(tmp_path / "000001", 1, 0, "r", runner, tuple(pool.values()), cfg, 2, grade,
                                      True)
    buffered, _, _ = read_buffer(tmp_path / "000001", pool, version=4)
    assert [t.carry.versions if t.carry else None for g in buffered for t in g.trajs] == [[3] * 35 + [4] * 14, None]
    assert {v for t in batch1 for v in t.versions} == {4}
    assert metrics["partial/version_lag_max"] == 0 and metrics["partial/off_policy_tokens"] == 0


def test_a_step_folder_without_the_column_trains_and_logs(tmp_path):
    """A step folder written before ``sampled_version`` existed: its rows train with ``sampled_version`` None (no
    ``perf/staleness_*``), and the store loads them with NULL beside a new step's stamped rows."""
    from tasks.stores import db
    from tasks.training.stages import training_rows

    keys = {"run_id": ["r"], "step": [0], "traj_id": ["0:p0:0"]}
    old = pl.DataFrame({**keys, "prompt_id": ["p0"], "prompt_ids": [[1]], "response_ids": [[5, 6]],
                        "response_mask": [[1, 0]]}, schema_overrides={"response_mask": pl.List(pl.Int8)})
    old.write_parquet(tmp_path / "trajectories.parquet")
    pl.DataFrame({**keys, "advantage": [1.0]}).write_parquet(tmp_path / "advantages.parquet")
    pl.DataFrame({**keys, "reward": [1.0]}).write_parquet(tmp_path / "scores.parquet")
    pl.DataFrame({**keys, "kept": [True]}).write_parquet(tmp_path / "mix.parquet")
    row = training_rows(tmp_path).row(0, named=True)
    assert row.get("sampled_version") is None and list(row["response_mask"]) == [1, 0]

    store = tmp_path / "store.duckdb"
    db.replace_step(store, "r", 0, {"trajectories": old})
    new = pl.DataFrame({"run_id": ["r"], "step": [1], "traj_id": ["1:p0:0"], "sampled_version": [[1, -1]]},
                       schema_overrides={"sampled_version": pl.List(pl.Int32)})
    db.replace_step(store, "r", 1, {"trajectories": new})
    got = db.query(store, "SELECT step, sampled_version FROM trajectories ORDER BY step")
    assert got["step"].to_list() == [0, 1] and got["sampled_version"].to_list() == [None, [1, -1]]


@pytest.mark.parametrize("old_first", [True, False])
def test_row_log_units_written_before_the_column_load_beside_new_ones(tmp_path, old_first):
    """A run's row log holding a step unit whose file lacks ``sampled_version`` (written by older code) and one with
    it loads both, whichever file is read first: NULL for the old row, the stamps for the new one."""
    from tasks.stores import rowlog

    store = tmp_path / "store.duckdb"
    frames = {s: pl.DataFrame({"run_id": ["r"], "step": [s], "traj_id": [f"{s}:p0:0"], "sampled_version": [[s, -1]]},
                              schema_overrides={"sampled_version": pl.List(pl.Int32)}) for s in (0, 1)}
    aged = 0 if old_first else 1
    for s, df in frames.items():
        rowlog.write_unit(store, "r", "step", s, {"trajectories": df})
    unit = rowlog.latest(store, "r", rowlog.unit_name("step", aged)) / "trajectories.parquet"
    pl.read_parquet(unit).drop("sampled_version").write_parquet(unit)
    con = rowlog.load(store, ["r"], ["trajectories"])
    got = con.execute("SELECT step, sampled_version FROM trajectories ORDER BY step").fetchall()
    con.close()
    want = {0: [0, -1], 1: [1, -1]}
    assert got == [(s, None if s == aged else want[s]) for s in (0, 1)]


@pytest.mark.parametrize("retry_from_step", [0, 1])
def test_r3l_rows_carry_the_version_of_the_policy_that_sampled_them(chat, retry_from_step):
    """R3L at step 3 sampled by version 2: the base, its retry (the base's turns up to the pivot, then new ones),
    the distill copy (guidance swapped back for the plain tool response) and the reflection all stamp 2 on their
    sampled tokens and −1 on injected ones (tool responses, guidance) and on the pivot-masked turns."""
    from tasks.r3l.driver import R3LRollout
    from tasks.rollout.r3l_config import R3LConfig
    from tests.test_r3l_rollout import RuleEngine, report, reward_fn

    cfg = RolloutConfig(n_samples=1, max_turns=4, saar=SAARConfig(raw_share=0.0))
    runner = Rollout(cfg, RuleEngine(chat, report(retry_from_step=retry_from_step)), chat, Box())
    runner.policy_version = 2
    res = R3LRollout(runner, R3LConfig(), reward_fn(chat)).run([ITEM], seed=0, step=3, progress=False)
    assert {t.kind for t in res.rows} >= {"base", "retry", "distill", "reflect"}
    rows = trajectory_frames(res.rows, "run", 3, chat.decode)["trajectories"]
    for r in rows.iter_rows(named=True):
        assert r["sampled_version"] == [2 if m else -1 for m in r["response_mask"]], r["traj_id"]
        assert set(r["token_versions"]) == {2}, r["traj_id"]


def test_environment_rollouts_stamp_the_version_on_sampled_tokens():
    from tasks.training.env_stages import stamped

    df = pl.DataFrame({"traj_id": ["a", "b"], "response_mask": [[1, 1, 0, 1], [0, 1]]},
                      schema_overrides={"response_mask": pl.List(pl.Int8)})
    out = stamped(df, 6)
    assert out["sampled_version"].to_list() == [[6, 6, -1, 6], [-1, 6]]
    assert out.schema["sampled_version"] == pl.List(pl.Int32)
