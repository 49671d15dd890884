"""Benchmark: rollout throughput with APRIL partial rollouts on vs off, as ratios measured in one run.

What: ``bench_partial(model)`` runs the real rollout stage (``tasks.training.stages.rollout_stage``) for
``steps`` consecutive steps per side, same prompts file, seed, model and engine, into scratch step folders:

* **off**: the ordinary step — ``data.prompts_per_step`` groups, DAPO refill rounds (``refill_rounds``)
  while fewer groups than that have unequal rewards; every step waits for its longest trajectory;
* **on**: ``rollout.partial`` — ``over_sampling`` groups submitted, the step stops once
  ``prompts_per_step`` groups passed the filter, the rest is aborted and carried to the next step.

Both sides draw fresh prompts from the same file (the off side by the step's seeded draw, the on side by
the seeded cursor). The length distribution is the policy's own, sampled at ``temperature`` 1.5 so that it is
long-tailed (the tiny policy measured p50 96, p90 308, p99 428 response tokens; at temperature 1 it is narrow,
p50 89, p99 97); the benchmark prints the quantiles it saw.
Sides alternate (off/on, then on/off) over ``repeats`` so load changes on a shared machine hit both. Per side:
rollout wall time, **passing groups/s** and **passing tokens/s** — groups whose graded rewards are not all equal
(the dynamic-sampling filter's pass: the groups that train) and their policy tokens, per second — and the
ratios on/off. Both sides are counted the same way (``passing``, after the timer): the on side's batch also
holds groups the filter rejected, the off side's is trimmed by the refill, and neither kind is counted.

Simplifies: no update between steps (the policy is the same at every step, the version still advances, so
carried tokens count as off-policy); the local sandbox; one torch thread; the model is loaded before
timing. The groups still carried after the last step (printed) hold work the on side did but is not
credited for: few steps understate its gain.
Run: ``cleaner bench-partial --model assets/tiny-warm`` (or call ``bench_partial``).
"""

from __future__ import annotations

import json
import shutil
import statistics
import time
from pathlib import Path


def passing(trajs, reward_cfg) -> tuple[int, int]:
    """(groups, policy tokens) of a step's trajectories that pass the dynamic-sampling filter: graded rewards
    (the outcome reward, as the partial rollout's judge sees it) not all equal."""
    import polars as pl

    from tasks.rewards.config import ScoreConfig
    from tasks.rewards.scoring import score_rows

    scores, _ = score_rows(trajs, reward_cfg, ScoreConfig(overlong_buffer=0), 1)
    rows = trajs.join(scores.select("traj_id", "score", "graded"), on="traj_id")
    groups = (rows.group_by("group_id")
              .agg(pl.col("score").filter(pl.col("graded")).n_unique().alias("distinct"),
                   pl.col("response_mask").list.sum().sum().alias("tokens"))
              .filter(pl.col("distinct") > 1))
    return groups.height, int(groups["tokens"].sum())


def _side(partial: bool, work: Path, model: str, prompts: Path, steps: int, cfg: dict) -> dict:
    import polars as pl

    from models.config import ChatConfig, EngineConfig
    from sandbox.config import SandboxConfig
    from tasks.data.config import DataConfig
    from tasks.rewards.config import RewardConfig
    from tasks.rollout.config import PartialConfig, RolloutConfig
    from tasks.training.setups import RolloutSetup
    from tasks.training.stages import rollout_stage

    shutil.rmtree(work, ignore_errors=True)
    data = DataConfig(train_path=str(prompts), synthetic=False, prompts_per_step=cfg["prompts_per_step"],
                      refill_rounds=cfg["refill_rounds"])
    rollout = RolloutConfig(n_samples=cfg["n_samples"], max_turns=cfg["max_turns"], max_new_tokens=cfg["max_new_tokens"],
                            max_response_tokens=cfg["max_response_tokens"],
                            partial=PartialConfig(enabled=partial, over_sampling=cfg["over_sampling"],
                                                  submit_rule=cfg["submit_rule"]))
    setup = RolloutSetup(seed=cfg["seed"], chat=ChatConfig(), train_path=data.train_path,
                         prompts_per_step=data.prompts_per_step, refill_rounds=data.refill_rounds, rollout=rollout,
                         engine=EngineConfig(temperature=cfg["temperature"]),
                         sandbox=SandboxConfig(backend="local", workers=2), reward=RewardConfig())
    groups = tokens = carried = 0
    lengths: list[int] = []
    wall = 0.0
    for step in range(steps):
        folder = work / "steps" / f"{step:06d}"
        folder.mkdir(parents=True)
        t0 = time.perf_counter()
        rollout_stage(folder, step, model, "bench", setup)
        wall += time.perf_counter() - t0
        m = json.loads((folder / "rollout.metrics.json").read_text())
        carried = int(m.get("partial/buffer_groups", 0))
        df = pl.read_parquet(folder / "trajectories.parquet")
        n, toks = passing(df, setup.reward)
        groups, tokens = groups + n, tokens + toks
        lengths += df["response_ids"].list.len().to_list()
    return {"wall_s": wall, "groups": groups, "tokens": tokens, "groups_per_s": groups / wall,
            "tokens_per_s": tokens / wall, "carried_at_end": carried, "lengths": lengths}


