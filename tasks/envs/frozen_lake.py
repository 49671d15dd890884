"""FrozenLake (RAGEN's ``frozen_lake`` env): gymnasium's slippery lake on a random 4×4 map per seed.

The map is drawn per seed the way RAGEN draws it: every cell is frozen with probability ``p``
(0.8) else a hole, start and goal are two distinct random cells, and the draw is repeated until
a hole-free 4-neighbour path joins them. The dynamics are gymnasium's ``FrozenLakeEnv`` on that
map: slippery, the intended move happens with probability 1/3 and each perpendicular one with
1/3; falling into a hole or reaching the goal ends the episode; reward 1 at the goal, else 0.

State text (RAGEN's symbols), one row per line::

    P player, _ frozen, O hole, G goal, X player in a hole, √ player on the goal

Simplifies: the map stream is gymnasium's ``seeding.np_random(seed)`` and the slip stream is the
gymnasium env's own, seeded by ``reset(seed)``; a seed gives the same game every time.
"""

from __future__ import annotations

from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv as GymFrozenLake
from gymnasium.utils import seeding

from tasks.envs.base import Env, register_env

MOVES = {"Left": (0, -1), "Down": (1, 0), "Right": (0, 1), "Up": (-1, 0)}
"""Action name → (row, col) change; the order is RAGEN's action list and gymnasium's action ids 0..3."""

SYMBOLS = {"P": "player", "_": "empty", "O": "hole", "G": "goal", "X": "player in hole", "√": "player on goal"}
_CELL = {"F": "_", "S": "_", "H": "O", "G": "G"}


def has_path(board: list[str]) -> bool:
    """True when a 4-neighbour path of non-hole cells joins ``S`` to ``G``."""
    n = len(board)
    start = next((r, c) for r in range(n) for c in range(n) if board[r][c] == "S")
    seen, todo = {start}, [start]
    while todo:
        r, c = todo.pop()
        for dr, dc in MOVES.values():
            nr, nc = r + dr, c + dc
            if 0 <= nr < n and 0 <= nc < n and (nr, nc) not in seen and board[nr][nc] != "H":
                if board[nr][nc] == "G":
                    return True
                seen.add((nr, nc))
                todo.append((nr, nc))
    return False


def random_map(size: int, p: float, seed: int) -> list[str]:
    """A solvable ``size``×``size`` map (rows of S/F/H/G) drawn from ``seed``."""
    rng, _ = seeding.np_random(seed)
    while True:
        board = [list(row) for row in rng.choice(["F", "H"], (size, size), p=[p, 1 - p])]
        sr, sc = (int(v) for v in rng.integers(size, size=2))
        gr, gc = (int(v) for v in rng.integers(size, size=2))
        if (sr, sc) == (gr, gc):
            continue
        board[sr][sc], board[gr][gc] = "S", "G"
        rows = ["".join(row) for row in board]
        if has_path(rows):
            return rows


@register_env("frozen_lake")
class FrozenLakeEnv(Env):
    name = "frozen_lake"
    instruction = (
        "You are solving the FrozenLake puzzle. Forbid the whole and go to the target. You may move to the "
        "unintended direction due to the slippery ice. Example answer format: <think>To forbid the hole and go to "
        "the target, I should go left then go up.</think><answer>Left || Up</answer>"
    )
    symbols = SYMBOLS

    def __init__(self, size: int = 4, p: float = 0.8, is_slippery: bool = True, success_rate: float = 1 / 3):
        super().__init__()
        self.size, self.p, self.is_slippery, self.success_rate = size, p, is_slippery, success_rate
        self.board: list[str] = []
        self.gym: GymFrozenLake | None = None

    @property
    def actions(self) -> tuple[str, ...]:
        return tuple(MOVES)

    def _reset(self, seed: int) -> None:
        self.load(random_map(self.size, self.p, seed), seed)

    def load(self, board: list[str], seed: int = 0) -> None:
        """Play ``board`` (rows of S/F/H/G, gymnasium's letters) from its ``S`` (tests, hand-made maps)."""
        self.board, self.size = list(board), len(board)
        self.gym = GymFrozenLake(desc=self.board, is_slippery=self.is_slippery, success_rate=self.success_rate)
        self.gym.reset(seed=seed)
        self.done = self.success = False

    @property
    def pos(self) -> tuple[int, int]:
        s = int(self.gym.s)
        return s // self.size, s % self.size

    def _act(self, action: str) -> tuple[float, bool, dict]:
        before = self.pos
        _, reward, terminated, truncated, _ = self.gym.step(list(MOVES).index(action))
        r, c = self.pos
        return float(reward), bool(terminated or truncated), {
            "success": self.board[r][c] == "G", "effective": (r, c) != before, "hole": self.board[r][c] == "H"}

    def render(self) -> str:
        pr, pc = self.pos
        rows = []
        for r, row in enumerate(self.board):
            cells = [_CELL[ch] for ch in row]
            if r == pr:
                cells[pc] = {"H": "X", "G": "√"}.get(row[pc], "P")
            rows.append("".join(cells))
        return "\n".join(rows)
