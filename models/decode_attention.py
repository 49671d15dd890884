"""The decode attention of ``models.decode.DecodeStream``: grouped-query attention without ``repeat_kv``'s copies.

The stream switches its model from ``sdpa`` to ``decode_gqa`` (``use_decode_attention``): a one-token decode step
attends with each key/value head's query heads stacked as queries (``gqa_decode_attention``), instead of copying
the whole cache once per query head (transformers' ``repeat_kv``); prefill and training-size inputs run
transformers' ``sdpa`` unchanged.
"""

from __future__ import annotations

import torch


def gqa_decode_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                         is_causal=None, **kwargs):
    """transformers' ``sdpa`` attention, except for a one-token query with grouped key/value heads: query head
    ``h`` reads key/value head ``h // groups`` (``repeat_kv``'s layout), so the ``groups`` query heads of a key/value
    head become ``groups`` queries of one SDPA call over the uncopied cache — same scores, same softmax, no copy.
    The mask (``[B, 1, 1, W]``, one query position) is the same for all of them."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    if query.shape[2] != 1 or groups == 1 or dropout:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    b, heads, _, dim = query.shape
    q = query.reshape(b, key.shape[1], groups, dim)
    out = torch.nn.functional.scaled_dot_product_attention(q, key, value, attn_mask=attention_mask, scale=scaling)
    return out.reshape(b, heads, 1, dim).transpose(1, 2).contiguous(), None


def use_decode_attention(model) -> None:
    """Register ``decode_gqa`` (attention + sdpa's mask) once and switch an ``sdpa`` model to it."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register("decode_gqa", gqa_decode_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register("decode_gqa", sdpa_mask)
    if getattr(model.config, "_attn_implementation", None) == "sdpa":
        model.config._attn_implementation = "decode_gqa"
