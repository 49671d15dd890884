"""Benchmark: a rollout's useful tokens/s against the forward bound at the same batch widths, in one process.

What: ``bench_decode(model)`` rolls the synthetic task's held-out prompts out (the t4 regime's turn settings: 4
turns, 192 new tokens a turn, SAAR on, lockstep tool calls, the local sandbox) once per side, alternating sides
``repeats`` times, and records the shape of every decode step (rows, cache width). Then the **bound**: a bare loop
of the model's own decode forward (``models.lean_decode.decode_forward`` over the preallocated cache, a padding
mask as in the rollout) at exactly those shapes — no sampling, no admission, no prefill, no rows leaving, no tool
calls. A second bound, the **all-forwards bound**, adds the rollout's prefill forwards: the shape of every prefill
forward the rollout ran is recorded (rows × new tokens, cache width before it; ``record_prefills``) and a bare loop
of the model's own prefill forward (``models.lean_decode.prefill_forward`` over a cache of that width, a padding
mask) is timed at exactly those shapes; its time is the decode bound's plus that loop's. It prints, per side,

* useful tokens/s of the rollout (tokens the engine returned) and of the decode bound (row-tokens its forwards
  decoded),
* their ratio **rollout / decode bound**, from wall time and from this process's CPU time (the figure a loaded machine
  disturbs least; the local sandbox's workers are other processes and not in it),
* the ratio **rollout / all-forwards bound**: the all-forwards bound's seconds over the rollout's (the bare forwards
  that produce the rollout's useful tokens, decode and prefill, against the rollout producing them), wall and CPU,
* the seconds of the rollout's parts inside the engine (decode forwards, sampling, prefill, rows leaving), from
  ``DecodeStream.timing`` — so what the rollout spends beyond the bound is named,

and, when it rolls out more than one side (``sides``: ``base`` = the engine's defaults; any other name =
``SIDES``'s overrides on top), whether each sampled the same token ids and log-probs as the first; it exits 1 only
then, when a side sampled other token ids. ``SIDES`` holds ``base`` alone today: nothing is compared, and it exits 0
once the rollouts and bounds ran.

Simplifies: one torch thread; the first repeat warms up and is left out when ``repeats`` > 1; the bound is timed
once per repeat right after the rollouts. On an accelerator the bounds build their caches and inputs on the model's
device and synchronise it before each clock read (``synchronize``), so they time the kernels, not their launches. Run: ``python -m flows.bench_decode [n_prompts] [samples] [repeats]
[--compile]``; ``--compile`` then times the decode bound's loop at the last rollout's shapes with the eager and a
``torch.compile``d decode forward (``compile_gain``: is the step Python or arithmetic, and would compiling pay).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

SIDES: dict[str, dict] = {"base": {}}
"""Side → ``EngineConfig`` overrides on top of the defaults (``base``: the defaults)."""


def _roll(model: str, items, n_samples: int, seed: int, box, overrides: dict) -> dict:
    from transformers import AutoTokenizer

    from models.chat import ChatFormat
    from models.config import EngineConfig
    from models.engine import make_engine
    from tasks.rollout.config import RolloutConfig
    from tasks.rollout.machine import Rollout

    chat = ChatFormat(AutoTokenizer.from_pretrained(model))
    engine = make_engine(EngineConfig(**overrides), model, chat.eos_id, chat.tokenizer.pad_token_id)
    streams, plain = [], engine.stream

    def stream(*args, **kwargs):
        s = record_prefills(plain(*args, **kwargs))
        s.shapes, s.timing = [], {}
        streams.append(s)
        return s

    engine.stream = stream
    cfg = RolloutConfig(n_samples=n_samples, max_turns=4, max_new_tokens=192, max_response_tokens=512)
    w0, c0 = time.perf_counter(), time.process_time()
    trajs = Rollout(cfg, engine, chat, box).run(items, seed, step=0, progress=False)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    timing: dict[str, float] = {}
    for s in streams:
        for k, v in s.timing.items():
            timing[k] = timing.get(k, 0.0) + v
    return {"wall_s": wall, "cpu_s": cpu, "useful": engine.counters["generated"], "timing": timing,
            "shapes": [x for s in streams for x in s.shapes], "model": engine.model,
            "prefills": [x for s in streams for x in s.prefills],
            "stats": {k: sum(s.stats[k] for s in streams) for k in streams[0].stats} if streams else {},
            "ids": [(t.traj_id, list(t.response_ids), list(t.logprobs)) for t in trajs]}


def record_prefills(stream):
    """``stream`` (a ``DecodeStream``) appends (rows, new tokens, cache width, fed tokens) of every prefill forward it
    runs to ``stream.prefills``: rows × new tokens is the forward's left-padded input, fed tokens its unpadded ones."""
    stream.prefills = []
    plain = stream._prefill_rows

    def prefill_rows(joiners):
        news = [len(req.input_ids) - c for req, c in joiners]
        stream.prefills.append((len(joiners), max(news), max(c for _, c in joiners), sum(news)))
        return plain(joiners)

    stream._prefill_rows = prefill_rows
    return stream


