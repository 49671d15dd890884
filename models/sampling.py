"""Sampling a continuous batch's next tokens (``models.decode.DecodeStream``): each row's own seeded draws.

A row's uniform draws come from its own ``torch.Generator`` seeded by (stream seed, key or seed key, input length)
(``row_seed``), one draw per sampled token, so what a row samples does not depend on which other rows share its
batch. ``RowDraws`` takes them from the generator a block at a time (``torch.rand(n)`` gives the numbers ``n``
calls of ``torch.rand(1)`` give, bit for bit: ``tests/test_decode.py``) so a decode step reads one float per row
instead of calling the generator once per row.

``sample`` turns a batch's logits and draws into tokens and their log-probs: temperature, optional nucleus
(``top_p``), the inverse of the cumulative distribution at the draw; temperature 0 is greedy (the arg-max, its
log-prob at temperature 1). The log-prob of a sampled token is under the temperature-scaled distribution.
"""

from __future__ import annotations

import hashlib

import torch

BLOCK = 64
"""Draws taken from a row's generator at a time."""


def row_seed(seed: int, key: object, n_ids: int) -> int:
    """The seed of a row's generator: a stable hash of (stream seed, key, input length)."""
    digest = hashlib.blake2b(f"{seed}:{key!r}:{n_ids}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


class RowDraws:
    """One row's uniform draws in order, taken from its seeded generator ``BLOCK`` at a time."""

    __slots__ = ("gen", "block", "at")

    def __init__(self, seed: int):
        self.gen = torch.Generator().manual_seed(seed)
        self.block: list[float] = []
        self.at = 0

    def next(self) -> float:
        if self.at == len(self.block):
            self.block, self.at = torch.rand(BLOCK, generator=self.gen).tolist(), 0
        self.at += 1
        return self.block[self.at - 1]


def sample(logits: torch.Tensor, temperature: float, top_p: float, draws: list[RowDraws]
           ) -> tuple[list[int], list[float]]:
    """Tokens and their log-probs for rows ``[n, vocab]`` of logits; ``draws[i]`` is row ``i``'s stream."""
    if temperature == 0:
        logp = torch.log_softmax(logits, dim=-1)
        tokens = logp.argmax(dim=-1)
    else:
        logp = torch.log_softmax(logits / temperature, dim=-1)
        probs = logp.exp()
        if top_p < 1.0:
            sorted_p, order = probs.sort(dim=-1, descending=True)
            keep = sorted_p.cumsum(-1) - sorted_p < top_p
            probs = torch.zeros_like(probs).scatter(-1, order, sorted_p * keep)
        cdf = probs.cumsum(-1)
        u = torch.tensor([[d.next()] for d in draws], dtype=torch.float32, device=cdf.device)
        tokens = torch.searchsorted(cdf, u * cdf[:, -1:]).clamp_(max=logits.shape[-1] - 1).squeeze(-1)
    chosen = logp.gather(-1, tokens[:, None]).squeeze(-1)
    return tokens.tolist(), chosen.tolist()
