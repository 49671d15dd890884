"""FrozenLake's grid-reading teacher and the exact optimum it is measured against.

The teacher (``grid_lake_turn``) reads the map each turn: it locates the player and the goal
(the thought names both, 1-based "row,column": ``P at 2,3, G at 4,1: down and left.``) and writes
several moves in one answer. Each move is, with probability ``p_path``, the first move of a
shortest hole-free path on the *non-slippery* map from where the teacher expects to be, else a
random move that stays on the map and out of holes; the expected position follows each move
deterministically (the ice may disagree: the next turn re-reads the grid). Moves per turn are
drawn uniformly from ``min_actions..max_actions`` within the episode's budgets. So the teacher's
actions depend on the grid, it uses RAGEN's several-actions-per-turn format, and it is clearly
below the optimum: RL has something to sharpen.

``optimum`` is the best success probability any policy can reach under RAGEN's budgets on a map
(dynamic programming over turns: each turn picks an open-loop sequence of 1..``max_actions_per_turn``
moves with gymnasium's slip probabilities; ``max_turns`` turns, ``max_actions_per_traj`` moves in
all). ``path_agreement`` measures how grid-dependent a policy's first move is.

Run: ``optimum(board, env_config("frozen_lake"))``; the corpus uses the teacher through
``EnvWarmupConfig.lake_teacher`` (``tasks.envs.warmup``).
"""

from __future__ import annotations

import itertools
import random
from functools import lru_cache

import numpy as np

from tasks.envs.config import EnvConfig, LakeTeacherConfig
from tasks.envs.frozen_lake import MOVES
from tasks.envs.solver import lake_path, relative


def _step(board: list[str], cell: tuple[int, int], move: str) -> tuple[int, int]:
    """Where ``move`` takes the player on the non-slippery map (walls keep it in place)."""
    n = len(board)
    r, c = cell[0] + MOVES[move][0], cell[1] + MOVES[move][1]
    return (r, c) if 0 <= r < n and 0 <= c < n else cell


def _find(board: list[str], ch: str) -> tuple[int, int]:
    return next((r, c) for r, row in enumerate(board) for c, x in enumerate(row) if x == ch)


def path_moves(board: list[str], cell: tuple[int, int]) -> set[str]:
    """Every first move of some shortest hole-free path from ``cell`` to the goal (non-slippery)."""
    best = len(lake_path(board, cell))
    if best == 0:
        return set()
    out = set()
    for move in MOVES:
        nxt = _step(board, cell, move)
        if nxt != cell and board[nxt[0]][nxt[1]] != "H":
            rest = lake_path(board, nxt)
            if len(rest) == best - 1 and (rest or board[nxt[0]][nxt[1]] == "G"):
                out.add(move)
    return out


def safe_moves(board: list[str], cell: tuple[int, int]) -> list[str]:
    """Moves that change the cell and do not enter a hole (non-slippery); every move if none."""
    ok = [m for m in MOVES if (nxt := _step(board, cell, m)) != cell and board[nxt[0]][nxt[1]] != "H"]
    return ok or list(MOVES)


def grid_lake_turn(env, ep, rng: random.Random, per_turn: int, cfg: LakeTeacherConfig) -> tuple[str, list[str]]:
    """One turn of the teacher: (thought, moves) from the live FrozenLake ``env`` (see module docstring)."""
    board, here = env.board, env.pos
    goal = _find(board, "G")
    n = min(rng.randint(cfg.min_actions, cfg.max_actions), per_turn, max(ep.actions_left, 1))
    moves, cell = [], here
    for _ in range(n):
        if board[cell[0]][cell[1]] in "GH":
            break
        path = lake_path(board, cell)
        move = path[0] if path and rng.random() < cfg.p_path else rng.choice(safe_moves(board, cell))
        moves.append(move)
        cell = _step(board, cell, move)
    thought = (f"P at {here[0] + 1},{here[1] + 1}, G at {goal[0] + 1},{goal[1] + 1}: "
               f"{relative(here, goal)}.")
    return thought, moves


def _matrices(board: list[str], success_rate: float) -> np.ndarray:
    """Transition matrices ``T[a, s, s']`` of gymnasium's slippery lake (holes and goal absorbing)."""
    from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv as GymFrozenLake

    gym = GymFrozenLake(desc=board, is_slippery=True, success_rate=success_rate)
    n = len(board) ** 2
    out = np.zeros((len(MOVES), n, n))
    for s in range(n):
        for a in range(len(MOVES)):
            for p, nxt, _, _ in gym.P[s][a]:
                out[a, s, nxt] += p
    return out


def optimum(board: list[str], cfg: EnvConfig, success_rate: float = 1 / 3) -> float:
    """The highest success probability from the map's ``S`` under ``cfg``'s turn and action budgets."""
    return _optimum(tuple(board), cfg.max_turns, cfg.max_actions_per_turn, cfg.max_actions_per_traj, success_rate)


@lru_cache(maxsize=4096)
def _optimum(board: tuple[str, ...], turns: int, per_turn: int, budget: int, success_rate: float) -> float:
    rows = list(board)
    trans = _matrices(rows, success_rate)
    seqs = {k: _sequence_matrices(trans, k) for k in range(1, min(per_turn, budget) + 1)}
    goal = np.array([ch == "G" for row in rows for ch in row], dtype=float)
    value = {b: goal.copy() for b in range(budget + 1)}          # after the last turn: success = on the goal
    for _ in range(turns):
        nxt = {0: goal.copy()}
        for b in range(1, budget + 1):
            best = goal.copy()
            for k, mats in seqs.items():
                if k <= b:
                    best = np.maximum(best, (mats @ value[b - k]).max(axis=0))
            nxt[b] = best
        value = nxt
    start = _find(rows, "S")
    return float(value[budget][start[0] * len(rows) + start[1]])


def _sequence_matrices(trans: np.ndarray, k: int) -> np.ndarray:
    """Products of ``k`` transition matrices, one per move sequence: shape (4**k, n, n)."""
    return np.stack([np.linalg.multi_dot([trans[a] for a in seq]) if k > 1 else trans[seq[0]]
                     for seq in itertools.product(range(len(trans)), repeat=k)])


def path_agreement(trajs) -> float:
    """Share of first moves (first turn, first executed action) that start a shortest path to the goal.

    A policy that ignores the grid scores about the share of shortest-path moves among the four
    (~0.3–0.4 on 4×4 maps); one that reads it scores near 1."""
    hits = []
    for tr in trajs:
        turns = tr.episode.turns
        if turns and turns[0].executed:
            board = tr.episode.env.board
            hits.append(turns[0].executed[0] in path_moves(board, _find(board, "S")))
    return sum(hits) / len(hits) if hits else 0.0
