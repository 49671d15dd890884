"""Splice treatments: how the update trains the tokens SAAR spliced in after a failed call.

A SAAR fix is sampled with the error in context; the purified trajectory trains it in the clean context. The
rollout marks those tokens (``Sample.spliced``) and keeps the log-probs they were sampled with (the behaviour
policy: ``Sample.rollout_lp``). A treatment turns, per row, the recomputed old log-probs (clean context) and the
response mask into what the loss sees (``Treated``):

* ``full`` (the paper, its code, the default): spliced tokens train like any other (old log-probs recomputed on
  the purified sequence, so their ratio starts at 1);
* ``mask``: spliced tokens leave the update exactly as if the response mask had cut them: mask 0 in the loss
  (neither numerator nor token-mean denominator), in VCPO's sequence weights (ESS) and in the critic's GAE (the
  outcome reward lands on the last unspliced trained token), and a row left with no trained token leaves the
  update (``trains``); the clean context they form for later turns stays;
* ``behaviour_old``: their old log-probs are the behaviour ones, so the ratio starts at ρ = π_clean/π_error and the
  clip sees it (DAPO: a positive advantage trains with weight ρ while ρ ≤ 1 + ε_high, a negative one is clipped
  to no gradient while ρ < 1 − ε_low);
* ``truncated_is``: their policy loss is weighted by w = min(1, π_clean/π_error) (a fixed per-token weight, the
  ratio still starts at 1) — in the surrogate's numerator only (``models.losses.LossBatch.weight``): token counts,
  ``seq-mean-token-mean``'s per-row denominators, the KL and value losses and the clip fraction do not see it.
  Under bounded staleness (``rollout.staleness`` ≥ 1) π_error is the behaviour policy of version s − k in the error
  context and π_clean the version s the update starts from, so w corrects the context shift and the version lag
  together (docs/rl_rules.md, "Bounded staleness").

Every treatment reports, over a batch (``splice_metrics``): ``splice/tokens`` (spliced trained tokens),
``splice/logp_gap`` (their mean log π_clean − log π_error, ≈ −3 nats on the tiny model at step 0) and
``splice/effective_weight`` (their mean gradient weight at the start of the update relative to an on-policy
token with the same advantage: full 1, mask 0, truncated_is w, behaviour_old ρ when unclipped else 0).

To add a treatment: ``@register_treatment("name")`` on ``def fn(view: SpliceView, cfg) -> Treated`` here (the
trainer config validates names against ``TREATMENTS``). Only tensor methods: importing it does not load torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class SpliceView:
    """One row's response tokens, each ``[R]``."""

    old_lp: torch.Tensor
    """Log-probs recomputed under the policy the update starts from, on the purified (clean) sequence."""
    behaviour_lp: torch.Tensor
    """Log-probs the engine sampled each token with (the error context for spliced tokens)."""
    spliced: torch.Tensor
    """1 on tokens sampled in an error context and spliced over the failed turn, else 0."""
    mask: torch.Tensor
    """The response mask (1 on tokens that train)."""


@dataclass(frozen=True)
class Treated:
    old_lp: torch.Tensor
    """The old log-probs the loss's ratio uses."""
    mask: torch.Tensor
    """1 on tokens in the loss and its token-mean denominator."""
    weight: torch.Tensor
    """Per-token weight of the loss (1 but on importance-weighted spliced tokens)."""

    def start_ratio(self, view: SpliceView) -> torch.Tensor:
        """The ratio at the update's first pass (the policy is the recomputed one): exp(old_clean − old_used)."""
        return (view.old_lp - self.old_lp).exp()


Treatment = Callable[[SpliceView, object], Treated]
TREATMENTS: dict[str, Treatment] = {}
CUTS: set[str] = set()
"""Treatments that take the spliced tokens out of the response mask (``trains``)."""
BEHAVIOURAL: set[str] = set()
"""Treatments that correct spliced tokens against their behaviour log-probs themselves: ``trainer.behaviour_is_cap``
(``models.behaviour``) leaves those tokens to them."""


def register_treatment(name: str, cuts: bool = False, behavioural: bool = False) -> Callable[[Treatment], Treatment]:
    def add(fn: Treatment) -> Treatment:
        TREATMENTS[name] = fn
        if cuts:
            CUTS.add(name)
        if behavioural:
            BEHAVIOURAL.add(name)
        return fn
    return add


def trains(mask: list[int], spliced: list[int] | None, name: str) -> bool:
    """Whether a row keeps a trained token under treatment ``name``. A row that ``mask`` leaves with none is left
    out of the update (``tasks.training.stages``, ``models.trainer.update``), as a row whose response mask is all 0
    is: it neither counts in ``seq-mean-token-mean``'s rows nor in a mini-batch's ESS."""
    if name in CUTS and spliced is not None:
        return any(m and not f for m, f in zip(mask, spliced))
    return any(mask)


