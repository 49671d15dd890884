"""Update-side rules pinned with hand-computed values: GRPO normalisation, the DAPO token-mean and grad clipping.

* GRPO: rewards [1, 0, 0, 0] → mean 0.25, unbiased std 0.5 → advantages [1.5, -0.5, -0.5, -0.5]
  (ddof 0 would give 1.732…, no std 0.75); a pair [2, 0] → ±1/√2.
* DAPO token-mean over the **mini-batch**: on the first optimizer step the ratio is 1, so the loss is
  −Σᵢ Aᵢ·nᵢ / Σᵢ nᵢ over the mini-batch's mask-1 tokens nᵢ, however it is split into micro-batches.
* ``loss_agg: seq-mean-token-mean``: −Σᵢ Aᵢ / (the mini-batch's rows) at ratio 1, each row's tokens averaged
  first — micro-batches of one or two alike.
* Gradient clipping: Adam's first step moves a parameter by lr·g/(|g| + 1e-8); clipped to a total
  norm of 1e-12 no parameter may move more than lr·1e-4, unclipped most move by ≈ lr.
* Step metrics: in a second epoch the ratios, clipped share, approx KL and entropy are those of the policy the
  first step moved (read off its logits here), each a token mean over both steps.
* Resume: AdamW's state is saved with each checkpoint and loaded by the next update (2 steps after two updates).
"""

from __future__ import annotations

from typing import get_args

import polars as pl
import pytest

from models.config import TrainerConfig
from models.engine import load_causal_lm
from models.losses import AGGREGATIONS
from models.trainer import Sample, update
from tasks.training.config import MixConfig
from tasks.training.mixing import grpo_advantages, mix_rows


def scored(groups: dict[str, list[float]]) -> pl.DataFrame:
    rows = [{"prompt_id": p, "traj_id": f"{p}{i}", "reward": float(r), "graded": True, "correct": r > 0, "raw": False,
             "rollbacks_recovered": 0} for p, rs in groups.items() for i, r in enumerate(rs)]
    return pl.DataFrame(rows)


def test_grpo_advantages_hand_computed():
    df, _ = mix_rows(scored({"a": [1, 0, 0, 0], "b": [2, 0], "c": [1, 1, 1, 1]}), MixConfig())
    adv = grpo_advantages(df, 1e-6)
    by = {p: adv.filter(pl.col("prompt_id") == p)["advantage"].to_list() for p in "abc"}
    assert by["a"] == pytest.approx([1.5, -0.5, -0.5, -0.5], rel=1e-5)
    assert by["b"] == pytest.approx([2 ** -0.5, -(2 ** -0.5)], rel=1e-5)
    assert by["c"] == [0.0] * 4  # uniform group: dropped by dynamic sampling, no advantage


def test_grpo_epsilon_only_guards_the_division():
    df, _ = mix_rows(scored({"a": [1, 0, 0, 0]}), MixConfig())
    assert grpo_advantages(df, 0.5)["advantage"].to_list() == pytest.approx([0.75, -0.25, -0.25, -0.25])


def test_mix_and_advantage_stages_on_files(tmp_path):
    """The stage functions: rows joined on (run, step, traj), kept flags and advantages written per row."""
    from tasks.training.mixing import advantage_step, mix_step

    keys = {"run_id": ["r"] * 6, "step": [3] * 6, "traj_id": [f"t{i}" for i in range(6)]}
    pl.DataFrame({**keys, "prompt_id": ["a"] * 4 + ["b"] * 2, "raw": [True, False, False, False, True, False],
                  "rollbacks_recovered": [0, 1, 0, 0, 0, 0]}).write_parquet(tmp_path / "trajectories.parquet")
    pl.DataFrame({**keys, "reward": [1.0, 0.0, 0.0, 0.0, 1.0, 1.0], "graded": [True] * 6,
                  "correct": [True, False, False, False, True, True]}).write_parquet(tmp_path / "scores.parquet")
    m = mix_step(tmp_path, MixConfig())
    assert (m["mix/groups"], m["mix/groups_kept"], m["mix/trajectories_kept"]) == (2, 1, 4)
    assert (m["mix/raw"], m["mix/purified"], m["mix/raw_accuracy"], m["mix/purified_accuracy"]) == (2, 1, 1.0, 0.0)
    mix = pl.read_parquet(tmp_path / "mix.parquet").sort("traj_id")
    assert mix["kept"].to_list() == [True] * 4 + [False] * 2 and mix.columns[:4] == ["run_id", "step", "traj_id", "kept"]
    m = advantage_step(tmp_path, MixConfig())
    written = pl.read_parquet(tmp_path / "advantages.parquet").sort("traj_id")
    assert written["advantage"].to_list() == pytest.approx([1.5, -0.5, -0.5, -0.5, 0.0, 0.0], rel=1e-5)
    assert written["dropped"].to_list() == [False] * 6  # GRPO drops no row; rows not kept are not "dropped"
    assert m["train/advantage_abs_mean"] == pytest.approx(0.75, rel=1e-5) and m["train/dropped_rows"] == 0



