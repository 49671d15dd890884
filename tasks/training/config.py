"""Config slices of training: group filters and advantages (``MixConfig``), held-out evaluation (``EvalConfig``),
the warm-up gate (``GateConfig``) and the multi-call regime's gate (``ChainGateConfig``).

Fields added after results were committed (issue 41: ``mix.failed_turns``, ``eval.fresh_*``) are left out of a
config's dump while they hold their off value (``OffFieldsOmitted``): the stage cache keys hash the dump
(``tasks.training.setups``), so a config that does not use them keeps the keys it had before they existed.

Pydantic only, so flow modules and the CLI read them without loading polars or torch.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tasks.envs.config import GroupFilterConfig
from tasks.rollout.config import OffFieldsOmitted


class MixConfig(OffFieldsOmitted):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)
    OMIT_WHEN_OFF: ClassVar[dict[str, object]] = {"failed_turns": "keep"}

    dynamic_sampling: bool = True
    """Drop groups whose rewards are all equal (DAPO dynamic sampling)."""

    group_filter: GroupFilterConfig = GroupFilterConfig()
    """Which prompt groups train, by reward std: StarPO-S (``kind: std``, ``ratio``), RAGEN-2 linear top-p
    (``kind: top_p``) or none; plus loss scaling and the early stop after empty steps."""

    adv_eps: float = Field(1e-6, gt=0)
    """ε added to the group std in the GRPO advantage."""

    advantage: str = "grpo"
    """Registered advantage estimator (``tasks.training.advantages``): ``grpo``, ``mean`` (r − group mean, RAGEN's
    ``reward_normalization: mean``), ``opmd_reweight_adv`` (R3L's positive amplification), ``grpo_reweight_adv`` or
    ``mc_grpo`` (MC-GRPO: median baseline, MAD scale, the pivot sample dropped; set ``rollout.n_samples`` to G+1) or
    ``gae`` (the critic variant: a value head on the policy and per-token GAE; options in ``trainer.critic``)."""

    reweight_alpha: float = Field(3.0, ge=0)
    """Reweighted estimators: factor on positive scores of partial-reward rows (R3L: 3)."""

    reweight_success: float = 1.0
    """Reweighted estimators: a reward at or above this gets advantage exactly 1 (R3L: 1.0)."""

    mc_eps: float = Field(1e-3, gt=0)
    """``mc_grpo``: ε added to the group's median absolute deviation (MC-GRPO: 1e-3)."""

    failed_turns: Literal["keep", "mask"] = "keep"
    """Assistant turns whose tool call failed and stayed in the trajectory (every failure of a SAAR-off run; an
    exhausted rollback's last attempt): ``keep`` trains them like any turn; ``mask`` sets their loss mask to 0 (the
    filter baseline of issue 41: the failed attempt and its error — a tool turn, never trained — out of the loss,
    no rollback; the turns after it still train). ``tasks.training.mixing.mask_failed_turns``."""

    @field_validator("advantage")
    @classmethod
    def _known_estimator(cls, name: str) -> str:
        from tasks.training.advantages import ESTIMATORS

        if name not in ESTIMATORS:
            raise ValueError(f"unknown estimator {name!r}; registered: {', '.join(sorted(ESTIMATORS))}")
        return name


class EvalConfig(OffFieldsOmitted):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)
    OMIT_WHEN_OFF: ClassVar[dict[str, object]] = {"fresh_prompts": None, "fresh_samples": None, "shared_pass": False,
                                                  "beside_training": False}

    n_prompts: int = Field(64, ge=1)
    """Held-out prompts evaluated (the first ones of ``data.eval_path``)."""

    samples: int = Field(4, ge=1)
    """Samples per prompt; pass@k needs ``samples >= k``."""

    ks: list[int] = [1, 4]
    """k values of pass@k."""

    modes: list[Literal["saar_off", "saar_on"]] = ["saar_off", "saar_on"]
    """Rollout modes: ``saar_off`` (the policy alone) and ``saar_on`` (rollback on, raw share 0)."""

    temperature: float = Field(1.0, gt=0)
    """Sampling temperature at evaluation."""

    final_prompts: int | None = Field(None, ge=1)
    """Held-out prompts of a run's last evaluation (None: ``n_prompts``); a large final evaluation beside
    smaller ones along the way keeps the final figure precise and the curve cheap."""

    final_samples: int | None = Field(None, ge=1)
    """Samples per prompt of a run's last evaluation (None: ``samples``)."""

    fresh_prompts: int | None = Field(None, ge=1)
    """Prompts of the fresh split (``data.fresh_path``) scored at a run's last evaluation, metrics
    ``eval_fresh/<mode>/…`` (None: every prompt of the file). Read only when ``data.fresh_path`` is set."""

    fresh_samples: int | None = Field(None, ge=1)
    """Samples per prompt on the fresh split (None: the last evaluation's samples)."""

    shared_pass: bool = True
    """SAAR off and on from one paired pass (``tasks.rollout.paired``: the SAAR-off twin of a trajectory forks at
    its first failed call; the same trajectories as two separate passes, the shared turns computed once). False, or
    an engine/scheduling whose draws are not each trajectory's own: two separate passes."""

    beside_training: bool = False
    """Evaluations off the critical path: the evaluation of version N runs in an evaluation lane (a worker process,
    ``tasks.training.lanes``, with ``engine.threads`` torch threads) beside steps N + 1, …; its line is printed when
    it is done and the run's end waits for all (``@best`` and the report read the same rows). With
    ``rollout.staleness`` ≥ 1 the run's last evaluation starts beside the one before it, its prompts in parts pulled
    by this lane and the rollout lane, idle by then, as each comes free (``tasks.training.eval_shards``: the same
    figures). False: each evaluation runs in the flow process and the steps wait for it, as before. Not part of any
    stage's key (the evaluation is the same either way)."""

    def final(self) -> EvalConfig:
        """This config at the size of a run's last evaluation."""
        return self.model_copy(update={"n_prompts": self.final_prompts or self.n_prompts,
                                       "samples": self.final_samples or self.samples})


class GateConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    n_prompts: int = Field(128, ge=1)
    """Held-out prompts (``eval`` split, drawn with ``seed``)."""

    samples: int = Field(4, ge=1)
    """Samples per prompt (trajectories = ``(n_prompts − start) × samples``)."""

    start: int = Field(0, ge=0)
    """First prompt of the draw to run: a gate measured in parts runs ``start``..``n_prompts`` − 1 per part
    (``tasks.training.gate.combine_reports`` merges them)."""

    seed: int = 0
    """Seed of the prompt draw and of sampling."""

    first_call_failure: tuple[float, float] = (0.3, 0.5)
    """Allowed range of the first-call failure rate."""

    min_recovery: float = 0.7
    """Lowest allowed recovery rate."""

    p_correct_clean: tuple[float, float] = (0.4, 0.7)
    """Allowed range of P(correct | clean first call)."""

    max_gap: float = 0.1
    """Largest allowed |P(correct | recovered) − P(correct | clean)|."""

    @model_validator(mode="after")
    def _start_before_end(self) -> GateConfig:
        if self.start >= self.n_prompts:
            raise ValueError(f"gate.start ({self.start}) must be below gate.n_prompts ({self.n_prompts})")
        return self


class ChainGateConfig(BaseModel):
    """The multi-call regime's gate (``tasks.training.chain_gate``): held-out chains the compare never evaluates,
    SAAR off, each prompt's own turn budget (calls + 1)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    skip: int = Field(128, ge=0)
    """Held-out prompts skipped: the compare's final evaluation uses the first ``eval.final_prompts`` (128)."""

    prompts: int = Field(72, ge=1)
    """Held-out prompts rolled out after ``skip`` (72 × 4 = 288 trajectories)."""

    samples: int = Field(4, ge=1)
    """Samples per prompt."""

    min_trajectories: int = Field(256, ge=1)
    """Fewest trajectories the gate may pass on."""

    next_step: float = 0.8
    """Lowest share of clean calls after which the policy takes the next step: the next call while steps remain,
    the answer in the last turn after the last one."""

    binds: float = 0.9
    """Lowest share of later calls (after a clean call) that bind the previous call's printed result exactly."""

    call_failure: tuple[float, float] = (0.2, 0.45)
    """Allowed range of the failure rate per call (failures must happen, and cost)."""

    p_correct_clean: tuple[float, float] = (0.3, 0.7)
    """Allowed range of P(correct | every call clean): room to learn which program to pick."""
