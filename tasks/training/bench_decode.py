"""Benchmark: continuous decoding with transformers' ``sdpa`` attention vs ``decode_gqa``, as ratios in one run.

What: ``bench_decode(model)`` decodes the same 64 seeded prompts (100–200 ids, up to 60 new ids each, one
``DecodeStream``, prefixes kept) with the model's attention set to

* **before**: ``sdpa`` — every one-token step copies each layer's key/value cache once per query head
  (``repeat_kv``);
* **after**: ``decode_gqa`` (``models.decode.gqa_decode_attention``) — the query heads of a key/value head
  attend as queries of one SDPA call over the uncopied cache;

alternating ``repeats`` times, and prints per side the wall and CPU (process) time, the ratios
before/after (CPU time is the figure a loaded machine disturbs least), how many rows sampled the same
tokens on both sides and the largest log-prob difference among them (float rounding only).

Simplifies: random prompt ids (the cost depends on lengths, not content); one torch thread.
Run: ``python -m tasks.training.bench_decode [assets/tiny-warm]``.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path


def _decode(model, attention: str, n_rows: int = 64, new: int = 60) -> tuple[float, float, dict]:
    from models.decode import DecodeStream

    stream = DecodeStream(model, 2, 0, 1.0, 1.0, 64, 0, True)  # switches sdpa to decode_gqa
    model.config._attn_implementation = attention
    rng = random.Random(0)
    for i in range(n_rows):
        stream.submit(i, [rng.randrange(3, 1000) for _ in range(rng.randrange(100, 200))], new)
    outs: dict = {}
    t0, c0 = time.perf_counter(), time.process_time()
    while stream.busy:
        for key, ids, lps, _ in stream.step():
            outs[key] = (ids, lps)
    return time.perf_counter() - t0, time.process_time() - c0, outs


def bench_decode(model_dir: Path, repeats: int = 4) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    totals = {"sdpa": [0.0, 0.0], "decode_gqa": [0.0, 0.0]}
    same, diff = 0, 0.0
    for rep in range(repeats):
        outs = {}
        for side in ("sdpa", "decode_gqa") if rep % 2 == 0 else ("decode_gqa", "sdpa"):
            wall, cpu, outs[side] = _decode(model, side)
            totals[side][0] += wall
            totals[side][1] += cpu
            print(f"repeat {rep} {side}: wall {wall:.2f} s, cpu {cpu:.2f} s")
        a, b = outs["sdpa"], outs["decode_gqa"]
        equal = [k for k in a if a[k][0] == b[k][0]]
        same += len(equal)
        diff = max([diff] + [abs(x - y) for k in equal for x, y in zip(a[k][1], b[k][1])])
    out = {"wall_ratio": totals["sdpa"][0] / totals["decode_gqa"][0],
           "cpu_ratio": totals["sdpa"][1] / totals["decode_gqa"][1], "same_rows": same / repeats,
           "max_logprob_diff": diff}
    print(f"decode_gqa vs sdpa over {repeats} repeats: wall x{out['wall_ratio']:.2f}, cpu x{out['cpu_ratio']:.2f} "
          f"faster; rows with the same tokens {out['same_rows']:.0f}/64; largest log-prob difference {diff:.1e}")
    return out


if __name__ == "__main__":
    from models.termination import install

    install()  # SIGTERM ends it as Ctrl-C does, also when swallowed in a finaliser
    bench_decode(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("assets/tiny-warm"))
