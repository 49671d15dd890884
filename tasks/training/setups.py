"""Stage setups: the one small frozen object each stage receives, and the cache key it yields.

A stage reads only its setup (plus the step folder, the policy it starts from and the run
identity), so its cache key hashes only the configuration it reads::

    rollout    seed, model.chat, data.train_path / prompts_per_step / refill_rounds, rollout, engine,
               sandbox, reward, env (and mix.dynamic_sampling with rollout.partial)
    score      reward, score, rollout.max_response_tokens, sandbox, env
    mix        mix, trainer.mini_batches
    advantage  mix
    update     trainer, seed, the start policy (the KL reference)
    log        tracking
    eval       seed, model.chat, data.eval_path, rollout, engine, sandbox, reward, eval, tracking, env

Stages of one step hand each other files, so a stage's key also covers every stage before it
in the step (a new reward recomputes score, mix, advantage, update and log; not the rollout).
A policy after step 0 is the product of the whole training chain, so every key at step > 0
(and the evaluation of a trained version) also covers ``model.path``, ``model.base`` and the
rollout..update setups. Fields no stage reads — ``train.*``, ``name``, ``output_dir``, ``compare.*``,
``tiny.*``, ``warmup.*`` — change no key: extending ``train.steps`` of a finished run reuses
every finished stage. The run's last evaluation uses ``eval.final()`` (a larger one when
``eval.final_prompts`` / ``final_samples`` are set) and the fresh split (``data.fresh_path``, with
``eval.fresh_*``): extending such a run evaluates the old last version again at the ordinary size. Fields
added later with an off value (``tasks.training.config.OffFieldsOmitted``) are not hashed while off. ``tests/test_stage_keys.py`` pins which field changes which key.

Pydantic only (built by ``flows.config.RunConfig.setups``), so flow modules stay light.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import ClassVar

from pydantic import BaseModel, ConfigDict

from models.config import ChatConfig, EngineConfig, TrainerConfig
from sandbox.config import SandboxConfig
from tasks.envs.config import EnvConfig
from tasks.rewards.config import RewardConfig, ScoreConfig
from tasks.rollout.config import RolloutConfig
from tasks.stores.config import TrackingConfig
from tasks.training.config import EvalConfig, MixConfig, OffFieldsOmitted

CHAIN = ("rollout", "score", "mix", "advantage", "update")
"""The stages that produce the next policy, in order."""

STAGES = (*CHAIN, "log", "eval")


def digest(*parts: str) -> str:
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:12]


class _Setup(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    def digest(self) -> str:
        """Hash of everything in the setup."""
        return digest(self.model_dump_json())


class RolloutSetup(_Setup):
    seed: int
    """Run seed (data order, raw-share draws, sampling)."""

    chat: ChatConfig
    """Prompt framing."""

    train_path: str
    """Training prompts (verl RL parquet)."""

    prompts_per_step: int
    """Prompts per step."""

    refill_rounds: int
    """DAPO dynamic-sampling refill rounds."""

    dynamic_sampling: bool = True
    """``mix.dynamic_sampling`` (with ``rollout.partial``, else always True): partial rollouts count a group as
    passed only when its rewards differ."""

    rollout: RolloutConfig
    """Agent loop and SAAR."""

    engine: EngineConfig
    """Inference engine."""

    sandbox: SandboxConfig
    """Code execution."""

    reward: RewardConfig
    """Graders (the refill rounds grade groups to find informative ones)."""

    env: EnvConfig | None = None
    """A multi-turn environment instead of tool-use prompts (then only seed, env, rollout and engine are read)."""


class ScoreSetup(_Setup):
    reward: RewardConfig
    """Outcome graders."""

    score: ScoreConfig
    """Reward shaping."""

    max_response_tokens: int
    """Response budget the overlong penalty is measured against."""

    sandbox: SandboxConfig
    """Code execution (code graders)."""

    env: EnvConfig | None = None
    """Environment mode: the episode score is the reward (nothing else is read)."""


class MixSetup(_Setup):
    mix: MixConfig
    """Group filters (the advantage fields of the slice are hashed here too: one slice, two stages)."""

    mini_batches: int
    """``trainer.mini_batches``: a step keeping fewer rows than mini-batches is reported."""


class AdvantageSetup(_Setup):
    mix: MixConfig
    """Advantage estimator and its parameters."""


class UpdateSetup(_Setup):
    trainer: TrainerConfig
    """Policy update."""

    seed: int
    """Run seed (the update of step s is seeded with ``seed * 100_003 + s``)."""

    reference: str | None = None
    """The run's start policy (``model.path``, or its copy linked to ``model.base``): the KL reference, read
    only when ``trainer.kl_coef > 0``."""


class LogSetup(_Setup):
    tracking: TrackingConfig
    """MLflow and DuckDB."""


class EvalSetup(_Setup, OffFieldsOmitted):
    OMIT_WHEN_OFF: ClassVar[dict[str, object]] = {"fresh_path": None}

    seed: int
    """Run seed (sampling)."""

    chat: ChatConfig
    """Prompt framing."""

    eval_path: str
    """Held-out prompts (verl RL parquet)."""

    rollout: RolloutConfig
    """Agent loop (SAAR is switched per evaluation mode)."""

    engine: EngineConfig
    """Inference engine (temperature from ``eval``)."""

    sandbox: SandboxConfig
    """Code execution."""

    reward: RewardConfig
    """Outcome graders."""

    eval: EvalConfig
    """Prompts, samples, k values, modes."""

    fresh_path: str | None = None
    """The fresh split (``data.fresh_path``), scored too: set on a run's last evaluation only."""

    tracking: TrackingConfig
    """Where the rows and metrics go."""

    env: EnvConfig | None = None
    """Environment mode: held-out episodes instead of prompts."""


