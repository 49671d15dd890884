"""One episode of a text game under RAGEN's rules: budgets, lenient action mapping, format penalty.

``Episode`` is the pure core of the environment rollout (no tokens, no model): it gives the
opening messages, takes each assistant turn as text and returns the next user message, until
the episode ends::

    ep = Episode(make_env("frozen_lake"), EnvConfig(), seed=7)
    ep.messages()                       # [system, user(instruction + Turn 1 state)]
    nxt = ep.play("<think>…</think><answer>Down</answer>")   # "Reward:\\n0\\n\\nTurn 2:…" or None at the end

Rules (RAGEN ``EnvStateManager.step``): the answer's actions are mapped case-insensitively to the
environment's names; unknown names are dropped; a turn with an unknown name or with no valid
action adds ``format_penalty`` to the score (an unparsable turn is such a no-op). At most
``max_actions_per_traj − used`` actions run; the episode ends when the game ends, when the
action budget is used up, or after ``max_turns`` turns. ``success`` = the game ended in its
goal state. ``score`` = sum of game rewards + penalties: the trajectory reward.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tasks.envs.base import Env
from tasks.envs.config import EnvConfig
from tasks.envs.prompt import SYSTEM_PROMPT, Parsed, instruction, parse_response, reward_text, turn_text


@dataclass(frozen=True)
class TurnRecord:
    """One assistant turn and what the environment made of it."""

    turn: int
    state: str
    response: str
    parsed: Parsed
    executed: list[str]
    invalid: list[str]
    reward: float
    penalty: float
    done: bool
    effective: bool
    actions_left: int


@dataclass
class Episode:
    env: Env
    cfg: EnvConfig
    seed: int
    state: str = field(default="", init=False)
    start_state: str = field(default="", init=False)
    actions_used: int = field(default=0, init=False)
    penalty: float = field(default=0.0, init=False)
    finished: bool = field(default=False, init=False)
    finish_reason: str = field(default="", init=False)
    turns: list[TurnRecord] = field(default_factory=list, init=False)

    def __post_init__(self):
        self.state = self.start_state = self.env.reset(self.seed)

    @property
    def actions_left(self) -> int:
        return self.cfg.max_actions_per_traj - self.actions_used

    @property
    def reward(self) -> float:
        """Sum of the game's rewards (no penalties)."""
        return sum(t.reward for t in self.turns)

    @property
    def score(self) -> float:
        """The trajectory reward: game rewards plus format penalties."""
        return self.reward + self.penalty

    @property
    def success(self) -> bool:
        return self.env.success

    def messages(self) -> list[dict]:
        """The opening conversation: system prompt and the first user message."""
        first = instruction(self.env, self.cfg.max_actions_per_traj, self.cfg.action_sep) + self._turn_prompt(1)
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": first}]

    def _turn_prompt(self, k: int) -> str:
        return turn_text(k, self.state, self.actions_left, self.cfg.max_tokens_hint, self.cfg.think)

    def play(self, response: str) -> str | None:
        """Apply one assistant turn (full text); the next user message, or None when the episode is over."""
        if self.finished:
            raise RuntimeError(f"episode {self.env.name}:{self.seed} is over ({self.finish_reason}); no more turns")
        parsed = parse_response(response, self.cfg.max_actions_per_turn, self.cfg.action_sep, self.cfg.think)
        valid = [c for c in map(self.env.lookup, parsed.actions) if c is not None]
        invalid = [a for a in parsed.actions if self.env.lookup(a) is None]
        penalty = self.cfg.format_penalty if invalid or not valid else 0.0
        run = valid[: self.actions_left]
        res = self.env.step(run) if run else None
        executed = res.info["executed"] if res else []
        self.actions_used += len(executed)
        self.penalty += penalty
        shown, self.state = self.state, res.observation if res else self.state
        done = bool(res and res.done)
        self.turns.append(TurnRecord(len(self.turns) + 1, shown, response, parsed, executed, invalid,
                                     res.reward if res else 0.0, penalty, done,
                                     bool(res and res.info["effective"]), self.actions_left))
        if done:
            return self._finish("success" if self.env.success else "done")
        if self.actions_left <= 0:
            return self._finish("action_budget")
        if len(self.turns) >= self.cfg.max_turns:
            return self._finish("turn_budget")
        return reward_text(self.turns[-1].reward) + self._turn_prompt(len(self.turns) + 1)

    def stop(self, reason: str) -> None:
        """End the episode from outside (the rollout ran out of context); not a success."""
        if not self.finished:
            self._finish(reason)

    def _finish(self, reason: str) -> None:
        self.finished, self.finish_reason = True, reason
