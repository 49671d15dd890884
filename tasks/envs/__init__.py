"""Multi-turn text games for RL (RAGEN's Bandit, FrozenLake, Sokoban) and StarPO-S tooling.

``make_env(name)`` / ``env_names()`` import the built-in games on first use (so config modules that
import ``tasks.envs.config`` stay free of gymnasium and numpy):

    base.py       Env interface (reset(seed) → text; step(actions) → StepResult) and registry
    bandit.py     two named arms (hi "Dragon" / lo "Phoenix"; eval variant "Librarian" / "Trader")
    frozen_lake.py gymnasium's slippery FrozenLake on a random 4×4 map per seed
    sokoban.py    6×6 one-box rooms generated solvable, gym-sokoban rewards
    prompt.py     RAGEN's prompt text and <think>/<answer> parse
    episode.py    one episode under RAGEN's budgets and format penalty (no tokens)
    states.py     seeded train / held-out start states
    filters.py    StarPO-S (std) and RAGEN-2 (linear top-p) group filters
    collapse.py   RAGEN-2 mutual-information diagnostics and success / pass@group
    solver.py     scripted players and the warm-up corpus
"""

from tasks.envs.base import Env, StepResult, UnknownActionError, UnknownEnvError, env_names, make_env, register_env

__all__ = ["Env", "StepResult", "UnknownActionError", "UnknownEnvError", "env_names", "make_env", "register_env"]
