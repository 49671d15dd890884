"""A finished 4-step run trained again with ``train.steps=6`` runs only steps 4 and 5.

Stage cache keys hash only what each stage reads (``tasks.training.setups``); ``train.steps``
is read by none, so the second call reuses every finished stage and evaluation and continues
from the last checkpoint. Checked three ways: the stage functions called (counted by wrapping
them), the step files on disk (untouched), and both stores (DuckDB rows and MLflow metrics of
steps 0-5, once each, with steps 0-3 as logged the first time). Before the per-stage keys every stage key
hashed the whole run config (``RunConfig.hash()``, ``train.steps`` included), so this rerun recomputed
every finished step and evaluation.

Run: ``pytest tests/test_extend_run.py``.
"""

from __future__ import annotations

from collections import Counter

import duckdb
import pytest
from mlflow.tracking import MlflowClient

from tasks.stores.tracking import RUN_TAG
from tests.flowrun import tiny_overrides

STAGE_FUNCS = ("rollout_stage", "score_stage", "mix_stage", "advantage_stage", "update_stage", "log_stage")
pytestmark = pytest.mark.slow  # two tiny flow runs, 4 + 2 steps (~2-3 min on 2 busy cores)
EVAL = ["train.eval_every=2", "eval.n_prompts=2", "eval.samples=1", "eval.ks=[1]", "eval.modes=[saar_off]"]


def _count_calls(monkeypatch) -> Counter:
    """Wrap the stage functions so each call is counted as (stage, step or policy version)."""
    from tasks.training import stages

    calls: Counter = Counter()
    for name in STAGE_FUNCS:
        real = getattr(stages, name)

        def wrapped(step_dir, *args, _real=real, _name=name):
            calls[(_name.removesuffix("_stage"), int(step_dir.name))] += 1
            return _real(step_dir, *args)

        monkeypatch.setattr(stages, name, wrapped)
    real_eval = stages.eval_stage

    def eval_wrapped(run_id, version, *args):
        calls[("eval", version)] += 1
        return real_eval(run_id, version, *args)

    monkeypatch.setattr(stages, "eval_stage", eval_wrapped)
    return calls


def _files(run_dir, steps) -> dict[str, int]:
    return {str(f.relative_to(run_dir)): f.stat().st_mtime_ns
            for s in steps for f in sorted((run_dir / "steps" / f"{s:06d}").iterdir())}


def test_extending_steps_runs_only_the_new_steps(prefect_harness, warm_model_dir, tmp_path, monkeypatch):
    from flows.train import train

    calls = _count_calls(monkeypatch)
    first = train("configs/tiny.yaml", [*tiny_overrides(tmp_path, warm_model_dir, steps=4), *EVAL], "extend")
    assert {k for k in calls if k[0] == "rollout"} == {("rollout", s) for s in range(4)}
    assert sorted(v for (stage, v) in calls if stage == "eval") == [0, 2, 4]
    run_dir = tmp_path / "runs" / "extend"
    before = _files(run_dir, range(4))
    store = str(tmp_path / "cleaner.duckdb")
    with duckdb.connect(store, read_only=True) as con:
        logged_at = con.execute("SELECT step, logged_at FROM steps WHERE run_id = 'extend' ORDER BY step").fetchall()
    assert [s for s, _ in logged_at] == [0, 1, 2, 3]
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    (mlrun,) = client.search_runs([client.get_experiment_by_name("tiny").experiment_id],
                                  filter_string=f"tags.`{RUN_TAG}` = 'extend'")
    history = {m.step: m.timestamp for m in client.get_metric_history(mlrun.info.run_id, "time/rollout_s")}

    calls.clear()
    second = train("configs/tiny.yaml", [*tiny_overrides(tmp_path, warm_model_dir, steps=6), *EVAL], "extend")

    expected = {(stage.removesuffix("_stage"), s): 1 for stage in STAGE_FUNCS for s in (4, 5)}
    assert dict(calls) == {**expected, ("eval", 6): 1}
    assert _files(run_dir, range(4)) == before
    assert second["final_checkpoint"].endswith("policy_000006") and first["mlflow_run_id"] == second["mlflow_run_id"]
    with duckdb.connect(store, read_only=True) as con:
        steps = con.execute("SELECT step, logged_at FROM steps WHERE run_id = 'extend' ORDER BY step").fetchall()
        per_step = con.execute("SELECT step, count(*) FROM trajectories WHERE run_id = 'extend' GROUP BY step "
                               "ORDER BY step").fetchall()
        versions = con.execute("SELECT DISTINCT policy_version FROM evaluations WHERE run_id = 'extend' "
                               "ORDER BY 1").fetchall()
    assert steps[:4] == logged_at and [s for s, _ in steps] == [0, 1, 2, 3, 4, 5]
    assert per_step == [(s, 16) for s in range(6)]
    assert [v for (v,) in versions] == [0, 2, 4, 6]
    after = client.get_metric_history(mlrun.info.run_id, "time/rollout_s")
    assert sorted(m.step for m in after) == [0, 1, 2, 3, 4, 5]
    assert {m.step: m.timestamp for m in after if m.step < 4} == history
