"""Sokoban (RAGEN's ``SimpleSokoban``): 6×6 rooms with one box, generated solvable per seed.

No maintained Sokoban package installs here (gym-sokoban needs the retired ``gym``), so rooms
are generated in this module:

1. **topology**: a seeded random walk carves floor out of a walled ``dim``×``dim`` room;
2. **targets and player** go on random floor cells, the boxes start on the targets;
3. **reverse search**: a breadth-first search over *reverse* moves (the player steps, or steps
   back pulling the box behind it — the exact inverse of a push) from every solved state gives
   each reachable state its exact forward distance to a solution;
4. a state with every box off target and a distance in ``[min_solution, max_solution]`` is drawn
   uniformly — solvable by construction, within the action budget by default.

Dynamics and rewards are gym-sokoban's defaults: each action costs 0.1; pushing a box onto a
target +1, off a target −1; +10 when every box is on a target; the episode ends when solved or
after ``max_steps`` actions. An action into a wall, or into a box that cannot move, only costs.

State text (RAGEN's symbols)::

    # wall, _ empty, O target, √ box on target, X box, P player, S player on target
"""

from __future__ import annotations

from collections import deque

import numpy as np

from tasks.envs.base import Env, register_env

MOVES = {"Up": (-1, 0), "Down": (1, 0), "Left": (0, -1), "Right": (0, 1)}
SYMBOLS = {"#": "wall", "_": "empty", "O": "target", "√": "box on target", "X": "box", "P": "player",
           "S": "player on target"}
STEP_COST, BOX_ON, BOX_OFF, SOLVED = -0.1, 1.0, -1.0, 10.0

Cell = tuple[int, int]
State = tuple[Cell, frozenset]


def _add(a: Cell, d: Cell) -> Cell:
    return a[0] + d[0], a[1] + d[1]


def push(floor: frozenset, state: State, move: Cell) -> State:
    """The state after one forward action (unchanged when blocked)."""
    player, boxes = state
    nxt = _add(player, move)
    if nxt not in floor:
        return state
    if nxt in boxes:
        beyond = _add(nxt, move)
        if beyond not in floor or beyond in boxes:
            return state
        return nxt, (boxes - {nxt}) | {beyond}
    return nxt, boxes


def _reverse(floor: frozenset, state: State):
    """States one forward action away from ``state`` (steps and pushes inverted)."""
    player, boxes = state
    for d in MOVES.values():
        back = (player[0] - d[0], player[1] - d[1])
        if back not in floor or back in boxes:
            continue
        yield back, boxes
        ahead = _add(player, d)
        if ahead in boxes:
            yield back, (boxes - {ahead}) | {player}


def distances_to_solved(floor: frozenset, targets: frozenset) -> dict[State, int]:
    """Exact forward distance to a solved state for every state that can reach one."""
    solved = [(p, targets) for p in floor if p not in targets]
    dist = {s: 0 for s in solved}
    todo = deque(solved)
    while todo:
        s = todo.popleft()
        for prev in _reverse(floor, s):
            if prev not in dist:
                dist[prev] = dist[s] + 1
                todo.append(prev)
    return dist


def solve(floor: frozenset, targets: frozenset, state: State, limit: int = 200) -> list[str] | None:
    """A shortest action list that puts every box on a target (None if none within ``limit``)."""
    parent: dict[State, tuple[State, str] | None] = {state: None}
    depth = {state: 0}
    todo = deque([state])
    while todo:
        s = todo.popleft()
        if s[1] <= targets:
            path = []
            while parent[s] is not None:
                s, a = parent[s]
                path.append(a)
            return path[::-1]
        if depth[s] >= limit:
            continue
        for name, d in MOVES.items():
            n = push(floor, s, d)
            if n not in parent:
                parent[n], depth[n] = (s, name), depth[s] + 1
                todo.append(n)
    return None


def carve(dim: int, steps: int, rng) -> frozenset:
    """Floor cells of a random-walk room inside a wall border."""
    pos = (int(rng.integers(1, dim - 1)), int(rng.integers(1, dim - 1)))
    direction = list(MOVES.values())[int(rng.integers(4))]
    floor = {pos}
    for _ in range(steps):
        if rng.random() < 0.35:
            direction = list(MOVES.values())[int(rng.integers(4))]
        pos = (min(max(pos[0] + direction[0], 1), dim - 2), min(max(pos[1] + direction[1], 1), dim - 2))
        floor.add(pos)
        side = list(MOVES.values())[int(rng.integers(4))]
        wide = (pos[0] + side[0], pos[1] + side[1])
        if 1 <= wide[0] <= dim - 2 and 1 <= wide[1] <= dim - 2 and rng.random() < 0.5:
            floor.add(wide)
    return frozenset(floor)


