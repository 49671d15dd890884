"""Config slice of the RL prompts (``DataConfig``): files, synthetic generation, prompts per step.

Pydantic only, so flow modules and the CLI read it without loading polars or torch.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class DataConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    train_path: str = "data/synthetic-v2/rl.parquet"
    """verl RL parquet with the training prompts (synthetic: the ``rl`` split, never a warm-up question)."""

    eval_path: str = "data/synthetic-v2/eval.parquet"
    """verl RL parquet with held-out prompts (evaluation; synthetic: the ``eval`` split)."""

    synthetic: bool = True
    """Write the synthetic task files when they are missing."""

    family: str = "single"
    """Synthetic task family written to missing files (``tasks.data.synthetic.problems.FAMILIES``): ``single`` (one
    call per prompt) or ``chain`` (2–3 dependent calls, turn budget calls + 1 per prompt; give it its own paths,
    e.g. ``data/synthetic-chain/*.parquet``)."""

    n_train: int = Field(4000, ge=1)
    """Synthetic training prompts to write."""

    n_eval: int = Field(200, ge=1)
    """Synthetic held-out prompts to write."""

    seed: int = 0
    """Seed of the synthetic files. Not the run's ``seed`` (that one orders the prompts): every run reads the same
    prompts and held-out set whatever its seed, so runs on different seeds pair up and a run started alone
    (``cleaner train --set seed=22``) sees the files a comparison wrote."""

    fresh_path: str | None = None
    """A second held-out file nothing was selected on (issue 41; e.g. ``data/synthetic-v2/fresh.parquet``): a run's
    last evaluation also scores on it (``eval_fresh/…``; ``eval.fresh_prompts`` / ``fresh_samples``). Synthetic:
    written from ``fresh_seed``, ``eval`` split questions only (never a training one) and none of ``eval_path``'s
    (``tasks.data.loader.write_fresh``); a user's file is checked for overlap with both. None: no fresh split."""

    n_fresh: int = Field(256, ge=1)
    """Synthetic fresh prompts to write."""

    fresh_seed: int = 1
    """Generator seed of the synthetic fresh file; must differ from ``seed`` (the held-out file's)."""

    prompts_per_step: int = Field(8, ge=1)
    """Prompts per RL step (each is rolled out ``rollout.n_samples`` times)."""

    refill_rounds: int = Field(0, ge=0)
    """DAPO dynamic sampling: extra rollout rounds with fresh prompts while fewer than
    ``prompts_per_step`` groups have unequal rewards (0 = no refill, only filtering)."""

    @model_validator(mode="after")
    def _family_has_its_own_files(self) -> DataConfig:
        default = DataConfig.model_fields
        shared = [f for f in ("train_path", "eval_path") if getattr(self, f) == default[f].default]
        if self.synthetic and self.family != "single" and shared:
            raise ValueError(f"data.family={self.family!r} needs its own files: data.{shared[0]} is the single-call "
                             f"task's ({getattr(self, shared[0])}); set e.g. data/synthetic-{self.family}/…")
        return self

    @model_validator(mode="after")
    def _fresh_is_another_file(self) -> DataConfig:
        if self.fresh_path is not None and self.fresh_path in (self.train_path, self.eval_path):
            raise ValueError(f"data.fresh_path: {self.fresh_path} is also the training or held-out file")
        if self.fresh_path is not None and self.synthetic and self.fresh_seed == self.seed:
            raise ValueError(f"data.fresh_seed ({self.fresh_seed}) must differ from data.seed (the held-out file's)")
        return self
