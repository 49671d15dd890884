"""Sandbox benchmark: rows, checked results, JSON report and the ``cleaner sandbox bench`` CLI."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from flows.cli_sandbox import app
from sandbox.bench import BenchRow, _percentile, measure, run_bench, speedups


def test_run_bench_local_vs_subprocess():
    report = run_bench(backends=("local", "subprocess"), snippets=("trivial",), concurrency=(1, 2),
                       n=4, workers=2)
    rows = report["rows"]
    assert [(r["backend"], r["concurrency"]) for r in rows] == [
        ("local", 1), ("local", 2), ("subprocess", 1), ("subprocess", 2)]
    assert all(r["failures"] == 0 and r["executions"] == 4 and r["execs_per_s"] > 0 for r in rows)
    assert all(r["p50_ms"] <= r["p95_ms"] <= r["p99_ms"] for r in rows)
    assert set(report["speedup_vs_subprocess"]) == {"local/trivial/c1", "local/trivial/c2"}
    assert report["isolation"]["local"] in {"bwrap", "rlimits"}


def test_wrong_output_counts_as_failure():
    row = measure(lambda code: (True, "not the answer"), "fake", "trivial", 2, 6)
    assert row.failures == 6


def test_percentile_and_speedup():
    assert _percentile([5.0, 1.0, 3.0, 2.0, 4.0], 50) == 3.0
    assert _percentile([1.0, 2.0], 99) == 2.0
    rows = [BenchRow("subprocess", "trivial", 8, 10, 0, 20.0, 1, 1, 1),
            BenchRow("docker", "trivial", 8, 10, 0, 200.0, 1, 1, 1)]
    assert speedups(rows) == {"docker/trivial/c8": 10.0}


def test_unknown_snippet_is_rejected():
    with pytest.raises(ValueError, match="snippets: unknown"):
        run_bench(backends=("subprocess",), snippets=("nope",))


def test_cli_bench_writes_json(tmp_path):
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(app, ["bench", "--backends", "local,subprocess", "--snippets", "trivial",
                                      "--concurrency", "1", "-n", "3", "--workers", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "exec/s" in result.output
    data = json.loads(out.read_text())
    assert {r["backend"] for r in data["rows"]} == {"local", "subprocess"}


def test_cli_rejects_bad_backend():
    result = CliRunner().invoke(app, ["bench", "--backends", "kubernetes"])
    assert result.exit_code != 0
    assert "unknown" in result.output
