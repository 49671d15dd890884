"""Warm-up SFT of a small causal LM on tool-use transcripts (loss on assistant tokens only).

Each transcript is turned into ids and a loss mask with ``models.chat.build_sft_example`` —
the same turn-by-turn ids a rollout builds — so the policy is trained on exactly what it
sees later. Optimiser: AdamW, linear warm-up to ``lr``, held there until ``decay_start`` of
the run, then a cosine to ``min_lr``. The run is measured in steps *and* time: progress is
the larger of ``step / max_steps`` and ``elapsed / time_budget_s``, so a time-bounded run
still decays at its end. The lr stays ≥ 1e-3 until late on purpose: the tiny model's loss
drops suddenly (≈0.55 → 0.2) when it learns to copy digit strings, after ~750+ steps at a
high lr (DESIGN §6). Judge a warm-up by that loss, not by its time.

Batches are length-bucketed (a pool of 32 batches is sorted by length, cut into batches and
shuffled) to waste less compute on padding. The result is saved with ``save_pretrained``
(model + tokenizer) into a temporary folder next to ``out_dir`` and renamed into place.

The transcripts (lists of chat messages) are handed in by the caller — the warm-up flow reads
them from the corpus file (``tasks.synthetic.read_sft_corpus``) — so this module knows no task.

Simplifies: single process, float32, no gradient accumulation or resume. Run:
``warmup(Path("tiny"), read_sft_corpus(Path("sft.jsonl")), WarmupConfig(), Path("tiny-warm"))``.
"""

from __future__ import annotations

import math
import os
import random
import shutil
import time
from pathlib import Path

from models.config import WarmupConfig

IGNORE = -100
POOL_BATCHES = 32


def lr_at(step: int, progress: float, cfg: WarmupConfig) -> float:
    """Learning rate at optimiser ``step`` (0-based) when ``progress`` ∈ [0, 1] of the run is done."""
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if progress <= cfg.decay_start:
        return cfg.lr
    frac = min(1.0, (progress - cfg.decay_start) / max(1e-9, 1.0 - cfg.decay_start))
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1.0 + math.cos(math.pi * frac))


def collate(examples: list[tuple[list[int], list[int]]], pad_id: int):
    """Right-padded ``input_ids``, ``attention_mask`` and ``labels`` (-100 off the loss mask)."""
    import torch

    width = max(len(ids) for ids, _ in examples)
    input_ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(examples), width), dtype=torch.long)
    labels = torch.full((len(examples), width), IGNORE, dtype=torch.long)
    for row, (ids, mask) in enumerate(examples):
        n = len(ids)
        input_ids[row, :n] = torch.tensor(ids)
        attention[row, :n] = 1
        labels[row, :n] = torch.tensor([t if m else IGNORE for t, m in zip(ids, mask)])
    return input_ids, attention, labels


def batches(transcripts: list[list[dict]], chat, cfg: WarmupConfig, skipped: list[int]):
    """Endless length-bucketed batches of (ids, mask); over-long transcripts are counted in ``skipped``.

    A ``chat`` with its own ``sft_example(messages)`` builds the examples (text games do); otherwise
    ``models.chat.build_sft_example`` does."""
    from models.chat import build_sft_example

    build = getattr(chat, "sft_example", None) or (lambda messages: build_sft_example(chat, messages))
    rng = random.Random(cfg.seed)
    order: list[int] = []
    while True:
        if len(order) < cfg.batch_size * POOL_BATCHES:
            fresh = list(range(len(transcripts)))
            rng.shuffle(fresh)
            order += fresh
        pool = []
        for idx in order[: cfg.batch_size * POOL_BATCHES]:
            ids, mask = build(transcripts[idx])
            if len(ids) > cfg.max_len:
                skipped[0] += 1
            else:
                pool.append((ids, mask))
        del order[: cfg.batch_size * POOL_BATCHES]
        pool.sort(key=lambda ex: len(ex[0]))
        chunks = [pool[i : i + cfg.batch_size] for i in range(0, len(pool), cfg.batch_size)]
        rng.shuffle(chunks)
        yield from (c for c in chunks if c)


def save_atomic(model, tokenizer, out_dir: Path) -> Path:
    """``save_pretrained`` model + tokenizer into a temp folder beside ``out_dir``, then rename it in."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.parent / f".{out_dir.name}.tmp-{os.getpid()}"
    old = out_dir.parent / f".{out_dir.name}.old-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if out_dir.exists():
        out_dir.rename(old)
    tmp.rename(out_dir)
    shutil.rmtree(old, ignore_errors=True)
    return out_dir


def train_loop(model, chat, transcripts, cfg: WarmupConfig) -> dict:
    import torch
    from tqdm import tqdm

    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95))
    skipped, losses, curve, tokens = [0], [], [], 0
    start = time.monotonic()
    model.train()
    stream = batches(transcripts, chat, cfg, skipped)
    bar = tqdm(total=cfg.max_steps, desc="warm-up", unit="step")
    step = 0
    for step in range(cfg.max_steps):
        elapsed = time.monotonic() - start
        if cfg.time_budget_s is not None and elapsed >= cfg.time_budget_s:
            break
        progress = max(step / cfg.max_steps, elapsed / cfg.time_budget_s if cfg.time_budget_s else 0.0)
        lr = lr_at(step, progress, cfg)
        for group in opt.param_groups:
            group["lr"] = lr
        input_ids, attention, labels = collate(next(stream), chat.tokenizer.pad_token_id)
        loss = model(input_ids=input_ids, attention_mask=attention, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        losses.append(loss.item())
        tokens += int(attention.sum())
        if (step + 1) % 50 == 0:
            curve.append((step + 1, round(sum(losses[-50:]) / len(losses[-50:]), 4), round(lr, 6)))
        bar.set_postfix(loss=f"{sum(losses[-20:]) / len(losses[-20:]):.3f}", lr=f"{lr:.1e}")
        bar.update(1)
    else:
        step = cfg.max_steps
    bar.close()
    tail = losses[-50:] or [float("nan")]
    return {
        "final_loss": round(sum(tail) / len(tail), 4),
        "steps": step,
        "seconds": round(time.monotonic() - start, 1),
        "tokens": tokens,
        "skipped_too_long": skipped[0],
        "loss_curve": curve,
    }


def warmup(model_dir: Path, transcripts: list[list[dict]], cfg: WarmupConfig, out_dir: Path) -> dict:
    """Fine-tune ``model_dir`` on ``transcripts`` (each a list of chat messages); save to ``out_dir``.

    Returns ``final_loss`` (mean of the last 50 steps), ``steps``, ``seconds``, ``tokens``,
    ``skipped_too_long`` and ``loss_curve`` ([step, mean loss of the last 50 steps, lr]).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from models.chat import ChatFormat

    if not transcripts:
        raise ValueError("warmup: no transcripts to train on")
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    result = train_loop(model, ChatFormat(tokenizer), transcripts, cfg)
    model.eval()
    save_atomic(model, tokenizer, out_dir)
    return result
