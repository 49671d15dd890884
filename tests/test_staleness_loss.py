"""The bounded-staleness loss (docs/rl_rules.md, "Bounded staleness"), computed by hand: the clipped ratio against the
recomputed old policy, the behaviour log-probs entering only through ``trainer.behaviour_is_cap`` (numerator only,
never the KL), and ``perf/staleness_*`` over trained tokens.

Run: ``PYTHONPATH=$PWD .venv/bin/pytest -q tests/test_staleness_loss.py``
"""

from __future__ import annotations

import math

import pytest
import torch

from models.behaviour import behaviour_weights, staleness_metrics
from models.config import TrainerConfig
from models.losses import LossBatch, get_loss, kl_penalty
from models.samples import Sample

# Two rows × 3 tokens (row B's last token injected: mask 0). Advantages +1 (A) and −1 (B); ε_low 0.2, ε_high 0.28.
# ρ = π_θ/π_old per token and r = π_old/π_behaviour (version s − 1) are chosen, the log-probs derived from them.
OLD = [[-1.0, -2.0, -0.5], [-1.5, -0.3, -2.2]]
RHO = [[1.1, 1.5, 0.9], [0.7, 1.2, 1.0]]
R = [[2.0, 0.5, 1.0], [3.0, 0.8, 5.0]]
MASK = [[1, 1, 1], [1, 1, 0]]
ADV = [1.0, -1.0]
NEW = [[o + math.log(p) for o, p in zip(os_, ps)] for os_, ps in zip(OLD, RHO)]
BEHAVIOUR = [[o - math.log(r) for o, r in zip(os_, rs)] for os_, rs in zip(OLD, R)]
CFG = TrainerConfig(clip_low=0.2, clip_high=0.28)

# By hand. The clipped surrogate min(ρA, clip(ρ, 0.8, 1.28)A) per trained token:
#   A: 1.1 (unclipped), min(1.5, 1.28) = 1.28 (clipped: no gradient), 0.9 (unclipped)
#   B: min(-0.7, -0.8) = -0.8 (clipped: no gradient), -1.2 (unclipped); B3 masked.
# Token-mean over the 5 trained tokens, weight w on the numerator: L = -(1/5) Σ w·surrogate; dL/dnew_lp = -(1/5)·w·ρ·A
# on unclipped tokens, 0 elsewhere.
# k = 0 (behaviour = old, r = 1, w = 1) and k = 1 without the cap (w = 1: the behaviour log-probs are not in the loss):
#   L = -(1.1 + 1.28 + 0.9 - 0.8 - 1.2)/5 = -0.256;  grad = [[-0.22, 0, -0.18], [0, 0.24, 0]]
# k = 1 with cap 1.5: w = min(1.5, r) = [[1.5, 0.5, 1.0], [1.5, 0.8, -]]:
#   L = -(1.5·1.1 + 0.5·1.28 + 1.0·0.9 + 1.5·(-0.8) + 0.8·(-1.2))/5 = -(1.65 + 0.64 + 0.9 - 1.2 - 0.96)/5 = -0.206
#   grad = [[-1.5·1.1/5, 0, -0.9/5], [0, 0.8·1.2/5, 0]] = [[-0.33, 0, -0.18], [0, 0.192, 0]]
UNCAPPED = (-0.256, [[-0.22, 0.0, -0.18], [0.0, 0.24, 0.0]])
CAPPED = (-0.206, [[-0.33, 0.0, -0.18], [0.0, 0.192, 0.0]])


def rows(behaviour) -> list[Sample]:
    return [Sample([1], [5, 6, 7], m, a, rollout_lp=b, row_id=f"r{i}") for i, (m, a, b) in
            enumerate(zip(MASK, ADV, behaviour))]


def loss_and_grad(behaviour, cap: float | None, ref=None, kl_coef: float = 0.0):
    """The trainer's path for one mini-batch of one micro-batch: weights from ``behaviour_weights``, the dapo loss and
    (``ref``) the KL penalty; returns the loss and its gradient w.r.t. the new log-probs."""
    cfg = CFG.model_copy(update={"behaviour_is_cap": cap, "kl_coef": kl_coef, "kl_estimator": "k1"})
    old = [torch.tensor(o, dtype=torch.float64) for o in OLD]
    ones = [torch.ones(3, dtype=torch.float64) for _ in OLD]
    weights, _ = behaviour_weights(rows(behaviour), old, ones, cfg)
    new = torch.tensor(NEW, dtype=torch.float64, requires_grad=True)
    batch = LossBatch(new, torch.stack(old), torch.tensor(ADV, dtype=torch.float64),
                      torch.tensor(MASK, dtype=torch.float64), 5.0,
                      torch.tensor(ref, dtype=torch.float64) if ref is not None else None, weight=torch.stack(weights))
    loss, _ = get_loss("dapo")(batch, cfg)
    if ref is not None:
        loss = loss + kl_coef * kl_penalty(batch, "k1")
    loss.backward()
    return float(loss.detach()), new.grad.tolist()