def test_advantage_metric_is_zero_when_nothing_or_only_zeros_train(tmp_path):
    """A step whose only group is uniform (rewards 1, 1): with dynamic sampling no row trains, without it both
    train at advantage 0 — the mean |A| is 0.0 either way (not a default of 1, not NaN)."""
    from tasks.training.mixing import advantage_step, mix_step

    keys = {"run_id": ["r"] * 2, "step": [0] * 2, "traj_id": ["t0", "t1"]}
    for name, cfg, kept in (("dyn", MixConfig(), 0), ("all", MixConfig(dynamic_sampling=False), 2)):
        step = tmp_path / name
        step.mkdir()
        pl.DataFrame({**keys, "prompt_id": ["b", "b"], "raw": [False, False], "rollbacks_recovered": [0, 0]}
                     ).write_parquet(step / "trajectories.parquet")
        pl.DataFrame({**keys, "reward": [1.0, 1.0], "graded": [True, True], "correct": [True, True]}
                     ).write_parquet(step / "scores.parquet")
        assert mix_step(step, cfg)["mix/trajectories_kept"] == kept
        m = advantage_step(step, cfg)
        assert (m["train/advantage_abs_mean"], m["train/dropped_rows"]) == (0.0, 0), name
        assert pl.read_parquet(step / "advantages.parquet")["advantage"].to_list() == [0.0, 0.0]


def test_with_roles_fills_the_group_and_the_kind():
    """No ``group_id`` / ``kind`` columns: the prompt id and ``rollout``; null cells are filled the same way and
    R3L's kinds are kept."""
    from tasks.training.mixing import with_roles

    out = with_roles(pl.DataFrame({"prompt_id": ["a", "b"]}))
    assert out["group_id"].to_list() == ["a", "b"] and out["kind"].to_list() == ["rollout", "rollout"]
    out = with_roles(pl.DataFrame({"prompt_id": ["a", "b", "c"], "group_id": ["r:a", None, None],
                                   "kind": ["reflect", None, "retry"]}))
    assert out["group_id"].to_list() == ["r:a", "b", "c"]
    assert out["kind"].to_list() == ["reflect", "rollout", "retry"]

def test_mix_metrics_and_singleton_groups_hand_computed():
    """Group a informative, b uniform (dropped), an ungraded row that counts nowhere, and R3L's reflect and
    retry rows: groups of one no filter sees nor drops. Raw rows a0-a2 (1 of 3 correct), purified a3, b0
    (1 of 2 correct)."""
    rows = [("a", "a", "rollout", 1.0, True, True, 0), ("a", "a", "rollout", 0.0, True, True, 0),
            ("a", "a", "rollout", 0.0, True, True, 0), ("a", "a", "rollout", 1.0, True, False, 2),
            ("b", "b", "rollout", 0.0, True, False, 1), ("b", "b", "rollout", 0.0, True, False, 0),
            ("u", "u", "rollout", 0.0, False, True, 0),
            ("a", "r:a", "reflect", 1.0, True, False, 0), ("a", "t:a", "retry", 0.0, True, False, 0)]
    df = pl.DataFrame([{"prompt_id": p, "group_id": g, "kind": k, "traj_id": f"x{i}", "reward": r, "graded": gr,
                        "correct": r > 0, "raw": raw, "rollbacks_recovered": rec}
                       for i, (p, g, k, r, gr, raw, rec) in enumerate(rows)])
    out, m = mix_rows(df, MixConfig())
    assert out["kept"].to_list() == [True] * 4 + [False] * 3 + [True] * 2
    assert out["adv_scale"].to_list() == [1.0] * 9
    assert (m["mix/groups"], m["mix/groups_kept"], m["mix/trajectories_kept"], m["mix/singleton_groups"]) == (4, 3, 6, 2)
    assert (m["mix/raw"], m["mix/purified"]) == (3, 2)
    assert m["mix/raw_accuracy"] == pytest.approx(1 / 3) and m["mix/purified_accuracy"] == 0.5
    # the group filter saw a and b only (with the singletons it would count 3 zero-std groups of 4)
    assert (m["rollout/filter_zero_count"], m["rollout/filter_kept_count"]) == (1.0, 2.0)
    # nothing raw, nothing purified: accuracies 0, not 1 or NaN
    _, m = mix_rows(df.filter(pl.col("prompt_id") == "b").with_columns(raw=False, rollbacks_recovered=0), MixConfig())
    assert (m["mix/raw"], m["mix/purified"], m["mix/raw_accuracy"], m["mix/purified_accuracy"]) == (0, 0, 0.0, 0.0)


