"""The behaviour policy in the update: how stale the trained tokens are, and the capped importance weight of
``trainer.behaviour_is_cap`` (the bounded-staleness loss, docs/rl_rules.md "Bounded staleness").

* **Staleness** (``staleness_metrics``): a trained token sampled by policy version v (``Sample.sampled_version``,
  stamped by the rollout, ``tasks.stores.records.sampled_versions``) in an update starting from version u has
  staleness u − v; ``perf/staleness_mean`` and ``perf/staleness_max`` are over the update's trained tokens
  (response mask 1 after the splice treatment). 0 in a synchronous run; k with ``rollout.staleness: k``; more for
  a partial rollout's carried tokens. verl names a per-trajectory figure (``training/off_policy/
  trajectory_staleness``, by a trajectory's newest version); prime-rl none: these are per token.
* **Behaviour importance weight** (``behaviour_weights``, AReaL's ``behav_imp_weight_cap``, verl's truncated IS
  "TIS"): every trained token's surrogate numerator is weighted by w = min(cap, π_old/π_behaviour), π_old the
  log-probs recomputed under the version the update starts from (the proximal policy), π_behaviour the engine's
  (``Sample.rollout_lp``: version s − k, and for a spliced token the error context). A spliced token whose splice
  treatment already uses its behaviour log-probs (``models.splice.BEHAVIOURAL``: ``truncated_is``,
  ``behaviour_old``) keeps that treatment's correction alone, so nothing is corrected twice. The weight multiplies
  the treatment's (``LossBatch.weight``: numerator only; the token counts, the KL and the clip statistics never
  see it). With ``cap`` None the weights are returned unchanged. Reported: ``train/behaviour_is_weight`` (its mean
  over trained tokens) and ``train/behaviour_is_capped`` (the fraction at the cap).

Only tensor methods at import: the config validates without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from models.splice import BEHAVIOURAL

if TYPE_CHECKING:
    import torch

    from models.samples import Sample


def staleness_metrics(samples: list[Sample], start_version: int) -> dict[str, float]:
    """``perf/staleness_mean`` / ``_max`` over the trained tokens of ``samples`` (nothing when no row carries
    ``sampled_version``: rows of step folders written before the column existed). A row without versions among
    rows with them, a count that does not match its response, or a trained token stamped −1 (injected) is an error
    naming the row."""
    if all(s.sampled_version is None for s in samples):
        return {}
    lags: list[int] = []
    for i, s in enumerate(samples):
        name = s.row_id or f"#{i}"
        if s.sampled_version is None or len(s.sampled_version) != len(s.response_ids):
            got = "none" if s.sampled_version is None else str(len(s.sampled_version))
            raise ValueError(f"row {name}: {got} sampled versions for {len(s.response_ids)} response tokens")
        trained = [v for v, m in zip(s.sampled_version, s.response_mask) if m]
        if any(v < 0 for v in trained):
            raise ValueError(f"row {name}: a trained token is stamped as injected (sampled_version -1)")
        lags += [start_version - v for v in trained]
    return {"perf/staleness_mean": sum(lags) / len(lags) if lags else 0.0,
            "perf/staleness_max": float(max(lags, default=0))}


def behaviour_weights(samples: list[Sample], old: list[torch.Tensor], weights: list[torch.Tensor], cfg
                      ) -> tuple[list[torch.Tensor], dict[str, float]]:
    """``weights`` times min(cap, exp(old − rollout_lp)) per trained token (module docstring), and the metrics;
    ``old`` are the recomputed old log-probs (before a treatment replaced any). A row without behaviour log-probs
    of its response is an error naming it (never w = 1)."""
    cap = cfg.behaviour_is_cap
    if cap is None:
        return weights, {}
    out, total, capped, tokens = [], 0.0, 0.0, 0.0
    for i, (s, o, w) in enumerate(zip(samples, old, weights)):
        if s.rollout_lp is None or len(s.rollout_lp) != len(s.response_ids):
            got = "none" if s.rollout_lp is None else str(len(s.rollout_lp))
            raise ValueError(f"trainer.behaviour_is_cap: row {s.row_id or f'#{i}'} has {got} behaviour log-probs "
                             f"(rollout_lp) for {len(s.response_ids)} response tokens")
        behaviour = o.new_tensor(s.rollout_lp)
        ratio = (o - behaviour).exp()
        own = o.new_tensor(s.spliced if cfg.splice in BEHAVIOURAL and s.spliced is not None else [0] * len(o)) > 0
        is_w = ratio.clamp(max=cap).masked_fill(own, 1.0)
        out.append(w * is_w)
        mask = o.new_tensor(s.response_mask)
        total += float((is_w * mask).sum())
        capped += float(((ratio >= cap) & ~own).to(o.dtype).mul(mask).sum())
        tokens += float(mask.sum())
    tokens = tokens or 1.0
    return out, {"train/behaviour_is_weight": total / tokens, "train/behaviour_is_capped": capped / tokens}