@pytest.mark.parametrize(("case", "behaviour", "cap", "expected"), [
    ("k=0", OLD, None, UNCAPPED),
    ("k=0 capped", OLD, 1.5, UNCAPPED),
    ("k=1", BEHAVIOUR, None, UNCAPPED),
    ("k=1 capped", BEHAVIOUR, 1.5, CAPPED),
])
def test_the_bounded_staleness_loss_and_its_gradient_by_hand(case, behaviour, cap, expected):
    loss, grad = loss_and_grad(behaviour, cap)
    assert loss == pytest.approx(expected[0], abs=1e-9), case
    assert grad == [pytest.approx(g, abs=1e-9) for g in expected[1]], case


def test_the_kl_term_never_sees_the_behaviour_weight():
    """k1 KL with coefficient 0.1: new − ref = 0.5 on every token, so +0.1·0.5 = 0.05 on the loss and +0.1/5 = 0.02 on
    every trained token's gradient, whatever the cap weighs the surrogate with."""
    ref = [[n - 0.5 for n in row] for row in NEW]
    loss, grad = loss_and_grad(BEHAVIOUR, 1.5, ref=ref, kl_coef=0.1)
    assert loss == pytest.approx(-0.206 + 0.05, abs=1e-9)
    want = [[g + 0.02 * m for g, m in zip(gs, ms)] for gs, ms in zip(CAPPED[1], MASK)]
    assert grad == [pytest.approx(g, abs=1e-9) for g in want]


def test_the_cap_weight_and_its_metrics_by_hand():
    """w = min(1.5, r) on trained tokens: mean (1.5 + 0.5 + 1 + 1.5 + 0.8)/5 = 1.06; at the cap: 2 of 5."""
    cfg = CFG.model_copy(update={"behaviour_is_cap": 1.5})
    old = [torch.tensor(o, dtype=torch.float64) for o in OLD]
    w, m = behaviour_weights(rows(BEHAVIOUR), old, [torch.full((3,), 2.0, dtype=torch.float64)] * 2, cfg)
    assert [x.tolist() for x in w] == [pytest.approx([3.0, 1.0, 2.0]), pytest.approx([3.0, 1.6, 3.0])]  # × the splice's 2
    assert m == {"train/behaviour_is_weight": pytest.approx(1.06), "train/behaviour_is_capped": pytest.approx(0.4)}


@pytest.mark.parametrize(("splice", "spliced_weight"), [("full", 1.5), ("truncated_is", 1.0), ("behaviour_old", 1.0)])
def test_a_spliced_token_is_left_to_a_treatment_that_corrects_it_already(splice, spliced_weight):
    """Row A's first token spliced (r = 2): under ``full`` the cap weighs it min(1.5, 2) = 1.5; ``truncated_is`` and
    ``behaviour_old`` use its behaviour log-prob themselves, so the cap leaves it at 1 (no double correction)."""
    cfg = CFG.model_copy(update={"behaviour_is_cap": 1.5, "splice": splice})
    samples = [Sample([1], [5, 6, 7], MASK[0], 1.0, rollout_lp=BEHAVIOUR[0], spliced=[1, 0, 0])]
    w, _ = behaviour_weights(samples, [torch.tensor(OLD[0], dtype=torch.float64)], [torch.ones(3, dtype=torch.float64)],
                             cfg)
    assert w[0].tolist() == pytest.approx([spliced_weight, 0.5, 1.0])


def test_the_cap_off_returns_the_weights_untouched_and_is_out_of_the_dump():
    same = [torch.tensor([0.3, 1.0])]
    w, m = behaviour_weights([Sample([1], [5, 6], [1, 1], 1.0)], [torch.zeros(2)], same, TrainerConfig())
    assert w is same and m == {}
    assert "behaviour_is_cap" not in TrainerConfig().model_dump()
    assert TrainerConfig(behaviour_is_cap=2.0).model_dump()["behaviour_is_cap"] == 2.0


