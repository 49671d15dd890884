"""The old-log-prob pass of an update: each row's response log-probs under the policy before any optimizer step.

SAAR changed the context the rollout log-probs were computed in, so the update recomputes them on the final token
sequences (``models.trainer.update``, step 2). ``old_logprobs`` is the no-grad pass, in micro-batches ordered by
length (``micro_order``: by response length when prompts are forwarded once for their rows, ``models.forward``).
With ``trainer.fuse_old_logprobs`` (``fusable``) the first mini-batch's forwards with grad, taken before any
optimizer step, *are* its rows' old log-probs (``first_forwards``): they are computed once instead of twice, and
only the other rows get the no-grad pass. ``random_in_train`` says when neither shortcut is exact (dropout).
"""

from __future__ import annotations

import time

import torch

from models.config import TrainerConfig
from models.forward import ForwardSwitches, SharedPrompts, by_response_length, micro_spans, response_logprobs
from models.forward import response_forward as _response_forward
from models.samples import Sample


@torch.no_grad()
def old_logprobs(model, samples: list[Sample], pad_id: int, cfg: TrainerConfig,
                 skip: frozenset[int] = frozenset()) -> list[torch.Tensor]:
    """Each row's response log-probs under ``model`` (no grad), in micro-batches ordered by length; rows in
    ``skip`` are left None (their log-probs come from elsewhere)."""
    model.eval()
    out: list[torch.Tensor | None] = [None] * len(samples)
    fast = ForwardSwitches.of(cfg)
    order = micro_order(samples, [i for i in range(len(samples)) if i not in skip], fast.share_prompts)
    prompts = SharedPrompts(model, [samples[i] for i in order], pad_id, cfg.device) if fast.share_prompts and order else None
    rows = [samples[i] for i in order]
    for lo, hi in micro_spans(rows, cfg.micro_batch, cfg.micro_tokens, fast.share_prompts):
        idx, chunk = order[lo:hi], rows[lo:hi]
        lp = prompts.forward(chunk)[0] if prompts else response_logprobs(model, chunk, pad_id, cfg.device, fast)[0]
        for row, i in enumerate(idx):
            out[i] = lp[row, : len(samples[i].response_ids)].detach()
    return out  # type: ignore[return-value]


def fusable(model, cfg: TrainerConfig, critic: bool) -> bool:
    """Whether the first mini-batch's forwards (with grad) may also be its old-log-prob pass: ``fuse_old_logprobs``
    is on, the step is a plain one (no critic, no OPOB, the ``full`` splice treatment: the others change rows'
    masks and old log-probs after the old-log-prob pass) and nothing random runs in train mode (no dropout), so the
    forward before any optimizer step computes exactly what the no-grad pass would. ``update`` also fuses only a
    first mini-batch that is one micro-batch: the fused forwards are held until the step, so with several
    micro-batches every one's graph would be alive at once (16 rows at micro_batch 2: 221 MiB vs 31 MiB)."""
    if not cfg.fuse_old_logprobs or critic or cfg.opob or cfg.splice != "full":
        return False
    return not random_in_train(model)


def random_in_train(model) -> bool:
    """Whether the model's forwards in train mode are random (dropout, LoRA's included). Then the fused old
    log-probs would not be the no-grad pass's, and a prompt forwarded once for its rows (``SharedPrompts``) would
    give every row one dropout mask: the update forwards each row whole instead."""
    dropouts = [m.p for m in model.modules() if isinstance(m, torch.nn.Dropout)]
    return any(dropouts) or bool(getattr(getattr(model, "config", None), "attention_dropout", 0.0))


def first_forwards(model, samples: list[Sample], first: list[int], pad_id: int, cfg: TrainerConfig):
    """The old log-probs of every row, the forwards (with grad, per micro-batch of ``first`` in the order the
    update takes them) that the first mini-batch's step reuses — for its rows the old log-probs are those forwards'
    outputs, detached: the policy has not changed yet, so they are computed once instead of twice — and the seconds
    of the separate no-grad pass over the other rows."""
    t0 = time.perf_counter()
    old = old_logprobs(model, samples, pad_id, cfg, skip=frozenset(first))
    seconds = time.perf_counter() - t0
    model.train()
    fast = ForwardSwitches.of(cfg)
    prompts = SharedPrompts(model, [samples[i] for i in first], pad_id, cfg.device) if fast.share_prompts and first else None
    forwards = []
    rows = [samples[i] for i in first]
    for lo, hi in micro_spans(rows, cfg.micro_batch, cfg.micro_tokens, fast.share_prompts):
        chunk = rows[lo:hi]
        fwd = prompts.forward(chunk) if prompts else _response_forward(model, chunk, pad_id, cfg.device, fast=fast)
        forwards.append(fwd)
        for row, i in enumerate(first[lo:hi]):
            old[i] = fwd[0][row, : len(samples[i].response_ids)].detach()
    return forwards, old, seconds, prompts


def micro_order(samples: list[Sample], idx, share_prompts: bool) -> list[int]:
    """The order a mini-batch's rows are cut into micro-batches: by response length with shared prompts (their
    prompts are forwarded apart), else by whole length."""
    return by_response_length(samples, idx) if share_prompts else by_length(samples, idx)


def by_length(samples: list[Sample], idx) -> list[int]:
    """``idx`` ordered by sequence length, so that each micro-batch pads to a similar width: about 1.3x fewer
    padded tokens on the tiny compare's batches (``tasks.training.bench_update``). Per-row log-probs and the
    token-mean loss do not depend on which rows share a micro-batch (up to float rounding)."""
    return sorted(idx, key=lambda i: len(samples[i].prompt_ids) + len(samples[i].response_ids))
