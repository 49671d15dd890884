"""A decode step's forward without transformers' per-call machinery: the same modules, the same operations.

A one-token decode step of a small model at a small batch costs more in Python around the tensor operations
(mask building, rotary module, per-layer wrappers and keyword plumbing, output objects) than in them.
``decode_forward`` (and ``prefill_forward``, several tokens a row) runs a Llama-family decoder (Qwen2, Llama/SmolLM2; a peft LoRA model through its base) layer
by layer calling the model's own modules — norms, projections (LoRA-wrapped or not), MLP, rotary embedding,
``apply_rotary_pos_emb`` of the model's module — and ``models.decode.gqa_decode_attention`` on the cache's
window, in transformers' order, so its logits are the same bit for bit (``tests/test_decode.py``). Models of
another shape are refused by ``supports`` and decode through transformers (``engine.lean_decode``).

Less Python per step, the same operations: a module whose forward is one known function of its weights — a plain
``nn.Linear`` (``F.linear``), transformers' Qwen2/Llama RMSNorm (its five operations), a gated MLP of plain linears
and SiLU — is computed inline instead of through ``nn.Module.__call__`` (hooks, wrappers, keyword plumbing); any
other module (a LoRA-wrapped projection, a hooked module) is called as it is (``_plan``, built once per model).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

PARTS = ("input_layernorm", "post_attention_layernorm", "mlp", "self_attn")
ATTN = ("q_proj", "k_proj", "v_proj", "o_proj", "head_dim", "scaling")


def _base(model):
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def supports(model) -> bool:
    """A decoder this forward reproduces: ``model.model`` with embeddings, rotary, norm and standard layers."""
    base = _base(model)
    core = getattr(base, "model", None)
    if core is None or not all(hasattr(core, a) for a in ("embed_tokens", "rotary_emb", "layers", "norm")):
        return False
    if not hasattr(base, "lm_head") or type(base.config).model_type not in ("qwen2", "llama"):
        return False
    return all(all(hasattr(layer, p) for p in PARTS) and all(hasattr(layer.self_attn, a) for a in ATTN)
               for layer in core.layers)


def _plain(module: nn.Module) -> bool:
    return not (module._forward_hooks or module._forward_pre_hooks)


def _silu(act) -> bool:
    return type(act).__name__ == "SiLUActivation" or (type(act) is nn.SiLU and not act.inplace)


def _inline(module: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """``module``'s forward as a plain function of its input when it is one this file knows; else the module."""
    if type(module) is nn.Linear and _plain(module):
        weight, bias = module.weight, module.bias
        return lambda x: F.linear(x, weight, bias)
    if type(module).__name__ in ("Qwen2RMSNorm", "LlamaRMSNorm") and _plain(module):
        weight, eps = module.weight, module.variance_epsilon

        def norm(h: torch.Tensor) -> torch.Tensor:
            x = h.to(torch.float32)
            variance = x.pow(2).mean(-1, keepdim=True)
            x = x * torch.rsqrt(variance + eps)
            return weight * x.to(h.dtype)

        return norm
    if type(module).__name__ in ("Qwen2MLP", "LlamaMLP") and _plain(module) and \
            _silu(getattr(module, "act_fn", None)):
        gate, up, down = (_inline(getattr(module, p)) for p in ("gate_proj", "up_proj", "down_proj"))
        return lambda x: down(F.silu(gate(x)) * up(x))
    return module


def _plan(model) -> list:
    """Per layer: (attention module, input norm, q, k, v, o, post-attention norm, MLP), each inlined where known;
    cached on the model and rebuilt when its parameters change identity (a LoRA adapter loaded, weights replaced)."""
    core = _base(model).model
    key = tuple(id(p) for p in model.parameters())
    cached = getattr(model, "_lean_plan", None)
    if cached is not None and cached[0] == key:
        return cached[1]
    plan = [(layer.self_attn, *(_inline(m) for m in (layer.input_layernorm, layer.self_attn.q_proj,
                                                      layer.self_attn.k_proj, layer.self_attn.v_proj,
                                                      layer.self_attn.o_proj, layer.post_attention_layernorm,
                                                      layer.mlp)))
            for layer in core.layers]
    plan.append((_inline(core.norm), _inline(_base(model).lm_head)))
    object.__setattr__(model, "_lean_plan", (key, plan))
    return plan


@torch.no_grad()
def decode_forward(model, ids: torch.Tensor, pos: torch.Tensor, attn: torch.Tensor, cache, attention) -> torch.Tensor:
    """Logits ``[n, 1, vocab]`` (float) of one token per row; ``cache.update(k, v, layer)`` appends and returns the
    layer's keys/values; ``attention`` is the decode attention function."""
    core = _base(model).model
    h = core.embed_tokens(ids)
    mask = None if bool(attn.all()) else attn.bool()[:, None, None, :]
    return _layers(model, h, pos, mask, cache, attention)


@torch.no_grad()
def prefill_forward(model, ids: torch.Tensor, pos: torch.Tensor, attn: torch.Tensor, cache, attention) -> torch.Tensor:
    """Logits ``[n, 1, vocab]`` (float) of the last of several tokens per row over ``cache`` (a ``DynamicCache``
    holding the rows' reused prefixes, grown in place): transformers' own causal mask (``create_causal_mask``, as its
    forward builds it), then the same layers as a decode step — transformers' forward without its per-call
    machinery, the same logits bit for bit (``tests/test_decode.py``)."""
    from transformers.masking_utils import create_causal_mask

    core = _base(model).model
    h = core.embed_tokens(ids)
    mask = create_causal_mask(config=core.config, inputs_embeds=h, attention_mask=attn, past_key_values=cache,
                              position_ids=pos)
    return _layers(model, h, pos, mask, cache, attention)


def _layers(model, h: torch.Tensor, pos: torch.Tensor, mask, cache, attention) -> torch.Tensor:
    core = _base(model).model
    *layers, (final_norm, head) = _plan(model)
    rope = sys.modules[type(core.layers[0].self_attn).__module__].apply_rotary_pos_emb
    cos, sin = core.rotary_emb(h, pos)
    for i, (a, norm1, q_proj, k_proj, v_proj, o_proj, norm2, mlp) in enumerate(layers):
        residual = h
        x = norm1(h)
        shape = (*x.shape[:-1], -1, a.head_dim)
        q = q_proj(x).view(shape).transpose(1, 2)
        k = k_proj(x).view(shape).transpose(1, 2)
        v = v_proj(x).view(shape).transpose(1, 2)
        q, k = rope(q, k, cos, sin)
        k, v = cache.update(k, v, i)
        out, _ = attention(a, q, k, v, mask, dropout=0.0, scaling=a.scaling)
        h = residual + o_proj(out.reshape(*x.shape[:-1], -1).contiguous())
        residual = h
        h = residual + mlp(norm2(h))
    return head(final_norm(h)[:, -1:, :]).float()
