"""Seeded start states: which seeds a training step plays and which the held-out evaluation plays.

Every seed is derived by hashing ``(base seed, split, step, group, attempt)``, so a rerun of a step
plays the same games. Train and held-out sets never share a start state: a start state belongs
to the held-out split when a hash of its text falls in the first ``heldout_share`` of the hash
range; a train draw that lands there (or a held-out draw that does not) moves on to the next
attempt. Games with only a few start states (``Env.split_by_state`` False: Bandit) are not split;
their held-out evaluation uses a renamed variant (``bandit_test``).

Run: ``train_seeds(env, cfg, run_seed=0, step=3)``; ``heldout_seeds(env, cfg, n=64)``.
"""

from __future__ import annotations

import hashlib

from tasks.envs.base import Env
from tasks.envs.config import EnvConfig

_SCALE = 10_000
MAX_ATTEMPTS = 10_000


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def derive_seed(*parts) -> int:
    """A 31-bit seed from any parts (stable across processes, unlike ``hash``)."""
    return _hash(":".join(map(str, parts))) & 0x7FFFFFFF


def is_heldout_state(start_state: str, share: float) -> bool:
    """True when the start state's text hashes into the held-out share."""
    return _hash(start_state) % _SCALE < round(share * _SCALE)


def start_seed(env: Env, cfg: EnvConfig, split: str, base: int, step: int, group: int) -> int:
    """The seed of one group's start state in ``split`` ("train" or "heldout")."""
    want_heldout = split == "heldout"
    for attempt in range(MAX_ATTEMPTS):
        seed = derive_seed(base, split, step, group, attempt)
        if not env.split_by_state or cfg.heldout_share == 0:
            return seed
        if is_heldout_state(env.reset(seed), cfg.heldout_share) == want_heldout:
            return seed
    raise RuntimeError(f"{env.name}: no {split} start state in {MAX_ATTEMPTS} draws (heldout_share={cfg.heldout_share})")


def train_seeds(env: Env, cfg: EnvConfig, run_seed: int, step: int, n: int | None = None) -> list[int]:
    """Seeds of the ``n`` (default ``cfg.groups``) groups of training step ``step``."""
    return [start_seed(env, cfg, "train", run_seed, step, g) for g in range(cfg.groups if n is None else n)]


def heldout_seeds(env: Env, cfg: EnvConfig, n: int) -> list[int]:
    """The first ``n`` held-out seeds (the same list in every run: based on ``cfg.heldout_seed``)."""
    return [start_seed(env, cfg, "heldout", cfg.heldout_seed, 0, g) for g in range(n)]