@pytest.fixture(scope="module")
def batch(chat):
    prompt = chat.prompt_ids([{"role": "user", "content": "What is 2 + 2?"}])
    short = chat.encode("It is 4")[:3]
    long_ = (chat.encode("The answer is \\boxed{4}, I am sure of it.") + [chat.eos_id])[:12]
    assert len(short) == 3 and len(long_) == 12
    # the long response has 3 injected (mask-0) tokens: 9 tokens train
    return [Sample(prompt, short, [1] * 3, 1.0), Sample(prompt, long_, [1] * 9 + [0] * 3, -1.0)]


@pytest.mark.parametrize("micro_batch", [1, 2])
def test_token_mean_over_the_mini_batch(batch, warm_model_dir, chat, tmp_path, micro_batch):
    """−(1·3 − 1·9) / (3 + 9) = 0.5, for one micro-batch of two or two of one (a per-micro-batch mean
    would give −3/3 + 9/9 = 0, a per-sequence mean (1·(−1) + (−1)·(−1))/2 … = 0 as well)."""
    cfg = TrainerConfig(lr=1e-9, mini_batches=1, epochs=1, micro_batch=micro_batch)
    m = update(warm_model_dir, batch, cfg, tmp_path / "next", chat.tokenizer.pad_token_id, seed=0)
    assert m["train/loss"] == pytest.approx(0.5, abs=1e-4)
    assert m["train/tokens"] == 12 and m["train/ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert m["train/clip_frac"] == 0.0 and m["train/optimizer_steps"] == 1


@pytest.mark.parametrize("micro_batch", [1, 2])
def test_seq_mean_token_mean_weighs_every_sequence_the_same(batch, warm_model_dir, chat, tmp_path, micro_batch):
    """``loss_agg: seq-mean-token-mean`` with advantages 1 and −0.5: −(1·3/3 + (−0.5)·9/9) / 2 = −0.25 (the
    token-mean gives −(1·3 − 0.5·9) / 12 = +0.125, a mean over micro-batches of one −(1 − 0.5) = −0.5)."""
    rows = [Sample(s.prompt_ids, s.response_ids, s.response_mask, a) for s, a in zip(batch, [1.0, -0.5])]
    pad = chat.tokenizer.pad_token_id
    cfg = TrainerConfig(lr=1e-9, mini_batches=1, micro_batch=micro_batch, loss_agg="seq-mean-token-mean")
    assert update(warm_model_dir, rows, cfg, tmp_path / "seq", pad, seed=0)["train/loss"] == pytest.approx(-0.25, abs=1e-4)
    token = update(warm_model_dir, rows, TrainerConfig(lr=1e-9, mini_batches=1, micro_batch=micro_batch),
                   tmp_path / "tok", pad, seed=0)
    assert token["train/loss"] == pytest.approx(0.125, abs=1e-4)


def test_an_unknown_loss_aggregation_names_the_valid_ones():
    with pytest.raises(ValueError, match=r"(?s)loss_agg.*'token-mean' or 'seq-mean-token-mean'"):
        TrainerConfig(loss_agg="seq-sum")
    assert set(get_args(TrainerConfig.model_fields["loss_agg"].annotation)) == set(AGGREGATIONS)  # config = registry


def max_change(before_dir, after_dir) -> float:
    a, b = load_causal_lm(before_dir), load_causal_lm(after_dir)
    return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))


