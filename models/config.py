"""Config slices of the policy side: chat framing, engines, the trainer, the tiny model and its warm-up.

``ChatConfig`` frames prompts (``models.chat``); ``EngineConfig`` picks and tunes the inference
engine (``models.engine``, ``models.sglang_engine``); ``TrainerConfig`` is the DAPO update
(``models.trainer``). ``TinyModelConfig`` is what ``models.tiny.build_tiny`` needs;
``LoraSpec`` shapes a LoRA adapter (``models.lora``);
``WarmupConfig`` is what ``tasks.data.synthetic.write_sft_corpus`` + ``models.sft.warmup`` need. The
tiny defaults are the measured recipe of DESIGN §6 (≈1.1M parameters, lr 2e-3 kept high until
late, batch 16). Pydantic only, so flow modules and the CLI read them without loading torch.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_serializer, model_validator


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
    def _heads_divide(self) -> TinyModelConfig:
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size={self.hidden_size} is not divisible by num_heads={self.num_heads}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads} is not divisible by num_kv_heads={self.num_kv_heads}")
        return self


class LoraSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    r: int = Field(8, ge=1)
    """Rank of each adapter (A: r × in, B: out × r)."""

    alpha: float = Field(16.0, gt=0)
    """LoRA scaling numerator: the update is ``alpha / r · B A``."""

    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    """Dropout on the adapter's input during training (0: the RL's recomputed log-probs equal the rollout's)."""

    target_modules: list[str] = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    """Names of the linear layers that get an adapter (Llama/Qwen naming)."""


class WarmupConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    n_transcripts: int = Field(40000, ge=1)
    """Synthetic tool-use transcripts in the SFT corpus (before dropping any that fail checks)."""

    wrong_share: float = Field(0.4, ge=0.0, le=1.0)
    """Share of transcripts that solve with the confusable wrong program (it runs cleanly, the answer is wrong)."""

    mistake_share: float = Field(0.5, ge=0.0, le=1.0)
    """Share of transcripts whose first tool call holds a planted mistake, its real error and a fix."""

    deep_fix_share: float = Field(0.25, ge=0.0, le=1.0)
    """Share of fixes that rewrite the code another way with new reasoning (SAAR "deep")."""

    reflect_share: float = Field(0.04, ge=0.0, le=1.0)
    """Per solving transcript, the chance of also writing an R3L reflection on it with the right diagnosis."""

    retry_share: float = Field(0.04, ge=0.0, le=1.0)
    """Per transcript that was not a clean success, the chance of also writing an R3L guided retry."""

    chain_share: float = Field(0.0, ge=0.0, le=1.0)
    """Share of transcripts that are chains of 2–3 dependent calls (the multi-call regime's warm-up,
    ``tasks.data.synthetic.chain_corpus``); the rest are single-call transcripts. 0: the single-call corpus only."""

    chain_wrong_share: float = Field(0.25, ge=0.0, le=1.0)
    """Per step of a chain transcript, the chance its program is the confusable wrong one (read with
    ``chain_share``)."""

    init_from: str | None = None
    """A model folder the SFT continues from (a later warm-up stage, e.g. ``assets/tiny-warm`` for the chain
    stage) instead of a tiny model built and initialised afresh. None: build one."""

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

    micro_tokens: int | None = Field(2048, ge=1)
    """Also cut micro-batches at this many padded tokens (rows × the widest row's forward width; rows are ordered by
    width, so short rows go many to a micro-batch and long ones few): on the tiny compare's update ×1.2 faster than
    16 rows each (less padding, activations the cache holds; ``cleaner bench-step``). None: ``micro_batch`` rows."""

    threads: int = Field(1, ge=1)
    """``torch.set_num_threads``; one thread is ~10× faster than two under contention."""

    lora: LoraSpec | None = None
    """None: full fine-tune (the tiny model). Set: the base stays frozen and only a LoRA adapter trains;
    the result at ``model.path`` is an adapter folder (SmolLM2's cold start)."""

    checkpoint_every: int = Field(0, ge=0)
    """Save a resumable checkpoint (weights or adapter, optimizer, step, loss curve, elapsed time) every this
    many steps; a rerun of the warm-up continues from it (0 = never)."""

    log_every: int = Field(50, ge=1)
    """Report the mean loss of the last this many steps (progress bar, MLflow) every this many steps."""


class ChatConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    system_prompt: str | None = None
    """System message prepended to every prompt (None: the chat template's default)."""

    fewshot: list[dict[str, str]] = []
    """Worked example turns (role/content messages) placed between the system prompt and each task."""


class EngineConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    kind: str = "transformers"
    """Registered engine name: ``transformers`` (in-process) or ``sglang`` (HTTP client of SGLang servers)."""

    temperature: float = Field(1.0, gt=0)
    """Sampling temperature for rollouts."""

    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling mass (1.0 = off)."""

    max_batch: int = Field(64, ge=1)
    """Largest number of sequences generated in one forward batch."""

    batching: Literal["continuous", "static"] = "continuous"
    """In-process engine: ``continuous`` (finished rows leave the batch, queued ones join, prefixes are
    reused across turns) or ``static`` (one padded ``generate`` per chunk; the benchmark's baseline)."""

    kv_cache: Literal["preallocated", "concat"] = "preallocated"
    """In-process continuous batching: ``preallocated`` (each decode step writes its keys/values in place into
    buffers sized once; rows leaving move only the rows behind them) or ``concat`` (transformers' cache copies the
    whole batch cache for every token; the previous path). Same logits bit for bit (``models.kv_cache``)."""

    lean_decode: bool = True
    """In-process continuous batching: a decode step and a prefill call the model's own modules layer by layer
    (``models.lean_decode``: Qwen2/Llama decoders, LoRA included) instead of transformers' forward with its
    per-call machinery; the same logits bit for bit. Other models, or False: transformers' forward."""

    share_prefill: bool = True
    """In-process continuous batching: requests admitted together that feed the same ids from scratch (the samples
    of one prompt) are prefilled once and the keys/values copied to each row. The same tokens are sampled; the
    log-probs move by float noise (~1e-6: a prefill batch of other rows and widths, as any continuous batch's
    composition does). False: every row prefills its own prompt (the previous path)."""

    device: str = "cpu"
    """Torch device of the in-process engine (``cpu`` or ``cuda``)."""

    micro_tokens: int | None = Field(2048, ge=1)
    """Also cut micro-batches at this many padded tokens (rows × the widest row's forward width; rows are ordered by
    width, so short rows go many to a micro-batch and long ones few): on the tiny compare's update ×1.2 faster than
    16 rows each (less padding, activations the cache holds; ``cleaner bench-step``). None: ``micro_batch`` rows."""

    threads: int = Field(1, ge=1)
    """Torch intra-op threads on CPU (one thread is fastest on a busy 2-core machine)."""

    server_urls: list[str] = []
    """``sglang``: base URLs of SGLang servers (``http://127.0.0.1:30000``); several are used round-robin,
    or give one SGLang router URL. The servers must see checkpoint paths on the same filesystem."""

    request_timeout_s: float = Field(600.0, gt=0)
    """``sglang``: seconds one ``/generate`` or weight-update request may take."""

    max_concurrency: int = Field(64, ge=1)
    """``sglang``: requests in flight at once (the server batches them)."""

    max_retries: int = Field(3, ge=0)
    """``sglang``: retries of a request after an infrastructure failure (connection error, 5xx, abort)."""

    health_timeout_s: float = Field(300.0, gt=0)
    """``sglang``: seconds to wait for every server's ``/health`` before giving up."""

    stop: list[str] = []
    """``sglang``: extra stop strings (generation always stops at the end-of-turn token)."""


class CriticConfig(BaseModel):
    """The critic of ``mix.advantage: gae`` (``models.critic``): a value head on the policy, GAE advantages."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    enabled: bool = False
    """Train a value head and use GAE advantages per token; set by ``mix.advantage: gae`` (never by hand)."""

    gamma: float = Field(1.0, ge=0, le=1)
    """GAE discount γ over the trained (mask-1) tokens; RAGEN's critic variant: 1."""

    lam: float = Field(1.0, ge=0, le=1)
    """GAE λ; RAGEN's critic variant: 1 (then A_t = return − V_t)."""

    value_coef: float = Field(0.1, ge=0)
    """Weight of the value loss ½(V − return)², token-mean over the trained tokens, added to the policy loss;
    with a shared trunk its gradient also moves the policy's body."""

    lr: float = Field(1e-3, gt=0)
    """AdamW learning rate of the value head itself (the trunk keeps ``trainer.lr``)."""

    detach_trunk: bool = False
    """Value head on detached hidden states: the value loss trains the head only, never the policy's body."""

    whiten: bool = True
    """Normalise the GAE advantages to mean 0, std 1 over the batch's trained tokens (verl's ``masked_whiten``)."""


class TrainerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    lr: float = Field(1e-4, gt=0)
    """AdamW learning rate of the RL update."""

    weight_decay: float = Field(0.0, ge=0)
    """AdamW weight decay."""

    clip_low: float = Field(0.2, ge=0)
    """DAPO lower clip ε_low: ratio is clipped at 1 - clip_low."""

    clip_high: float = Field(0.28, ge=0)
    """DAPO upper clip ε_high (clip-higher): ratio is clipped at 1 + clip_high."""

    loss: str = "dapo"
    """Registered policy loss (``models.losses``): ``dapo`` (clipped surrogate) or ``opmd`` (R3L)."""

    opmd_tau: float = Field(1.0, ge=0)
    """OPMD τ: the loss is divided by 1 + τ (R3L: 1.0)."""

    kl_coef: float = Field(0.0, ge=0)
    """Weight of a KL penalty to the reference policy (the run's initial policy); 0 = no KL
    (DAPO), R3L's OPMD configs use 0.001 with ``k2``."""

    loss_agg: Literal["token-mean", "seq-mean-token-mean"] = "token-mean"
    """How per-token losses become the mini-batch's loss (``models.losses.AGGREGATIONS``, verl's ``loss_agg_mode``):
    ``token-mean`` (DAPO: every trained token weighs the same) or ``seq-mean-token-mean`` (every sequence weighs
    the same: the multi-turn environments' choice when failed episodes run longer than successes)."""

    kl_estimator: Literal["k1", "k2", "k3"] = "k2"
    """KL estimate per token: ``k1`` = new - ref, ``k2`` = ½(new - ref)², ``k3`` = exp(ref - new) - 1 - (ref - new)."""

    @field_validator("loss")
    @classmethod
    def _known_loss(cls, name: str) -> str:
        from models.losses import LOSSES  # torch-free module: the registry of losses

        if name not in LOSSES:
            raise ValueError(f"unknown loss {name!r}; registered losses: {', '.join(sorted(LOSSES))}")
        return name

    lr_scale: str = "none"
    """Registered learning-rate rule per optimizer step (``models.vcpo``): ``none``, ``ess_sqrt`` (VCPO: lr·√min(1,
    ρ/ρ_base), ρ = ESS/N of the mini-batch's sequence importance weights, restored after the step) or ``ess_linear``."""

    ess_rho_base: float = Field(1.0, gt=0)
    """VCPO ρ_base: the ESS ratio at or above which the learning rate is not reduced (VCPO: 1.0)."""

    opob: bool = False
    """VCPO's optimal off-policy baseline: per group, b = Σ‖g_i‖²w_i²r_i / Σ‖g_i‖²w_i² and the update follows
    Σ(r_i − b)·g_i with g_i each row's own gradient (one backward per row; the advantage stage's values are unused)."""

    opob_norm_by_std: bool = False
    """OPOB: divide (r_i − b) by the group's reward std (VCPO's ``norm_by_std``)."""

    @field_validator("lr_scale")
    @classmethod
    def _known_lr_scale(cls, name: str) -> str:
        from models.vcpo import LR_SCALES  # torch-free at import

        if name not in LR_SCALES:
            raise ValueError(f"unknown rule {name!r}; registered: {', '.join(sorted(LR_SCALES))}")
        return name

    grad_clip: float = Field(1.0, gt=0)
    """Max global gradient norm."""

    mini_batches: int = Field(2, ge=1)
    """Optimizer steps per RL step (the batch is split into this many mini-batches)."""

    epochs: int = Field(1, ge=1)
    """Passes over the batch per RL step."""

    micro_batch: int = Field(16, ge=1)
    """Sequences per forward/backward (gradient accumulation inside a mini-batch)."""

    micro_tokens: int | None = Field(2048, ge=1)
    """Also cut micro-batches at this many padded tokens (rows × the widest row's forward width; rows are ordered by
    width, so short rows go many to a micro-batch and long ones few): on the tiny compare's update ×1.2 faster than
    16 rows each (less padding, activations the cache holds; ``cleaner bench-step``). None: ``micro_batch`` rows."""

    threads: int = Field(1, ge=1)
    """Torch intra-op threads on CPU."""

    device: str = "cpu"
    """Torch device for the update."""

    fuse_old_logprobs: bool = True
    """The first mini-batch's forwards (with grad) are also its old-log-prob pass (the policy has not moved yet), so
    its rows are forwarded once instead of twice; only where exact (no critic, no OPOB, no dropout) and when that
    mini-batch is one micro-batch (fused forwards are held until the step: with several micro-batches every one's
    graph would be alive at once, and micro-batching would no longer bound memory). False: a separate no-grad pass
    over every row first (``cleaner bench-step`` measures both)."""

    causal_only: bool = True
    """The update's forwards pass no padding mask: rows are right-padded, so causal attention alone keeps every
    real token from seeing padding (and skips the masked half of the attention). False: the padding mask too."""

    response_logits: bool = True
    """The update's forwards compute logits, log-softmax and entropy only from a micro-batch's first response
    position on (the prompt positions' logits are never read). False: over every position."""

    share_prompts: bool = True
    """The update's forwards run each distinct prompt of a mini-batch once and its rows' responses attend to its
    keys/values (``models.forward``: a group's 8 samples share one prompt), instead of every row whole. Not with the
    critic or OPOB, nor in the training forwards of a model with dropout (LoRA's included: one prompt forward would
    give its rows one dropout mask). False: every row forwarded whole."""

    critic: CriticConfig = CriticConfig()
    """Value head and GAE (``mix.advantage: gae``); off otherwise."""

    splice: str = "full"
    """Registered splice treatment (``models.splice``): how tokens SAAR spliced in after a failed call train.
    ``full`` (the paper: like any token, old log-probs recomputed in the clean context), ``mask`` (out of the loss,
    the clean context kept), ``behaviour_old`` (their old log-probs are the error-context ones they were sampled
    with, so the clip sees π_clean/π_error) or ``truncated_is`` (loss weight min(1, π_clean/π_error))."""

    @field_validator("splice")
    @classmethod
    def _known_splice(cls, name: str) -> str:
        from models.splice import TREATMENTS  # torch-free at import

        if name not in TREATMENTS:
            raise ValueError(f"unknown splice treatment {name!r}; registered: {', '.join(sorted(TREATMENTS))}")
        return name

    behaviour_is_cap: float | None = Field(None, gt=0)
    """Weight every trained token's surrogate numerator by min(cap, π_old/π_behaviour) (AReaL's
    ``behav_imp_weight_cap``, verl's TIS; ``models.behaviour``): π_old recomputed under the version the update starts
    from, π_behaviour the engine's log-probs (version s − k with ``rollout.staleness: k``). Spliced tokens under
    ``splice`` truncated_is / behaviour_old keep that treatment's correction alone. None: off (out of the dump while
    off, so no stage key changes)."""

    @model_serializer(mode="wrap")
    def _omit_off(self, handler):
        """``behaviour_is_cap`` left at None (every run made before the field existed) is out of the dump, hence out
        of every stage's cache key (``tests/test_stage_keys.py``)."""
        out = handler(self)
        if out.get("behaviour_is_cap", 0) is None:
            del out["behaviour_is_cap"]
        return out

    @model_validator(mode="after")
    def _splice_fits_loss(self) -> TrainerConfig:
        if self.splice == "behaviour_old" and self.loss != "dapo":
            raise ValueError(f"trainer.splice=behaviour_old needs a ratio loss (dapo); trainer.loss={self.loss!r} "
                             "never reads the old log-probs")
        if self.splice == "truncated_is" and self.opob:
            raise ValueError("trainer.splice=truncated_is and trainer.opob exclude each other (OPOB builds its "
                             "loss per row without the treatment's weights)")
        if self.behaviour_is_cap is not None and self.opob:
            raise ValueError("trainer.behaviour_is_cap and trainer.opob exclude each other (OPOB builds its loss per "
                             "row without per-token weights)")
        return self
