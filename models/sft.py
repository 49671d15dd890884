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
them from the corpus file (``tasks.data.synthetic.read_sft_corpus``) — so this module knows no task.

With ``WarmupConfig.lora`` only a LoRA adapter trains on a frozen base (SmolLM2's cold start: a
135M model on 2 CPU cores) and the result is an adapter folder. With ``checkpoint_every`` the
loop saves a resumable state (trainable weights, optimizer, counters, loss curve) and a rerun
continues from it; ``on_log`` receives the loss every ``log_every`` steps (the flow sends it to
MLflow). The loss is computed with the LM head applied only to the label positions.

Simplifies: single process, float32, no gradient accumulation. Run:
``warmup(Path("tiny"), read_sft_corpus(Path("sft.jsonl")), WarmupConfig(), Path("tiny-warm"))``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import shutil
import time
from pathlib import Path

from models.config import ChatConfig, WarmupConfig

IGNORE = -100
POOL_BATCHES = 32
log = logging.getLogger(__name__)


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


def length_census(transcripts: list[list[dict]], chat, max_len: int, kinds: list[str] | None = None) -> dict:
    """Per kind of transcript (``kinds[i]`` names transcript ``i``; one kind ``all`` without them):
    ``{"n": count, "too_long": count longer than max_len, "longest": tokens}``, built as training builds them."""
    from models.chat import build_sft_example

    if kinds is not None and len(kinds) != len(transcripts):
        raise ValueError(f"warmup: {len(kinds)} kinds for {len(transcripts)} transcripts")
    build = getattr(chat, "sft_example", None) or (lambda messages: build_sft_example(chat, messages))
    out: dict[str, dict] = {}
    for i, messages in enumerate(transcripts):
        n = len(build(messages)[0])
        row = out.setdefault(kinds[i] if kinds else "all", {"n": 0, "too_long": 0, "longest": 0})
        row["n"] += 1
        row["too_long"] += n > max_len
        row["longest"] = max(row["longest"], n)
    return out


def check_lengths(census: dict, max_len: int) -> None:
    """Say how many transcripts of each kind the warm-up will skip as longer than ``max_len`` (a warning),
    and refuse (``ValueError``) when a kind would be skipped whole: the model would never see it."""
    for kind, row in census.items():
        if row["too_long"]:
            log.warning("warmup: %d of %d %r transcripts are longer than max_len %d tokens (longest %d) and are "
                        "skipped", row["too_long"], row["n"], kind, max_len, row["longest"])
    lost = [f"{k} ({r['n']}, shortest > {max_len})" for k, r in census.items() if r["n"] and r["too_long"] == r["n"]]
    if lost:
        raise ValueError(f"warmup: every transcript of kind {', '.join(lost)} is longer than max_len {max_len} "
                         "tokens: the model would never see that kind; shorten them or raise warmup.max_len")


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


def sft_loss(model, input_ids, attention, labels):
    """Mean cross-entropy over the label tokens, equal to ``model(..., labels=labels).loss``.

    The LM head (vocab-wide, a fifth of a 135M model's compute) is applied only where a label is, when
    the model exposes its body and head (``model.model``, ``model.lm_head``: Llama, Qwen2); else the
    model's own loss."""
    import torch.nn.functional as F

    core = model.get_base_model() if hasattr(model, "get_base_model") else model
    body, head = getattr(core, "model", None), getattr(core, "lm_head", None)
    if body is None or head is None:
        return model(input_ids=input_ids, attention_mask=attention, labels=labels).loss
    hidden = body(input_ids=input_ids, attention_mask=attention).last_hidden_state
    target = labels[:, 1:]
    keep = target != IGNORE
    return F.cross_entropy(head(hidden[:, :-1][keep]).float(), target[keep])


def save_state(state_dir: Path, model, opt, state: dict) -> None:
    """A resumable warm-up state: the trainable weights, the optimizer, the loop's counters (atomic)."""
    import torch
    from safetensors.torch import save_file

    state_dir = Path(state_dir)
    tmp = state_dir.with_name(f".{state_dir.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file({k: p.detach().contiguous() for k, p in model.named_parameters() if p.requires_grad},
              str(tmp / "trainable.safetensors"))
    torch.save(opt.state_dict(), tmp / "optimizer.pt")
    (tmp / "state.json").write_text(json.dumps(state))
    shutil.rmtree(state_dir, ignore_errors=True)
    tmp.rename(state_dir)


