"""Inference engines: generate assistant turns for many live trajectories at once.

An engine takes a batch of ``GenRequest`` (token ids so far, a token budget) and returns,
per request, the new token ids, their log-probs under the sampling distribution and why
generation stopped (``stop`` = end-of-turn token, ``length`` = budget used up). Stopping
is on the end-of-turn id only: a hermes turn ends ``...</tool_call><|im_end|>``. An engine may also
``score(prompt_ids, response_ids)``: each response id's log-prob given everything before it, same weights, one
prefill (SAAR's importance decision, ``tasks.rollout.decisions``).

``TransformersEngine`` runs a ``from_pretrained`` checkpoint in-process (CPU or one GPU) — a full
folder, or a frozen base + LoRA adapter whose weight sync loads only the adapter. By
default (``batching: continuous``) it decodes with ``models.decode.DecodeStream``: rows join and
leave one batch, so a finished row stops costing compute, and only sampled tokens' log-probs
are kept; ``stream(seed)`` hands that batch to a caller (the rollout) that submits each turn as
soon as its trajectory is ready and reuses each trajectory's cached prefix. ``batching:
static`` is the previous path (left-pad a chunk of ``max_batch``, one ``generate`` with full
logits, every row decoding to the longest budget), kept as the benchmark's baseline. It is
the default for the demo and the tests. Engines are built by name from a registry
(``@register_engine``); an HTTP engine for SGLang servers plugs in the same way.

Simplifications: top-k is not offered; in ``static`` mode per-request budgets are honoured by
truncating after one batched ``generate`` with the largest budget.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

import torch

from models.config import EngineConfig


@dataclass(frozen=True)
class GenRequest:
    input_ids: list[int]
    max_new_tokens: int


@dataclass(frozen=True)
class GenOutput:
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: Literal["stop", "length", "abort"]
    """``stop``: the engine ended the turn (on the end-of-turn id, or on another eos id or a stop string,
    which then is the last id: ids are only what was sampled, never a token added for form);
    ``length``: the budget was used up; ``abort``: a stream's ``abort()`` stopped the turn (ids = what was
    sampled so far; only partial rollouts ask for it)."""


class Engine(Protocol):
    eos_id: int

    def generate(self, requests: list[GenRequest], seed: int) -> list[GenOutput]: ...

    def load_weights(self, path: str | Path) -> None: ...


_ENGINES: dict[str, Callable[..., Engine]] = {}
_PLUGINS = {"sglang": "models.sglang_engine"}
"""Engines registered by a module imported on first use (keeps this module free of their imports)."""


def register_engine(name: str):
    def deco(factory):
        _ENGINES[name] = factory
        return factory

    return deco


def make_engine(cfg: EngineConfig, model_path: str | Path, eos_id: int, pad_id: int) -> Engine:
    if cfg.kind not in _ENGINES and cfg.kind in _PLUGINS:
        import importlib

        importlib.import_module(_PLUGINS[cfg.kind])
    try:
        factory = _ENGINES[cfg.kind]
    except KeyError:
        raise ValueError(f"engine.kind: unknown engine {cfg.kind!r}; valid: {sorted(_ENGINES)}") from None
    return factory(cfg, model_path, eos_id, pad_id)


def load_causal_lm(path: str | Path, device: str = "cpu"):
    """A checkpoint in float32 on ``device``, eval mode: ``from_pretrained`` for a full folder, base +
    ``PeftModel`` for a LoRA adapter folder (``models.lora``)."""
    from models.lora import load_policy

    return load_policy(path, device)


@register_engine("transformers")
class TransformersEngine:
    """In-process batched generation with a transformers causal LM."""

    row_seeded = True
    """Its stream's draws are a function of (stream seed, key or ``seed_key``, input length): a turn samples the
    same tokens whatever else shares the batch, up to the float noise of other batch shapes
    (``tasks.rollout.paired`` relies on it)."""

    def __init__(self, cfg: EngineConfig, model_path: str | Path, eos_id: int, pad_id: int):
        self.cfg = cfg
        self.eos_id = eos_id
        self.pad_id = pad_id
        if cfg.device == "cpu":
            torch.set_num_threads(cfg.threads)
        self.model_path = str(model_path)
        self.model = load_causal_lm(model_path, cfg.device)
        self.counters = {"generated": 0, "decode_slots": 0}
        """Tokens returned to callers, and row-tokens decoded for them (padding after a row finished included)."""

    def load_weights(self, path: str | Path) -> None:
        """Weight sync: load the new checkpoint's parameters into the live model (only the adapter's, when
        the policy is a LoRA adapter on a frozen base)."""
        from models.lora import is_adapter, load_adapter_weights

        if str(path) == self.model_path:
            return
        if is_adapter(path) != is_adapter(self.model_path):
            raise ValueError(f"engine: cannot sync {path} into a model loaded from {self.model_path} "
                             "(one is a LoRA adapter, the other a full model)")
        if is_adapter(path):
            load_adapter_weights(self.model, path)
        else:
            self.model.load_state_dict(load_causal_lm(path, "cpu").state_dict())
        self.model_path = str(path)

    def score(self, prompt_ids: list[int], response_ids: list[int]) -> list[float]:
        """Log-prob of each response id given everything before it, under this engine's sampling distribution
        (temperature-scaled as the sampled log-probs are; at temperature 0 the log-prob at temperature 1): one
        forward without gradients, no random draw."""
        return token_logprobs(self.model, prompt_ids + response_ids, len(prompt_ids), self.cfg.temperature or 1.0,
                              self.cfg.device)

    def stream(self, seed: int, keep_prefix: bool = True):
        """A continuous decoding batch (``models.decode.DecodeStream``) on this engine's model."""
        from models.decode import DecodeStream

        return DecodeStream(self.model, self.eos_id, self.pad_id, self.cfg.temperature, self.cfg.top_p,
                            self.cfg.max_batch, seed, keep_prefix, counters=self.counters, kv_cache=self.cfg.kv_cache,
                            share_prefill=self.cfg.share_prefill, lean_decode=self.cfg.lean_decode)

    @torch.no_grad()
    def generate(self, requests: list[GenRequest], seed: int) -> list[GenOutput]:
        if self.cfg.batching == "continuous":
            stream = self.stream(seed, keep_prefix=False)
            for i, r in enumerate(requests):
                stream.submit(i, r.input_ids, r.max_new_tokens)
            outs: list[GenOutput | None] = [None] * len(requests)
            while stream.busy:
                for i, ids, lps, reason in stream.step():
                    outs[i] = GenOutput(ids, lps, reason)
            return outs  # type: ignore[return-value]
        torch.manual_seed(seed)
        order = sorted(range(len(requests)), key=lambda i: len(requests[i].input_ids))
        outputs: list[GenOutput | None] = [None] * len(requests)
        for lo in range(0, len(order), self.cfg.max_batch):
            chunk = order[lo : lo + self.cfg.max_batch]
            for i, out in zip(chunk, self._generate_chunk([requests[i] for i in chunk])):
                outputs[i] = out
        return outputs  # type: ignore[return-value]

    def _generate_chunk(self, reqs: list[GenRequest]) -> list[GenOutput]:
        width = max(len(r.input_ids) for r in reqs)
        ids = torch.full((len(reqs), width), self.pad_id, dtype=torch.long)
        attn = torch.zeros_like(ids)
        for row, r in enumerate(reqs):
            ids[row, width - len(r.input_ids) :] = torch.tensor(r.input_ids)
            attn[row, width - len(r.input_ids) :] = 1
        budget = max(r.max_new_tokens for r in reqs)
        out = self.model.generate(
            input_ids=ids.to(self.cfg.device),
            attention_mask=attn.to(self.cfg.device),
            max_new_tokens=budget,
            do_sample=True,
            temperature=self.cfg.temperature,
            top_p=self.cfg.top_p,
            top_k=0,
            eos_token_id=self.eos_id,
            pad_token_id=self.pad_id,
            output_logits=True,
            return_dict_in_generate=True,
        )
        new = out.sequences[:, width:].cpu()
        self.counters["decode_slots"] += new.numel()
        logits = torch.stack(out.logits, dim=1).float().cpu() / self.cfg.temperature
        lps = torch.log_softmax(logits, dim=-1).gather(-1, new.unsqueeze(-1)).squeeze(-1)
        return [self._trim(new[row].tolist(), lps[row].tolist(), r.max_new_tokens) for row, r in enumerate(reqs)]

    def _trim(self, toks: list[int], lps: list[float], cap: int) -> GenOutput:
        if self.eos_id in toks[:cap]:
            end = toks.index(self.eos_id) + 1
            out = GenOutput(toks[:end], lps[:end], "stop")
        else:
            out = GenOutput(toks[:cap], lps[:cap], "length")
        self.counters["generated"] += len(out.token_ids)
        return out


@torch.no_grad()
def token_logprobs(model, ids: list[int], start: int, temperature: float = 1.0, device: str = "cpu") -> list[float]:
    """``log softmax(logits / temperature)`` of ``ids[k]`` given ``ids[:k]``, for every ``k >= start`` (``start``
    >= 1: the first id has nothing before it), from one forward of ``model`` over ``ids``."""
    if not 1 <= start <= len(ids):
        raise ValueError(f"token_logprobs: start={start} must be within 1..{len(ids)} (the first id has no context)")
    x = torch.tensor([ids], dtype=torch.long, device=device)
    logits = model(input_ids=x).logits[0, start - 1 : len(ids) - 1].float() / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, x[0, start:].unsqueeze(-1)).squeeze(-1).tolist()
