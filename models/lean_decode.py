"""A decode step's forward without transformers' per-call machinery: the same modules, the same operations.

A one-token decode step of a small model at a small batch costs more in Python around the tensor operations
(mask building, rotary module, per-layer wrappers and keyword plumbing, output objects) than in them.
``decode_forward`` runs a Llama-family decoder (Qwen2, Llama/SmolLM2; a peft LoRA model through its base) layer
by layer calling the model's own modules — norms, projections (LoRA-wrapped or not), MLP, rotary embedding,
``apply_rotary_pos_emb`` of the model's module — and ``models.decode.gqa_decode_attention`` on the cache's
window, in transformers' order, so its logits are the same bit for bit (``tests/test_decode.py``). Models of
another shape are refused by ``supports`` and decode through transformers (``engine.lean_decode``).
"""

from __future__ import annotations

import sys

import torch

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


@torch.no_grad()
def decode_forward(model, ids: torch.Tensor, pos: torch.Tensor, attn: torch.Tensor, cache, attention) -> torch.Tensor:
    """Logits ``[n, 1, vocab]`` (float) of one token per row; ``cache.update(k, v, layer)`` appends and returns the
    layer's keys/values; ``attention`` is the decode attention function."""
    base = _base(model)
    core = base.model
    rope = sys.modules[type(core.layers[0].self_attn).__module__].apply_rotary_pos_emb
    h = core.embed_tokens(ids)
    cos, sin = core.rotary_emb(h, pos)
    mask = None if bool(attn.all()) else attn.bool()[:, None, None, :]
    for i, layer in enumerate(core.layers):
        a = layer.self_attn
        residual = h
        x = layer.input_layernorm(h)
        shape = (*x.shape[:-1], -1, a.head_dim)
        q = a.q_proj(x).view(shape).transpose(1, 2)
        k = a.k_proj(x).view(shape).transpose(1, 2)
        v = a.v_proj(x).view(shape).transpose(1, 2)
        q, k = rope(q, k, cos, sin)
        k, v = cache.update(k, v, i)
        out, _ = attention(a, q, k, v, mask, dropout=0.0, scaling=a.scaling)
        h = residual + a.o_proj(out.reshape(*x.shape[:-1], -1).contiguous())
        residual = h
        h = residual + layer.mlp(layer.post_attention_layernorm(h))
    return base.lm_head(core.norm(h)[:, -1:, :]).float()
