"""The environment interface and registry: text games the policy plays turn by turn.

An environment is reset from a seed to a start state and stepped with a list of action names
(one turn's actions)::

    env = make_env("frozen_lake")
    obs = env.reset(seed=3)                     # the state as text (RAGEN's grid symbols)
    res = env.step(["Down", "right"])           # StepResult(observation, reward, done, info)

Action names are matched case-insensitively against ``env.actions``; ``step`` raises
``UnknownActionError`` (listing the valid names) on a name it does not know — the episode layer
(``tasks.envs.episode``) maps model output leniently first, so a model's bad action is a format
penalty there, never an exception. ``step`` stops at the first action that ends the episode.
``info`` carries ``success`` (the episode ended in the goal state), ``effective`` (some action
changed the state) and ``executed`` (the canonical names run).

Subclasses implement ``_reset(seed)``, ``_act(action) -> (reward, done, info)`` and ``render``;
they register with ``@register_env("name")``. ``make_env`` with an unknown name lists the
registered ones.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar


class UnknownEnvError(ValueError):
    """An environment name that is not registered."""


class UnknownActionError(ValueError):
    """An action name the environment does not know."""


@dataclass(frozen=True)
class StepResult:
    observation: str
    reward: float
    done: bool
    info: dict = field(default_factory=dict)


class Env(ABC):
    """A seeded text environment with named discrete actions (see module docstring)."""

    name: ClassVar[str] = ""
    instruction: ClassVar[str] = ""
    """Task description shown before the first state (RAGEN's ``env_instruction``)."""

    symbols: ClassVar[dict[str, str]] = {}
    """Grid symbol → meaning (RAGEN's ``grid_vocab``); empty for non-grid games."""

    list_actions: ClassVar[bool] = True
    """Whether the prompt lists ``actions`` (RAGEN lists none for Bandit: the state names the arms)."""

    split_by_state: ClassVar[bool] = True
    """Whether start states are split into train and held-out by a hash of the start state (False for
    games with a handful of start states, such as Bandit, whose held-out variant renames the arms)."""

    def __init__(self) -> None:
        self.done = False
        self.success = False

    @property
    @abstractmethod
    def actions(self) -> tuple[str, ...]:
        """Canonical action names, in the order the prompt lists them."""

    @abstractmethod
    def _reset(self, seed: int) -> None:
        """Build the start state of ``seed`` (same seed, same state)."""

    @abstractmethod
    def _act(self, action: str) -> tuple[float, bool, dict]:
        """Apply one canonical action: (reward, done, info with at least ``success`` and ``effective``)."""

    @abstractmethod
    def render(self) -> str:
        """The current state as text."""

    def reset(self, seed: int) -> str:
        self.done, self.success = False, False
        self._reset(int(seed))
        return self.render()

    def lookup(self, name: str) -> str | None:
        """The canonical action for ``name`` (case-insensitive, surrounding spaces ignored), or None."""
        key = name.strip().lower()
        return next((a for a in self.actions if a.lower() == key), None)

    def step(self, actions: list[str]) -> StepResult:
        """Run ``actions`` in order until one ends the episode; unknown names raise ``UnknownActionError``."""
        if self.done:
            raise RuntimeError(f"{self.name}: step after the episode ended; call reset(seed) first")
        canonical = []
        for a in actions:
            c = self.lookup(a)
            if c is None:
                raise UnknownActionError(f"{self.name}: unknown action {a!r}; valid: {list(self.actions)}")
            canonical.append(c)
        reward, effective, executed, last = 0.0, False, [], {}
        for a in canonical:
            r, done, last = self._act(a)
            reward += r
            effective |= bool(last.get("effective", False))
            executed.append(a)
            if done:
                self.done, self.success = True, bool(last.get("success", False))
                break
        info = {**last, "success": self.success, "effective": effective, "executed": executed}
        return StepResult(self.render(), reward, self.done, info)


_ENVS: dict[str, Callable[..., Env]] = {}
_BUILTIN = ("tasks.envs.bandit", "tasks.envs.frozen_lake", "tasks.envs.sokoban")
"""Modules that register the built-in games, imported on first use (config modules stay light)."""


def _load_builtin() -> None:
    import importlib

    for module in _BUILTIN:
        importlib.import_module(module)


def register_env(name: str):
    """Class decorator: make ``name`` buildable by ``make_env``."""

    def deco(cls):
        if name in _ENVS:
            raise ValueError(f"environment {name!r} is registered twice")
        _ENVS[name] = cls
        return cls

    return deco


def env_names() -> list[str]:
    _load_builtin()
    return sorted(_ENVS)


def make_env(name: str, **options) -> Env:
    """A fresh environment by registered name; ``options`` go to its constructor."""
    _load_builtin()
    try:
        factory = _ENVS[name]
    except KeyError:
        raise UnknownEnvError(f"unknown environment {name!r}; valid: {env_names()}") from None
    return factory(**options)
