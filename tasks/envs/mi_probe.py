"""RAGEN-2's MI probe: how much does a policy's first-turn reasoning depend on its input?

For a sample of finished episodes (first turn only, RAGEN-2's ``first_turn`` mode), ``z`` is the
generated reasoning strictly inside ``<think>…</think>`` — the ids of the first turn that decode
entirely before ``</think>`` (the forced ``<think>`` is part of the prompt) — and ``x`` the
first-turn prompt. The cross matrix ``L[i, j]`` is the mean per-token log-prob of ``z_i`` after
each distinct prompt ``x_j`` (teacher forcing, no grad); ``tasks.envs.collapse.mi_diagnostics``
turns it into MI, H(Z|X), retrieval accuracy and the MI z-score. Samples with empty reasoning
are skipped; fewer than two distinct prompts give no figures.

Run: ``mi_probe(model, trajs, decode_piece, n_samples=64, seed=0)`` with a causal LM in eval mode.
"""

from __future__ import annotations

import random

import numpy as np

from tasks.envs.collapse import mi_diagnostics

THINK_END = "</think>"


def reasoning_ids(generated: list[int], decode_piece) -> list[int]:
    """The leading ids of a turn that decode entirely before ``</think>`` ([] if it never closes)."""
    ends, text = [], ""
    for tid in generated:
        text += decode_piece(tid)
        ends.append(len(text))
    cut = text.find(THINK_END)
    if cut < 0:
        return []
    return [tid for tid, end in zip(generated, ends) if end <= cut]


def _mean_logprob(model, prompt: list[int], zs: list[list[int]], batch: int = 32) -> np.ndarray:
    import torch

    out = np.zeros(len(zs))
    for lo in range(0, len(zs), batch):
        chunk = zs[lo: lo + batch]
        width = len(prompt) + max(len(z) for z in chunk)
        ids = torch.zeros((len(chunk), width), dtype=torch.long)
        attn = torch.zeros_like(ids)
        for r, z in enumerate(chunk):
            seq = prompt + z
            ids[r, : len(seq)] = torch.tensor(seq)
            attn[r, : len(seq)] = 1
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=attn).logits.float()
        lp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
        for r, z in enumerate(chunk):
            span = lp[r, len(prompt) - 1: len(prompt) - 1 + len(z)]
            out[lo + r] = float(span.mean())
    return out


def mi_probe(model, trajs, decode_piece, n_samples: int = 64, seed: int = 0) -> dict[str, float]:
    """MI diagnostics of the first-turn reasoning of ``trajs`` (``EnvTrajectory``-like objects)."""
    pairs = []
    for t in trajs:
        if not t.turn_spans:
            continue
        start, end = t.turn_spans[0]
        z = reasoning_ids(t.response_ids[start:end], decode_piece)
        if z:
            pairs.append((tuple(t.prompt_ids), z))
    metrics = {"collapse/valid_thinking_rate": len(pairs) / len(trajs) if trajs else 0.0}
    random.Random(seed).shuffle(pairs)
    pairs = pairs[:n_samples]
    prompts = list(dict.fromkeys(p for p, _ in pairs))
    if len(prompts) < 2:
        return metrics
    col = {p: j for j, p in enumerate(prompts)}
    zs = [z for _, z in pairs]
    cross = np.stack([_mean_logprob(model, list(p), zs) for p in prompts], axis=1)
    metrics.update(mi_diagnostics(cross, np.array([col[p] for p, _ in pairs])))
    return metrics