def get_treatment(name: str) -> Treatment:
    if name not in TREATMENTS:
        raise ValueError(f"unknown splice treatment {name!r}; registered: {', '.join(sorted(TREATMENTS))}")
    return TREATMENTS[name]


@register_treatment("full")
def full(view: SpliceView, cfg) -> Treated:
    return Treated(view.old_lp, view.mask, view.mask.new_ones(view.mask.shape))


@register_treatment("mask", cuts=True)
def mask(view: SpliceView, cfg) -> Treated:
    return Treated(view.old_lp, view.mask * (1 - view.spliced), view.mask.new_ones(view.mask.shape))


@register_treatment("behaviour_old", behavioural=True)
def behaviour_old(view: SpliceView, cfg) -> Treated:
    old = view.old_lp * (1 - view.spliced) + view.behaviour_lp * view.spliced
    return Treated(old, view.mask, view.mask.new_ones(view.mask.shape))


@register_treatment("truncated_is", behavioural=True)
def truncated_is(view: SpliceView, cfg) -> Treated:
    w = (view.old_lp - view.behaviour_lp).exp().clamp(max=1.0)
    return Treated(view.old_lp, view.mask, w * view.spliced + (1 - view.spliced))


def effective_weight(view: SpliceView, treated: Treated, advantage: float, cfg) -> torch.Tensor:
    """Per-token gradient weight at the update's first pass relative to an on-policy token with the same advantage:
    mask × weight × ρ₀ × [the clipped surrogate's unclipped branch is active] (ρ₀ = ``Treated.start_ratio``)."""
    rho = treated.start_ratio(view)
    if advantage > 0:
        live = rho <= 1 + cfg.clip_high
    elif advantage < 0:
        live = rho >= 1 - cfg.clip_low
    else:
        live = rho == rho
    return treated.mask * treated.weight * rho * live.to(rho.dtype)


def splice_metrics(views: list[SpliceView], treated: list[Treated], advantages: list[float], cfg) -> dict[str, float]:
    """``splice/tokens``, ``splice/logp_gap`` and ``splice/effective_weight`` over the trained spliced tokens of a batch
    (the response mask's 1s that are spliced); gap and weight are 0 when nothing was spliced."""
    tokens = gap = weight = 0.0
    for v, t, a in zip(views, treated, advantages):
        on = v.spliced * v.mask
        tokens += float(on.sum())
        gap += float(((v.old_lp - v.behaviour_lp) * on).sum())
        weight += float((effective_weight(v, t, a, cfg) * on).sum())
    return {"splice/tokens": tokens, "splice/logp_gap": gap / tokens if tokens else 0.0,
            "splice/effective_weight": weight / tokens if tokens else 0.0}


def treat_rows(samples: list, old: list[torch.Tensor], cfg) -> tuple[list, list[torch.Tensor], list[torch.Tensor],
                                                                     dict[str, float]]:
    """Apply ``cfg.splice`` to every row (``models.trainer.Sample``): rows with their mask replaced by the treated
    one, the old log-probs and per-token weights the loss uses, and the batch's ``splice/*`` metrics.

    A row with spliced tokens needs the behaviour log-probs of its response (``rollout_lp``); without them the
    treatment cannot be computed and the row is named in the error."""
    import dataclasses

    import torch

    fn = get_treatment(cfg.splice)
    rows, olds, weights, views, treated, advs = [], [], [], [], [], []
    for i, (s, o) in enumerate(zip(samples, old)):
        n = len(s.response_ids)
        spliced = list(s.spliced) if s.spliced is not None else [0] * n
        if len(spliced) != n:
            raise ValueError(f"row {i} (group {s.group!r}): {len(spliced)} spliced flags for {n} response tokens")
        if any(spliced) and (s.rollout_lp is None or len(s.rollout_lp) != n):
            raise ValueError(f"row {i} (group {s.group!r}) has {sum(spliced)} spliced tokens but no behaviour "
                             "log-probs (rollout_lp) of its response: the splice treatment cannot be computed")
        like = {"dtype": o.dtype, "device": o.device}
        behaviour = torch.tensor(s.rollout_lp, **like) if any(spliced) else o
        view = SpliceView(o, behaviour, torch.tensor(spliced, **like), torch.tensor(s.response_mask, **like))
        t = fn(view, cfg)
        rows.append(dataclasses.replace(s, response_mask=[int(m) for m in t.mask.tolist()]) if any(spliced) else s)
        olds.append(t.old_lp)
        weights.append(t.weight)
        views.append(view)
        treated.append(t)
        advs.append(s.advantage)
    return rows, olds, weights, splice_metrics(views, treated, advs, cfg)
