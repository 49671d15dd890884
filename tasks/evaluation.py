"""Evaluation: roll a policy out on held-out prompts with SAAR off and on, and grade it.

With SAAR **off** the numbers say what the policy does on its own (internalisation): pass@1,
first-call failure rate, failures by kind. With SAAR **on** (raw share 0) they add how often
the policy fixes a failed call once it sees the error (``saar/global_recovery_rate``).
"""

from __future__ import annotations

import polars as pl

from models.engine import EngineConfig
from sandbox.config import SandboxConfig
from tasks.records import trajectory_frames
from tasks.rewards import RewardConfig
from tasks.rollout import PromptItem, Rollout, RolloutConfig
from tasks.saar import aggregate_stats
from tasks.scoring import ScoreConfig, score_rows


def evaluate_mode(ckpt: str, items: list[PromptItem], rollout: RolloutConfig, engine: EngineConfig,
                  sandbox: SandboxConfig, reward: RewardConfig, seed: int, system_prompt: str | None,
                  saar_on: bool) -> dict[str, float]:
    from tasks.stages import get_chat, get_engine, get_sandbox

    cfg = rollout.model_copy(update={"saar": rollout.saar.model_copy(update={"enabled": saar_on, "raw_share": 0.0})})
    chat = get_chat(ckpt, system_prompt)
    box = get_sandbox(sandbox)
    trajs = Rollout(cfg, get_engine(engine, ckpt, chat), chat, box).run(items, seed, step=0)
    frames = trajectory_frames(trajs, "eval", 0, chat.decode)
    _, score_metrics = score_rows(frames["trajectories"], reward, ScoreConfig(), cfg.max_response_tokens, box)
    out = {**aggregate_stats([t.stats for t in trajs], [t.raw for t in trajs]), **score_metrics}
    out["tools/first_call_failure_rate"] = 1.0 - out["tools/first_attempt_success_rate"] if out["tools/first_attempt_total"] else 0.0
    calls = frames["trajectories"]
    out["rollout/tool_use_rate"] = float((calls["tool_calls"] > 0).mean()) if calls.height else 0.0
    return out


def evaluate(ckpt: str, items: list[PromptItem], rollout: RolloutConfig, engine: EngineConfig,
             sandbox: SandboxConfig, reward: RewardConfig, seed: int, system_prompt: str | None) -> pl.DataFrame:
    """One row per mode (saar_off, saar_on) with the evaluation metrics as columns."""
    rows = []
    for mode, on in (("saar_off", False), ("saar_on", True)):
        rows.append({"mode": mode, **evaluate_mode(ckpt, items, rollout, engine, sandbox, reward, seed, system_prompt, on)})
    return pl.DataFrame(rows)
