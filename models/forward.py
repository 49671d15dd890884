"""The update's forwards: each response token's log-prob (and the policy's entropy there) under the policy.

A row is ``prompt_ids + response_ids``; the log-prob of response token t is read at the position before it. Two
ways to compute them, the same up to float rounding (``tests/test_step_speed.py``):

* **plain** (``response_forward``): every row of a micro-batch forwarded whole, right-padded. ``ForwardSwitches``
  trim it: ``causal_only`` (no padding mask) and ``response_logits`` (no logits over prompt positions).
* **shared prompts** (``SharedPrompts``, ``share_prompts``): a group's samples share their prompt, and the update
  forwarded it once per sample (8× on the compare: ~45 % of the update's tokens). Here each distinct prompt is
  forwarded once; its keys/values in every layer are what the rows' responses attend to::

      rows                          phase 1: distinct prompts,        phase 2: micro-batches by response length
                                    all but their last token          (the prompt's last token + the response)
      [p0 p1 p2 p3 | r0 r1 r2]  ->  [p0 p1 p2]  -> keys/values K  ->  [p3 | r0 r1 r2]  attending to K[row's prompt]
      [p0 p1 p2 p3 | s0 s1]                                            [p3 | s0 s1 ·]   (· padding, masked)

  Position j of phase 2 predicts response token j (the prompt's last token predicts the first response token), at
  position ``len(prompt) - 1 + j`` (rotary positions as in the whole row). With grad, phase 1's keys/values are
  handed to phase 2 as detached leaves: each micro-batch's backward accumulates their gradient, and
  ``SharedPrompts.backward`` sends the sum through phase 1 once (the gradient of a sum is the sum of gradients, so
  this is the plain forward's gradient, float rounding aside).

Simplifies: no value head (the critic's forwards stay plain); a model whose forward takes ``past_key_values``,
``position_ids`` and a 2-D attention mask with holes (transformers' decoders).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache


@dataclass(frozen=True)
class ForwardSwitches:
    """How the update's forwards skip work that cannot change a response token's log-prob (``TrainerConfig``)."""

    causal_only: bool = False
    """No padding mask: rows are right-padded, so causal attention alone already keeps every real token from
    seeing padding (the padded positions' own outputs are never read)."""
    response_logits: bool = False
    """Logits, log-softmax and entropy only from the micro-batch's first response position on, not over prompts."""
    share_prompts: bool = False
    """Each distinct prompt forwarded once (``SharedPrompts``), not once per row; micro-batches by response length."""

    @classmethod
    def of(cls, cfg) -> ForwardSwitches:
        """The config's switches; none with OPOB, whose per-row step keeps the previous forward throughout."""
        return cls() if cfg.opob else cls(cfg.causal_only, cfg.response_logits, cfg.share_prompts)


def _pad_batch(samples: list, pad_id: int, device: str):
    """Right-padded ``prompt+response`` ids, attention mask, and per-token response masks."""
    width = max(len(s.prompt_ids) + len(s.response_ids) for s in samples)
    rlen = max(len(s.response_ids) for s in samples)
    ids = torch.full((len(samples), width), pad_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    resp_mask = torch.zeros((len(samples), rlen))
    starts = []
    for i, s in enumerate(samples):
        seq = s.prompt_ids + s.response_ids
        ids[i, : len(seq)] = torch.tensor(seq)
        attn[i, : len(seq)] = 1
        resp_mask[i, : len(s.response_ids)] = torch.tensor(s.response_mask, dtype=torch.float)
        starts.append(len(s.prompt_ids))
    return ids.to(device), attn.to(device), resp_mask.to(device), starts, rlen


def response_forward(model, samples: list, pad_id: int, device: str = "cpu", head=None,
                     detach_trunk: bool = False, fast: ForwardSwitches | None = None):
    """Log-probs, mask, entropy and — with a value ``head`` (``models.critic``) — values ``[B, R]`` of the
    response tokens, each read at the position that predicts the token (values None without a head)."""
    fast = fast or ForwardSwitches()
    ids, attn, resp_mask, starts, rlen = _pad_batch(samples, pad_id, device)
    first = min(starts) - 1 if fast.response_logits else 0
    """Position of the first logit computed: the one predicting the earliest response token of the batch."""
    out_model = model(input_ids=ids, attention_mask=None if fast.causal_only else attn,
                      output_hidden_states=head is not None, logits_to_keep=ids.shape[1] - first)
    lp_all, ent_all = _logprobs_entropy(out_model.logits, ids[:, first + 1 :])
    v_all = None
    if head is not None:
        hidden = out_model.hidden_states[-1][:, :-1]
        v_all = head(hidden.detach() if detach_trunk else hidden)
    out = torch.zeros((len(samples), rlen), device=lp_all.device)
    ent = torch.zeros_like(out)
    values = torch.zeros_like(out) if v_all is not None else None
    for i, (s, st) in enumerate(zip(samples, starts)):
        n = len(s.response_ids)
        out[i, :n] = lp_all[i, st - 1 - first : st - 1 - first + n]
        ent[i, :n] = ent_all[i, st - 1 - first : st - 1 - first + n]
        if values is not None:
            values[i, :n] = v_all[i, st - 1 : st - 1 + n]
    return out, resp_mask, ent, values


def _logprobs_entropy(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of ``targets`` read from ``logits[:, :-1]``, and the entropy there (no grad)."""
    log_p = torch.log_softmax(logits.float()[:, :-1], dim=-1)
    lp = log_p.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():
        ent = -(log_p.exp() * log_p).sum(-1)
    return lp, ent


def response_logprobs(model, samples: list, pad_id: int, device: str = "cpu",
                      fast: ForwardSwitches | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of each response token under ``model``: ``[B, R]`` tensor and its mask."""
    lp, mask, _ = response_logprobs_entropy(model, samples, pad_id, device, fast)
    return lp, mask


def response_logprobs_entropy(model, samples: list, pad_id: int, device: str = "cpu",
                              fast: ForwardSwitches | None = None):
    """``response_logprobs`` plus the policy's entropy at each response position (``[B, R]``, no grad)."""
    lp, mask, ent, _ = response_forward(model, samples, pad_id, device, fast=fast)
    return lp, mask, ent


def by_response_length(samples: list, idx) -> list[int]:
    """``idx`` ordered by response length: phase 2's micro-batches pad to a similar width."""
    return sorted(idx, key=lambda i: len(samples[i].response_ids))


def micro_spans(rows: list, max_rows: int, max_tokens: int | None, share_prompts: bool) -> list[tuple[int, int]]:
    """Cut ``rows`` (in order) into micro-batches ``rows[lo:hi]`` of at most ``max_rows`` rows and, with
    ``max_tokens``, at most that many padded tokens: rows × the widest row's forward width (the whole row; with
    shared prompts the prompt's last token and the response). A row wider than ``max_tokens`` goes alone.

    Rows come ordered by that width (``by_length``, ``by_response_length``), so short rows share a micro-batch with
    many others and long ones with few: fewer padded tokens and activations a cache can hold."""
    spans, lo, widest = [], 0, 0
    for i, s in enumerate(rows):
        width = 1 + len(s.response_ids) if share_prompts else len(s.prompt_ids) + len(s.response_ids)
        wider = max(widest, width)
        if i > lo and (i - lo == max_rows or (max_tokens is not None and wider * (i - lo + 1) > max_tokens)):
            spans.append((lo, i))
            lo, wider = i, width
        widest = wider
    return spans + [(lo, len(rows))] if rows else spans


class SharedPrompts:
    """Phase 1 for ``samples``: the keys/values of each distinct prompt (all but its last token), computed once
    under the current grad mode; ``forward`` is phase 2 for any of those rows, ``backward`` ends the gradient."""

    def __init__(self, model, samples: list, pad_id: int, device: str = "cpu"):
        self.model, self.pad_id, self.device = model, pad_id, device
        self.index: dict[tuple[int, ...], int] = {}
        for s in samples:
            self.index.setdefault(tuple(s.prompt_ids[:-1]), len(self.index))
        prompts = list(self.index)
        self.lengths = torch.tensor([len(p) for p in prompts])
        self.width = int(self.lengths.max())
        if min(self.lengths) < 1:
            raise ValueError("shared prompts need prompts of at least 2 tokens")
        ids = torch.full((len(prompts), self.width), pad_id, dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, : len(p)] = torch.tensor(p)
        cache = DynamicCache()
        model(input_ids=ids.to(device), past_key_values=cache, use_cache=True, logits_to_keep=1)
        self._computed = [(layer.keys, layer.values) for layer in cache.layers]
        self._kv = [tuple(t.detach().requires_grad_() if t.requires_grad else t for t in kv) for kv in self._computed]
        """Phase 2's keys/values: leaves where phase 1's depend on trainable weights (not under no_grad, nor a
        frozen base's layers below the first trainable one)."""

    def forward(self, samples: list):
        """``response_forward``'s outputs (log-probs, mask, entropy, None) for ``samples`` (rows given at start)."""
        which = torch.tensor([self.index[tuple(s.prompt_ids[:-1])] for s in samples])
        width = max(1 + len(s.response_ids) for s in samples)
        ids = torch.full((len(samples), width), self.pad_id, dtype=torch.long)
        attn = torch.zeros((len(samples), self.width + width), dtype=torch.long)
        attn[:, : self.width] = torch.arange(self.width) < self.lengths[which, None]
        mask = torch.zeros((len(samples), width - 1))
        for i, s in enumerate(samples):
            ids[i, : 1 + len(s.response_ids)] = torch.tensor(s.prompt_ids[-1:] + s.response_ids)
            attn[i, self.width : self.width + 1 + len(s.response_ids)] = 1
            mask[i, : len(s.response_ids)] = torch.tensor(s.response_mask, dtype=torch.float)
        pos = self.lengths[which, None] + torch.arange(width)
        cache = DynamicCache(ddp_cache_data=[(k.index_select(0, which.to(k.device)), v.index_select(0, which.to(v.device)))
                                             for k, v in self._kv])
        out = self.model(input_ids=ids.to(self.device), attention_mask=attn.to(self.device),
                         position_ids=pos.to(self.device), past_key_values=cache, use_cache=True)
        lp, ent = _logprobs_entropy(out.logits, ids[:, 1:].to(self.device))
        inside = (torch.arange(width - 1) < torch.tensor([len(s.response_ids) for s in samples])[:, None]).to(lp.device)
        return torch.where(inside, lp, 0.0), mask.to(self.device), torch.where(inside, ent, 0.0), None

    def backward(self) -> None:
        """Send the gradient the micro-batches left on the prompts' keys/values through phase 1 (once)."""
        pairs = [(c, k.grad) for kv_c, kv in zip(self._computed, self._kv) for c, k in zip(kv_c, kv)
                 if k is not c and k.grad is not None]
        if pairs:
            torch.autograd.backward([c for c, _ in pairs], [g for _, g in pairs])
        self._computed, self._kv = [], []