def load_state(state_dir: Path, model, opt) -> dict | None:
    """Restore a state written by ``save_state`` into ``model`` and ``opt``; None when there is none."""
    import torch
    from safetensors.torch import load_file

    if not (Path(state_dir) / "state.json").is_file():
        return None
    weights = load_file(str(Path(state_dir) / "trainable.safetensors"))
    names = {k for k, p in model.named_parameters() if p.requires_grad}
    if set(weights) != names:
        raise ValueError(f"warm-up state {state_dir} does not fit the model being trained (other trainable "
                         f"weights: {sorted(set(weights) ^ names)[:3]}); delete it to start over")
    model.load_state_dict(weights, strict=False)
    opt.load_state_dict(torch.load(Path(state_dir) / "optimizer.pt", weights_only=True))
    return json.loads((Path(state_dir) / "state.json").read_text())


def train_loop(model, chat, transcripts, cfg: WarmupConfig, state_dir: Path | None = None, on_log=None) -> dict:
    """SFT ``model`` in place on ``transcripts``; returns the result dict of ``warmup``.

    With ``state_dir`` and ``cfg.checkpoint_every``, a resumable state is saved there and a run that finds
    one continues from it (same data order, lr schedule and loss curve). ``on_log(step, metrics)`` gets
    ``warmup/loss`` (mean of the last ``log_every`` steps), ``warmup/lr`` and ``warmup/tokens``."""
    import torch
    from tqdm import tqdm

    pad = chat.tokenizer.pad_token_id if chat.tokenizer.pad_token_id is not None else chat.eos_id
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95))
    st = (load_state(state_dir, model, opt) if state_dir else None) or {
        "step": 0, "elapsed": 0.0, "tokens": 0, "skipped": 0, "losses": [], "curve": []}
    skipped = [0]
    stream = batches(transcripts, chat, cfg, skipped)
    for _ in range(st["step"]):
        next(stream)
    skipped[0] = st["skipped"]
    start = time.monotonic() - st["elapsed"]
    model.train()
    bar = tqdm(total=cfg.max_steps, initial=st["step"], desc="warm-up", unit="step")
    while st["step"] < cfg.max_steps:
        elapsed = time.monotonic() - start
        if cfg.time_budget_s is not None and elapsed >= cfg.time_budget_s:
            break
        progress = max(st["step"] / cfg.max_steps, elapsed / cfg.time_budget_s if cfg.time_budget_s else 0.0)
        lr = lr_at(st["step"], progress, cfg)
        for group in opt.param_groups:
            group["lr"] = lr
        input_ids, attention, labels = collate(next(stream), pad)
        loss = sft_loss(model, input_ids, attention, labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        opt.step()
        st["losses"].append(round(loss.item(), 5))
        st["tokens"] += int(attention.sum())
        st["step"] += 1
        _after_step(st, cfg, lr, bar, on_log)
        if state_dir and cfg.checkpoint_every and st["step"] % cfg.checkpoint_every == 0:
            save_state(state_dir, model, opt, {**st, "elapsed": time.monotonic() - start, "skipped": skipped[0]})
    bar.close()
    tail = st["losses"][-cfg.log_every:] or [float("nan")]
    return {"final_loss": round(sum(tail) / len(tail), 4), "steps": st["step"],
            "seconds": round(time.monotonic() - start, 1), "tokens": st["tokens"], "skipped_too_long": skipped[0],
            "loss_curve": st["curve"]}


def _after_step(st: dict, cfg: WarmupConfig, lr: float, bar, on_log) -> None:
    recent = st["losses"][-cfg.log_every:]
    if st["step"] % cfg.log_every == 0:
        mean = round(sum(recent) / len(recent), 4)
        st["curve"].append((st["step"], mean, round(lr, 6)))
        if on_log is not None:
            on_log(st["step"], {"warmup/loss": mean, "warmup/lr": lr, "warmup/tokens": st["tokens"]})
    bar.set_postfix(loss=f"{sum(recent[-20:]) / len(recent[-20:]):.3f}", lr=f"{lr:.1e}")
    bar.update(1)


def warmup(model_dir: Path, transcripts: list[list[dict]], cfg: WarmupConfig, out_dir: Path,
           chat_cfg: ChatConfig | None = None, state_dir: Path | None = None, on_log=None,
           kinds: list[str] | None = None) -> dict:
    """Fine-tune ``model_dir`` on ``transcripts`` (each a list of chat messages); save to ``out_dir``.

    With ``cfg.lora`` the base stays frozen and ``out_dir`` is a LoRA adapter folder (``models.lora``)
    pointing at ``model_dir``; otherwise every weight trains and ``out_dir`` is a full model. Transcripts
    are framed by ``chat_cfg`` (system prompt, few-shot turns) as rollouts will be. ``state_dir`` and
    ``on_log``: see ``train_loop``. Returns ``final_loss`` (mean of the last ``log_every`` steps),
    ``steps``, ``seconds``, ``tokens``, ``skipped_too_long``, ``lengths`` (``length_census`` per kind,
    ``kinds[i]`` naming transcript ``i``) and ``loss_curve`` ([step, mean loss, lr]). Before training, the
    transcripts longer than ``cfg.max_len`` are counted per kind and warned about; a kind with none that
    fits is an error (``check_lengths``).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from models.chat import ChatFormat

    if not transcripts:
        raise ValueError("warmup: no transcripts to train on")
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    chat_cfg = chat_cfg or ChatConfig()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    chat = ChatFormat(tokenizer, chat_cfg.system_prompt, fewshot=chat_cfg.fewshot)
    census = length_census(transcripts, chat, cfg.max_len, kinds)
    check_lengths(census, cfg.max_len)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if cfg.lora is not None:
        from models.lora import add_lora

        model = add_lora(model, cfg.lora)
    result = train_loop(model, chat, transcripts, cfg, state_dir, on_log)
    result["lengths"] = census
    model.eval()
    save_atomic(model, tokenizer, out_dir)
    return result


def write_adapter_card(out_dir: Path, cfg: WarmupConfig, chat_cfg: ChatConfig, result: dict) -> Path:
    """``MODEL_CARD.md`` of a LoRA warm-up's adapter folder: what it is, how to load it, how it was trained."""
    conf = json.loads((Path(out_dir) / "adapter_config.json").read_text())
    lora = cfg.lora
    curve = "\n".join(f"| {s} | {loss:.4f} | {lr:.2e} |" for s, loss, lr in result.get("loss_curve", []))
    text = f"""# {Path(out_dir).name} — a cold-start LoRA adapter for tool use

A LoRA adapter (rank {lora.r}, alpha {lora.alpha:g}, on {", ".join(lora.target_modules)}) on the frozen base
`{conf["base_model_name_or_path"]}`, trained by SFT on the project's synthetic tool-use transcripts (loss on
the assistant turns only) so that the base calls the Python tool with hermes
`<tool_call>{{"name": "code_interpreter", "arguments": {{"code": "..."}}}}</tool_call>` calls before RL.

Load: `PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), "{Path(out_dir).name}")`, or
`AutoModelForCausalLM.from_pretrained("{Path(out_dir).name}")` when the base path above exists, or
`models.lora.load_policy`; the tokenizer is the base's. Weights are stored in float16 (`models.lora.compact_adapter`)
and load into the float32 base. Prompts must be framed as in training: the system prompt below, then the task.

## Training

- transcripts: {result.get("transcripts", "?")} in the corpus (`{result.get("corpus", "?")}`); {result["steps"]} optimizer
  steps of batch {cfg.batch_size} ({result["tokens"]} tokens incl. prompts), {result["skipped_too_long"]} skipped as
  longer than {cfg.max_len} tokens
- AdamW lr {cfg.lr:g} (warm-up {cfg.warmup_steps} steps, cosine to {cfg.min_lr:g} after {cfg.decay_start:.0%} of the
  run), weight decay {cfg.weight_decay:g}, grad clip {cfg.grad_clip:g}, seed {cfg.seed}, {cfg.threads} torch thread(s)
- wall time {result["seconds"]:.0f} s (budget {cfg.time_budget_s}); load average {result.get("load_start", 0):.1f} at the
  start, {result.get("load_end", 0):.1f} at the end (a shared 2-core machine)
- final loss (mean of the last {cfg.log_every} steps): {result["final_loss"]}

| step | loss | lr |
| --- | --- | --- |
{curve}

## System prompt

```
{chat_cfg.system_prompt or "(the chat template's default)"}
```

<!-- gate -->
(the warm-up gate writes its figures here)
<!-- /gate -->
"""
    path = Path(out_dir) / "MODEL_CARD.md"
    path.write_text(text)
    return path
