"""The critic variant (``mix.advantage: gae``): GAE by hand on 3 tokens, the value head through an update, config."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from flows.config import ConfigError, load_config
from models.config import CriticConfig, TrainerConfig
from models.critic import CRITIC_FILE, gae, load_critic, token_gae, whiten
from models.engine import load_causal_lm
from models.forward import response_forward as _response_forward
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


@pytest.mark.parametrize("micro_batch", [1, 2])
def test_critic_loss_on_rows_of_different_lengths(tmp_path, micro_batch):
    """Rows of 5 and 3 response tokens (4 and 3 trained), two epochs at lr ≈ 0, zero head: V = 0, so each trained
    token's GAE advantage is its row's reward (1, 0.5), whitened over the 7 tokens to mean 0; per step the policy
    loss at ratio 1 is −mean(A) = 0 and the value loss ½·mean(R²) = ½·(4·1 + 3·0.25)/7 = 4.75/14, so
    ``train/loss`` = 0 + 1.0·4.75/14 (returns, not whitened advantages, feed the value loss; each micro-batch
    gets its own rows' targets and adds its share); the return mean is 4.75/7, nothing clips or drifts."""
    ids = list(range(20, 30))
    samples = [Sample(ids[:4], ids[4:9], [1, 1, 0, 1, 1], 1.0, reward=1.0, group="g"),
               Sample(ids[:4], ids[5:8], [1, 1, 1], 0.5, reward=0.5, group="g")]
    cfg = TrainerConfig(lr=1e-9, mini_batches=1, epochs=2, micro_batch=micro_batch,
                        critic=CriticConfig(enabled=True, lr=1e-9, value_coef=1.0))
    m = update(ENV_MODEL, samples, cfg, tmp_path / "v", pad_id=0, seed=0)
    assert m["train/value_loss"] == pytest.approx(4.75 / 14, abs=1e-6)
    assert m["train/return_mean"] == pytest.approx((4 + 1.5) / 7)
    assert m["train/loss"] == pytest.approx(4.75 / 14, abs=1e-5) and m["train/tokens"] == 7
    assert (m["train/optimizer_steps"], m["train/clip_frac"]) == (2, 0.0)
    assert m["train/approx_kl"] == pytest.approx(0.0, abs=1e-4) and m["train/ratio_mean"] == pytest.approx(1.0, abs=1e-4)


def test_detach_trunk_keeps_the_value_loss_out_of_the_policy(tmp_path):
    """From a checkpoint with a trained (non-zero) head, the same update with and without ``detach_trunk``
    moves the policy's body differently: only without it does the value loss reach the trunk. The value mean
    is that of the head's values on the trained tokens before the step."""
    ids = list(range(20, 30))
    samples = [Sample(ids[:4], ids[4:9], [1, 1, 0, 1, 1], 1.0, reward=1.0, group="g"),
               Sample(ids[:4], ids[5:10], [1, 1, 0, 1, 1], 0.0, reward=0.0, group="g")]
    critic = CriticConfig(enabled=True, lr=1e-2, value_coef=1.0)
    update(ENV_MODEL, samples, TrainerConfig(lr=1e-3, mini_batches=1, critic=critic), tmp_path / "v1", pad_id=0, seed=0)
    model = load_causal_lm(tmp_path / "v1")
    head, _ = load_critic(tmp_path / "v1", model, critic.lr)
    with torch.no_grad():
        _, mask, _, values = _response_forward(model.eval(), samples, 0, "cpu", head)
    expected = float((values * mask).sum() / mask.sum())
    assert abs(expected) > 1e-4
    for detach in (False, True):
        cfg = TrainerConfig(lr=1e-3, mini_batches=1, micro_batch=1,
                            critic=critic.model_copy(update={"detach_trunk": detach}))
        m = update(tmp_path / "v1", samples, cfg, tmp_path / f"d{detach}", pad_id=0, seed=1)
        assert m["train/value_mean"] == pytest.approx(expected, rel=1e-4)
    a, b = load_causal_lm(tmp_path / "dFalse"), load_causal_lm(tmp_path / "dTrue")
    assert max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters())) > 1e-7


def test_opob_and_the_critic_exclude_each_other(tmp_path):
    ids = list(range(20, 30))
    cfg = TrainerConfig(opob=True, critic=CriticConfig(enabled=True))
    with pytest.raises(ValueError, match=r"^trainer.opob and the critic \(mix.advantage: gae\) exclude each other$"):
        update(ENV_MODEL, [Sample(ids[:4], ids[4:9], [1] * 5, 1.0, reward=1.0, group="g")], cfg, tmp_path / "x", 0, 0)


def test_the_critic_metrics_mask_lives_on_the_returns_device():
    """On CUDA the returns live on the GPU: a mask built on the CPU beside them raises in every ``gae`` update
    (the ``meta`` device raises the same way); the hand-computed sum on the CPU is 1 + 1 + 0.5 (mask 1, 1, 0, 1)."""
    from models.trainer import trained_return_sum

    samples = [Sample([1], [2, 3, 4], [1, 1, 0], 0.0, group="g"), Sample([1], [5], [1], 0.0, group="g")]
    on = lambda device: [(torch.zeros(3, device=device), torch.tensor([1.0, 1.0, 9.0], device=device)),
                         (torch.zeros(1, device=device), torch.tensor([0.5], device=device))]
    assert float(trained_return_sum(samples, on("cpu"))) == 2.5
    total = trained_return_sum(samples, on("meta"))
    assert total.device.type == "meta" and total.shape == ()
