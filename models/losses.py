"""Policy losses and KL penalties as registries: the trainer looks its loss up by name.

Every loss takes a ``LossBatch`` (log-probs of the response tokens under the policy being
trained, the old policy and optionally a reference policy; advantages per sequence ``[B]`` or
per token ``[B, R]``; the response mask; the mini-batch's token count) and the trainer config,
and returns ``(loss, stats)``: a scalar to backpropagate and token *sums* the trainer turns
into ``train/*`` metrics (``clipped``, ``ratio``). A per-token ``weight`` (splice treatments) scales the policy
loss's numerator only.

Registered losses:

* ``dapo``: clipped surrogate ``-min(ρA, clip(ρ, 1-ε_low, 1+ε_high)A)``, token-mean over the
  mini-batch (DESIGN §2; or another aggregation below), ρ = exp(new − old);
* ``opmd``: R3L's OPMD loss ``mean(-A · log π) / (1 + τ)`` (``OPMDPolicyLossFn``): no
  ratio, no clip — importance sampling is removed.

KL penalties (``KL_FNS``, added by the trainer when ``kl_coef > 0``, with any loss): ``k1``
= new − ref, ``k2`` = ½(new − ref)² (R3L's choice, coefficient 0.001 in its configs), ``k3`` =
exp(ref − new) − 1 − (ref − new); token-mean like the loss.

To add a loss: write ``def my_loss(batch, cfg) -> (loss, stats)`` in this module under
``@register_loss("name")`` (the config validates names against ``LOSSES``). The module only
uses tensor methods, so importing it (to validate a config) does not load torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class LossBatch:
    new_lp: torch.Tensor
    """``[B, R]`` log-probs under the policy being trained (with grad)."""
    old_lp: torch.Tensor
    """``[B, R]`` log-probs under the policy that the update starts from (recomputed, no grad)."""
    adv: torch.Tensor
    """``[B]`` per-sequence or ``[B, R]`` per-token advantages."""
    mask: torch.Tensor
    """``[B, R]`` 1 on tokens that train."""
    n_tokens: float
    """Tokens with mask 1 in the whole mini-batch (the token-mean's denominator)."""
    ref_lp: torch.Tensor | None = None
    """``[B, R]`` log-probs under the KL reference policy, when a KL penalty is on."""
    agg: str = "token-mean"
    """Registered aggregation (``AGGREGATIONS``) of per-token values into the loss."""
    n_seqs: float = 1.0
    """Rows in the whole mini-batch (the ``seq-mean-token-mean`` denominator)."""
    weight: torch.Tensor | None = None
    """``[B, R]`` per-token weight of the policy loss's numerator only (``models.splice``: ``truncated_is``); None
    is 1. The denominators (the token count, each row's token count), the KL and value losses and the clip and ratio
    stats never see it, so a weight w trains its token w times as hard whatever the aggregation."""

    def token_adv(self) -> torch.Tensor:
        return self.adv.unsqueeze(-1) if self.adv.dim() == 1 else self.adv

    def weighted(self, per_token: torch.Tensor) -> torch.Tensor:
        return per_token if self.weight is None else per_token * self.weight

    def aggregate(self, per_token: torch.Tensor) -> torch.Tensor:
        """This micro-batch's share of the mini-batch's loss aggregate of ``per_token`` values."""
        return AGGREGATIONS[self.agg](self, per_token)


AGGREGATIONS: dict[str, Callable[[LossBatch, torch.Tensor], torch.Tensor]] = {
    "token-mean": lambda b, x: (x * b.mask).sum() / b.n_tokens,
    "seq-mean-token-mean": lambda b, x: ((x * b.mask).sum(-1) / b.mask.sum(-1).clamp(min=1)).sum() / b.n_seqs,
}


LossFn = Callable[[LossBatch, object], "tuple[torch.Tensor, dict[str, torch.Tensor]]"]
LOSSES: dict[str, LossFn] = {}


def register_loss(name: str) -> Callable[[LossFn], LossFn]:
    def add(fn: LossFn) -> LossFn:
        LOSSES[name] = fn
        return fn
    return add


def get_loss(name: str) -> LossFn:
    if name not in LOSSES:
        raise ValueError(f"unknown loss {name!r}; registered losses: {', '.join(sorted(LOSSES))}")
    return LOSSES[name]


@register_loss("dapo")
def dapo(batch: LossBatch, cfg) -> tuple:
    """Clipped surrogate with clip-higher; stats: clipped and ratio token sums."""
    ratio = (batch.new_lp - batch.old_lp).exp()
    a = batch.token_adv()
    surrogate = (ratio * a).minimum(ratio.clamp(1 - cfg.clip_low, 1 + cfg.clip_high) * a)
    clipped = ((ratio < 1 - cfg.clip_low) | (ratio > 1 + cfg.clip_high)).float()
    stats = {"clipped": (clipped * batch.mask).sum().detach(), "ratio": (ratio * batch.mask).sum().detach()}
    return -batch.aggregate(batch.weighted(surrogate)), stats


@register_loss("opmd")
def opmd(batch: LossBatch, cfg) -> tuple:
    """R3L's OPMD loss: ``mean(-A · log π) / (1 + τ)``; the ratio is reported, never used."""
    ratio = (batch.new_lp - batch.old_lp).detach().exp()
    loss = batch.aggregate(batch.weighted(-batch.token_adv() * batch.new_lp)) / (1.0 + cfg.opmd_tau)
    return loss, {"clipped": ratio.new_zeros(()), "ratio": (ratio * batch.mask).sum()}


KL_FNS: dict[str, Callable] = {
    "k1": lambda lp, ref: lp - ref,
    "k2": lambda lp, ref: 0.5 * (lp - ref).square(),
    "k3": lambda lp, ref: (ref - lp).exp() - 1 - (ref - lp),
}


def kl_penalty(batch: LossBatch, kind: str) -> torch.Tensor:
    """KL estimate ``kind`` between the policy and the reference, aggregated like the loss."""
    if kind not in KL_FNS:
        raise ValueError(f"unknown KL estimator {kind!r}; registered: {', '.join(sorted(KL_FNS))}")
    if batch.ref_lp is None:
        raise ValueError("a KL penalty needs reference log-probs (ref_lp), but none were computed")
    return batch.aggregate(KL_FNS[kind](batch.new_lp, batch.ref_lp))
