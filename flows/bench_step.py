"""Benchmark: the RL step of the compare's CLEANER arm with the speed switches off ("before") and on ("after").

What: ``bench_step(config)`` runs whole RL steps — rollout (with the weight sync), score, mix, advantage,
update, log (DuckDB rows, MLflow metrics and traces) — through the stage functions of
``tasks.training.stages`` on the config's compare settings (``compare.shared``: for ``configs/tiny.yaml``
16 prompts × 8 samples, no refill round, 16 traces a step; the CLEANER arm is the config itself), once
per side, in one process, alternating sides block by block so a change of machine load hits all of them:

* **before**: every switch of ``SWITCHES`` off — what the code did before them;
* **after**: every switch on (their defaults);
* a switch's name: only that switch on (to see what each one buys).

Every step of a side starts from the same policy (two copies of it, alternated so every step pays a
real weight sync) and the same step index as on the other sides, so the sides must produce the same
trajectories (token ids, the engine's log-probs) and the same update (loss, gradient norm, every
``train/*`` metric): their largest differences are printed and checked against ``tolerance``
(1e-6: the switches reorder float sums, e.g. a micro-batch of other widths in the old-log-prob pass,
which moves a float32 log-prob by ~1e-8, never a sampled token). A block of ``steps_per_block`` steps
ends with the trace writer flushed, inside its wall time: writes left in the background are paid for.

It prints where a step's time goes per side (stage seconds from each stage's ``time/*`` metric; the
rest of the block wall — the trace writer's flush — as ``flush``), the per-step ratio before/after
(mean over repeats after the first, which warms up; and the median of the paired repeat ratios), and
the 1/5/15-minute load averages at the start and end. ``--set`` overrides apply to every side (e.g.
``data.prompts_per_step=4``).

Simplifies: no Prefect (its orchestration is the same on every side); one torch thread, as the
compare's children; the run's sandbox backend (Docker when available, ``auto``).
Run: ``cleaner bench-step`` (``--config configs/smollm2-135m.yaml`` for SmolLM2's LoRA step).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import time
from pathlib import Path

SWITCHES: dict[str, tuple[str, str, str]] = {
    "kv_cache": ("engine.kv_cache", "concat", "preallocated"),
    "share_prefill": ("engine.share_prefill", "false", "true"),
    "lean_decode": ("engine.lean_decode", "false", "true"),
    "fuse_old_logprobs": ("trainer.fuse_old_logprobs", "false", "true"),
    "causal_only": ("trainer.causal_only", "false", "true"),
    "response_logits": ("trainer.response_logits", "false", "true"),
    "share_prompts": ("trainer.share_prompts", "false", "true"),
    "micro_tokens": ("trainer.micro_tokens", "null", "2048"),
    "background_traces": ("tracking.background_traces", "false", "true"),
}
"""Switch name → (config key, value before, value after)."""

TOLERANCES = {"token_ids": 0.0, "rollout_logprobs": 2e-5, "train/ess_ratio": 2e-5, "train/ess_ratio_min": 2e-5}
"""Largest difference allowed between sides, per figure (others: ``tolerance``, 1e-6). Token ids must be equal. The
engine's log-probs (and VCPO's ESS figures computed from them) carry the continuous rollout's own noise: which
rows share a decoding batch depends on when tool calls finish — the same config run twice differs by up to 3.1e-6
(4 rollouts of 128 trajectories) — and ``share_prefill`` prefills a prompt in a batch of its own instead of with
its 8 copies: before vs after differ by 3.5e-6 to 1.1e-5 (7 runs of 6 steps, docs/step_time.md)."""

PARTS = ("rollout", "score", "mix", "update", "old_lp", "log", "traces", "flush")
"""Where a step's seconds go: each stage's call (``mix`` with the advantage stage), two parts of those measured by
the stages themselves — ``old_lp`` (the update's old-log-prob pass, ``time/old_logprobs_s``) inside ``update``,
``traces`` (the seconds the log stage waited for its traces) inside ``log`` — and ``flush``: the rest of the block's
wall time per step (the trace writer's flush)."""


def side_overrides(side: str) -> list[str]:
    """``--set`` overrides of a side: ``before`` (all off), ``after`` (all on) or one switch's name (only it on)."""
    if side not in ("before", "after", *SWITCHES):
        raise ValueError(f"bench-step: unknown side {side!r}; valid: before, after, {', '.join(SWITCHES)}")
    return [f"{key}={on if side in ('after', name) else off}" for name, (key, off, on) in SWITCHES.items()]


def _config(config: Path, work: Path, side: str, extra: list[str]):
    from flows.config import load_config

    shared = list(load_config(config, []).compare.shared)
    return load_config(config, [*shared, f"output_dir={work}", f"tracking.mlflow_uri=sqlite:///{work}/mlflow.db",
                                f"tracking.duckdb_path={work}/store.duckdb", f"tracking.artifact_root={work}/mlartifacts",
                                f"data.train_path={work}/train.parquet", f"data.eval_path={work}/eval.parquet",
                                *extra, *side_overrides(side)])


class _Side:
    """One side's config, MLflow run and step folders."""

    def __init__(self, name: str, cfg, work: Path):
        from tasks.stores import db, tracking

        self.name, self.cfg, self.work = name, cfg, work / name
        self.setups = cfg.setups()
        self.mlrun = tracking.open_run(cfg.tracking, "bench-step", f"bench-{name}", cfg.model_dump(mode="json"), {})
        db.upsert_run(cfg.tracking.duckdb_path, f"bench-{name}", cfg.name, cfg.model_dump(mode="json"), self.mlrun,
                      "running")

    def step(self, step: int, ckpt: str) -> dict:
        """One RL step from ``ckpt``; returns its metrics and the seconds of its parts (``PARTS``)."""
        from tasks.training import stages

        folder = self.work / "steps" / f"{step:06d}"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        s, run, parts = self.setups, f"bench-{self.name}", {}
        out = self.work / "checkpoints" / f"policy_{step + 1:06d}"
        calls = {"rollout": lambda: stages.rollout_stage(folder, step, ckpt, run, s.rollout),
                 "score": lambda: stages.score_stage(folder, s.score),
                 "mix": lambda: (stages.mix_stage(folder, s.mix), stages.advantage_stage(folder, s.advantage)),
                 "update": lambda: stages.update_stage(folder, ckpt, out, s.update),
                 "log": lambda: stages.log_stage(folder, step, run, self.mlrun, str(out), s.log, {"arm": "cleaner"})}
        for part, call in calls.items():
            t0 = time.perf_counter()
            result = call()
            parts[part] = time.perf_counter() - t0
        parts["old_lp"], parts["traces"] = result.get("time/old_logprobs_s", 0.0), result.get("time/traces_s", 0.0)
        return {"folder": str(folder), "parts": parts, **result}


def _trajectories(folder: str) -> list[tuple]:
    from tasks.stores.records import read_table

    df = read_table(Path(folder), "trajectories").sort("traj_id")
    return list(zip(df["traj_id"].to_list(), df["response_ids"].to_list(), df["rollout_logprobs"].to_list()))


def differences(a: dict, b: dict) -> dict[str, float]:
    """Largest differences between two sides' step: trajectories (ids must be equal: else ``inf``), the engine's
    log-probs, and every ``train/*`` metric (relative to it above 1: float32 carries ~7 digits)."""
    ta, tb = _trajectories(a["folder"]), _trajectories(b["folder"])
    same_ids = [x[:2] for x in ta] == [x[:2] for x in tb]
    lp = max((abs(p - q) for x, y in zip(ta, tb) for p, q in zip(x[2], y[2])), default=0.0) if same_ids else float("inf")
    train = [k for k in a if k.startswith("train/")]
    return {"token_ids": 0.0 if same_ids else float("inf"), "rollout_logprobs": lp,
            **{k: abs(float(a[k]) - float(b[k])) / max(1.0, abs(float(a[k]))) if k in b else float("inf") for k in train}}


def bench_step(config: str | Path = "configs/tiny.yaml", work_dir: str | Path = "runs/bench-step",
               sides: tuple[str, ...] = ("before", "after"), repeats: int = 3, steps_per_block: int = 2,
               overrides: list[str] | None = None, tolerance: float = 1e-6, echo=print) -> dict:
    """Run ``repeats`` alternating blocks per side; print and return per-step seconds, parts, ratios, differences."""
    import torch

    from flows.prepare import ensure_policy, start_policy
    from tasks.data.loader import ensure_files
    from tasks.stores import trace_writer
    from tasks.training import live

    torch.set_num_threads(1)
    work = Path(work_dir).resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    load = [os.getloadavg()]
    cfgs = {side: _config(Path(config), work, side, overrides or []) for side in sides}
    first = cfgs[sides[0]]
    ensure_files(first.data)
    ensure_policy(first)
    start = start_policy(first, first.model.path, work / "start-policy")
    copies = [str(shutil.copytree(start, work / f"start-{c}", symlinks=True)) for c in "ab"]
    runs = {side: _Side(side, cfgs[side], work) for side in sides}
    rows: dict[str, list[dict]] = {side: [] for side in sides}
    flips = 0
    try:
        for rep in range(repeats):
            for side in sides:
                t0, c0 = time.perf_counter(), time.process_time()
                block = []
                for k in range(steps_per_block):
                    block.append(runs[side].step(rep * steps_per_block + k, copies[flips % 2]))
                    flips += 1
                trace_writer.flush()
                wall, cpu = time.perf_counter() - t0, time.process_time() - c0
                for m in block:
                    m["parts"]["wall"], m["parts"]["cpu"] = wall / steps_per_block, cpu / steps_per_block
                    m["parts"]["flush"] = (wall - sum(sum(_stage_seconds(x)) for x in block)) / steps_per_block
                rows[side].extend(block)
                echo(f"repeat {rep} {side:>18}: {wall / steps_per_block:6.2f} s a step, "
                     f"{cpu / steps_per_block:6.2f} s of this process's CPU (load {os.getloadavg()[0]:.1f})")
    finally:
        trace_writer.flush()
        live.close_live()
    load.append(os.getloadavg())
    return _report(rows, sides, repeats, steps_per_block, load, tolerance, first, echo)


def _stage_seconds(m: dict) -> list[float]:
    return [m["parts"][p] for p in ("rollout", "score", "mix", "update", "log")]


def _report(rows: dict, sides, repeats: int, per_block: int, load: list, tolerance: float, cfg, echo) -> dict:
    timed = {side: (r[per_block:] if repeats > 1 else r) for side, r in rows.items()}
    cols = (*PARTS, "wall", "cpu")
    mean = {side: {p: statistics.mean(m["parts"][p] for m in rs) for p in cols} for side, rs in timed.items()}
    base = sides[0]
    out: dict = {"sides": mean, "load_start": load[0], "load_end": load[1], "repeats": repeats,
                 "steps_per_block": per_block, "prompts": cfg.data.prompts_per_step, "samples": cfg.rollout.n_samples,
                 "model": cfg.model.path, "differences": {}, "ratio": {}, "paired_median_ratio": {}, "cpu_ratio": {}}
    echo(f"{cfg.model.path}: {cfg.data.prompts_per_step} prompts x {cfg.rollout.n_samples} samples, "
         f"seconds per step (mean of {max(repeats - 1, 1)} repeats x {per_block} steps after a warm-up)")
    echo("side".rjust(18) + "".join(p.rjust(8) for p in cols))
    for side in sides:
        echo(side.rjust(18) + "".join(f"{mean[side][p]:8.2f}" for p in cols))
    for side in sides[1:]:
        diffs: dict[str, float] = {}
        for a, b in zip(rows[base], rows[side]):
            for k, v in differences(a, b).items():
                diffs[k] = max(diffs.get(k, 0.0), v)
        over = {k: v for k, v in diffs.items() if v > TOLERANCES.get(k, tolerance)}
        worst = max((k for k in diffs if not k.startswith("rollout") and k != "token_ids"), key=diffs.get, default="-")
        pairs = [rows[base][i]["parts"]["wall"] / rows[side][i]["parts"]["wall"]
                 for i in range(per_block if repeats > 1 else 0, len(rows[base]), per_block)]
        out["differences"][side], out["ratio"][side] = diffs, mean[base]["wall"] / mean[side]["wall"]
        out["paired_median_ratio"][side] = statistics.median(pairs)
        out["cpu_ratio"][side] = mean[base]["cpu"] / mean[side]["cpu"]
        echo(f"{base} / {side}: x{out['ratio'][side]:.2f} per step (median of paired repeats "
             f"x{out['paired_median_ratio'][side]:.2f}; this process's CPU x{out['cpu_ratio'][side]:.2f}); token ids {'equal' if not diffs['token_ids'] else 'DIFFER'}, "
             f"engine log-probs within {diffs['rollout_logprobs']:.1e}, update within {diffs.get(worst, 0.0):.1e} "
             f"({worst}) -> " + (f"DIFFERENT: {over}" if over else "same within the tolerances"))
    echo("load average (1, 5, 15 min): start " + ", ".join(f"{x:.1f}" for x in load[0])
         + "; end " + ", ".join(f"{x:.1f}" for x in load[1]) + f" on {os.cpu_count()} cores")
    out["same"] = all(v <= TOLERANCES.get(k, tolerance) for d in out["differences"].values() for k, v in d.items())
    return out


def write_json(report: dict, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1, default=str))
    return path
