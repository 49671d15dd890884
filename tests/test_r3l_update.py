"""The OPMD loss and the KL penalty inside the real policy update (tiny model, CPU)."""

from __future__ import annotations

import pytest
import torch

from models.config import TrainerConfig
from models.engine import load_causal_lm
from models.forward import response_logprobs
from models.trainer import Sample, update


def _samples(chat):
    prompt = chat.prompt_ids([{"role": "user", "content": "What is 2 + 2?"}])
    good = chat.encode("The answer is \\boxed{4}.") + [chat.eos_id]
    bad = chat.encode("The answer is \\boxed{5}.") + [chat.eos_id]
    return good, bad, [Sample(prompt, good, [1] * len(good), 1.0), Sample(prompt, bad, [1] * len(bad), -1.0)]


def test_opmd_update_with_k2_kl_moves_logprobs_the_advantage_way(warm_model_dir, chat, tmp_path):
    good, bad, samples = _samples(chat)
    pad = chat.tokenizer.pad_token_id
    cfg = TrainerConfig(lr=1e-3, mini_batches=1, epochs=2, loss="opmd", kl_coef=0.001)
    metrics = update(warm_model_dir, samples, cfg, tmp_path / "next", pad, seed=0, ref_dir=warm_model_dir)
    before, after = load_causal_lm(warm_model_dir), load_causal_lm(tmp_path / "next")
    with torch.no_grad():
        lp0, _ = response_logprobs(before, samples[:2], pad)
        lp1, _ = response_logprobs(after, samples[:2], pad)
    differ = next(i for i, (g, b) in enumerate(zip(good, bad)) if g != b)
    assert lp1[0, differ] > lp0[0, differ] and lp1[1, differ] < lp0[1, differ]
    assert metrics["train/clip_frac"] == 0.0 and metrics["train/optimizer_steps"] == 2
    assert metrics["train/kl"] > 0.0, "the second epoch starts from a moved policy"


def test_kl_without_a_reference_is_a_clear_error(warm_model_dir, chat, tmp_path):
    _, _, samples = _samples(chat)
    with pytest.raises(ValueError, match="needs a reference policy"):
        update(warm_model_dir, samples, TrainerConfig(kl_coef=0.01), tmp_path / "x", chat.tokenizer.pad_token_id, 0)


def test_unknown_loss_names_the_registered_ones():
    with pytest.raises(ValueError, match="unknown loss 'ppo'; registered losses: dapo, opmd"):
        TrainerConfig(loss="ppo")
