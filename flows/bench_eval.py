"""Benchmark: an evaluation's two modes as two separate passes vs one paired pass, as ratios measured in one run.

What: ``bench_eval(model, n_prompts, samples)`` evaluates the same held-out prompts (synthetic ``eval`` split, the
tiny config, local sandbox) with SAAR off and on, alternating ``repeats`` times

* **separate**: ``evaluate_mode`` per mode (two rollouts; the evaluation until ``eval.shared_pass``);
* **paired**: ``evaluate_pair`` (``tasks.rollout.paired``: one SAAR-on rollout forking each trajectory's SAAR-off
  twin at its first failed call);

and prints, per side, wall time, this process's CPU seconds, tokens the engine generated and tool calls run, the
ratios separate / paired, and whether every metric of both modes is equal (it must be: exits 1 otherwise).
Tokens and calls do not depend on the machine's load; wall and CPU do (the local sandbox's workers are other
processes: their CPU is not in this process's figure).

Simplifies: one torch thread; the first repeat warms up (model, sandbox) and is left out of the ratio when
``repeats`` > 1. Run: ``python -m flows.bench_eval [n_prompts] [samples] [repeats]``.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path


def _side(side: str, model: str, items, setup) -> tuple[dict, dict]:
    from tasks.training import evaluation, live

    engine = live.get_engine(setup.engine.model_copy(update={"temperature": setup.eval.temperature}), model,
                             live.get_chat(model, setup.chat))
    box = live.get_sandbox(setup.sandbox)
    run, calls = box.run, []
    box.run = lambda *a, **k: calls.append(1) or run(*a, **k)  # the continuous driver's one call at a time
    before = engine.counters["generated"]
    w0, c0 = time.perf_counter(), time.process_time()
    try:
        if side == "paired":
            result = evaluation.evaluate_pair(model, items, setup)
        else:
            result = {m: evaluation.evaluate_mode(model, items, setup, m) for m in ("saar_off", "saar_on")}
    finally:
        del box.run
    figures = {"wall_s": time.perf_counter() - w0, "cpu_s": time.process_time() - c0,
               "generated": engine.counters["generated"] - before, "tool_calls": len(calls)}
    return figures, {m: metrics for m, (metrics, _) in result.items()}


def bench_eval(model: str = "assets/tiny-warm", n_prompts: int = 32, samples: int = 4, repeats: int = 3,
               echo=print) -> dict:
    """Alternate the sides ``repeats`` times; print and return the figures, ratios and whether metrics agree."""
    import torch

    from flows.config import load_config
    from tasks.data.loader import load_prompts
    from tasks.data.synthetic import write_task_parquet

    torch.set_num_threads(1)
    setup = load_config("configs/tiny.yaml", ["sandbox.backend=local"]).setups().eval
    setup = setup.model_copy(update={"eval": setup.eval.model_copy(update={"n_prompts": n_prompts,
                                                                           "samples": samples})})
    items = list(load_prompts(str(write_task_parquet(Path("runs/bench-eval/eval.parquet"), n_prompts, 0,
                                                      "eval"))))
    rows: dict[str, list[dict]] = {"separate": [], "paired": []}
    metrics: dict[str, dict] = {}
    for rep in range(repeats):
        for side in rows:
            figures, metrics[side] = _side(side, model, items, setup)
            rows[side].append(figures)
            echo(f"repeat {rep} {side:>8}: wall {figures['wall_s']:.1f} s, cpu {figures['cpu_s']:.1f} s, "
                 f"{figures['generated']} tokens generated, {figures['tool_calls']} tool calls")
    kept = {side: (r[1:] if repeats > 1 else r) for side, r in rows.items()}
    mean = {side: {k: statistics.mean(x[k] for x in r) for k in r[0]} for side, r in kept.items()}
    ratios = {k: mean["separate"][k] / mean["paired"][k] for k in mean["paired"]}
    equal = metrics["separate"] == metrics["paired"]
    echo(f"separate / paired ({n_prompts} prompts x {samples} samples): wall x{ratios['wall_s']:.2f}, "
         f"cpu x{ratios['cpu_s']:.2f}, tokens x{ratios['generated']:.2f}, tool calls x{ratios['tool_calls']:.2f}; "
         f"metrics of both modes {'equal' if equal else 'DIFFERENT'}")
    return {"mean": mean, "ratios": ratios, "metrics_equal": equal, "repeats": rows}


if __name__ == "__main__":
    from models.termination import install

    install()  # SIGTERM ends it as Ctrl-C does, also when swallowed in a finaliser
    args = [int(a) for a in sys.argv[1:]]
    sys.exit(0 if bench_eval("assets/tiny-warm", *args)["metrics_equal"] else 1)
