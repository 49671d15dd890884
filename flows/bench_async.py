"""Benchmark: a slice of a t4 compare run trained synchronously and at bounded staleness, whole runs alternating.

What: ``bench_async(config, sides=("sync-1t", "sync-2t", "async"), repeats=2)`` trains whole runs of the slice
``flows.bench_run`` trains (configs/regimes/t4.yaml with ``compare.shared``, the t4 study's ``MASK_RAW0`` arm,
``bench_run.RUN``, ``ONE_PASS``; ``steps`` RL steps, SAAR off and on evaluated at version ``eval_at`` and at the
end, at the final size) from the same start policy, once per side and repeat, in one process. The sides
(``SIDES``):

* **sync-1t**: ``rollout.staleness: 0``, every stage in this process, one torch thread (engine and trainer);
* **sync-2t**: the same with two torch threads each;
* **async**: ``rollout.staleness: 1`` and ``eval.beside_training: true``, one thread each: rollout + score run in the
  rollout lane and the evaluations in the evaluation lane (``tasks.training.lanes``, worker processes), the
  update in this process, ordered by the run's own schedule (``tasks.training.schedule.run_steps``, its ``submit`` a
  ``concurrent.futures`` executor's; every side goes through it, the synchronous ones with ``submit`` None).

The side order alternates (``run_order``: the list, then reversed, ...). Each side first runs one untimed warm-up
step and evaluation (its engine, its lanes and their sandbox pools load there). Per side it prints wall seconds and
core-seconds a run (``bench_run.core_seconds``: this process and every process under it — lanes and sandbox
workers — over the run), each part's core-seconds measured in the process that ran it (``measured``: a lane's part
by the worker around its call, itself and its children; a part of this process with ``core_seconds`` when nothing
runs beside it, else with ``own_seconds``, this process alone), the schedule's waits (``schedule.PERF`` summed over
a run, ``perf/eval_wait_s``), the policy version each rollout sampled with, the wall ratios of async against each
synchronous side and the faster, the core-seconds ratio, and whether issue 52's goal is met
(``bench_async_report.GOAL_WALL``, ``GOAL_CORE``). Checks (``same`` False, ``cleaner bench-run`` exits 1): the
repeats of every side of ``Side.checked`` (sync-1t, async) trained on identical token ids.

Simplifies: no Prefect (``run_steps`` takes any submit); the local sandbox (its CPU is counted).
Run: ``cleaner bench-run`` (``--sides``, ``--repeats``, ``--steps``, ``--eval-at``, ``--set`` for a smaller slice).
"""

from __future__ import annotations

import importlib
import os
import resource
import threading
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from flows.bench_run import MASK_RAW0, PARTS, RUN, core_seconds

STAGES = "tasks.training.stages"
ONE_PASS = ["eval.shared_pass=true"]
"""Every side evaluates SAAR off and on in one paired pass (the default; t4.yaml pins the study's two passes)."""


@dataclass(frozen=True)
class Side:
    overrides: tuple[str, ...]
    """``--set`` overrides of the side (on top of the config, ``compare.shared``, the arm, ``RUN``)."""
    checked: bool
    """Whether its repeats must train on identical token ids (exit 1 otherwise)."""


def _threads(n: int) -> tuple[str, ...]:
    return f"engine.threads={n}", f"trainer.threads={n}"


SIDES: dict[str, Side] = {
    "sync-1t": Side(("rollout.staleness=0", "eval.beside_training=false", *_threads(1)), checked=True),
    "sync-2t": Side(("rollout.staleness=0", "eval.beside_training=false", *_threads(2)), checked=False),
    "async": Side(("rollout.staleness=1", "eval.beside_training=true", *_threads(1)), checked=True),
}
"""Side name → its settings."""


def check_sides(names: list[str]) -> None:
    """Raise ``ValueError`` naming the unknown sides and the valid ones."""
    unknown = [n for n in names if n not in SIDES]
    if unknown or not names:
        raise ValueError(f"bench-run: unknown side(s) {', '.join(unknown) or '(none given)'}; valid: "
                         f"{', '.join(SIDES)}")


def run_order(names: list[str], repeats: int) -> list[tuple[str, int]]:
    """(side, repeat) in the order they run: the list, then reversed, then as listed, ..."""
    return [(name, rep) for rep in range(repeats) for name in (names if rep % 2 == 0 else names[::-1])]


def own_seconds() -> float:
    """CPU seconds of this process (every thread), nothing under it: the lanes left out (a sandbox worker of
    another side reaped meanwhile too)."""
    use = resource.getrusage(resource.RUSAGE_SELF)
    return use.ru_utime + use.ru_stime