def generate_room(dim: int, num_boxes: int, seed: int, min_solution: int = 1, max_solution: int = 10,
                  walk_steps: int | None = None) -> tuple[frozenset, frozenset, State, int]:
    """(floor, targets, start state, optimal solution length) of the room drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    steps = walk_steps or int(1.7 * (dim + dim))
    for _ in range(1000):
        floor = carve(dim, steps, rng)
        cells = sorted(floor)
        if len(cells) < num_boxes + 2:
            continue
        picks = rng.choice(len(cells), size=num_boxes, replace=False)
        targets = frozenset(cells[i] for i in picks)
        dist = distances_to_solved(floor, targets)
        pool = sorted((s for s, d in dist.items() if min_solution <= d <= max_solution and not (s[1] & targets)),
                      key=lambda s: (s[0], sorted(s[1])))
        if pool:
            start = pool[int(rng.integers(len(pool)))]
            return floor, targets, start, dist[start]
    raise RuntimeError(f"sokoban: no room with a {min_solution}..{max_solution}-action solution for seed {seed}")


@register_env("sokoban")
class SokobanEnv(Env):
    name = "sokoban"
    instruction = (
        "You are solving the Sokoban puzzle. You are the player and you need to push all boxes to targets. When you "
        "are right next to a box, you can push it by moving in the same direction. You cannot push a box through a "
        "wall, and you cannot pull a box. The answer should be a sequence of actions, like "
        "<answer>Right || Right || Up</answer>"
    )
    symbols = SYMBOLS

    def __init__(self, dim: int = 6, num_boxes: int = 1, max_steps: int = 100, min_solution: int = 1,
                 max_solution: int = 10):
        super().__init__()
        self.dim, self.num_boxes, self.max_steps = dim, num_boxes, max_steps
        self.shape = (dim, dim)
        self.min_solution, self.max_solution = min_solution, max_solution
        self.floor: frozenset = frozenset()
        self.targets: frozenset = frozenset()
        self.state: State = ((0, 0), frozenset())
        self.optimal = 0
        self.steps = 0

    @property
    def actions(self) -> tuple[str, ...]:
        return tuple(MOVES)

    def _reset(self, seed: int) -> None:
        self.floor, self.targets, self.state, self.optimal = generate_room(
            self.dim, self.num_boxes, seed, self.min_solution, self.max_solution)
        self.shape, self.steps = (self.dim, self.dim), 0

    def load(self, rows: list[str]) -> None:
        """Set the state from text in RAGEN's symbols (tests, hand-made rooms)."""
        floor, targets, boxes, player = set(), set(), set(), None
        for r, row in enumerate(rows):
            for c, ch in enumerate(row):
                if ch != "#":
                    floor.add((r, c))
                if ch in "O√S":
                    targets.add((r, c))
                if ch in "X√":
                    boxes.add((r, c))
                if ch in "PS":
                    player = (r, c)
        self.shape = (len(rows), max(len(r) for r in rows))
        self.floor, self.targets = frozenset(floor), frozenset(targets)
        self.state, self.steps, self.done, self.success = (player, frozenset(boxes)), 0, False, False

    def on_target(self, state: State | None = None) -> int:
        return len((state or self.state)[1] & self.targets)

    def _act(self, action: str) -> tuple[float, bool, dict]:
        before = self.state
        self.state = push(self.floor, before, MOVES[action])
        self.steps += 1
        reward = STEP_COST
        gained = self.on_target() - self.on_target(before)
        reward += BOX_ON if gained > 0 else BOX_OFF if gained < 0 else 0.0
        solved = self.state[1] <= self.targets
        if solved:
            reward += SOLVED
        return reward, solved or self.steps >= self.max_steps, {"success": solved, "effective": self.state != before}

    def solution(self) -> list[str] | None:
        """A shortest action list from the current state (None if it cannot be solved any more)."""
        return solve(self.floor, self.targets, self.state)

    def render(self) -> str:
        player, boxes = self.state
        rows = []
        for r in range(self.shape[0]):
            row = []
            for c in range(self.shape[1]):
                cell, target = (r, c), (r, c) in self.targets
                if cell == player:
                    row.append("S" if target else "P")
                elif cell in boxes:
                    row.append("√" if target else "X")
                elif cell in self.floor:
                    row.append("O" if target else "_")
                else:
                    row.append("#")
            rows.append("".join(row))
        return "\n".join(rows)
