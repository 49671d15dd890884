"""Scripted players and the warm-up corpus: episodes that act validly, in RAGEN's format.

Each registered expert picks one turn's thought and actions from the live environment:

* ``bandit``: either arm with equal probability (the warm-up must not already know the good name);
* ``frozen_lake``: a shortest hole-free path to the goal on the map (breadth-first search),
  re-planned every turn from wherever the ice put the player; ``actions_per_turn`` moves of it;
* ``sokoban``: a shortest solution from the current state (``tasks.envs.sokoban.solve``),
  ``actions_per_turn`` moves of it.

With probability ``explore`` a turn's actions are drawn uniformly from the valid names instead,
so a policy imitating the corpus acts validly but is not yet good — RL has room to improve it.
The thought names what the player sees and does ("The goal is down and right. I go Down."),
so the reasoning depends on the state (what RAGEN-2's MI diagnostics measure).

``expert_episode`` plays one episode through ``Episode`` (the rollout's rules) and returns its
messages; ``write_corpus`` writes many as JSONL rows ``{env, seed, messages, score, success}``.
Start states come from the train split only (``tasks.envs.states``).
"""

from __future__ import annotations

import json
import random
from collections import deque
from collections.abc import Callable
from pathlib import Path

from tasks.envs.base import Env, make_env
from tasks.envs.config import EnvConfig
from tasks.envs.episode import Episode
from tasks.envs.frozen_lake import MOVES as LAKE_MOVES
from tasks.envs.prompt import THINK_PREFIX
from tasks.envs.states import start_seed

Expert = Callable[[Env, Episode, random.Random, int], tuple[str, list[str]]]
_EXPERTS: dict[str, Expert] = {}


def register_expert(*names: str):
    def deco(fn):
        for n in names:
            _EXPERTS[n] = fn
        return fn

    return deco


def relative(src: tuple[int, int], dst: tuple[int, int]) -> str:
    """Where ``dst`` lies from ``src`` in words: "down and right", "up", "here"."""
    parts = [("down" if dst[0] > src[0] else "up") if dst[0] != src[0] else "",
             ("right" if dst[1] > src[1] else "left") if dst[1] != src[1] else ""]
    return " and ".join(p for p in parts if p) or "here"


@register_expert("bandit", "bandit_test")
def bandit_expert(env: Env, ep: Episode, rng: random.Random, per_turn: int) -> tuple[str, list[str]]:
    arm = rng.choice(env.actions)
    return f"I choose {arm}.", [arm]


def lake_path(board: list[str], start: tuple[int, int]) -> list[str]:
    """Shortest hole-free move list from ``start`` to the goal (deterministic moves; [] if none)."""
    n = len(board)
    prev: dict[tuple[int, int], tuple[tuple[int, int], str] | None] = {start: None}
    todo = deque([start])
    while todo:
        cell = todo.popleft()
        if board[cell[0]][cell[1]] == "G":
            path = []
            while prev[cell] is not None:
                cell, move = prev[cell]
                path.append(move)
            return path[::-1]
        for name, (dr, dc) in LAKE_MOVES.items():
            nxt = (cell[0] + dr, cell[1] + dc)
            if 0 <= nxt[0] < n and 0 <= nxt[1] < n and nxt not in prev and board[nxt[0]][nxt[1]] != "H":
                prev[nxt] = (cell, name)
                todo.append(nxt)
    return []


@register_expert("frozen_lake")
def lake_expert(env, ep: Episode, rng: random.Random, per_turn: int) -> tuple[str, list[str]]:
    goal = next((r, c) for r, row in enumerate(env.board) for c, ch in enumerate(row) if ch == "G")
    moves = lake_path(env.board, env.pos)[:per_turn]
    return f"The goal is {relative(env.pos, goal)}.", moves


@register_expert("sokoban")
def sokoban_expert(env, ep: Episode, rng: random.Random, per_turn: int) -> tuple[str, list[str]]:
    player, boxes = env.state
    box = min(boxes - env.targets or boxes)
    target = min(env.targets - boxes or env.targets)
    plan = env.solution() or []
    return f"The box is {relative(player, box)}. The target is {relative(box, target)} of the box.", plan[:per_turn]


def expert_turn(env: Env, ep: Episode, rng: random.Random, explore: float, per_turn: int,
                expert: Expert | None = None) -> str:
    """One assistant turn's full text (forced ``<think>`` included) from the registered expert, or from
    ``expert`` (its thought is then kept as it is: it names what it sees, the answer what it does)."""
    narrate = expert is None
    if expert is None:
        try:
            expert = _EXPERTS[env.name]
        except KeyError:
            raise ValueError(f"no expert for environment {env.name!r}; experts exist for {sorted(_EXPERTS)}") from None
    thought, actions = expert(env, ep, rng, per_turn)
    if rng.random() < explore or not actions:
        actions = [rng.choice(env.actions) for _ in range(max(1, len(actions)))]
    if env.name.startswith("bandit"):
        thought = f"I choose {actions[0]}."
    elif thought and narrate:
        thought += f" I go {' then '.join(actions)}."
    sep = f" {ep.cfg.action_sep} "
    body = f"{thought}</think><answer>{sep.join(actions)}</answer>" if ep.cfg.think else f"<answer>{sep.join(actions)}</answer>"
    return (THINK_PREFIX + body) if ep.cfg.think else body


def expert_episode(cfg: EnvConfig, seed: int, rng: random.Random, explore: float = 0.0,
                   actions_per_turn: int = 1, expert: Expert | None = None) -> dict:
    """Play one episode with the expert (``expert`` overrides the registered one); transcript and outcome."""
    ep = Episode(make_env(cfg.name, **cfg.options), cfg, seed)
    messages = ep.messages()
    while not ep.finished:
        text = expert_turn(ep.env, ep, rng, explore, min(actions_per_turn, cfg.max_actions_per_turn), expert)
        messages.append({"role": "assistant", "content": text})
        nxt = ep.play(text)
        if nxt is not None:
            messages.append({"role": "user", "content": nxt})
    return {"env": cfg.name, "seed": seed, "messages": messages, "score": ep.score, "success": ep.success,
            "turns": len(ep.turns)}


def write_corpus(path: Path, cfgs: list[EnvConfig], n_per_env: int, seed: int, explore: float,
                 actions_per_turn: dict[str, int] | None = None,
                 experts: dict[str, Expert] | None = None) -> dict[str, dict[str, float]]:
    """Write ``n_per_env`` expert episodes per environment as JSONL (``experts`` overrides the registered
    player per environment); per-env success and mean score."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    summary: dict[str, dict[str, float]] = {}
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w") as fh:
        for cfg in cfgs:
            env = make_env(cfg.name, **cfg.options)
            per_turn = (actions_per_turn or {}).get(cfg.name, 1)
            wins, total = 0, 0.0
            for i in range(n_per_env):
                row = expert_episode(cfg, start_seed(env, cfg, "train", seed, i, 0), rng, explore, per_turn,
                                     (experts or {}).get(cfg.name))
                wins += row["success"]
                total += row["score"]
                fh.write(json.dumps(row, ensure_ascii=False) + "\n")
            summary[cfg.name] = {"success": wins / max(n_per_env, 1), "score": total / max(n_per_env, 1)}
    tmp.replace(path)
    return summary


def read_corpus(path: Path) -> list[dict]:
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    for i, row in enumerate(rows):
        if "messages" not in row:
            raise ValueError(f"{path}: row {i} has no 'messages'")
    return rows
