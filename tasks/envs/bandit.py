"""Two-armed bandit with named arms (RAGEN's ``bandit`` env): does the policy learn the better name?

The arms are named ``hi`` ("Dragon") and ``lo`` ("Phoenix"); their order in the prompt is drawn
per seed. Pulling ``lo`` pays 0.1 always; pulling ``hi`` pays 1.0 with probability 0.25, else 0
(expected 0.25 > 0.1). One pull ends the episode; ``success`` = the ``hi`` arm was pulled. The
held-out variant ``bandit_test`` renames the arms ("Librarian" = hi, "Trader" = lo) so an
evaluation can tell a learned name from a learned rule. The state text is RAGEN's prompt.

Simplifies: the random stream is numpy's ``default_rng(seed)`` (arm order, then the payoff),
not gym's ``np_random``; the same seed gives the same game here, not RAGEN's game.
"""

from __future__ import annotations

import numpy as np

from tasks.envs.base import Env, register_env

PROMPT = """You are playing a bandit game. Goal: Maximize your total reward by choosing which arm to pull. 
Game Rules: 
1. There are 2 arms, named {name_a} and {name_b}
2. Each arm has its own reward distribution, related to their names. 
3. Analyze the symbolic meaning of each arm's name to guess how their reward distribution might behave.
4. Based on the symbolic meaning of their names, which arm do you think is more likely to give higher rewards on average? Choose between {name_a} and {name_b}, and output like <answer> {name_a} </answer> or <answer> {name_b} </answer>.
"""


@register_env("bandit")
class BanditEnv(Env):
    name = "bandit"
    list_actions = False
    split_by_state = False

    def __init__(self, hi_name: str = "Dragon", lo_name: str = "Phoenix", lo_score: float = 0.1,
                 hi_score: float = 1.0, hi_low_score: float = 0.0, hi_prob: float = 0.25):
        super().__init__()
        if hi_name.lower() == lo_name.lower():
            raise ValueError(f"bandit arms need two names, got {hi_name!r} twice")
        self.hi_name, self.lo_name = hi_name, lo_name
        self.lo_score, self.hi_score, self.hi_low_score, self.hi_prob = lo_score, hi_score, hi_low_score, hi_prob
        self.order: tuple[str, str] = (hi_name, lo_name)
        self.rng = np.random.default_rng(0)
        self.text = ""

    @property
    def actions(self) -> tuple[str, ...]:
        return self.order

    def _reset(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        lo_first = self.rng.random() < 0.5
        self.order = (self.lo_name, self.hi_name) if lo_first else (self.hi_name, self.lo_name)
        self.text = PROMPT.format(name_a=self.order[0], name_b=self.order[1])

    def payoff(self, arm: str) -> float:
        """One draw of ``arm``'s reward."""
        if arm == self.lo_name:
            return self.lo_score
        return self.hi_score if self.rng.random() < self.hi_prob else self.hi_low_score

    def _act(self, action: str) -> tuple[float, bool, dict]:
        reward = self.payoff(action)
        self.text = f"{action}: {reward} points"
        return reward, True, {"success": action == self.hi_name, "effective": True, "hi_arm": action == self.hi_name}

    def render(self) -> str:
        return self.text


@register_env("bandit_test")
class BanditTestEnv(BanditEnv):
    """Held-out bandit: the same payoffs under other names (RAGEN's ``BanditTest``)."""

    name = "bandit_test"

    def __init__(self, hi_name: str = "Librarian", lo_name: str = "Trader", **kw):
        super().__init__(hi_name=hi_name, lo_name=lo_name, **kw)
