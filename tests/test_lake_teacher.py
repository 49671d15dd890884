"""FrozenLake's grid-reading teacher (valid moves that follow a hand-made map), its seeded corpus
(disjoint from held-out start states) and the exact optimum under RAGEN's budgets on tiny maps."""

from __future__ import annotations

import random
import re
from functools import partial
from pathlib import Path

import pytest

from tasks.envs import make_env
from tasks.envs.config import EnvWarmupConfig, LakeTeacherConfig, env_config
from tasks.envs.episode import Episode
from tasks.envs.evaluate import evaluate_env
from tasks.envs.lake_teacher import grid_lake_turn, optimum, path_moves, safe_moves
from tasks.envs.prompt import parse_response
from tasks.envs.solver import read_corpus, write_corpus
from tasks.envs.states import heldout_seeds, is_heldout_state
from tasks.envs.warmup import write_env_corpus

BOARD = ["SFFF",
         "HHFH",
         "FFFH",
         "HFFG"]                       # one shortest path: Right Right Down Down Down Right


def _turn(board, p, lo, hi, seed, per_turn=5):
    cfg = env_config("frozen_lake")
    ep = Episode(make_env("frozen_lake"), cfg, 0)
    ep.env.load(board)
    return grid_lake_turn(ep.env, ep, random.Random(seed), per_turn, LakeTeacherConfig(p_path=p, min_actions=lo,
                                                                                       max_actions=hi))


def test_teacher_names_positions_and_follows_the_shortest_path():
    thought, moves = _turn(BOARD, 1.0, 3, 3, seed=0)
    assert thought == "P at 1,1, G at 4,4: down and right."
    assert moves == ["Right", "Right", "Down"]
    assert _turn(BOARD, 1.0, 5, 5, seed=0, per_turn=2)[1] == ["Right", "Right"]   # capped by the turn budget


def test_teacher_random_moves_stay_on_the_map_and_out_of_holes():
    seen = set()
    for seed in range(200):
        _, moves = _turn(BOARD, 0.0, 1, 3, seed)
        assert 1 <= len(moves) <= 3
        seen.add(len(moves))
        assert moves[0] == "Right"                     # from S every other move is a wall or a hole
        cell = (0, 0)
        for m in moves:
            assert m in safe_moves(BOARD, cell)
            cell = {"Left": (cell[0], cell[1] - 1), "Right": (cell[0], cell[1] + 1),
                    "Up": (cell[0] - 1, cell[1]), "Down": (cell[0] + 1, cell[1])}[m]
            assert BOARD[cell[0]][cell[1]] != "H"
    assert seen == {1, 2, 3}
    assert safe_moves(BOARD, (0, 1)) == ["Left", "Right"]


def test_path_moves_lists_every_shortest_first_move():
    assert path_moves(BOARD, (0, 0)) == {"Right"}
    assert path_moves(["SF", "FG"], (0, 0)) == {"Down", "Right"}
    assert path_moves(["SH", "HG"], (0, 0)) == set()


def test_optimum_by_hand_on_a_2x2_map():
    # S G / F F, slippery 1/3: one move reaches G w.p. 1/3 (Right, Up or Down: G is intended or perpendicular);
    # two moves in one turn: Up then anything towards G: 1/3 + (2/3 stay on S) x 1/3 = 5/9
    board = ["SG", "FF"]
    one = env_config("frozen_lake", max_turns=1, max_actions_per_turn=1, max_actions_per_traj=1)
    two = env_config("frozen_lake", max_turns=1, max_actions_per_turn=2, max_actions_per_traj=2)
    assert optimum(board, one) == pytest.approx(1 / 3)
    assert optimum(board, two) == pytest.approx(5 / 9)
    assert optimum(["SH", "HG"], two) == pytest.approx(0.0)   # every way to G crosses a hole


def _lake_corpus(tmp_path, name, seed, n=30):
    path = tmp_path / name
    write_corpus(path, [env_config("frozen_lake")], n, seed, 0.0, {"frozen_lake": 3},
                 {"frozen_lake": partial(grid_lake_turn, cfg=LakeTeacherConfig())})
    return path


