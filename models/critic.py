"""The critic variant of the update (``mix.advantage: gae``): a value head on the policy and GAE per token.

Design: the critic is a **value head on the policy** — one linear map of the policy's last hidden state to a
scalar, stored beside the weights as ``critic.pt`` (head weights + its AdamW state) — rather than a separate
value model. On the 2-core CPU box a separate critic would double every forward and backward of the update;
the head reuses the policy's forward (the hidden states come with the logits) and costs one dot product per
token. The head starts at zero (V ≡ 0: the first step's advantages are the returns). With
``critic.detach_trunk`` the value loss trains the head only; otherwise (default) its gradient, weighted by
``critic.value_coef``, also flows into the shared body, as in PPO's shared actor-critic.

Time steps are the trained (mask-1) response tokens in order; observation tokens (mask 0) are skipped, so a
multi-turn episode is one sequence of action tokens. The value of a token is read at the position that
predicts it (the state before the token), like its log-prob. The outcome reward sits on the last trained
token. GAE (Schulman et al. 2016) backwards over those tokens:

    δ_t = r_t + γ·V_{t+1} − V_t   (V after the last token = 0)
    A_t = δ_t + γ·λ·A_{t+1},      return_t = A_t + V_t   (the value target)

With γ = λ = 1 (RAGEN's critic variant) A_t = R − V_t and every return is R. Advantages are computed once per
RL step from the values before the update (like the old log-probs) and, with ``critic.whiten``, normalised
over the batch's trained tokens; the value loss is ``value_coef`` × token-mean ½(V − return)².
"""

from __future__ import annotations

from pathlib import Path

import torch

CRITIC_FILE = "critic.pt"


def gae(rewards: list[float], values: list[float], gamma: float, lam: float) -> tuple[list[float], list[float]]:
    """GAE advantages and returns of one sequence of time steps (rewards and values per step)."""
    adv = [0.0] * len(rewards)
    last, next_value = 0.0, 0.0
    for t in reversed(range(len(rewards))):
        delta = rewards[t] + gamma * next_value - values[t]
        last = delta + gamma * lam * last
        adv[t] = last
        next_value = values[t]
    return adv, [a + v for a, v in zip(adv, values)]


def token_gae(outcome: float, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float):
    """Per-position advantages and returns ``[R]`` of one response: GAE over its mask-1 positions, the outcome
    reward on the last of them; 0 at mask-0 positions."""
    idx = [i for i, m in enumerate(mask.tolist()) if m > 0]
    adv, ret = torch.zeros_like(values), torch.zeros_like(values)
    if idx:
        rewards = [0.0] * len(idx)
        rewards[-1] = float(outcome)
        a, r = gae(rewards, [float(values[i]) for i in idx], gamma, lam)
        adv[idx] = torch.tensor(a, dtype=values.dtype, device=values.device)
        ret[idx] = torch.tensor(r, dtype=values.dtype, device=values.device)
    return adv, ret


def whiten(rows: list[torch.Tensor], masks: list[torch.Tensor], eps: float = 1e-8) -> list[torch.Tensor]:
    """``rows`` shifted and scaled to mean 0, std 1 over every mask-1 position of the batch (zeros elsewhere)."""
    flat = torch.cat([r[m > 0] for r, m in zip(rows, masks)])
    if flat.numel() < 2:
        return [r * m for r, m in zip(rows, masks)]
    mean, std = flat.mean(), flat.std(unbiased=False)
    return [(r - mean) / (std + eps) * m for r, m in zip(rows, masks)]


class ValueHead(torch.nn.Module):
    """V(state) = w·h + b on the policy's last hidden state ``h``; zero at start."""

    def __init__(self, hidden: int):
        super().__init__()
        self.proj = torch.nn.Linear(hidden, 1)
        torch.nn.init.zeros_(self.proj.weight)
        torch.nn.init.zeros_(self.proj.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.proj(hidden.float()).squeeze(-1)


def hidden_size(model) -> int:
    cfg = model.config
    return int(getattr(cfg, "hidden_size", None) or cfg.get_text_config().hidden_size)


def load_critic(ckpt_dir: Path, model, lr: float, device: str = "cpu"):
    """The value head and its optimizer of checkpoint ``ckpt_dir`` (a fresh zero head when it has none)."""
    head = ValueHead(hidden_size(model)).to(device)
    opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=0.0)
    path = Path(ckpt_dir) / CRITIC_FILE
    if path.exists():
        state = torch.load(path, weights_only=True, map_location=device)
        head.load_state_dict(state["head"])
        opt.load_state_dict(state["optimizer"])
        for group in opt.param_groups:
            group["lr"] = lr
    return head, opt


def save_critic(head: ValueHead, opt, out_dir: Path) -> None:
    torch.save({"head": head.state_dict(), "optimizer": opt.state_dict()}, Path(out_dir) / CRITIC_FILE)