def measured(module: str, function: str, *args, clock: str = "core_seconds"):
    """``module.function(*args)`` and the core-seconds (``clock``: ``core_seconds`` or ``own_seconds``) and wall
    seconds it took, its traces flushed inside: ``(value, core_s, wall_s)``. A lane calls it in its worker, so a
    part's CPU is measured in the process that ran it."""
    from tasks.stores import trace_writer

    fn, tick = getattr(importlib.import_module(module), function), globals()[clock]
    c0, w0 = tick(), time.perf_counter()
    value = fn(*args)
    trace_writer.flush()
    return value, tick() - c0, time.perf_counter() - w0


class _Run:
    """One run of a side: its folders, checkpoints, the parts' seconds, and ``schedule.StepFns`` whose stages run
    in this process or in the side's lanes."""

    def __init__(self, name: str, cfg, work: Path, start: str, steps: int, evals: dict[int, bool]):
        from flows.bench_step import _Side
        from tasks.training.lanes import get_lane

        self.side, self.cfg, self.start, self.steps, self.evals_at = _Side(name, cfg, work), cfg, start, steps, evals
        self.s, self.run = self.side.setups, f"bench-{name}"
        self.k, self.beside = cfg.rollout.staleness, cfg.eval.beside_training
        self.lanes = {"rollout": get_lane("rollout", cfg.engine.threads) if self.k else None,
                      "eval": get_lane("eval", cfg.engine.threads) if self.beside else None}
        for lane in filter(None, self.lanes.values()):  # started from this (the main) thread: see ``run_side``
            lane.call("os", "getpid")
        self.clock = "own_seconds" if self.k or self.beside else "core_seconds"
        self.core, self.wall = dict.fromkeys(PARTS, 0.0), dict.fromkeys(PARTS, 0.0)
        self.rows: dict[int, dict] = {}
        self.evals: dict[int, dict] = {}
        self.versions: dict[int, int] = {}
        self._lock = threading.Lock()

    def folder(self, step: int) -> Path:
        return self.side.work / "steps" / f"{step:06d}"

    def ckpt(self, version: int) -> str:
        return self.start if version == 0 else str(self.side.work / "checkpoints" / f"policy_{version:06d}")

    def version_of(self, ckpt: str) -> int:
        """The policy version of a checkpoint this run handed over (the start policy is version 0)."""
        return 0 if ckpt == self.start else int(Path(ckpt).name.removeprefix("policy_"))

    def _call(self, part: str, lane: str | None, module: str, function: str, *args):
        if self.lanes.get(lane) is not None:
            value, core, wall = self.lanes[lane].call(__name__, "measured", module, function, *args)
        else:
            value, core, wall = measured(module, function, *args, clock=self.clock)
        with self._lock:
            self.core[part] += core
            self.wall[part] += wall
        return value

    def rollout(self, step: int, version: int) -> None:
        folder, ckpt = self.folder(step), self.ckpt(version)
        folder.mkdir(parents=True, exist_ok=True)
        self.versions[step] = self.version_of(ckpt)
        self._call("rollout", "rollout", STAGES, "rollout_stage", folder, step, ckpt, self.run, self.s.rollout)
        self._call("score", "rollout", STAGES, "score_stage", folder, self.s.score)

    def train(self, step: int) -> None:
        folder = self.folder(step)
        self._call("mix", None, STAGES, "mix_stage", folder, self.s.mix)
        self._call("mix", None, STAGES, "advantage_stage", folder, self.s.advantage)
        self._call("update", None, STAGES, "update_stage", folder, self.ckpt(step), Path(self.ckpt(step + 1)),
                   self.s.update)

    def log(self, step: int, perf: dict[str, float]) -> bool:
        metrics = self._call("log", None, STAGES, "log_stage", self.folder(step), step, self.run, self.side.mlrun,
                             self.ckpt(step + 1), self.s.log, {"arm": "bench"})
        self.rows[step] = {"folder": str(self.folder(step)), **metrics, **perf}
        return False

    def evaluate(self, version: int) -> None:
        """As the train flow evaluates: the last evaluation's parts pulled by the evaluation and the (idle) rollout
        lane as each comes free, when both run beside training (``tasks.training.eval_shards``)."""
        from tasks.training.schedule import eval_on_both_lanes

        setup, ckpt, rolled, parts = self.s.eval_setup(self.evals_at[version]), self.ckpt(version), None, 1
        if eval_on_both_lanes(self.evals_at[version], self.k, self.beside):
            from tasks.training.eval_shards import part_count, roll_across

            lanes = ("eval", "rollout")
            parts = part_count(len(lanes))
            rolled = roll_across([partial(self._call, "eval", lane) for lane in lanes], ckpt, setup, parts)
        metrics = self._call("eval", "eval", STAGES, "eval_stage", self.run, version, ckpt, self.side.mlrun, setup,
                             None, None, rolled, parts)
        with self._lock:
            self.evals[version] = {k: v for k, v in metrics.items() if not k.startswith("time/")}

    def fns(self):
        from tasks.training.schedule import StepFns

        return StepFns(rollout=self.rollout, train=self.train, log=self.log, evaluate=self.evaluate,
                       eval_due=lambda version: version in self.evals_at)


