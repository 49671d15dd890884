"""Check what ``make demo`` left in a fresh clone: CI runs it after the demo (``.ci/run``).

    python infra/check_demo.py demo.log [--config configs/tiny.yaml]

Reads the stores the demo wrote (the config's MLflow store and DuckDB file) and the demo's printed output, and
fails with every missing item listed: one finished MLflow run with every step's metrics, traces, logged models, a
registered model whose ``@best`` alias resolves, DuckDB rows for every step (trajectories, turns, tool executions,
SAAR events, metrics, evaluations), and the printed "where to look" block with the training-view link. Prints a
one-line summary when everything is there.

What a newcomer reads is checked too (``check_output``): from the "training" rule on, one line per step, an
evaluation line per evaluation, the summary (start → final held-out pass@1, best checkpoint, wall time), none of the
libraries' bookkeeping (weight-loading or shard-writing bars, Prefect task or flow state lines, the temporary
server's banner, MLflow's database messages), and at most ``OVERHEAD`` lines besides the step and evaluation lines:
28 lines for the demo's 10 steps and 3 evaluations.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BLOCK = ("MLflow UI:", "cleaner ui --config", "workflowType=machine_learning", "Policy:", "@best", "DuckDB:")
NOISE = ("Loading weights", "Writing model shards", "Finished in state", "Task run '", "Beginning flow run",
         "View at http", "temporary server", "MLflow database tables", "Traceback")
"""What the demo's output must not hold: the libraries' bookkeeping (and no traceback)."""
OVERHEAD = 15
"""Lines of the training part besides the step and evaluation lines: the rule, the plan, the run's MLflow link, the
summary (3), the results rule, the where-to-look block (5), and 3 to spare."""
STEP_LINE = re.compile(r"^step (\d+) \| reward \S+ \| accuracy \S+ \| first try \S+ \| rollbacks \d+ \(\d+ recovered\) \| "
                       r"(loss \S+|no informative groups \(\d+ dropped\)) \| [\d.]+ s$")
EVAL_LINE = re.compile(r"^eval policy (\d+)( \(the starting policy\))? \| pass@1 SAAR off [\d.]+( \(start [\d.]+\))? \| "
                       r"pass@1 SAAR on [\d.]+( \(start [\d.]+\))? \| first try \S+( \(start \S+\))? \| [\d.]+ s$")
SUMMARY = {"run <id> finished in <time>; final checkpoint <folder>":
           re.compile(r"^run \S+ finished in \d+ (min \d+ )?s; final checkpoint \S+$"),
           "held-out pass@1 SAAR off: <start> at the start → <final> after <n> steps":
           re.compile(r"^held-out pass@1 SAAR off: [\d.]+ at the start → [\d.]+ after \d+ steps?$"),
           "best checkpoint: policy <v> (pass@1 SAAR off <x>): <folder> | models:/<name>/<version>":
           re.compile(r"^best checkpoint: policy \d+ \(pass@1 SAAR off [\d.]+\): .+models:/\S+/\d+")}
"""The summary's lines (a name for each pattern)."""


def check_output(text: str, steps: int, evaluations: list[int]) -> list[str]:
    """What is wrong with the demo's printed output (``text``) for a run of ``steps`` steps evaluating the policy
    versions ``evaluations``; empty when it reads as it should."""
    missing = [f"no {noise!r} in the output" for noise in NOISE if noise in text]
    lines = [ln.rstrip() for ln in text.splitlines() if ln.strip()]
    start = next((i for i, ln in enumerate(lines) if "─ training ─" in ln), 0)  # after a warm-up's own output
    lines = lines[start:]
    step_lines = [int(m.group(1)) for m in map(STEP_LINE.match, lines) if m]
    if step_lines != list(range(steps)):
        missing.append(f"one line per step, steps 0..{steps - 1} in order (found steps {step_lines})")
    eval_lines = [int(m.group(1)) for m in map(EVAL_LINE.match, lines) if m]
    if eval_lines != evaluations:
        missing.append(f"an evaluation line for policies {evaluations} (found {eval_lines})")
    missing += [f"the summary line {name!r}" for name, rx in SUMMARY.items() if not any(map(rx.match, lines))]
    bound = OVERHEAD + steps + len(evaluations)
    if len(lines) > bound:
        missing.append(f"at most {bound} lines from the training rule on (found {len(lines)})")
    return missing


