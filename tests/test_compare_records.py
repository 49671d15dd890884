"""A comparison's runs kept as committed records (``compare.records_dir``, ``tasks.stores.run_records``): a rerun on
a fresh clone trains nothing that has a record and rebuilds the same report; a record of another configuration is
refused, naming what differs."""

from __future__ import annotations

import json
import shutil

import polars as pl
import pytest

from tasks.stores import run_records
from tests.flowrun import run_log_lines, tiny_overrides

CONFIG = {"seed": 3, "trainer": {"lr": 1e-4, "threads": 1}, "rollout": {"staleness": 0},
          "compare": {"parallel": 1}, "tracking": {"duckdb_path": "a.duckdb"}}


def _record(tmp_path, config=CONFIG, overrides=("seed=3",)):
    evals = pl.DataFrame({"policy_version": [0, 2], "key": ["eval/saar_off/all/pass_at_1"] * 2, "value": [0.25, 0.5]})
    metrics = pl.DataFrame({"step": [0, 1, 0, 1], "key": ["rollout/sampled_tokens"] * 2 + ["score/suspected_hacks/x"] * 2,
                            "value": [100.0, 120.0, 1.0, 0.0]})
    kinds = pl.DataFrame({"kind": ["purified"], "n": [5], "reward": [0.8], "advantage": [0.1]})
    rec = run_records.make("cmp-a-s3", list(overrides), config, evals, metrics, kinds, {"entropy": 1.5, "tokens": 9.0}, 12.34)
    return run_records.write(tmp_path, rec)


def test_record_round_trip_gives_the_stores_rows_and_totals(tmp_path):
    path = _record(tmp_path)
    assert path.name == "cmp-a-s3.json" and not list(tmp_path.glob(".*.tmp"))  # written whole, then renamed
    rec = run_records.read(tmp_path, "cmp-a-s3", CONFIG)
    assert rec["probe"] == {"entropy": 1.5, "tokens": 9.0} and rec["wall_s"] == 12.3 and rec["overrides"] == ["seed=3"]
    assert "compare" not in rec["config"] and "tracking" not in rec["config"]
    evals, metrics, kinds = run_records.frames(run_records.load(tmp_path, ["cmp-a-s3"]))
    assert evals.rows() == [("cmp-a-s3", 0, "eval/saar_off/all/pass_at_1", 0.25),
                            ("cmp-a-s3", 2, "eval/saar_off/all/pass_at_1", 0.5)]
    assert kinds.rows() == [("cmp-a-s3", "purified", 5, 0.8, 0.1)]
    assert metrics.height == 4
    sums = run_records.totals(metrics, ("rollout/sampled_tokens",))
    assert sums.rows() == [("cmp-a-s3", "rollout/sampled_tokens", 220.0, 2)]  # 100 + 120 over 2 steps
    hacks = run_records.totals(metrics, (), ("score/suspected_hacks/",))
    assert hacks.rows() == [("cmp-a-s3", "score/suspected_hacks/x", 1.0, 2)]


def test_no_record_means_train(tmp_path):
    assert run_records.read(tmp_path, "cmp-a-s3", CONFIG) is None
    with pytest.raises(FileNotFoundError, match="no run record for cmp-a-s3"):
        run_records.load(tmp_path, ["cmp-a-s3"])


def test_where_rows_go_does_not_make_another_run(tmp_path):
    _record(tmp_path)
    moved = {**CONFIG, "compare": {"parallel": 2}, "tracking": {"duckdb_path": "b.duckdb"}}
    assert run_records.read(tmp_path, "cmp-a-s3", moved) is not None


def test_a_record_of_another_configuration_is_refused_naming_the_field(tmp_path):
    _record(tmp_path)
    other = {**CONFIG, "trainer": {"lr": 2e-4, "threads": 1}}
    with pytest.raises(run_records.RecordMismatch, match=r"cmp-a-s3\.json .*fields that differ: trainer\.lr\)"):
        run_records.read(tmp_path, "cmp-a-s3", other)
    added = {**CONFIG, "rollout": {"staleness": 0, "extra_turns": 2}}
    with pytest.raises(run_records.RecordMismatch, match=r"rollout\.extra_turns"):
        run_records.read(tmp_path, "cmp-a-s3", added)


