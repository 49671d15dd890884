"""Config slices for the tiny model: its architecture/tokenizer and its warm-up SFT.

``TinyModelConfig`` is what ``models.tiny.build_tiny`` needs; ``WarmupConfig`` is what
``tasks.synthetic.write_sft_corpus`` + ``models.sft.warmup`` need. The defaults are the
measured recipe of DESIGN §6 (≈1.1M parameters, lr 2e-3 kept high until late, batch 16).
Light on imports (pydantic only) so flow modules can read them cheaply.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class TinyModelConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    vocab_size: int = Field(1024, ge=300)
    """Target vocabulary of the byte-level BPE (256 bytes + specials + merges); the synthetic
    corpus is so templated that merges run out near 750, so the real size may be smaller."""

    num_layers: int = Field(4, ge=1)
    """Transformer decoder layers."""

    hidden_size: int = Field(128, ge=8)
    """Width of the residual stream (and of the tied embeddings)."""

    num_heads: int = Field(4, ge=1)
    """Attention (query) heads; ``hidden_size`` must be divisible by it."""

    num_kv_heads: int = Field(2, ge=1)
    """Key/value heads (grouped-query attention); must divide ``num_heads``."""

    intermediate_size: int = Field(512, ge=8)
    """Width of the SwiGLU MLP."""

    tie_embeddings: bool = True
    """Share the input embedding and the LM head (saves vocab × hidden parameters)."""

    max_positions: int = Field(1024, ge=64)
    """Longest sequence (prompt + all turns) the model is built for."""

    atomic_chars: str = ""
    """Characters BPE never merges with each other, e.g. ``"_#OXPSG√\\n"`` so a text-game grid is one
    token per cell (as digits are one token each); empty: no restriction."""

    rope_theta: float = Field(10000.0, gt=0)
    """RoPE base frequency."""

    seed: int = 0
    """Seed of the random initialisation (``torch.manual_seed``)."""

    @model_validator(mode="after")
    def _heads_divide(self) -> "TinyModelConfig":
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size={self.hidden_size} is not divisible by num_heads={self.num_heads}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads} is not divisible by num_kv_heads={self.num_kv_heads}")
        return self


class WarmupConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    n_transcripts: int = Field(40000, ge=1)
    """Synthetic tool-use transcripts in the SFT corpus (before dropping any that fail checks)."""

    mistake_share: float = Field(0.3, ge=0.0, le=1.0)
    """Share of transcripts whose first tool call contains a realistic mistake and a fix."""

    deep_fix_share: float = Field(0.25, ge=0.0, le=1.0)
    """Share of fixes that rewrite the code another way with new reasoning (SAAR "deep")."""

    lr: float = Field(2e-3, gt=0)
    """Peak AdamW learning rate, held until ``decay_start`` of the run."""

    min_lr: float = Field(2e-4, ge=0)
    """Learning rate reached at the very end of the cosine decay."""

    warmup_steps: int = Field(100, ge=0)
    """Linear learning-rate warm-up steps from 0 to ``lr``."""

    decay_start: float = Field(0.8, ge=0.0, le=1.0)
    """Fraction of the run (steps or time, whichever is further) after which lr decays to
    ``min_lr``; late, because the copy-digits loss drop needs lr ≥ 1e-3 (DESIGN §6)."""

    weight_decay: float = Field(0.01, ge=0)
    """AdamW weight decay."""

    grad_clip: float = Field(1.0, gt=0)
    """Global gradient-norm clip."""

    batch_size: int = Field(16, ge=1)
    """Transcripts per optimiser step."""

    max_steps: int = Field(4000, ge=1)
    """Optimiser steps; the run also stops at ``time_budget_s``."""

    time_budget_s: float | None = Field(None, gt=0)
    """Wall-clock budget of the training loop in seconds (None: steps only)."""

    max_len: int = Field(512, ge=32)
    """Transcripts longer than this many tokens are skipped (counted in the result)."""

    seed: int = 0
    """Seed of the data order and of ``torch.manual_seed`` (pass it to ``write_sft_corpus`` too)."""

    threads: int = Field(1, ge=1)
    """``torch.set_num_threads``; one thread is ~10× faster than two under contention."""
