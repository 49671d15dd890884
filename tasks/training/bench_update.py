"""Benchmark: the policy update with micro-batches in arrival order vs ordered by length, as ratios in one run.

What: ``bench_update(model, trajectories)`` runs ``models.trainer.update`` on the same samples
twice per repeat, alternating

* **before**: micro-batches in the order the rows arrive (shuffled mini-batches, as before);
* **after**: rows ordered by length inside each mini-batch and in the old-log-prob pass
  (``models.old_logprobs.by_length``), so each micro-batch pads to a similar width;

and prints, per side, the update's wall time and the padded tokens its forwards process, the
ratios after/before, and the largest difference of the update's metrics between the sides (the
same update up to float rounding). Samples come from a run's ``trajectories.parquet`` (a step
folder of ``cleaner train``) or, without one, from seeded random lengths like the tiny compare's.

Simplifies: one torch thread; advantages are seeded random (the cost does not depend on them); the
first repeat warms up and is left out of the ratio when ``repeats`` > 1.
Run: ``python -m tasks.training.bench_update [assets/tiny-warm] [runs/<run>/steps/000001/trajectories.parquet]``.
"""

from __future__ import annotations

import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from models.config import TrainerConfig
from models.trainer import Sample


def load_samples(trajectories: Path | None, n: int = 128, seed: int = 0) -> list[Sample]:
    rng = random.Random(seed)
    if trajectories is not None:
        import polars as pl

        df = pl.read_parquet(trajectories, columns=["prompt_ids", "response_ids", "response_mask"])
        rows = list(df.iter_rows())
    else:
        rows = []
        for _ in range(n):
            r = rng.choice([rng.randint(15, 60)] * 3 + [rng.randint(60, 220)])
            rows.append(([5] * rng.randint(80, 110), [7] * r, [1] * r))
    return [Sample(list(p), list(r), list(m), rng.uniform(-1, 1)) for p, r, m in rows]


def padded_tokens(samples: list[Sample], order: list[int], micro: int) -> int:
    lens = [len(samples[i].prompt_ids) + len(samples[i].response_ids) for i in order]
    return sum(len(lens[lo : lo + micro]) * max(lens[lo : lo + micro]) for lo in range(0, len(lens), micro))


def _run(side: str, model: Path, samples: list[Sample], cfg: TrainerConfig, out: Path) -> tuple[float, dict]:
    from models import trainer

    sorted_by_length = trainer.by_length
    if side == "before":
        trainer.by_length = lambda _samples, idx: list(idx)
    try:
        t0 = time.perf_counter()
        metrics = trainer.update(model, samples, cfg, out / side, pad_id=0, seed=0)
        return time.perf_counter() - t0, metrics
    finally:
        trainer.by_length = sorted_by_length


def bench_update(model: Path, trajectories: Path | None = None, repeats: int = 2) -> dict:
    import torch

    from models.old_logprobs import by_length

    torch.set_num_threads(1)
    samples = load_samples(trajectories)
    cfg = TrainerConfig(lr=2e-4, mini_batches=2)
    rng = random.Random(0)
    order = list(range(len(samples)))
    rng.shuffle(order)
    half = (len(order) + 1) // 2
    pads = {"before": sum(padded_tokens(samples, mb, cfg.micro_batch) for mb in (order[:half], order[half:])),
            "after": sum(padded_tokens(samples, by_length(samples, mb), cfg.micro_batch)
                         for mb in (order[:half], order[half:]))}
    useful = sum(len(s.prompt_ids) + len(s.response_ids) for s in samples)
    walls: dict[str, list[float]] = {"before": [], "after": []}
    metrics: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(repeats):
            for side in ("before", "after"):
                wall, metrics[side] = _run(side, model, samples, cfg, Path(tmp))
                walls[side].append(wall)
                print(f"repeat {rep} {side}: update {wall:.2f} s, padded tokens per pass {pads[side]} "
                      f"(useful {useful})")
    kept = slice(1, None) if repeats > 1 else slice(None)
    wall = {side: statistics.mean(walls[side][kept]) for side in walls}
    diff = max(abs(metrics["before"][k] - metrics["after"][k]) for k in metrics["before"])
    out = {"wall_ratio": wall["before"] / wall["after"], "padded_ratio": pads["before"] / pads["after"],
           "max_metric_diff": diff, "samples": len(samples)}
    print(f"{len(samples)} samples: update wall time x{out['wall_ratio']:.2f} faster, padded tokens "
          f"x{out['padded_ratio']:.2f} fewer; largest metric difference {diff:.2e}")
    return out


if __name__ == "__main__":
    from models.termination import install

    install()  # SIGTERM ends it as Ctrl-C does, also when swallowed in a finaliser
    args = sys.argv[1:]
    bench_update(Path(args[0]) if args else Path("assets/tiny-warm"), Path(args[1]) if len(args) > 1 else None)
