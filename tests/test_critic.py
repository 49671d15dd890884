"""The critic variant (``mix.advantage: gae``): GAE by hand on 3 tokens, the value head through an update, config."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from flows.config import ConfigError, load_config
from models.config import CriticConfig, TrainerConfig
from models.critic import CRITIC_FILE, gae, token_gae, whiten
from models.trainer import Sample, update

ENV_MODEL = Path(__file__).resolve().parents[1] / "assets" / "tiny-env"


def test_gae_three_tokens_by_hand():
    # reward 1 on the last token, values 0.2, 0.5, 0.8
    adv, ret = gae([0.0, 0.0, 1.0], [0.2, 0.5, 0.8], gamma=1.0, lam=1.0)
    assert adv == pytest.approx([0.8, 0.5, 0.2]) and ret == pytest.approx([1.0, 1.0, 1.0])  # A_t = R - V_t
    # gamma 0.9, lambda 0.5: deltas 0.9*0.5-0.2 = 0.25, 0.9*0.8-0.5 = 0.22, 1-0.8 = 0.2;
    # A2 = 0.2, A1 = 0.22 + 0.45*0.2 = 0.31, A0 = 0.25 + 0.45*0.31 = 0.3895; returns = A + V
    adv, ret = gae([0.0, 0.0, 1.0], [0.2, 0.5, 0.8], gamma=0.9, lam=0.5)
    assert adv == pytest.approx([0.3895, 0.31, 0.2]) and ret == pytest.approx([0.5895, 0.81, 1.0])


def test_token_gae_skips_observation_tokens():
    # 3 trained tokens around one observation token (mask 0): the same figures as above, 0 on the observation
    values = torch.tensor([0.2, 9.0, 0.5, 0.8])
    adv, ret = token_gae(1.0, values, torch.tensor([1.0, 0.0, 1.0, 1.0]), 0.9, 0.5)
    assert adv.tolist() == pytest.approx([0.3895, 0.0, 0.31, 0.2])
    assert ret.tolist() == pytest.approx([0.5895, 0.0, 0.81, 1.0])
    rows = whiten([torch.tensor([1.0, 5.0, 3.0]), torch.tensor([2.0])], [torch.tensor([1.0, 0.0, 1.0]), torch.tensor([1.0])])
    flat = torch.cat([rows[0][[0, 2]], rows[1]])
    assert float(flat.mean()) == pytest.approx(0.0, abs=1e-6) and float(flat.std(unbiased=False)) == pytest.approx(1.0)
    assert float(rows[0][1]) == 0.0


def test_update_trains_the_value_head(tmp_path):
    """Two updates with the critic: the head (zero at first) is saved in critic.pt, moves towards the returns,
    and the second update starts from it."""
    ids = list(range(20, 30))
    samples = [Sample(ids[:4], ids[4:9], [1, 1, 0, 1, 1], 1.0, reward=1.0, group="g"),
               Sample(ids[:4], ids[5:10], [1, 1, 0, 1, 1], 0.0, reward=0.0, group="g")]
    cfg = TrainerConfig(lr=1e-3, mini_batches=1, critic=CriticConfig(enabled=True, lr=1e-2, value_coef=1.0))
    m1 = update(ENV_MODEL, samples, cfg, tmp_path / "v1", pad_id=0, seed=0)
    assert (tmp_path / "v1" / CRITIC_FILE).exists() and not (ENV_MODEL / CRITIC_FILE).exists()
    assert m1["train/value_mean"] == 0.0 and m1["train/value_loss"] == pytest.approx(0.5 * 0.5)  # V = 0: ½·mean(R²), R = 1 on half the tokens
    assert m1["train/return_mean"] == pytest.approx(0.5)
    m2 = update(tmp_path / "v1", samples, cfg, tmp_path / "v2", pad_id=0, seed=1)
    assert m2["train/value_mean"] > 0.0 and m2["train/value_loss"] < m1["train/value_loss"]
    head = torch.load(tmp_path / "v2" / CRITIC_FILE, weights_only=True)["head"]
    assert float(head["proj.weight"].abs().sum()) > 0


def test_gae_turns_the_critic_on_and_refuses_conflicts():
    cfg = load_config("configs/bandit.yaml", ["mix.advantage=gae"])
    assert cfg.trainer.critic.enabled and cfg.trainer.critic.gamma == 1.0 and cfg.trainer.critic.lam == 1.0
    assert not load_config("configs/bandit.yaml").trainer.critic.enabled
    with pytest.raises(ConfigError, match="loss_scaling must be none"):
        load_config("configs/bandit.yaml", ["mix.advantage=gae", "mix.group_filter.loss_scaling=linear"])
    with pytest.raises(ConfigError, match="set by mix.advantage=gae"):
        load_config("configs/bandit.yaml", ["trainer.critic.enabled=true"])
