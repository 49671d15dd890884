"""Benchmark: a slice of a t4 compare run, today's paths ("before") against the defaults ("after"), in core-seconds.

What: ``bench_run(config)`` trains the same run twice in one process — ``steps`` RL steps of the compare's
settings (``compare.shared``, then ``arm``: by default configs/regimes/t4.yaml with the masked, raw-share-0 CLEANER
arm of the t4 study, ``MASK_RAW0``), evaluating SAAR off and on after step ``eval_at`` at the evaluation's size
(64 × 4) and after the last step at the final size (128 × 8) — once per side, the sides alternating step by step
so that load changes hit both, and which side goes first alternating too (``side_order``), so that caches the
first one warms do not favour the second:

* **before** (``SIDES``): the study's paths — two evaluation passes, SAAR off then SAAR on (``eval.shared_pass``
  false, as configs/regimes/t4.yaml pins it);
* **after**: the defaults — both modes in one paired pass (``tasks.rollout.paired``).

Both sides decode through the same engine code (its speed-ups since are the same bit for bit: a ``before`` with
another decode would sample the same tokens). Every stage is the one a run calls (``tasks.training.stages``:
rollout with the weight sync, score, mix + advantage, update, log with its traces, evaluation with its DuckDB rows
and MLflow traces). It prints per part the **core-seconds** (``core_seconds``: CPU time of this process, its
threads and every process under it — the local sandbox's workers included — live or ended) and the wall seconds,
the ratios before / after per part and for the whole run, and checks

* the training steps: token ids equal, engine log-probs and every ``train/*`` figure within ``bench_step``'s
  tolerances (``bench_step.differences``) — the sides train identically;
* the evaluations: every figure of both modes equal (``time/*`` aside) — one paired pass gives what two separate
  seeded passes give;

and returns ``same`` False (``cleaner bench-run`` exits 1) when either fails. Before the sides, one step and one
evaluation of a third run (``warm-up``, untimed) load the engine, the trainer and the sandbox's workers, which
both sides then share.

Simplifies: no Prefect (its orchestration is the same on both sides); one torch thread, as a compare's children; the
local sandbox (Docker's containers run outside this process tree, so their CPU could not be counted).
Run: ``cleaner bench-run`` (``--steps``, ``--eval-at``, ``--set`` for a smaller slice).
"""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path

MASK_RAW0 = ["rollout.saar.enabled=true", "rollout.saar.raw_share=0.0", "trainer.splice=mask"]
"""The t4 study's masked CLEANER arm (configs/regimes/t4_long.yaml's ``mask_raw0``)."""

RUN = ["seed=21", "rollout.tool_lag_steps=1", "sandbox.backend=local"]
"""Every side: a compare seed, lockstep tool calls (so a rollout does not depend on the sandbox's timing and the two
sides' steps can be compared token for token), the local sandbox (its CPU is counted)."""

SIDES: dict[str, list[str]] = {"before": ["eval.shared_pass=false"], "after": ["eval.shared_pass=true"]}
"""Side → overrides on top of the config, ``compare.shared``, the arm and ``RUN``."""

PARTS = ("rollout", "score", "mix", "update", "log", "eval")


def core_seconds() -> float:
    """CPU seconds (user + system) of this process and every process under it: the ended ones this process waited
    for (``RUSAGE_CHILDREN``), the live ones and what they waited for (``psutil``)."""
    import psutil

    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        use = resource.getrusage(who)
        total += use.ru_utime + use.ru_stime
    for proc in psutil.Process().children(recursive=True):
        try:
            t = proc.cpu_times()
        except psutil.Error:  # ended between the listing and the reading: counted by its parent's wait
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


class _Timed:
    """Core-seconds and wall seconds of a side's parts, summed over the run."""

    def __init__(self):
        self.core = dict.fromkeys(PARTS, 0.0)
        self.wall = dict.fromkeys(PARTS, 0.0)

    def __call__(self, part: str, call):
        c0, w0 = core_seconds(), time.perf_counter()
        out = call()
        self.core[part] += core_seconds() - c0
        self.wall[part] += time.perf_counter() - w0
        return out


def _step(side, timed: _Timed, step: int, ckpt: str) -> tuple[dict, str]:
    """One RL step of a side, each stage timed as its part; returns the step's metrics and the new checkpoint."""
    from tasks.stores import trace_writer
    from tasks.training import stages

    folder = side.work / "steps" / f"{step:06d}"
    folder.mkdir(parents=True, exist_ok=True)
    s, run = side.setups, f"bench-{side.name}"
    out = side.work / "checkpoints" / f"policy_{step + 1:06d}"
    timed("rollout", lambda: stages.rollout_stage(folder, step, ckpt, run, s.rollout))
    timed("score", lambda: stages.score_stage(folder, s.score))
    timed("mix", lambda: (stages.mix_stage(folder, s.mix), stages.advantage_stage(folder, s.advantage)))
    timed("update", lambda: stages.update_stage(folder, ckpt, out, s.update))

    def log() -> dict:
        metrics = stages.log_stage(folder, step, run, side.mlrun, str(out), s.log, {"arm": "bench"})
        trace_writer.flush()  # the traces' writes are this step's cost, whenever they run
        return metrics

    return {"folder": str(folder), **timed("log", log)}, str(out)


def _evaluate(side, timed: _Timed, version: int, ckpt: str, final: bool) -> dict:
    from tasks.training import stages

    setup = side.setups.eval_setup(final)
    metrics = timed("eval", lambda: stages.eval_stage(f"bench-{side.name}", version, ckpt, side.mlrun, setup))
    return {k: v for k, v in metrics.items() if not k.startswith("time/")}