def synchronize(device) -> None:
    """Wait for ``device``'s queued kernels (nothing on the CPU and the ``meta`` device): a clock read after it
    times the work, not its launch."""
    import torch

    if device.type not in ("cpu", "meta"):
        torch.accelerator.synchronize(device)


def prefill_bound(model, prefills: list[tuple[int, int, int, int]], forward=None) -> dict:
    """Seconds (wall, CPU) of a bare loop of prefill forwards at ``prefills``' (rows, new tokens, cache width);
    ``forward``: the prefill forward to time (default ``models.lean_decode.prefill_forward``)."""
    import torch
    from transformers import DynamicCache

    from models.decode import gqa_decode_attention
    from models.lean_decode import prefill_forward

    forward = forward or prefill_forward
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    rows, width = max((p[0] for p in prefills), default=1), max((p[2] for p in prefills), default=0)
    device = next(model.parameters()).device
    block = torch.randn(rows, cfg.num_key_value_heads, width, head_dim).to(device)
    gen = torch.Generator().manual_seed(1)
    caches = [DynamicCache([(block[:n, :, :w], block[:n, :, :w])] * cfg.num_hidden_layers) if w else DynamicCache()
              for n, _, w, _ in prefills]
    inputs = []
    for n, s, w, _ in prefills:
        attn = torch.ones((n, w + s), dtype=torch.long)
        attn[0, 0] = 0 if w + s > 1 else 1  # a padding column, as a left-padded prefill almost always has
        inputs.append((torch.randint(3, cfg.vocab_size, (n, s), generator=gen).to(device),
                       torch.arange(w, w + s).expand(n, s).to(device), attn.to(device)))
    synchronize(device)
    w0, c0 = time.perf_counter(), time.process_time()
    with torch.no_grad():
        for (ids, pos, attn), cache in zip(inputs, caches):
            logits = forward(model, ids, pos, attn, cache, gqa_decode_attention)
            logits[:, -1].log_softmax(-1)
    synchronize(device)
    return {"wall_s": time.perf_counter() - w0, "cpu_s": time.process_time() - c0, "forwards": len(prefills),
            "tokens": sum(n * s for n, s, _, _ in prefills)}


def _filled_cache(model, rows: int, width: int, generator=None):
    """A ``SlotKV`` of ``rows`` rows on the model's device whose every layer holds one random block of ``width``
    cached positions (drawn on the CPU, so a seeded ``generator`` gives the same block on every device)."""
    import torch

    from models.kv_cache import SlotKV

    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv = SlotKV(rows, capacity=2 * width + 4)
    device = next(model.parameters()).device
    block = torch.randn(rows, cfg.num_key_value_heads, width, head_dim, generator=generator).to(device)
    kv.merge([block] * cfg.num_hidden_layers, [block] * cfg.num_hidden_layers)
    return kv