def test_a_damaged_or_foreign_record_is_refused(tmp_path):
    path = _record(tmp_path)
    path.write_text(path.read_text()[:40])
    with pytest.raises(run_records.RecordMismatch, match="not valid JSON"):
        run_records.read(tmp_path, "cmp-a-s3", CONFIG)
    _record(tmp_path)
    path.write_text(json.dumps({**json.loads(path.read_text()), "version": 99}))
    with pytest.raises(run_records.RecordMismatch, match="version 99"):
        run_records.read(tmp_path, "cmp-a-s3", CONFIG)


def test_records_refuse_dispatch():
    from flows.config import CompareConfig

    with pytest.raises(ValueError, match="records_dir 'r' with dispatch 'train/x'"):
        CompareConfig(records_dir="r", dispatch="train/x")


def _fresh_clone(work, n):
    """Everything a session's machine held goes but the committed records and the data files; the overrides of new
    stores (this process keeps its MLflow engine open on the old file, which a new clone's process would not)."""
    for p in work.iterdir():
        if p.name not in {"records", "train.parquet", "eval.parquet"} and not p.name.startswith("mlflow"):
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    return [f"tracking.mlflow_uri=sqlite:///{work / f'mlflow{n}.db'}", f"tracking.artifact_root={work / f'mla{n}'}",
            f"tracking.duckdb_path={work / f'store{n}.duckdb'}"]


def test_a_rerun_on_a_fresh_clone_trains_nothing_recorded_and_gives_the_same_report(prefect_harness, warm_model_dir,
                                                                                    tmp_path):
    from flows.compare import compare_flow

    arms = json.dumps({"cleaner": ["rollout.saar.enabled=true"], "dapo": ["rollout.saar.enabled=false"]})
    records = tmp_path / "records"
    overrides = [*tiny_overrides(tmp_path, warm_model_dir, steps=1), f"compare.arms={arms}", "compare.seeds=[0]",
                 "compare.arm_seeds={}", "compare.steps=1", "compare.eval_every=1", "eval.n_prompts=4",
                 "eval.samples=2", "eval.ks=[1,2]", "compare.probe_prompts=3", "compare.shared=[]",
                 f"compare.records_dir={records}"]
    first = compare_flow("configs/tiny.yaml", overrides, compare_id="cmp")
    assert sorted(p.name for p in records.iterdir()) == ["cmp-cleaner-s0.json", "cmp-dapo-s0.json",
                                                         "initial_eval.json", "probe.parquet"]
    assert first["probe_entropy"]["cleaner"]["tokens"] > 0

    with run_log_lines() as lines:
        again = compare_flow("configs/tiny.yaml", [*overrides, *_fresh_clone(tmp_path, 2)], compare_id="cmp")
    printed = "\n".join(lines)
    assert not (tmp_path / "runs" / "cmp" / "logs").exists(), "no run was trained"
    assert "cmp-cleaner-s0: reused from its record in" in printed and "cmp-dapo-s0: reused" in printed
    drop = ("wall_s",)
    assert {k: v for k, v in again.items() if k not in drop} == {k: v for k, v in first.items() if k not in drop}

    # one record gone: that run alone is trained again, and lands on the same rows (a run is reproducible)
    (records / "cmp-dapo-s0.json").unlink()
    third = compare_flow("configs/tiny.yaml", [*overrides, *_fresh_clone(tmp_path, 3)], compare_id="cmp")
    assert sorted(p.name for p in (tmp_path / "runs" / "cmp" / "logs").iterdir()) == ["cmp-dapo-s0.log"]
    assert third["per_seed"] == first["per_seed"] and third["final"] == first["final"]

    # the same records under another shared setting: refused before anything runs, naming the field
    with pytest.raises(run_records.RecordMismatch, match=r"cmp-cleaner-s0\.json .*fields that differ: trainer\.lr\)"):
        compare_flow("configs/tiny.yaml", [*overrides, "compare.shared=[trainer.lr=3.0e-4]"], compare_id="cmp")