def check_mlflow(cfg, missing: list[str]) -> str:
    from mlflow import MlflowClient

    from tasks.stores.tracking import RUN_TAG, STEP_SENTINEL

    client = MlflowClient(cfg.tracking.mlflow_uri)
    exp = client.get_experiment_by_name(cfg.tracking.experiment or cfg.name)
    if exp is None:
        missing.append(f"MLflow experiment {cfg.tracking.experiment or cfg.name!r}")
        return ""
    runs = client.search_runs([exp.experiment_id], filter_string="attributes.status = 'FINISHED'")
    runs = [r for r in runs if RUN_TAG in r.data.tags]
    if len(runs) != 1:
        missing.append(f"exactly one finished training run in MLflow (found {len(runs)})")
        return ""
    run = runs[0]
    steps = sorted(m.step for m in client.get_metric_history(run.info.run_id, STEP_SENTINEL))
    if steps != list(range(cfg.train.steps)):
        missing.append(f"metrics of steps 0..{cfg.train.steps - 1} (found {steps})")
    traces = client.search_traces(locations=[exp.experiment_id], max_results=5)
    if not traces:
        missing.append("traces")
    if not client.search_logged_models([exp.experiment_id]):
        missing.append("logged models")
    name = cfg.tracking.registered_model or cfg.name
    try:
        best = client.get_model_version_by_alias(name, "best")
    except Exception as err:  # noqa: BLE001 — any failure to resolve the alias is what this check reports
        missing.append(f"registered model {name}@best ({type(err).__name__})")
        best = None
    return (f"MLflow run {run.info.run_id} ({len(steps)} steps, traces, logged models"
            + (f", {name}@best = version {best.version})" if best else ")"))


def check_duckdb(cfg, run_id: str, missing: list[str]) -> str:
    from tasks.stores.db import query

    store, counts = cfg.tracking.duckdb_path, {}
    for table in ("trajectories", "turns", "tool_executions", "saar_events", "metrics"):
        steps = query(store, f"SELECT count(DISTINCT step) FROM {table} WHERE run_id = ?", [run_id]).item()
        counts[table] = steps
        if steps != cfg.train.steps:
            missing.append(f"DuckDB {table} rows of every step (steps with rows: {steps})")
    evals = query(store, "SELECT count(*) FROM evaluations WHERE run_id = ?", [run_id]).item()
    if not evals:
        missing.append("DuckDB evaluations")
    return f"DuckDB rows for {cfg.train.steps} steps in {', '.join(counts)}; {evals} evaluation rows"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", type=Path, help="The demo's captured output.")
    parser.add_argument("--config", default="configs/tiny.yaml")
    args = parser.parse_args()
    from flows.config import load_config

    cfg = load_config(args.config, [])
    missing: list[str] = []
    text = " ".join(args.log.read_text(errors="replace").split())
    missing += [f"printed block: {head!r}" for head in BLOCK if head not in text]
    missing += check_output(args.log.read_text(errors="replace"), cfg.train.steps, evaluations(cfg))
    mlflow_line = check_mlflow(cfg, missing)
    run_id = _run_id(cfg)
    db_line = check_duckdb(cfg, run_id, missing) if run_id else ""
    if missing:
        print("make demo left an incomplete result; missing:\n  " + "\n  ".join(missing))
        return 1
    print(f"demo ok: {mlflow_line}; {db_line}; the where-to-look block printed; the output reads as it should "
          f"(a line per step and evaluation, the summary, no library bookkeeping)")
    return 0


def evaluations(cfg) -> list[int]:
    """The policy versions a run of ``cfg`` evaluates, in order."""
    from flows.train import eval_due

    return [v for v in range(cfg.train.steps + 1) if eval_due(cfg, v)]


def _run_id(cfg) -> str | None:
    from tasks.stores.db import query

    rows = query(cfg.tracking.duckdb_path, "SELECT run_id FROM runs WHERE status = 'finished'")["run_id"].to_list()
    return rows[0] if len(rows) == 1 else None


if __name__ == "__main__":
    sys.exit(main())