def bound(model, shapes: list[tuple[int, int]], forward=None) -> dict:
    """Seconds (wall, CPU) of a bare loop of decode forwards at ``shapes`` (rows, cache width), and its row-tokens;
    ``forward``: the decode forward to time (default ``models.lean_decode.decode_forward``)."""
    import torch

    from models.decode import gqa_decode_attention
    from models.lean_decode import decode_forward

    forward = forward or decode_forward
    cfg = model.config
    kv = _filled_cache(model, max(n for n, _ in shapes), max(w for _, w in shapes))
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(0)
    inputs = []
    for n, w in shapes:
        attn = torch.ones((n, w + 1), dtype=torch.long)
        attn[0, 0] = 0 if w else 1  # a padding column, as a continuous batch almost always has
        inputs.append((torch.randint(3, cfg.vocab_size, (n, 1), generator=gen).to(device),
                       torch.full((n, 1), w, device=device), attn.to(device)))
    synchronize(device)
    w0, c0 = time.perf_counter(), time.process_time()
    with torch.no_grad():
        for (n, w), (ids, pos, attn) in zip(shapes, inputs):
            kv.rows, kv.lo = n, kv.hi - w
            logits = forward(model, ids, pos, attn, kv.lean_cache(), gqa_decode_attention)
            logits[:, -1].log_softmax(-1)
    synchronize(device)
    return {"wall_s": time.perf_counter() - w0, "cpu_s": time.process_time() - c0,
            "tokens": sum(n for n, _ in shapes)}


def compile_gain(model, shapes: list[tuple[int, int]], repeats: int = 2, backend: str = "inductor",
                 echo=print) -> dict:
    """Whether ``torch.compile`` pays for the decode forward: the decode bound's loop at ``shapes`` with the eager
    forward and with ``torch.compile(decode_forward, dynamic=True, backend=backend)``, alternating ``repeats``
    times after one compiling pass; CPU seconds of each, of the compile, and the largest logit difference of one
    step (the compiled kernels fuse and reorder, so not bit for bit)."""
    import torch

    from models.decode import gqa_decode_attention
    from models.lean_decode import decode_forward

    torch._dynamo.reset()
    compiled = torch.compile(decode_forward, dynamic=True, backend=backend)
    first = bound(model, shapes, compiled)
    eager_s, compiled_s = [], []
    for _ in range(repeats):
        eager_s.append(bound(model, shapes)["cpu_s"])
        compiled_s.append(bound(model, shapes, compiled)["cpu_s"])
    cfg, (n, w), device = model.config, shapes[0], next(model.parameters()).device
    ids = (torch.arange(3, 3 + n)[:, None] % cfg.vocab_size).to(device)
    pos, attn = torch.full((n, 1), w, device=device), torch.ones((n, w + 1), device=device)
    logits = [fwd(model, ids, pos, attn, _filled_cache(model, n, w, torch.Generator().manual_seed(2)).lean_cache(),
                  gqa_decode_attention) for fwd in (decode_forward, compiled)]
    out = {"eager_cpu_s": statistics.mean(eager_s), "compiled_cpu_s": statistics.mean(compiled_s),
           "compile_cpu_s": first["cpu_s"] - statistics.mean(compiled_s),
           "logit_diff": float((logits[0] - logits[1]).abs().max())}
    out["gain"] = out["eager_cpu_s"] / out["compiled_cpu_s"]
    out["break_even_forwards"] = (out["compile_cpu_s"] / max(out["eager_cpu_s"] - out["compiled_cpu_s"], 1e-9)
                                  * len(shapes))
    echo(f"torch.compile ({backend}) of the decode forward at {len(shapes)} shapes: eager {out['eager_cpu_s']:.2f} s "
         f"cpu, compiled {out['compiled_cpu_s']:.2f} s cpu (x{out['gain']:.2f}, mean of {repeats}); compiling "
         f"{out['compile_cpu_s']:.1f} s cpu, repaid after ~{out['break_even_forwards']:.0f} forwards; largest "
         f"logit difference {out['logit_diff']:.1e}")
    return out


def _differs(a: list, b: list) -> str:
    if [x[:2] for x in a] != [x[:2] for x in b]:
        return "token ids DIFFER"
    lp = max((abs(p - q) for x, y in zip(a, b) for p, q in zip(x[2], y[2])), default=0.0)
    return "same ids and log-probs bit for bit" if lp == 0 else f"same ids, log-probs within {lp:.1e}"


