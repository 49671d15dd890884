"""Sandbox benchmark: rows, checked results, JSON report and the ``cleaner sandbox bench`` CLI."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from flows.cli_sandbox import app
from sandbox.bench import BenchRow, _percentile, measure, run_bench, speedups
from sandbox.config import SandboxConfig


def test_run_bench_local_vs_its_plain_twin_and_the_host_subprocess():
    cfg = SandboxConfig(workers=2, preimport=["math"], timeout_s=30, runs_per_container=3)
    report = run_bench(backends=("local", "subprocess"), snippets=("trivial",), concurrency=(1, 2),
                       n=4, cfg=cfg, reps=2, long_factor=2.0)
    short = [r for r in report["rows"] if r["phase"] == "short"]
    assert [(r["backend"], r["concurrency"]) for r in short] == [
        ("local", 1), ("local", 2), ("local-plain", 1), ("local-plain", 2), ("subprocess", 1), ("subprocess", 2)]
    assert all(r["failures"] == 0 and r["executions"] == 4 and r["execs_per_s"] > 0 for r in short)
    assert all(r["p50_ms"] <= r["p95_ms"] <= r["p99_ms"] for r in short)
    assert set(report["speedup_vs_plain"]) == set(report["speedup_vs_host"]) == {"local/trivial/c1", "local/trivial/c2"}
    assert "fork server" in short[0]["interpreter"] and "fresh per snippet" in short[2]["interpreter"]
    assert "(host)" in short[4]["interpreter"]
    (long,) = [r for r in report["rows"] if r["phase"] == "long"]
    assert long["backend"] == "local" and long["executions"] == 12 and long["failures"] == 0
    assert long["retired"] >= 3 and long["spares_used"] <= long["retired"]
    assert report["config"]["preimport"] == ["math"]
    assert set(report["config"]["preimport_s"]) == {"local", "local-plain"}


def test_plain_runners_import_the_pools_preimports():
    from sandbox.bench import _subprocess_runner

    run, interpreter = _subprocess_runner(30, "import json\n")
    assert run("import sys\nprint('json' in sys.modules, sys.flags.no_site)") == (True, "True 1\n")
    assert interpreter.endswith("-S (host)")


def test_wrong_output_counts_as_failure():
    row = measure(lambda code: (True, "not the answer"), "fake", "trivial", 2, 6)
    assert row.failures == 6


def test_percentile_and_speedup():
    assert _percentile([5.0, 1.0, 3.0, 2.0, 4.0], 50) == 3.0
    assert _percentile([1.0, 2.0], 99) == 2.0
    rows = [BenchRow("subprocess", "trivial", 8, 10, 0, 20.0, 1, 1, 1),
            BenchRow("docker-plain", "trivial", 8, 10, 0, 40.0, 1, 1, 1),
            BenchRow("docker", "trivial", 8, 10, 0, 200.0, 1, 1, 1),
            BenchRow("docker", "trivial", 8, 10, 0, 100.0, 1, 1, 1, phase="long")]
    assert speedups(rows, "plain") == {"docker/trivial/c8": 5.0}
    assert speedups(rows, "host") == {"docker/trivial/c8": 10.0}


def test_unknown_snippet_is_rejected():
    with pytest.raises(ValueError, match="snippets: unknown"):
        run_bench(backends=("subprocess",), snippets=("nope",))


def test_cli_bench_writes_json(tmp_path):
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(app, ["bench", "--backends", "local,subprocess", "--snippets", "trivial",
                                      "--concurrency", "1", "-n", "3", "--workers", "1", "--reps", "1",
                                      "--long-factor", "0", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "exec/s" in result.output and "× plain" in result.output
    data = json.loads(out.read_text())
    assert {r["backend"] for r in data["rows"]} == {"local", "local-plain", "subprocess"}


def test_cli_rejects_bad_backend():
    result = CliRunner().invoke(app, ["bench", "--backends", "kubernetes"])
    assert result.exit_code != 0
    assert "unknown" in result.output