def run_side(name: str, cfg, work: Path, start: str, steps: int, eval_at: int) -> dict:
    """One whole run of a side (evaluations at ``eval_at`` and ``steps``, the last at the final size): its wall
    and core-seconds, the parts', the waits, the rows of its steps and evaluations, the versions sampled.

    The side's lanes are started (when not running yet) by ``_Run`` in this thread before the run: a worker's
    ``PR_SET_PDEATHSIG`` fires when the *thread* that started it ends, so a lane first called from the executor's
    threads would be killed when the executor shuts down and restarted (torch imported, the engine loaded) in
    the next run's first call."""
    from concurrent.futures import ThreadPoolExecutor

    import torch

    from tasks.stores import db
    from tasks.training.schedule import EVAL_WAIT, PERF, run_steps

    torch.set_num_threads(cfg.trainer.threads)
    run = _Run(name, cfg, work, start, steps, {v: v == steps for v in (eval_at, steps) if 0 < v <= steps})
    c0, w0 = core_seconds(), time.perf_counter()
    with ThreadPoolExecutor(max_workers=8, thread_name_prefix=f"bench-{name}") as pool:
        timeline = run_steps(steps, run.fns(), run.k, pool.submit if run.k or run.beside else None, run.beside)
    if run.beside:  # the evaluation lane wrote row-log units; this process loads them, as the train flow does
        run._call("eval", None, "tasks.stores.db", "ingest", cfg.tracking.duckdb_path)
    wall, core = time.perf_counter() - w0, core_seconds() - c0
    db.try_ingest(cfg.tracking.duckdb_path)
    waits = {p: sum(timeline.perf[s].get(p, 0.0) for s in timeline.perf) for p in PERF}
    for ratio in ("perf/trainer_idle_ratio", "perf/rollouter_idle_ratio"):
        waits[ratio] /= max(len(timeline.perf), 1)
    return {"wall_s": wall, "core_s": core, "parts_core_s": run.core, "parts_wall_s": run.wall,
            "waits": {**waits, EVAL_WAIT: timeline.eval_wait_s}, "rows": [run.rows[s] for s in sorted(run.rows)],
            "evals": [run.evals[v] for v in sorted(run.evals)],
            "rollout_versions": [[s, run.versions[s]] for s in sorted(run.versions)],
            "token_versions": [_token_versions(run.folder(s)) for s in sorted(run.versions)]}


def _token_versions(folder: Path) -> list[int]:
    """The policy versions the trajectories of a step folder record for their sampled tokens (``sampled_version``;
    −1, an injected token's, left out)."""
    from tasks.stores.records import read_table

    versions = read_table(folder, "trajectories")["sampled_version"].explode().drop_nulls().unique().to_list()
    return sorted(v for v in versions if v >= 0)


def bench_async(config: str | Path = "configs/regimes/t4.yaml", work_dir: str | Path = "runs/bench-run",
                sides: tuple[str, ...] = tuple(SIDES), repeats: int = 2, steps: int = 6, eval_at: int = 3,
                arm: list[str] | None = None, overrides: list[str] | None = None, echo=print) -> dict:
    """Train every side's runs in ``run_order`` after a warm-up of each; print and return the report
    (``flows.bench_async_report``)."""
    import shutil

    from flows.bench_async_report import report
    from flows.bench_step import _config
    from flows.prepare import ensure_policy, start_policy
    from tasks.data.loader import ensure_files
    from tasks.stores import trace_writer
    from tasks.training import live

    check_sides(list(sides))
    work = Path(work_dir).resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    extra = [*(MASK_RAW0 if arm is None else arm), *RUN, *ONE_PASS, *(overrides or [])]
    cfgs = {name: _config(Path(config), work, "after", [*extra, *SIDES[name].overrides]) for name in sides}
    first = cfgs[sides[0]]
    ensure_files(first.data)
    ensure_policy(first)
    start = str(start_policy(first, first.model.path, work / "start-policy"))
    results: dict[str, list[dict]] = {name: [] for name in sides}
    order = run_order(list(sides), repeats)
    try:
        for name in sides:
            run_side(f"warm-{name}", cfgs[name], work, start, 1, 1)
        load = [os.getloadavg()]
        for name, rep in order:
            results[name].append(run_side(f"{name}-r{rep}", cfgs[name], work, start, steps, eval_at))
            echo(f"{name} repeat {rep}: {results[name][-1]['wall_s']:.0f} s wall, "
                 f"{results[name][-1]['core_s']:.0f} core-s (load {os.getloadavg()[0]:.1f})")
    finally:
        trace_writer.flush()
        live.close_live()
    load.append(os.getloadavg())
    return report(results, order, cfgs, {n: SIDES[n].checked for n in sides}, load, steps, eval_at, echo)