def test_gradient_norm_is_clipped(batch, warm_model_dir, chat, tmp_path):
    pad = chat.tokenizer.pad_token_id
    clipped = update(warm_model_dir, batch, TrainerConfig(lr=1e-3, mini_batches=1, grad_clip=1e-12),
                     tmp_path / "clipped", pad, seed=0)
    assert clipped["train/grad_norm"] > 1e-6  # the norm before clipping is reported
    assert max_change(warm_model_dir, tmp_path / "clipped") < 1e-3 * 1e-4 * 1.01
    update(warm_model_dir, batch, TrainerConfig(lr=1e-3, mini_batches=1, grad_clip=1e6), tmp_path / "free", pad, seed=0)
    assert 0.9e-3 < max_change(warm_model_dir, tmp_path / "free") < 1.1e-3  # Adam's first step: at most ≈ lr



def test_the_mini_batch_order_follows_the_seed(batch, warm_model_dir, chat, tmp_path):
    """Each epoch shuffles the mini-batches with the step's seed: the same seed gives the same weights bit for
    bit, another seed another order (six epochs of two mini-batches: 64 orders, so a random order would match
    the first run once in 64)."""
    pad = chat.tokenizer.pad_token_id
    cfg = TrainerConfig(lr=1e-3, mini_batches=2, epochs=6, micro_batch=2)
    for name, seed in [("a", 0), ("b", 0), ("c", 1)]:
        update(warm_model_dir, batch, cfg, tmp_path / name, pad, seed=seed)
    assert max_change(tmp_path / "a", tmp_path / "b") == 0.0
    assert max_change(tmp_path / "a", tmp_path / "c") > 1e-6


def test_old_logprobs_ordered_by_length_come_back_in_row_order(batch, warm_model_dir, chat):
    """The old-log-prob pass batches rows by length (long first here would be reordered) and hands each row its
    own log-probs: equal to the row computed alone, and the ordering is shortest first."""
    from models.forward import response_logprobs
    from models.old_logprobs import by_length
    from models.old_logprobs import old_logprobs as _old_logprobs

    rows = [batch[1], batch[0], batch[1]]
    assert by_length(rows, range(3)) == [1, 0, 2]
    model, pad = load_causal_lm(warm_model_dir), chat.tokenizer.pad_token_id
    got = _old_logprobs(model, rows, pad, TrainerConfig(micro_batch=2))
    for row, lp in zip(rows, got):
        alone, _ = response_logprobs(model, [row], pad)
        assert lp.shape == (len(row.response_ids),)
        assert (lp - alone[0]).abs().max().item() < 1e-5


def test_two_mini_batches_are_two_steps_whose_metrics_average(batch, warm_model_dir, chat, tmp_path):
    """mini_batches=2 on the two rows: one step each. At lr≈0 the short row alone has loss −1·3/3 = −1 and
    the long one −(−1)·9/9 = +1, so the per-step mean is 0; tokens add up to 12; the reported gradient
    norm is the mean of the two steps' norms, each measured by an update on its row alone."""
    pad = chat.tokenizer.pad_token_id
    cfg = TrainerConfig(lr=1e-9, mini_batches=2, epochs=1, micro_batch=2)
    alone = [update(warm_model_dir, [row], cfg, tmp_path / f"alone{i}", pad, seed=0)["train/grad_norm"]
             for i, row in enumerate(batch)]
    m = update(warm_model_dir, batch, cfg, tmp_path / "both", pad, seed=0)
    assert m["train/optimizer_steps"] == 2 and m["train/tokens"] == 12
    assert m["train/loss"] == pytest.approx(0.0, abs=1e-4)
    assert m["train/grad_norm"] == pytest.approx(sum(alone) / 2, rel=1e-3) and alone[0] != pytest.approx(alone[1])