def _eval_differences(a: dict, b: dict) -> list[str]:
    """Figures that are not equal (or present on one side only) between two evaluations."""
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def side_order(names: list[str], step: int) -> list[str]:
    """The order the sides run in at ``step``: as listed on even steps, reversed on odd ones."""
    return names if step % 2 == 0 else names[::-1]


def bench_run(config: str | Path = "configs/regimes/t4.yaml", work_dir: str | Path = "runs/bench-run",
              steps: int = 6, eval_at: int = 3, arm: list[str] | None = None, overrides: list[str] | None = None,
              echo=print) -> dict:
    """Train both sides step by step (alternating), evaluate each at ``eval_at`` and at the end; print and return
    core-seconds and wall seconds per part, the ratios and the checks."""
    import shutil

    import torch

    from flows.bench_step import TOLERANCES, _config, _Side, differences
    from flows.prepare import ensure_policy, start_policy
    from tasks.data.loader import ensure_files
    from tasks.stores import trace_writer
    from tasks.training import live

    torch.set_num_threads(1)
    work = Path(work_dir).resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    extra = [*(MASK_RAW0 if arm is None else arm), *RUN, *(overrides or [])]
    cfgs = {name: _config(Path(config), work, "after", [*extra, *side]) for name, side in SIDES.items()}
    first = next(iter(cfgs.values()))
    ensure_files(first.data)
    ensure_policy(first)
    start = start_policy(first, first.model.path, work / "start-policy")
    sides = {name: _Side(name, cfg, work) for name, cfg in cfgs.items()}
    warm = _Side("warm-up", first, work)
    _evaluate(warm, _Timed(), 1, _step(warm, _Timed(), 0, start)[1], False)
    timed = {name: _Timed() for name in sides}
    ckpts = dict.fromkeys(sides, start)
    rows: dict[str, list[dict]] = {name: [] for name in sides}
    evals: dict[str, list[dict]] = {name: [] for name in sides}
    load, w0 = [os.getloadavg()], time.perf_counter()
    try:
        for step in range(steps):
            for name in side_order(list(sides), step):
                side = sides[name]
                metrics, ckpts[name] = _step(side, timed[name], step, ckpts[name])
                rows[name].append(metrics)
                if step + 1 in (eval_at, steps):
                    evals[name].append(_evaluate(side, timed[name], step + 1, ckpts[name], step + 1 == steps))
            echo(f"step {step + 1}/{steps} done on both sides ({time.perf_counter() - w0:.0f} s, load "
                 f"{os.getloadavg()[0]:.1f})")
    finally:
        trace_writer.flush()
        live.close_live()
    load.append(os.getloadavg())
    return _report(rows, evals, timed, load, first, steps, eval_at, TOLERANCES, differences, echo)


def _report(rows, evals, timed, load, cfg, steps, eval_at, tolerances, differences, echo) -> dict:
    before, after = list(timed)
    diffs: dict[str, float] = {}
    for a, b in zip(rows[before], rows[after]):
        for k, v in differences(a, b).items():
            diffs[k] = max(diffs.get(k, 0.0), v)
    over = {k: v for k, v in diffs.items() if v > tolerances.get(k, 1e-6)}
    eval_diff = [_eval_differences(a, b) for a, b in zip(evals[before], evals[after])]
    core = {side: {**t.core, "run": sum(t.core.values())} for side, t in timed.items()}
    wall = {side: {**t.wall, "run": sum(t.wall.values())} for side, t in timed.items()}
    ratio = {p: core[before][p] / core[after][p] if core[after][p] else float("nan") for p in core[before]}
    echo(f"{cfg.model.path}: {steps} steps of {cfg.data.prompts_per_step} prompts x {cfg.rollout.n_samples} samples; "
         f"SAAR off and on evaluated after step {eval_at} ({cfg.eval.n_prompts} x {cfg.eval.samples}) and {steps} "
         f"(the final size); core-seconds (this process and every process under it), wall seconds in brackets")
    echo("side".rjust(8) + "".join(p.rjust(16) for p in (*PARTS, "run")))
    for side in timed:
        echo(side.rjust(8) + "".join(f"{core[side][p]:9.1f} ({wall[side][p]:4.0f})" for p in (*PARTS, "run")))
    echo("ratio".rjust(8) + "".join(f"x{ratio[p]:.2f}".rjust(16) for p in (*PARTS, "run")))
    ids = "equal" if diffs.get("token_ids", 0.0) == 0.0 else "DIFFER"
    echo(f"training steps: token ids {ids}, engine log-probs within {diffs.get('rollout_logprobs', 0.0):.1e}, "
         f"train/* within {max((v for k, v in diffs.items() if k.startswith('train/')), default=0.0):.1e}"
         + (f" -> DIFFERENT: {over}" if over else ""))
    echo("evaluations: " + "; ".join(f"after step {s}: " + ("every figure equal" if not d else f"DIFFERENT: {d}")
                                     for s, d in zip(sorted({eval_at, steps}), eval_diff)))
    echo("load average (1, 5, 15 min): start " + ", ".join(f"{x:.1f}" for x in load[0])
         + "; end " + ", ".join(f"{x:.1f}" for x in load[1]) + f" on {os.cpu_count()} cores")
    same = not over and not any(eval_diff)
    return {"core_s": core, "wall_s": wall, "ratio": ratio, "differences": diffs, "eval_differences": eval_diff,
            "evals": evals, "load_start": load[0], "load_end": load[1], "same": same}