class StepSetups(_Setup):
    """Every stage's setup of one run, and the cache keys they give."""

    start_policy: str
    """``model.path``: the policy of version 0."""

    staleness: int = 0
    """``rollout.staleness``: no part of the rollout's key (its policy argument says which version it samples);
    when ≥ 1 part of every later stage's key and of every trained policy's identity (they train on other rollouts)."""

    base: str | None = None
    """``model.base``: the frozen base a LoRA adapter policy runs on (None: ``start_policy`` is a full model)."""

    rollout: RolloutSetup
    score: ScoreSetup
    mix: MixSetup
    advantage: AdvantageSetup
    update: UpdateSetup
    log: LogSetup
    eval: EvalSetup
    final_eval: EvalSetup | None = None
    """The run's last evaluation when it is larger (``eval.final_prompts`` / ``final_samples``); None: ``eval``."""

    def eval_setup(self, final: bool = False) -> EvalSetup:
        """The evaluation's setup: the last evaluation's when ``final``."""
        return self.final_eval if final and self.final_eval is not None else self.eval

    def config_hash(self, stage: str, final: bool = False) -> str:
        """Hash of the setups ``stage`` depends on within one step (its own and every earlier stage's)."""
        if stage not in STAGES:
            raise ValueError(f"stage: unknown stage {stage!r}; valid: {list(STAGES)}")
        if stage == "eval":
            return self.eval_setup(final).digest()
        upto = CHAIN if stage == "log" else CHAIN[: CHAIN.index(stage) + 1]
        own = [getattr(self, name).digest() for name in upto] + (self._lag() if stage != "rollout" else [])
        return digest(*own, self.log.digest()) if stage == "log" else digest(*own)

    def _lag(self) -> list[str]:
        """The staleness as a key part (none at 0: the keys of synchronous runs stay)."""
        return [f"staleness={self.staleness}"] if self.staleness else []

    def policy_hash(self, version: int, lag: bool = True) -> str:
        """Identity of policy ``version``: the start policy, plus the training chain once trained (and the staleness
        it was trained at, unless ``lag`` is off: the rollout's key)."""
        start = [self.start_policy] if self.base is None else [self.start_policy, self.base]
        if version == 0:
            return digest(*start)
        return digest(*start, *(getattr(self, name).digest() for name in CHAIN), *(self._lag() if lag else []))

    def key(self, run_id: str, step: int, stage: str, policy: str | Path, final: bool = False) -> str:
        """Cache key of ``stage`` at ``step`` starting from ``policy`` (policy version ``step``; for ``eval``,
        ``step`` is the version evaluated, ``final`` says it is the run's last): (run, step, stage, config hash,
        policy version)."""
        config = self.config_hash(stage, final)
        return f"{run_id}:{step}:{stage}:{config}:{self.policy_hash(step, stage != 'rollout')}-{Path(policy).name}"