def test_the_cap_needs_behaviour_logprobs_and_excludes_opob():
    cfg = TrainerConfig(behaviour_is_cap=2.0)
    with pytest.raises(ValueError, match=r"row r7 has none behaviour log-probs \(rollout_lp\) for 2 response tokens"):
        behaviour_weights([Sample([1], [5, 6], [1, 1], 1.0, row_id="r7")], [torch.zeros(2)], [torch.ones(2)], cfg)
    with pytest.raises(ValueError, match="behaviour_is_cap and trainer.opob exclude each other"):
        TrainerConfig(behaviour_is_cap=2.0, opob=True)
    with pytest.raises(ValueError, match="greater than 0"):
        TrainerConfig(behaviour_is_cap=0.0)


def test_staleness_over_trained_tokens_by_hand():
    """Update from version 4; trained tokens sampled by 3, 3, 2 (row A) and 3, 2 (row B; its injected token −1 is
    untrained): lags 1, 1, 2, 1, 2 → mean 7/5, max 2. A synchronous step (every version = the start) gives 0."""
    samples = [Sample([1], [5, 6, 7], [1, 1, 1], 1.0, sampled_version=[3, 3, 2]),
               Sample([1], [5, 6, 7], [1, 1, 0], 1.0, sampled_version=[3, 2, -1])]
    assert staleness_metrics(samples, 4) == {"perf/staleness_mean": pytest.approx(1.4), "perf/staleness_max": 2.0}
    sync = [Sample([1], [5, 6], [1, 0], 1.0, sampled_version=[4, -1])]
    assert staleness_metrics(sync, 4) == {"perf/staleness_mean": 0.0, "perf/staleness_max": 0.0}
    assert staleness_metrics([Sample([1], [5], [1], 1.0)], 4) == {}  # an old step folder: no versions, no metric


def test_a_trained_token_stamped_injected_or_a_row_without_versions_is_an_error_naming_the_row():
    bad = [Sample([1], [5, 6], [1, 1], 1.0, sampled_version=[3, -1], row_id="0:p0:1")]
    with pytest.raises(ValueError, match=r"row 0:p0:1: a trained token is stamped as injected"):
        staleness_metrics(bad, 4)
    mixed = [Sample([1], [5], [1], 1.0, sampled_version=[3]), Sample([1], [5, 6], [1, 1], 1.0, row_id="0:p1:0")]
    with pytest.raises(ValueError, match=r"row 0:p1:0: none sampled versions for 2 response tokens"):
        staleness_metrics(mixed, 4)


@pytest.mark.parametrize(("cap", "loss", "weight"), [(None, 0.5, None), (2.0, 1.0, 2.0)])
def test_the_update_measures_staleness_from_its_checkpoint_and_applies_the_cap(warm_model_dir, chat, tmp_path, cap,
                                                                              loss, weight):
    """One update from ``policy_000004`` (lr 1e-9: the ratio stays 1) on a 3-token row (A = +1, sampled by versions
    3, 3, 2) and a 12-token row (A = −1, 9 trained tokens sampled by 4, 3 injected). Behaviour log-probs −50: π_old/π_b
    is far above any cap, so w = cap on every token. Off: −(3 − 9)/12 = 0.5 (π_b not in the loss); cap 2:
    −(2·3 − 2·9)/12 = 1.0. Staleness over the 12 trained tokens: lags 1, 1, 2 and nine 0s → mean 4/12, max 2."""
    from models.checkpoint import copy_checkpoint
    from models.trainer import update

    start = copy_checkpoint(warm_model_dir, tmp_path / "policy_000004", {"policy_version": "policy_000004"})
    prompt = chat.prompt_ids([{"role": "user", "content": "What is 2 + 2?"}])
    short = chat.encode("It is 4")[:3]
    long_ = (chat.encode("The answer is \\boxed{4}, I am sure of it.") + [chat.eos_id])[:12]
    rows_ = [Sample(prompt, short, [1] * 3, 1.0, rollout_lp=[-50.0] * 3, sampled_version=[3, 3, 2]),
             Sample(prompt, long_, [1] * 9 + [0] * 3, -1.0, rollout_lp=[-50.0] * 12, sampled_version=[4] * 9 + [-1] * 3)]
    cfg = TrainerConfig(lr=1e-9, mini_batches=1, behaviour_is_cap=cap)
    m = update(start, rows_, cfg, tmp_path / "policy_000005", chat.tokenizer.pad_token_id, seed=0)
    assert m["train/loss"] == pytest.approx(loss, abs=1e-4)
    assert m["perf/staleness_mean"] == pytest.approx(4 / 12) and m["perf/staleness_max"] == 2.0
    assert m.get("train/behaviour_is_weight") == (pytest.approx(weight) if weight else None)