def test_corpus_is_seeded_valid_grid_reading_and_disjoint_from_heldout(tmp_path):
    a, b, c = (_lake_corpus(tmp_path, f"{x}.jsonl", s) for x, s in (("a", 3), ("b", 3), ("c", 4)))
    assert a.read_bytes() == b.read_bytes() and a.read_bytes() != c.read_bytes()
    env, cfg = make_env("frozen_lake"), env_config("frozen_lake")
    heldout = {env.reset(s) for s in heldout_seeds(env, cfg, 64)}
    counts = []
    for row in read_corpus(a):
        start = env.reset(row["seed"])
        assert start not in heldout and not is_heldout_state(start, cfg.heldout_share)
        assert row["score"] >= 0                          # never format-penalised
        msgs = row["messages"]
        for prev, turn in zip(msgs, msgs[1:]):
            if turn["role"] != "assistant":
                continue
            parsed = parse_response(turn["content"], 5)
            assert parsed.matched and set(parsed.actions) <= set(env.actions)
            counts.append(len(parsed.actions))
            grid = prev["content"].split("State:\n")[1].split("\nYou have")[0].split("\n")
            r, c = next((r, row_.index("P") + 1) for r, row_ in enumerate(grid, 1) if "P" in row_)
            assert re.match(rf"P at {r},{c}, G at \d,\d: ", parsed.think)     # it names where it is
    assert set(counts) == {1, 2, 3}


def test_warmup_corpus_uses_the_teacher_only_when_set(tmp_path):
    on = EnvWarmupConfig(episodes={"frozen_lake": 10}, lake_teacher=LakeTeacherConfig())
    off = EnvWarmupConfig(episodes={"frozen_lake": 10})
    write_env_corpus(tmp_path / "on.jsonl", on)
    write_env_corpus(tmp_path / "off.jsonl", off)
    first = [read_corpus(tmp_path / f)[0]["messages"][2]["content"] for f in ("on.jsonl", "off.jsonl")]
    assert first[0].startswith("<think>P at ") and first[1].startswith("<think>The goal is ")
    with pytest.raises(ValueError, match="min_actions 3 > max_actions 2"):
        LakeTeacherConfig(min_actions=3, max_actions=2)


def test_rewarm_settings_get_their_own_work_folder_and_a_missing_base_is_named(tmp_path):
    from flows.warmup import env_work_name
    from models.config import TinyModelConfig, WarmupConfig
    from tasks.envs.warmup import build_env_policy

    assert env_work_name(EnvWarmupConfig(seed=2)) == "env-seed2"                  # the default corpus: as before
    grid = env_work_name(EnvWarmupConfig(lake_teacher=LakeTeacherConfig(), base="assets/tiny-env"))
    assert grid.startswith("env-seed0-") and grid != env_work_name(EnvWarmupConfig(lake_teacher=LakeTeacherConfig()))
    with pytest.raises(FileNotFoundError, match="env_warmup.base: no checkpoint at .*nowhere"):
        build_env_policy(tmp_path, tmp_path / "out", EnvWarmupConfig(base=str(tmp_path / "nowhere")),
                         TinyModelConfig(), WarmupConfig())
    assert not (tmp_path / "corpus.jsonl").exists()


def test_the_committed_grid_policy_reads_the_grid():
    """``assets/tiny-env-grid`` (FrozenLake's starting policy) answers validly, plays several moves a turn like its
    teacher (``tiny-env``: 1.0) and starts on a shortest path far more often than uniform moves (0.34): on these
    64 held-out maps × 2 it measured 0.617 with 1.62 moves a turn (``tiny-env``: 0.25 on 32 of them)."""
    m = evaluate_env(Path(__file__).resolve().parents[1] / "assets" / "tiny-env-grid", env_config("frozen_lake"), n_states=64, samples=2,
                     max_new_tokens=48, max_response_tokens=640)
    assert m["eval/frozen_lake/valid_action_rate"] >= 0.95
    assert m["eval/frozen_lake/actions_per_turn"] > 1.3
    assert m["eval/frozen_lake/path_agreement"] > 0.45