def bench_partial(model: str | Path = "assets/tiny-warm", work_dir: str | Path = "runs/bench-partial", steps: int = 4,
                  prompts_per_step: int = 4, n_samples: int = 4, over_sampling: int = 8, refill_rounds: int = 3,
                  max_turns: int = 4, max_new_tokens: int = 192, max_response_tokens: int = 640,
                  temperature: float = 1.5, repeats: int = 2, n_prompts: int = 256, seed: int = 0,
                  submit_rule: str = "april", echo=print) -> dict:
    """Partial rollouts off and on, alternately ``repeats`` times; print and return the figures and ratios."""
    import torch

    from models.config import ChatConfig, EngineConfig
    from tasks.data.synthetic import write_task_parquet
    from tasks.training.live import get_chat, get_engine

    torch.set_num_threads(1)
    get_engine(EngineConfig(temperature=temperature), str(model), get_chat(str(model), ChatConfig()))
    work = Path(work_dir)
    prompts = work / "train.parquet"
    if not prompts.exists():
        prompts.parent.mkdir(parents=True, exist_ok=True)
        write_task_parquet(prompts, n_prompts, seed, "rl")
    cfg = {"prompts_per_step": prompts_per_step, "n_samples": n_samples, "over_sampling": over_sampling,
           "refill_rounds": refill_rounds, "max_turns": max_turns, "max_new_tokens": max_new_tokens,
           "max_response_tokens": max_response_tokens, "temperature": temperature, "seed": seed,
           "submit_rule": submit_rule}
    rows: dict[str, list[dict]] = {"off": [], "on": []}
    for rep in range(repeats):
        for side in (("off", "on") if rep % 2 == 0 else ("on", "off")):
            r = _side(side == "on", work / side, str(model), prompts, steps, cfg)
            rows[side].append(r)
            echo(f"repeat {rep} {side:>3}: {r['wall_s']:.1f} s for {steps} steps, {r['groups']} passing groups "
                 f"({r['groups_per_s']:.3f}/s), {r['tokens']} of their policy tokens ({r['tokens_per_s']:.0f}/s), "
                 f"{r['carried_at_end']} groups carried at the end")
    summary: dict = {side: {k: statistics.mean(x[k] for x in rs) for k in ("wall_s", "groups", "tokens", "groups_per_s",
                                                                          "tokens_per_s", "carried_at_end")}
                     for side, rs in rows.items()}
    lengths = sorted(n for r in rows["off"] for n in r["lengths"])
    q = {p: lengths[min(len(lengths) - 1, int(p / 100 * len(lengths)))] for p in (50, 90, 99)}
    summary["response_tokens_quantiles"] = {**q, "max": lengths[-1]}
    summary["ratio_groups_per_s"] = summary["on"]["groups_per_s"] / summary["off"]["groups_per_s"]
    summary["ratio_tokens_per_s"] = summary["on"]["tokens_per_s"] / summary["off"]["tokens_per_s"]
    summary["repeats"] = {side: [{k: v for k, v in r.items() if k != "lengths"} for r in rs] for side, rs in rows.items()}
    echo(f"response length (off side, tokens): p50 {q[50]}, p90 {q[90]}, p99 {q[99]}, max {lengths[-1]}")
    echo(f"partial on / off: passing groups/s x{summary['ratio_groups_per_s']:.2f}, "
         f"their tokens/s x{summary['ratio_tokens_per_s']:.2f} ({steps} steps x {prompts_per_step} groups x {n_samples} "
         f"samples, over-sampling {over_sampling}, submit rule {submit_rule}, mean of {repeats} alternating repeats)")
    return summary
