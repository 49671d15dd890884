"""VCPO's off-policy controls: ESS-scaled learning rate and the optimal off-policy baseline (OPOB).

From mit-han-lab/vcpo (arXiv 2602.17616): ``recipe/fully_async_policy/staleness_utils.py``
(``compute_is_info``, ``compute_ess_info``, ``compute_opob_baseline``) and
``verl/workers/actor/megatron_actor.py::_optimizer_step_with_buffer``.

* **Sequence importance weight** of a trained row: w_i = π_old / π_behav over its policy tokens,
  log w_i = Σ_t mask·(old_lp − rollout_lp), where ``old_lp`` are the log-probs recomputed at update
  time (the trainer's old policy) and ``rollout_lp`` those the engine reported when it sampled
  (the behaviour policy: an older version for tokens of a resumed partial rollout).
* **ESS** of a mini-batch = (Σw)² / Σw², ρ = ESS / N ∈ (0, 1]; computed in log space here
  (2·logsumexp(log w) − logsumexp(2·log w)), so long sequences cannot overflow (the reference adds
  1e-8 to the denominator instead).
* **LR scaling** (registered rules, ``trainer.lr_scale``): the optimizer step of that mini-batch runs
  with lr·f(ρ) and the learning rate is restored after it: ``ess_sqrt`` f = √min(1, ρ/ρ_base) (VCPO's
  default ``scaling_rule: sqrt``), ``ess_linear`` f = min(1, ρ/ρ_base), ``none`` f = 1.
* **OPOB** (``trainer.opob``): per group, b = Σ W_i r_i / Σ W_i with W_i = ‖g_i‖²·w_i², g_i the
  gradient of row i's loss with advantage 1; the update follows Σ_i (r_i − b)·g_i (``opob_norm_by_std``:
  (r_i − b)/σ_group, the reference's ``norm_by_std``). ``models.trainer`` builds the per-row gradients.

The module imports torch only inside its tensor functions, so the config validates ``lr_scale`` against
``LR_SCALES`` without loading torch.

Caveat: the engine's log-probs are under its sampling temperature; at a temperature other than 1 the
weights also measure that difference, and SAAR-spliced tokens were sampled in another context.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

LrScale = Callable[[float, float], float]
LR_SCALES: dict[str, LrScale] = {}


def register_lr_scale(name: str) -> Callable[[LrScale], LrScale]:
    def add(fn: LrScale) -> LrScale:
        LR_SCALES[name] = fn
        return fn
    return add


register_lr_scale("none")(lambda rho, base: 1.0)
register_lr_scale("ess_sqrt")(lambda rho, base: math.sqrt(min(1.0, rho / base)))
register_lr_scale("ess_linear")(lambda rho, base: min(1.0, rho / base))


def get_lr_scale(name: str) -> LrScale:
    if name not in LR_SCALES:
        raise ValueError(f"trainer.lr_scale: unknown rule {name!r}; registered: {', '.join(sorted(LR_SCALES))}")
    return LR_SCALES[name]


def seq_log_weights(old: list[torch.Tensor], rollout: list[torch.Tensor], masks: list[torch.Tensor]) -> torch.Tensor:
    """log w_i = Σ_t mask·(old − rollout) per row (``[N]``)."""
    import torch

    return torch.stack([((o - r) * m).sum() for o, r, m in zip(old, rollout, masks)])


def ess_ratio(log_w: torch.Tensor) -> float:
    """ρ = ESS / N with ESS = (Σw)² / Σw², from log-weights."""
    import torch

    lw = log_w.double()
    ess = torch.exp(2 * torch.logsumexp(lw, 0) - torch.logsumexp(2 * lw, 0))
    return float(ess) / len(lw)


def opob_baseline(grad_sq_norms: list[float], log_w: list[float], rewards: list[float], eps: float = 1e-8) -> float:
    """b = Σ W_i r_i / Σ W_i, W_i = ‖g_i‖²·w_i² (weights rescaled by the largest w², which b does not see)."""
    top = max(log_w)
    weights = [g * math.exp(2 * (lw - top)) for g, lw in zip(grad_sq_norms, log_w)]
    return sum(w * r for w, r in zip(weights, rewards)) / (sum(weights) + eps)
