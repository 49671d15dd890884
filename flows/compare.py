"""Prefect flow ``compare``: CLEANER vs the DAPO baseline (and side arms), over several seeds, in parallel.

1. **Initial evaluation**, once: the starting policy on the fixed held-out prompts at the final
   evaluation's size (``eval.final_prompts × eval.final_samples``), SAAR off and on, and on the fresh split
   when ``data.fresh_path`` is set; it is step 0 of every run (all runs start from the same policy).
2. **Training**: every arm × seed (``compare.seeds``, or ``compare.arm_seeds[arm]``) is a child
   ``cleaner train`` process with one torch thread, ``compare.parallel`` at a time (one per
   core) — or, with ``compare.dispatch`` (``--dispatch train/train-tiny-fanout``), a flow run of that
   deployment on its work pool's workers, on any machine (``flows/dispatch.py``: progress, lost
   workers' runs rescheduled and resumed; docs/team.md). The same seed means the same data order in
   every arm, so runs pair up by seed. Each
   child is its own Prefect flow run and a child MLflow run under the parent; all write the rows of
   ``tracking.duckdb_path`` through its row log (docs/store.md), so none waits for another. Each run
   evaluates with SAAR off and on every ``compare.eval_every`` steps (``eval.n_prompts × eval.samples``)
   and at its last step at the final size.
3. **Fixed-probe entropy** (``tasks.training.probe``): every run's final checkpoint scores the same tokens
   (the starting policy's own on ``compare.probe_prompts`` held-out prompts), instead of ``train/entropy``
   (each arm's own trained tokens), so arms compare like for like.
4. **Report** (``tasks.reports.compare``): per seed and paired across arms, JSON + Markdown + PNGs
   in ``<output_dir>/<compare id>/report/`` and the parent run's ``report/`` artifacts; the registered contrasts
   (``compare.contrasts``, ``compare.primary``) and the mediators per arm (``tasks.reports.mediators``) with them.

A rerun with the same ``compare_id`` resumes: finished child runs are cached by their own
flows (their stages are skipped). With ``compare.records_dir``, each run that finishes writes its record there
(``tasks.stores.run_records``), a rerun on any clone trains no run that has one, and the report is built from the
records alone: a study spread over sessions keeps its runs in the repository. Run: ``cleaner compare --config configs/tiny.yaml``;
``--set 'compare.add_arms=[r3l]'`` adds R3L as an arm (``flows.config.ARM_PRESETS``; docs/methods.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from flows.config import CompareConfig, RunConfig, load_config
from flows.train_log import duration, eval_line, outcome_line
from models.termination import arm
from tasks.reports import contrasts, mediators
from tasks.reports.compare import headline, summarize, write_report
from tasks.reports.compare_extra import COMPUTE_KEYS
from tasks.stores import db, links, run_records, tracking


def arm_overrides(shared: list[str], arm: list[str], steps: int, every: int, initial_shared: bool) -> list[str]:
    out = [*shared, *arm, f"train.steps={steps}", f"train.eval_every={every}", "eval.modes=[saar_off,saar_on]"]
    return out + (["train.eval_at_start=false"] if initial_shared else [])


def jobs_of(cfg: RunConfig) -> list[tuple[str, int]]:
    """(arm, seed) pairs, seed-major so that the runs of one seed (a pair) finish close together."""
    cmp = cfg.compare
    seeds = sorted({s for arm in cmp.arms for s in cmp.seeds_of(arm)})
    return [(arm, s) for s in seeds for arm in cmp.arms if s in cmp.seeds_of(arm)]


def compare_jobs(cfg: RunConfig, overrides: list[str] | None, compare_id: str) -> list[tuple[str, int, str, list[str]]]:
    """(arm, seed, run id, the child's overrides) of every run of the comparison, in ``jobs_of`` order."""
    cmp = cfg.compare
    shared_initial = cmp.shared_initial_eval and cfg.env is None  # environment runs evaluate their own start
    return [(arm, seed, f"{compare_id}-{arm}-s{seed}",
             [*(overrides or []), *arm_overrides(cmp.shared, cmp.arms[arm], cmp.steps, cmp.eval_every, shared_initial),
              f"tracking.arm={arm}", f"seed={seed}"])
            for arm, seed in jobs_of(cfg)]


@task(name="initial-eval", cache_policy=NO_CACHE)
def initial_eval_task(cfg: RunConfig, run_id: str, mlrun: str, folder: str) -> dict:
    """Evaluate the starting policy once, at the final evaluation's size (SAAR off and on)."""
    from flows.prepare import ensure_policy
    from tasks.data.loader import ensure_files
    from tasks.training import live, stages

    config = cfg.model_dump(mode="json")
    kept = run_records.read_initial(folder, config)
    if kept is not None:
        return kept
    ensure_files(cfg.data)
    ensure_policy(cfg)
    final = cfg.setups().eval_setup(final=True)  # with the fresh split when data.fresh_path is set
    setup = final.model_copy(update={"eval": final.eval.model_copy(update={"modes": ["saar_off", "saar_on"]})})
    metrics = stages.eval_stage(run_id, 0, cfg.model.path, mlrun, setup)
    live.close_live()
    run_records.write_initial(folder, config, metrics)
    return metrics


def _api_url() -> str | None:
    """The Prefect API this flow talks to (the temporary server in ephemeral mode), for the child runs."""
    from prefect.client.orchestration import get_client

    url = str(get_client().api_url or "")
    return url if url.startswith("http") else None


def _train_process(config_path: str, overrides: list[str], run_id: str, parent: str | None, log: Path,
                   api_url: str | None, records: str | None = None, probe_path: str | None = None) -> str:
    """One child run as a ``cleaner train`` process with one torch thread; raises with its log's tail. With
    ``records`` (``compare.records_dir``), the finished run's record is written there before it counts as done.

    The child talks to this flow's Prefect API (no temporary server of its own to start), so its
    flow run sits beside the compare's in the same Prefect database.
    """
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    if api_url:
        env["PREFECT_API_URL"] = api_url
    argv = [sys.executable, "-m", "flows.cli", "train", "--config", config_path, "--run-id", run_id,
            *(["--parent-mlflow-run", parent] if parent else [])]
    for o in overrides:
        argv += ["--set", o]
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    with log.open("w") as fh:
        code = subprocess.run(argv, stdout=fh, stderr=subprocess.STDOUT, env=env).returncode
    if code != 0:
        tail = "".join(log.read_text().splitlines(keepends=True)[-30:])
        raise RuntimeError(f"compare run {run_id} failed (exit {code}); log {log}:\n{tail}")
    if records:
        record_run(config_path, overrides, run_id, records, probe_path, time.time() - t0)
    print(f"{run_id} finished in {duration(time.time() - t0)}: {run_outcome(config_path, overrides, run_id)}")
    return run_id


def record_run(config_path: str, overrides: list[str], run_id: str, records: str, probe_path: str | None,
               wall_s: float) -> Path:
    """Write a finished run's record (``tasks.stores.run_records``) from its rows and its final checkpoint."""
    import polars as pl

    from tasks.training.probe import final_checkpoint, probe_entropy

    cfg = load_config(config_path, overrides)
    path, ids = cfg.tracking.duckdb_path, [run_id]
    probe = (probe_entropy(final_checkpoint(Path(cfg.output_dir) / run_id), pl.read_parquet(probe_path))
             if probe_path else None)
    return run_records.write(records, run_records.make(
        run_id, overrides, cfg.model_dump(mode="json"), db.evaluation_rows(path, ids), db.run_metrics(path, run_id),
        db.kept_kinds(path, ids), probe, wall_s))


def run_outcome(config_path: str, overrides: list[str], run_id: str) -> str:
    """A finished child run's held-out outcome, from its rows (``flows.train_log.outcome_line``)."""
    rows = db.eval_pass_at_1(load_config(config_path, overrides).tracking.duckdb_path, run_id).to_dicts()
    evals: dict[int, dict[str, float]] = {}
    for row in rows:
        evals.setdefault(int(row["policy_version"]), {})[row["key"]] = row["value"]
    return outcome_line(evals)


def _recorded(config_path: str, jobs: list[tuple[str, str, list[str]]], records: str | None) -> set[str]:
    """Check every job's configuration; the run ids of those with a record in ``records`` (each made by the same
    resolved configuration, or ``run_records.RecordMismatch`` names the fields that differ), announced as reused."""
    done = set()
    for _, run_id, ov in jobs:
        cfg = load_config(config_path, ov)
        if records and run_records.read(records, run_id, cfg.model_dump(mode="json")):
            print(f"{run_id}: reused from its record in {records}")
            done.add(run_id)
    return done


@task(name="compare-runs", cache_policy=NO_CACHE)
def runs_task(config_path: str, jobs: list[tuple[str, str, list[str]]], parent: str, folder: str, parallel: int,
              records: str | None = None, probe_path: str | None = None) -> list[str]:
    """Train every (arm, run id, overrides) job, ``parallel`` processes at a time, each writing its record to
    ``records`` when set (with its fixed-probe entropy over ``probe_path``'s probe). Interrupted (SIGTERM through
    ``models.termination``, Ctrl-C), it starts no further job: the queued ones are cancelled, and only the runs in
    flight are waited for (a signal to the process group ends them too; each resumes from its stage cache)."""
    logs = Path(folder) / "logs"
    api_url = _api_url()
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        futures = [pool.submit(_train_process, config_path, ov, run_id, parent, logs / f"{run_id}.log", api_url,
                               records, probe_path) for _, run_id, ov in jobs]
        try:
            return [_result(f) for f in futures]
        except KeyboardInterrupt:
            for f in futures:
                f.cancel()
            raise


def _result(future):
    """A future's result, waited for in short slices: a signal's handler (SIGTERM's ``KeyboardInterrupt``) runs
    between them, where one untimed wait would hold it until the future is done."""
    while True:
        try:
            return future.result(timeout=0.5)
        except TimeoutError:
            continue


@task(name="compare-probe-build", cache_policy=NO_CACHE)
def probe_build_task(cfg: RunConfig, folder: str) -> str:
    """The fixed probe's file in ``folder``, rolled out once by the starting policy (``tasks.training.probe``)."""
    from tasks.training.probe import PROBE_FILE, build_probe

    path = Path(folder) / PROBE_FILE
    build_probe(cfg.model.path, cfg.setups().eval, cfg.compare.probe_prompts, path)
    return str(path)


@task(name="compare-probe", cache_policy=NO_CACHE)
def probe_task(cfg: RunConfig, folder: str, run_ids: list[str]) -> dict[str, dict]:
    """Fixed-probe entropy of every run's final checkpoint (``tasks.training.probe``), the probe built once."""
    import polars as pl

    from tasks.training.probe import final_checkpoint, probe_entropy

    probe = pl.read_parquet(probe_build_task.fn(cfg, folder))
    return {r: probe_entropy(final_checkpoint(Path(cfg.output_dir) / r), probe) for r in run_ids}


@task(name="compare-dispatch", cache_policy=NO_CACHE)
def dispatch_task(cmp: CompareConfig, config_path: str, jobs: list[tuple[str, str, list[str]]], parent: str,
                  token: dict[str, str], duckdb_path: str) -> list[str]:
    """Run every (arm, run id, overrides) job as a flow run of the ``compare.dispatch`` deployment on its workers,
    ingesting their rows into ``duckdb_path`` from this process as they come (the runs never open it)."""
    from flows import dispatch

    dispatch.ensure_lost_run_automation(cmp.lost_after_s)
    todo = [dispatch.Job(run_id, {"config_path": config_path, "overrides": ov, "run_id": run_id,
                                  "parent_mlflow_run": parent, "store_token": token}) for _, run_id, ov in jobs]
    done = dispatch.run_all(cmp.dispatch, todo, cmp.parallel, cmp.retries, cmp.heartbeat_s,
                            on_poll=lambda: db.try_ingest(duckdb_path))
    return [j.run_id for j in done]


def _store_token(cfg: RunConfig, folder: Path) -> dict[str, str]:
    """The token files each dispatched run must see before it trains (``tasks.stores.shared``)."""
    from flows.dispatch import shared_files
    from tasks.data.loader import ensure_files
    from tasks.stores.shared import token_paths, write_token

    ensure_files(cfg.data)  # the data files' sizes go into the token: each run checks it sees the same ones
    return write_token(token_paths(folder, cfg.tracking.duckdb_path), shared_files(cfg))


def _check_dispatch(deployment: str) -> None:
    """The deployment exists (a clear error before any work otherwise); say when no worker polls its pool yet."""
    from flows.dispatch import check_deployment

    found = check_deployment(deployment)
    if not found["online_workers"]:
        print(f"no worker polls work pool {found['pool']!r} yet: runs wait until one does "
              f"(`prefect worker start --pool {found['pool']} --limit 1` on any machine; docs/team.md)")


@task(name="compare-report", cache_policy=NO_CACHE)
def report_task(duckdb_path: str, runs: dict[str, list[str]], baseline: str, treatment: str, folder: str,
                initial: dict | None, keys: tuple[str, str] | None = None, probe: dict | None = None,
                cmp: CompareConfig | None = None, records: str | None = None) -> dict:
    """The report; with ``cmp``, its registered contrasts (``compare.contrasts``, ``compare.primary``) and the
    mediators paired per ``compare.pair_with`` (tool-use runs only: environment runs have neither). With
    ``records`` (``compare.records_dir``), every row comes from the runs' records, none from the store."""
    ids = [r for ids in runs.values() for r in ids]
    if records:
        evals, metrics, kinds = run_records.frames(run_records.load(records, ids))
        totals = run_records.totals(metrics, COMPUTE_KEYS)
        train = run_records.totals(metrics, mediators.TRAIN_KEYS, (mediators.HACK_PREFIX,))
    else:
        evals, kinds = db.evaluation_rows(duckdb_path, ids), db.kept_kinds(duckdb_path, ids)
        totals = db.step_totals(duckdb_path, ids, COMPUTE_KEYS)
        train = db.step_totals(duckdb_path, ids, mediators.TRAIN_KEYS, prefixes=[mediators.HACK_PREFIX])
    summary = summarize(evals, runs, baseline, treatment, kinds, initial, *(keys or ()), probe=probe, totals=totals)
    if keys is None:
        summary |= {"contrasts": contrasts.summarize(evals, runs, cmp.contrasts if cmp else {},
                                                     cmp.primary if cmp else None, mediators.MEDIATORS),
                    "mediators": mediators.summarize(evals, runs, baseline, cmp.pair_with if cmp else {}, train)}
    write_report(summary, Path(folder))
    return summary


@flow(name="compare", log_prints=True, on_running=[arm])
def compare_flow(config_path: str = "configs/tiny.yaml", overrides: list[str] | None = None,
                 compare_id: str | None = None) -> dict:
    """Evaluate the starting policy once, train every arm × seed in parallel, write the comparison report."""
    cfg = load_config(config_path, overrides)
    cmp = cfg.compare
    compare_id = compare_id or f"compare-{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    folder = Path(cfg.output_dir) / compare_id
    if cmp.dispatch:
        from flows.dispatch import check_storage

        check_storage(cfg, f"compare.dispatch ({cmp.dispatch})")  # before any run starts, or any server is asked
        _check_dispatch(cmp.dispatch)
        token = _store_token(cfg, folder)
    shared_initial = cmp.shared_initial_eval and cfg.env is None  # environment runs evaluate their own start
    jobs = [(arm, run_id, ov) for arm, _, run_id, ov in compare_jobs(cfg, overrides, compare_id)]
    done = _recorded(config_path, jobs, cmp.records_dir)  # a bad arm or override fails now, not after hours
    kept = Path(cmp.records_dir or folder)  # where the initial evaluation and the probe are kept
    parent = tracking.open_run(cfg.tracking, cfg.tracking.experiment or cfg.name, compare_id,
                               cfg.model_dump(mode="json"), {"cleaner.kind": "compare"})
    seeds = sorted({s for _, s in jobs_of(cfg)})
    links.set_description(cfg.tracking, parent, links.describe_compare(compare_id, cfg.name, None, seeds,
                                                                       list(cmp.arms)))
    t0 = time.time()
    initial = None
    if shared_initial:
        eval_cfg = load_config(config_path, [*(overrides or []), *cmp.shared])
        initial = initial_eval_task(eval_cfg, f"{compare_id}-initial", parent, str(kept))
        print(eval_line(0, initial))
    with_probe = shared_initial and cmp.probe_prompts > 0
    if cmp.dispatch:
        dispatch_task(cmp, config_path, jobs, parent, token, cfg.tracking.duckdb_path)
    else:
        probe_path = probe_build_task(eval_cfg, str(kept)) if cmp.records_dir and with_probe else None
        runs_task(config_path, [j for j in jobs if j[1] not in done], parent, str(folder), cmp.parallel,
                  cmp.records_dir, probe_path)
    db.try_ingest(cfg.tracking.duckdb_path)
    runs = {arm: [rid for a, rid, _ in jobs if a == arm] for arm in cmp.arms}
    keys = None
    if cfg.env is not None:
        played = cfg.env.eval_name or cfg.env.name
        keys = (f"eval/{played}/success", f"eval/{played}/valid_action_rate")
    probe = None
    if with_probe:
        probe = ({r["run_id"]: r["probe"] for r in run_records.load(cmp.records_dir, [r for _, r, _ in jobs])}
                 if cmp.records_dir else probe_task(eval_cfg, str(folder), [r for _, r, _ in jobs]))
    summary = report_task(cfg.tracking.duckdb_path, runs, cmp.baseline, cmp.treatment, str(folder / "report"),
                          initial, keys, probe, cmp, cmp.records_dir)
    summary["wall_s"] = round(time.time() - t0, 1)
    (folder / "report" / "compare.json").write_text(json.dumps(summary, indent=1))
    for f in sorted((folder / "report").iterdir()):
        tracking.log_file(cfg.tracking, parent, f, "report")
    links.set_description(cfg.tracking, parent, links.describe_compare(compare_id, cfg.name, summary, seeds))
    tracking.finish_run(cfg.tracking, parent)
    print("\n".join([*headline(summary), "", f"the full report: {folder / 'report' / 'compare.md'} (plots beside it, "
                     f"and in the MLflow run {compare_id})"]))
    return summary
