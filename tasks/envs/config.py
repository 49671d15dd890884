"""Config slices of the environment rollout mode and the StarPO-S group filters (pydantic only).

``EnvConfig`` says which game is played and with which budgets (RAGEN's defaults: 5 turns,
5 actions per turn, 10 actions per episode, format penalty −0.1; Bandit 1/1/1) and how start
states are split into train and held-out. ``GroupFilterConfig`` selects the StarPO-S filter
applied to prompt groups before the advantage (``tasks.envs.filters``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


def _known_env(name: str) -> str:
    from tasks.envs.base import UnknownEnvError, env_names

    if name not in env_names():
        raise UnknownEnvError(f"unknown environment {name!r}; valid: {env_names()}")
    return name


class EnvConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    name: str = "frozen_lake"
    """Registered environment trained on: ``bandit``, ``bandit_test``, ``frozen_lake``, ``sokoban``."""

    eval_name: str | None = None
    """Environment of the held-out evaluation (None: ``name`` on held-out start states; ``bandit_test`` for Bandit)."""

    options: dict = {}
    """Constructor options of the environment (e.g. ``{p: 0.8, size: 4}`` for FrozenLake)."""

    groups: int = Field(8, ge=1)
    """Start states (prompt groups) per RL step; each is played ``rollout.n_samples`` times."""

    max_turns: int = Field(5, ge=1)
    """Assistant turns per episode (RAGEN ``max_turn``)."""

    max_actions_per_turn: int = Field(5, ge=1)
    """Actions kept from one answer; the rest are dropped (RAGEN ``max_actions_per_turn``)."""

    max_actions_per_traj: int = Field(10, ge=1)
    """Actions executed per episode; the episode is truncated when they are used up."""

    format_penalty: float = -0.1
    """Added to the episode score for each turn with an unknown action or no valid action."""

    max_tokens_hint: int = Field(100, ge=1)
    """The "Max response length: N words (tokens)" figure written into every turn's prompt."""

    think: bool = True
    """Require ``<think>…</think><answer>…</answer>`` (and force generation to start with ``<think>``);
    False: ``<answer>…</answer>`` only."""

    action_sep: str = "||"
    """Separator between actions in one answer."""

    heldout_share: float = Field(0.1, ge=0, lt=1)
    """Share of start states reserved for held-out evaluation (split by a hash of the start state);
    environments with only a handful of start states (Bandit) are not split."""

    heldout_seed: int = 123
    """Base seed of the held-out start states (fixed across runs, so every run is evaluated on the same set)."""

    mi_every: int = Field(5, ge=0)
    """Run RAGEN-2's MI probe on the first step and every this many steps (0 = never)."""

    mi_samples: int = Field(64, ge=2)
    """First-turn (prompt, reasoning) pairs the MI probe scores."""

    @field_validator("name", "eval_name")
    @classmethod
    def _registered(cls, v: str | None) -> str | None:
        return v if v is None else _known_env(v)


class GroupFilterConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    kind: Literal["none", "std", "top_p"] = "none"
    """``std``: StarPO-S, keep the ``int(ratio·groups)`` groups with the highest reward std (RAGEN);
    ``top_p``: RAGEN-2's linear top-p over reward std; ``none``: keep every group."""

    ratio: float = Field(0.25, gt=0, le=1)
    """``std``: share of groups kept (RAGEN ``rollout_filter_ratio``; 1 = no-op)."""

    reverse: bool = False
    """``std``: keep the lowest-std groups instead (RAGEN ``std_rev``)."""

    top_p: float = Field(0.9, gt=0)
    """``top_p``: keep the shortest prefix (by descending std) whose std sum reaches ``top_p``·total − ``eps``
    (≥ 1 keeps every group)."""

    include_zero: bool = False
    """``top_p``: count zero-std groups in the total (RAGEN-2 recommends False)."""

    eps: float = Field(0.01, ge=0)
    """``top_p``: slack subtracted from the target std sum."""

    loss_scaling: Literal["none", "linear", "sqrt"] = "none"
    """Scale advantages by the kept share of groups (``linear``) or its square root (``sqrt``)."""

    empty_stop_steps: int = Field(5, ge=0)
    """Stop training after this many consecutive steps in which the filter kept nothing (0 = never)."""


def max_kept_trajectories(cfg: GroupFilterConfig, groups: int, group_size: int) -> int | None:
    """Most trajectories the filter can keep per step (known up front for ``std`` and ``none``; None for ``top_p``)."""
    if cfg.kind == "std":
        return int(cfg.ratio * groups) * group_size
    if cfg.kind == "none":
        return groups * group_size
    return None


SINGLE_PULL = {"max_turns": 1, "max_actions_per_turn": 1, "max_actions_per_traj": 1}
BUDGETS: dict[str, dict] = {"bandit": SINGLE_PULL, "bandit_test": SINGLE_PULL}
"""RAGEN's per-game budgets where they differ from ``EnvConfig``'s defaults (Bandit: one pull)."""


def env_config(name: str, **fields) -> EnvConfig:
    """``EnvConfig`` for ``name`` with RAGEN's budgets for that game, then ``fields``."""
    return EnvConfig(name=name, **{**BUDGETS.get(name, {}), **fields})


class LakeTeacherConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    p_path: float = Field(0.5, ge=0, le=1)
    """Chance that a move is the next step of a shortest path on the non-slippery map (else a random move
    that stays on the map and out of holes)."""

    min_actions: int = Field(1, ge=1)
    """Fewest moves the teacher writes in one answer."""

    max_actions: int = Field(3, ge=1)
    """Most moves in one answer (also capped by the episode's ``max_actions_per_turn`` and what is left)."""

    @model_validator(mode="after")
    def _ordered(self):
        if self.min_actions > self.max_actions:
            raise ValueError(f"lake_teacher: min_actions {self.min_actions} > max_actions {self.max_actions}")
        return self


class EnvWarmupConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    episodes: dict[str, int] = {"bandit": 2000, "frozen_lake": 10000, "sokoban": 3000}
    """Scripted episodes per environment in the warm-up corpus."""

    explore: float = Field(0.25, ge=0, le=1)
    """Share of scripted turns whose actions are drawn at random from the valid names, so the warmed-up
    policy acts validly but is not yet good."""

    actions_per_turn: dict[str, int] = {"sokoban": 5}
    """Actions the scripted player puts in one answer (default 1: FrozenLake is slippery, so it re-plans)."""

    lake_teacher: LakeTeacherConfig | None = None
    """FrozenLake's grid-reading teacher (``tasks.envs.lake_teacher``: positions in the thought, several noisy
    shortest-path moves per turn; ``explore`` is then not applied to FrozenLake); None: the shortest-path
    player of ``tasks.envs.solver``."""

    base: str | None = None
    """Checkpoint to continue SFT from (its tokenizer kept, e.g. ``assets/tiny-env`` re-warmed on the grid
    teacher); None: build a new tiny model and tokenizer on the corpus."""

    seed: int = 0
    """Seed of the corpus (start states, exploration) and of the SFT."""

    eval_states: int = Field(64, ge=1)
    """Held-out start states per environment on which the warmed-up policy is measured."""

    eval_samples: int = Field(2, ge=1)
    """Episodes per held-out start state in that measurement (temperature 1)."""
