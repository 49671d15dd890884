"""Benchmark: the rollout before and after continuous batching, as ratios measured in one run.

What: ``bench_rollout(model, prompts)`` rolls the same prompts out (same config, SAAR on with
its raw share, the synthetic task's bound inputs) with

* **before**: ``engine.batching=static`` + ``rollout.scheduling=rounds`` — every round
  generates all waiting turns in one padded ``generate`` (full logits kept) and waits for the
  longest one, then runs all tool calls;
* **after**: ``engine.batching=continuous`` + ``rollout.scheduling=continuous`` — finished rows
  leave the batch, a turn's tool call runs while others decode, the next turn joins with its
  cached prefix, only sampled log-probs are kept; tool calls rejoin in lockstep (``rollout.tool_lag_steps=1``:
  after the next decode step, waited for if need be, so the rollout does not depend on the sandbox's timing);
* **asap**: as *after*, but a call rejoins as soon as it is back (``tool_lag_steps=0``; never waits, and a
  rerun can differ at a near-tie token) — the price of lockstep is the wall time after / asap, and the
  seconds decoding stood still for a due call (``tool_wait_s``, the rollout stage's ``rollout/tool_wait_s``);

alternating the sides ``repeats`` times so load changes on a shared machine hit both. It
prints, per side, rollout wall time, useful tokens (tokens the engine returned: sampled for a
live row, not padding) per second, decode slots (row-tokens the engine decoded, padding after
a row finished included) and the padding share, and the ratios after/before. The two sides sample different tokens, so useful tokens/s is the
fair throughput figure; wall time is for the same prompts and samples.

Simplifies: one torch thread; the local sandbox (``backend``: ``docker`` for slower calls); the first repeat of each side warms up caches
and is reported but left out of the ratio when ``repeats`` > 1.
Run: ``cleaner bench-rollout --model assets/tiny-warm`` (or call ``bench_rollout``).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

SIDES = {"before": ("static", "rounds", 0), "asap": ("continuous", "continuous", 0),
         "after": ("continuous", "continuous", 1)}
"""Side → (engine.batching, rollout.scheduling, rollout.tool_lag_steps)."""


def _roll(side: str, model: str, items, n_samples: int, max_new_tokens: int, seed: int, box) -> dict:
    from transformers import AutoTokenizer

    from models.chat import ChatFormat
    from models.config import EngineConfig
    from models.engine import make_engine
    from tasks.rollout.config import RolloutConfig
    from tasks.rollout.machine import Rollout

    batching, scheduling, lag = SIDES[side]
    chat = ChatFormat(AutoTokenizer.from_pretrained(model))
    engine = make_engine(EngineConfig(batching=batching), model, chat.eos_id, chat.tokenizer.pad_token_id)
    cfg = RolloutConfig(n_samples=n_samples, max_turns=4, max_new_tokens=max_new_tokens,
                        max_response_tokens=4 * max_new_tokens, scheduling=scheduling, tool_lag_steps=lag)
    t0 = time.perf_counter()
    runner = Rollout(cfg, engine, chat, box)
    trajs = runner.run(items, seed, step=0, progress=False)
    wall = time.perf_counter() - t0
    useful, slots = engine.counters["generated"], engine.counters["decode_slots"]
    return {"wall_s": wall, "useful_tokens": useful, "useful_tokens_per_s": useful / wall, "decode_slots": slots,
            "padding_share": 1 - useful / max(slots, 1), "kept_tokens": sum(sum(t.response_mask) for t in trajs),
            "trajectories": len(trajs), "tool_wait_s": runner.tool_wait_s}


def bench_rollout(model: str | Path, prompts_path: str | Path | None = None, n_prompts: int = 32, n_samples: int = 8,
                  max_new_tokens: int = 128, repeats: int = 3, seed: int = 0, echo=print,
                  backend: str = "local") -> dict:
    """Roll out every side alternately ``repeats`` times; print and return the figures and ratios."""
    import torch

    from sandbox.base import make_sandbox
    from sandbox.config import SandboxConfig
    from tasks.data.loader import load_prompts

    torch.set_num_threads(1)
    if prompts_path is None:
        from tasks.data.synthetic import write_task_parquet

        prompts_path = write_task_parquet(Path("runs/bench-rollout/eval.parquet"), n_prompts, seed, "eval")
    items = list(load_prompts(str(prompts_path)))[:n_prompts]
    rows: dict[str, list[dict]] = {side: [] for side in SIDES}
    with make_sandbox(SandboxConfig(backend=backend, workers=2)) as box:
        for rep in range(repeats):
            for side in SIDES:
                r = _roll(side, str(model), items, n_samples, max_new_tokens, seed + rep, box)
                rows[side].append(r)
                echo(f"repeat {rep} {side:>6}: {r['wall_s']:.1f} s, {r['useful_tokens']} useful tokens "
                     f"({r['useful_tokens_per_s']:.0f}/s), {r['decode_slots']} decode slots "
                     f"({100 * r['padding_share']:.0f} % padding)")
    timed = {side: (r[1:] if repeats > 1 else r) for side, r in rows.items()}
    summary = {side: {k: statistics.mean(x[k] for x in rs) for k in rs[0]} for side, rs in timed.items()}
    summary["ratio_useful_tokens_per_s"] = (summary["after"]["useful_tokens_per_s"]
                                            / summary["before"]["useful_tokens_per_s"])
    summary["ratio_wall_time"] = summary["before"]["wall_s"] / summary["after"]["wall_s"]
    summary["ratio_lockstep_wall_time"] = summary["after"]["wall_s"] / summary["asap"]["wall_s"]
    summary["repeats"] = rows
    echo(f"after / before: useful tokens/s x{summary['ratio_useful_tokens_per_s']:.2f}, "
         f"rollout wall time x{summary['ratio_wall_time']:.2f} faster "
         f"({len(items)} prompts x {n_samples} samples, mean of {max(1, repeats - 1)} repeats after a warm-up)")
    echo(f"lockstep tool calls (after) / as soon as back (asap): rollout wall time x{summary['ratio_lockstep_wall_time']:.3f}; "
         f"decoding stood still for a due call {summary['after']['tool_wait_s']:.2f} s of {summary['after']['wall_s']:.1f} s "
         f"(rollout/tool_wait_s)")
    return summary