def _token_stats(model, s: Sample):
    """Log-probs and entropies of ``s``'s response tokens, read off the logits (independent of the trainer)."""
    import torch

    with torch.no_grad():
        logits = model(input_ids=torch.tensor([s.prompt_ids + s.response_ids])).logits[0].float()
    logp = logits[len(s.prompt_ids) - 1 : len(s.prompt_ids) + len(s.response_ids) - 1].log_softmax(-1)
    lp = logp.gather(-1, torch.tensor(s.response_ids)[:, None])[:, 0]
    return lp, -(logp.exp() * logp).sum(-1), torch.tensor(s.response_mask, dtype=torch.float32)


def test_the_second_epoch_measures_the_policy_the_first_moved(batch, warm_model_dir, chat, tmp_path):
    """Two epochs of one mini-batch in micro-batches of one row, lr 1e-3: the first step is at ratio 1 (loss 0.5,
    as above); the second scores both rows with the policy the first step moved — the checkpoint of a one-epoch
    update. Every token metric is a mean over both steps' 24 tokens (clipped share, ratio, approx KL, entropy),
    the loss a mean over the 2 steps, ``train/tokens`` the tokens of one epoch."""
    import torch

    pad = chat.tokenizer.pad_token_id
    cfg = TrainerConfig(lr=1e-3, mini_batches=1, epochs=2, micro_batch=1)
    m = update(warm_model_dir, batch, cfg, tmp_path / "two", pad, seed=0)
    update(warm_model_dir, batch, cfg.model_copy(update={"epochs": 1}), tmp_path / "one", pad, seed=0)
    before, after = load_causal_lm(warm_model_dir), load_causal_lm(tmp_path / "one")
    clipped = ratio_sum = approx_kl = entropy = loss2 = 0.0
    for s in batch:
        old, ent0, mask = _token_stats(before, s)
        new, ent1, _ = _token_stats(after, s)
        ratio = (new - old).exp()
        clipped += float((((ratio < 0.8) | (ratio > 1.28)).float() * mask).sum())
        ratio_sum += float((ratio * mask).sum())
        approx_kl += float(((old - new) * mask).sum())
        entropy += float(((ent0 + ent1) * mask).sum())
        loss2 -= float((torch.minimum(ratio * s.advantage, ratio.clamp(0.8, 1.28) * s.advantage) * mask).sum()) / 12
    assert 0 < clipped < 12  # some of the second step's tokens left the clip range, not all
    assert m["train/loss"] == pytest.approx((0.5 + loss2) / 2, abs=1e-4)
    assert m["train/clip_frac"] == pytest.approx(clipped / 24)
    assert m["train/ratio_mean"] == pytest.approx((12.0 + ratio_sum) / 24, rel=1e-4)
    assert m["train/approx_kl"] == pytest.approx(approx_kl / 24, abs=1e-5)
    assert m["train/entropy"] == pytest.approx(entropy / 24, rel=1e-4)
    assert (m["train/tokens"], m["train/sequences"], m["train/optimizer_steps"]) == (12, 2, 2)
    assert "train/kl" not in m and "train/ess_ratio" not in m


def test_the_optimizer_state_carries_over_to_the_next_update(batch, warm_model_dir, chat, tmp_path):
    """AdamW's state is saved with the checkpoint (beside the caller's trainer state) and loaded by the next update:
    after two updates it has taken 2 steps (1 from a copy of the same weights without ``optimizer.pt``), and the
    weights differ accordingly."""
    import json
    import shutil

    import torch

    pad = chat.tokenizer.pad_token_id
    cfg = TrainerConfig(lr=1e-3, mini_batches=1)
    update(warm_model_dir, batch, cfg, tmp_path / "b", pad, seed=0, state={"step": 1})
    assert json.loads((tmp_path / "b" / "trainer_state.json").read_text()) == {"source": str(warm_model_dir), "step": 1}
    shutil.copytree(tmp_path / "b", tmp_path / "b_fresh")
    (tmp_path / "b_fresh" / "optimizer.pt").unlink()
    for name in ("b", "b_fresh"):
        update(tmp_path / name, batch, cfg, tmp_path / f"{name}_next", pad, seed=1)
    steps = [int(torch.load(tmp_path / f"{n}_next" / "optimizer.pt", weights_only=True)["state"][0]["step"])
             for n in ("b", "b_fresh")]
    assert steps == [2, 1]
    assert max_change(tmp_path / "b_next", tmp_path / "b_fresh_next") > 1e-6
