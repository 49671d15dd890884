"""Measure a policy on held-out start states: success, valid-action rate, reward, Bandit's hi-arm rate.

``evaluate_env`` plays ``samples`` episodes from each of ``n_states`` held-out start states
(``tasks.envs.states.heldout_seeds``; the evaluation environment ``cfg.eval_name`` when set) with a
transformers engine and returns ``<prefix>/success``, ``/pass_at_k``, ``/valid_action_rate`` (share of
turns without a format penalty), ``/score``, ``/turns``, ``/actions_per_turn`` (actions run per turn), for
FrozenLake ``/path_agreement`` (share of first moves that start a shortest path: how much the policy reads
the grid; ~0.34 for uniform moves on held-out maps) and, for Bandit, ``/hi_arm_rate``.
``summarize`` computes the same figures from finished trajectories (the training rollout uses it);
``play_heldout`` returns the episodes themselves (the training flow's evaluation traces them).

Run: ``evaluate_env(Path("assets/tiny-env"), env_config("frozen_lake"), n_states=64)``.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from tasks.envs.base import make_env
from tasks.envs.config import EnvConfig
from tasks.envs.lake_teacher import path_agreement
from tasks.envs.states import heldout_seeds


def summarize(trajs, prefix: str) -> dict[str, float]:
    """Success, pass@group, valid-action rate, score and turns of finished ``EnvTrajectory`` objects."""
    if not trajs:
        return {}
    turns = [t for tr in trajs for t in tr.episode.turns]
    groups: dict[str, list[bool]] = {}
    for tr in trajs:
        groups.setdefault(tr.group, []).append(tr.episode.success)
    k = max(len(v) for v in groups.values())
    out = {
        f"{prefix}/success": statistics.fmean(tr.episode.success for tr in trajs),
        f"{prefix}/pass_at_{k}": statistics.fmean(any(v) for v in groups.values()),
        f"{prefix}/valid_action_rate": statistics.fmean(t.penalty == 0 for t in turns) if turns else 0.0,
        f"{prefix}/score": statistics.fmean(tr.episode.score for tr in trajs),
        f"{prefix}/turns": statistics.fmean(len(tr.episode.turns) for tr in trajs),
        f"{prefix}/response_length": statistics.fmean(sum(tr.response_mask) for tr in trajs),
    }
    out[f"{prefix}/actions_per_turn"] = statistics.fmean(len(t.executed) for t in turns) if turns else 0.0
    if trajs[0].episode.env.name == "frozen_lake":
        out[f"{prefix}/path_agreement"] = path_agreement(trajs)
    if trajs[0].episode.env.name.startswith("bandit"):
        hi = [tr.episode.turns[-1].executed == [tr.episode.env.hi_name] for tr in trajs if tr.episode.turns]
        out[f"{prefix}/hi_arm_rate"] = statistics.fmean(hi) if hi else 0.0
    return out


def play_heldout(model_dir: Path, cfg: EnvConfig, n_states: int = 64, samples: int = 2, temperature: float = 1.0,
                 max_new_tokens: int = 64, max_response_tokens: int = 768, seed: int = 0, engine=None):
    """The held-out episodes of the policy at ``model_dir`` (or a live ``engine``): (trajectories, chat, seeds)."""
    from transformers import AutoTokenizer

    from models.engine import EngineConfig, make_engine
    from tasks.envs.rollout import EnvRollout
    from tasks.envs.tokens import EnvChat

    chat = EnvChat(AutoTokenizer.from_pretrained(model_dir), cfg.think)
    pad = chat.tokenizer.pad_token_id if chat.tokenizer.pad_token_id is not None else chat.eos_id
    engine = engine or make_engine(EngineConfig(temperature=temperature), model_dir, chat.eos_id, pad)
    name = cfg.eval_name or cfg.name
    seeds = heldout_seeds(make_env(name, **cfg.options), cfg, n_states)
    runner = EnvRollout(cfg, engine, chat, samples, max_new_tokens, max_response_tokens, env_name=name)
    return runner.run(seeds, seed, step=-1, progress=False), chat, seeds


def evaluate_env(model_dir: Path, cfg: EnvConfig, n_states: int = 64, samples: int = 2, temperature: float = 1.0,
                 max_new_tokens: int = 64, max_response_tokens: int = 768, seed: int = 0,
                 prefix: str | None = None, engine=None) -> dict[str, float]:
    """Play held-out episodes with the policy at ``model_dir`` (or a live ``engine``); figures as above."""
    trajs, _, _ = play_heldout(model_dir, cfg, n_states, samples, temperature, max_new_tokens, max_response_tokens,
                               seed, engine)
    return summarize(trajs, prefix or f"eval/{cfg.eval_name or cfg.name}")
