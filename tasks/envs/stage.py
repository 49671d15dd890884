"""The environment parts of one RL step, called by the training stages in environment mode.

``play_step`` rolls out the step's groups (train start states of ``(run seed, step)``) with a live
engine and returns the step tables (``tasks.envs.records``), the per-step signals and the
trajectories; every ``mi_every`` steps it adds RAGEN-2's MI probe (the engine's model when it has
one in process, else the checkpoint loaded once). ``mi_due`` says when.

Signals (RAGEN's names where they exist): ``<env>/success``, ``<env>/pass_at_k``,
``<env>/valid_action_rate``, ``<env>/score``, ``<env>/actions_per_turn``, ``<env>/hi_arm_rate`` (Bandit),
``frozen_lake/path_agreement`` (grid-reading first moves), ``response_length``;
the group filter adds the reward-std ones in the mix stage, the trainer the entropy, grad norm,
clip fraction and approx KL.
"""

from __future__ import annotations

from tasks.envs.base import make_env
from tasks.envs.config import EnvConfig
from tasks.envs.evaluate import summarize
from tasks.envs.records import env_frames
from tasks.envs.rollout import EnvRollout
from tasks.envs.states import train_seeds
from tasks.envs.tokens import EnvChat


def mi_due(cfg: EnvConfig, step: int) -> bool:
    """RAGEN-2's schedule (``CollapseDetector.should_compute``: global step 1, then every ``compute_freq``-th; its
    steps count from 1, ours from 0): steps 0, ``mi_every`` − 1, 2·``mi_every`` − 1, …"""
    return bool(cfg.mi_every) and (step == 0 or (step + 1) % cfg.mi_every == 0)


def play_step(engine, tokenizer, cfg: EnvConfig, run_id: str, run_seed: int, step: int, n_samples: int,
              max_new_tokens: int, max_response_tokens: int, ckpt: str, traj_row_extra: dict | None = None):
    """Roll out one step; returns (frames, metrics, trajectories)."""
    chat = EnvChat(tokenizer, cfg.think)
    seeds = train_seeds(make_env(cfg.name, **cfg.options), cfg, run_seed, step)
    runner = EnvRollout(cfg, engine, chat, n_samples, max_new_tokens, max_response_tokens)
    trajs = runner.run(seeds, run_seed, step)
    metrics = summarize(trajs, cfg.name)
    metrics["response_length"] = metrics.pop(f"{cfg.name}/response_length")
    if mi_due(cfg, step):
        from tasks.envs.mi_probe import mi_probe

        model = getattr(engine, "model", None)
        if model is None:
            from models.engine import load_causal_lm

            model = load_causal_lm(ckpt)
        metrics.update(mi_probe(model, trajs, lambda i: chat.decode([i]), cfg.mi_samples, seed=run_seed + step))
    return env_frames(trajs, run_id, step, chat.decode, traj_row_extra), metrics, trajs