def bench_decode(model: str = "assets/tiny-warm", n_prompts: int = 16, samples: int = 8, repeats: int = 3,
                 sides: tuple[str, ...] = tuple(SIDES), echo=print) -> dict:
    """Alternate the sides ``repeats`` times; print and return per side the rollout / bound ratios and parts."""
    import torch

    from sandbox.base import make_sandbox
    from sandbox.config import SandboxConfig
    from tasks.data.loader import load_prompts
    from tasks.data.synthetic import write_task_parquet

    torch.set_num_threads(1)
    items = list(load_prompts(str(write_task_parquet(Path("runs/bench-decode/eval.parquet"), n_prompts, 0, "eval"))))
    rows: dict[str, list[dict]] = {side: [] for side in sides}
    same: dict[str, str] = {}
    with make_sandbox(SandboxConfig(backend="local", workers=2)) as box:
        for rep in range(repeats):
            for side in sides:
                r = _roll(model, items, samples, rep, box, SIDES[side])
                m = r.pop("model")
                b, p = bound(m, r["shapes"]), prefill_bound(m, r["prefills"])
                r.update(bound_wall_s=b["wall_s"], bound_cpu_s=b["cpu_s"], bound_tokens=b["tokens"],
                         prefill_wall_s=p["wall_s"], prefill_cpu_s=p["cpu_s"],
                         ratio_wall=(r["useful"] / r["wall_s"]) / (b["tokens"] / b["wall_s"]),
                         ratio_cpu=(r["useful"] / r["cpu_s"]) / (b["tokens"] / b["cpu_s"]),
                         all_ratio_wall=(b["wall_s"] + p["wall_s"]) / r["wall_s"],
                         all_ratio_cpu=(b["cpu_s"] + p["cpu_s"]) / r["cpu_s"])
                rows[side].append(r)
                if side != sides[0]:
                    same[side] = _differs(rows[sides[0]][rep]["ids"], r["ids"])
                echo(f"repeat {rep} {side:>10}: rollout {r['wall_s']:.2f} s wall, {r['cpu_s']:.2f} s cpu, "
                     f"{r['useful']} useful tokens; bound {b['wall_s']:.2f} s wall, {b['cpu_s']:.2f} s cpu for "
                     f"{b['tokens']} row-tokens in {len(r['shapes'])} forwards; rollout / bound: "
                     f"wall x{r['ratio_wall']:.2f}, cpu x{r['ratio_cpu']:.2f}; prefill bound {p['wall_s']:.2f} s "
                     f"wall, {p['cpu_s']:.2f} s cpu for {p['tokens']} row-tokens in {p['forwards']} forwards; "
                     f"rollout / all-forwards bound: wall x{r['all_ratio_wall']:.2f}, cpu x{r['all_ratio_cpu']:.2f}; "
                     + ", ".join(f"{k} {v:.2f} s" for k, v in sorted(r["timing"].items())))
    out: dict = {"sides": {}, "same": same}
    for side, rs in rows.items():
        kept = rs[1:] if repeats > 1 else rs
        mean = {k: statistics.mean(r[k] for r in kept) for k in ("wall_s", "cpu_s", "bound_wall_s", "bound_cpu_s",
                                                                  "ratio_wall", "ratio_cpu", "useful", "prefill_wall_s",
                                                                  "prefill_cpu_s", "all_ratio_wall",
                                                                  "all_ratio_cpu")}
        mean["timing"] = {k: statistics.mean(r["timing"].get(k, 0.0) for r in kept) for k in kept[0]["timing"]}
        out["sides"][side] = mean
        echo(f"{side}: useful tokens/s of the rollout / the forward bound at its widths: cpu x{mean['ratio_cpu']:.2f}, "
             f"wall x{mean['ratio_wall']:.2f}; rollout / the all-forwards bound (decode and prefill forwards): "
             f"cpu x{mean['all_ratio_cpu']:.2f}, wall x{mean['all_ratio_wall']:.2f} "
             f"(mean of {len(kept)}; {n_prompts} prompts x {samples} samples)"
             + (f"; vs {sides[0]}: {same[side]}" if side in same else ""))
    out["runs"] = rows
    out["ok"] = not any("DIFFER" in s for s in same.values())
    return out


if __name__ == "__main__":
    from models.termination import install

    install()  # SIGTERM ends it as Ctrl-C does, also when swallowed in a finaliser
    args = [int(a) for a in sys.argv[1:] if a != "--compile"][:3]
    result = bench_decode("assets/tiny-warm", *args)
    if "--compile" in sys.argv:
        from transformers import AutoModelForCausalLM

        compile_gain(AutoModelForCausalLM.from_pretrained("assets/tiny-warm").eval(),
                     result["runs"]["base"][-1]["shapes"])
    sys.exit(0 if result["ok"] else 1)
