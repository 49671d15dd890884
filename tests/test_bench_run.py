"""``cleaner bench-run``: a run's slice, today's paths vs the defaults, in core-seconds (``flows.bench_run``).

* ``core_seconds`` counts the CPU of processes under this one, live or ended (the local sandbox's workers are).
* The command runs a tiny slice end to end (1 step of 2 prompts x 2 samples, both evaluations at 2 x 2), finds the
  sides' training steps and evaluations the same (exit 0), and exits 1 when a side trains differently.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli import app

TINY = Path(__file__).resolve().parents[1] / "configs" / "tiny.yaml"
SLICE = ["data.prompts_per_step=2", "rollout.n_samples=2", "eval.n_prompts=2", "eval.samples=2",
         "eval.final_prompts=2", "eval.final_samples=2", "tracking.traces_per_step=2"]
SPIN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n"


def test_core_seconds_count_children_live_and_ended():
    """A child that spun 0.3 s of CPU and ended, then one that spun 0.3 s and still lives: both counted."""
    from flows.bench_run import core_seconds

    c0 = core_seconds()
    subprocess.run([sys.executable, "-c", SPIN], check=True)
    ended = core_seconds() - c0
    live = subprocess.Popen([sys.executable, "-c", SPIN + "print('spun', flush=True)\ntime.sleep(30)\n"],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert live.stdout.readline().strip() == "spun"
        c1 = core_seconds()
        time.sleep(0.05)
        assert core_seconds() - c1 < 0.2, "a sleeping child adds nothing"
        with_live = core_seconds() - c0
    finally:
        live.kill()
        live.wait()
    assert ended >= 0.3 and with_live >= ended + 0.3


def _bench(tmp_path, *extra):
    return CliRunner().invoke(app, ["bench-run", "--config", str(TINY), "--sides", "before,after", "--steps", "1",
                                    "--eval-at", "1", "--work-dir", str(tmp_path / "work"), "--out", str(tmp_path / "report.json"),
                                    *(a for s in SLICE for a in ("--set", s)), *extra])


@pytest.mark.slow
def test_bench_run_finds_the_sides_the_same_and_prints_core_seconds(tmp_path):
    import json

    res = _bench(tmp_path)
    assert res.exit_code == 0, res.output
    assert "training steps: token ids equal" in res.output and "after step 1: every figure equal" in res.output
    report = json.loads((tmp_path / "report.json").read_text())
    for side in ("before", "after"):
        core = report["core_s"][side]
        assert core["rollout"] > 0 and core["update"] > 0 and core["eval"] > 0
        assert abs(core["run"] - sum(core[p] for p in ("rollout", "score", "mix", "update", "log", "eval"))) < 1e-9
    assert report["evals"]["before"] == report["evals"]["after"] and report["evals"]["after"][0]
    assert report["differences"]["token_ids"] == 0.0


@pytest.mark.slow
def test_bench_run_exits_1_when_a_side_trains_differently(tmp_path, monkeypatch):
    from flows import bench_run

    monkeypatch.setitem(bench_run.SIDES, "after", ["eval.shared_pass=true", "engine.temperature=0.5"])
    res = _bench(tmp_path)
    assert res.exit_code == 1, res.output
    assert "token ids DIFFER" in res.output


def test_which_side_runs_first_alternates_step_by_step(tmp_path, monkeypatch):
    """Caches the first side of a step warms favour the second: over the steps each side goes first as often.
    The run's loop, its stages recorded instead of run."""
    from types import SimpleNamespace

    from flows import bench_run, bench_step, prepare
    from tasks.data import loader

    ran: list[tuple[int, str]] = []
    monkeypatch.setattr(bench_step, "_config", lambda *args: SimpleNamespace(data=None, model=SimpleNamespace(path="m")))
    monkeypatch.setattr(bench_step, "_Side", lambda name, cfg, work: name)
    for module, name in ((loader, "ensure_files"), (prepare, "ensure_policy"), (prepare, "start_policy")):
        monkeypatch.setattr(module, name, lambda *args: "start")
    monkeypatch.setattr(bench_run, "_step", lambda side, timed, step, ckpt: (ran.append((step, side)), ({}, ckpt))[1])
    monkeypatch.setattr(bench_run, "_evaluate", lambda *args: {})
    monkeypatch.setattr(bench_run, "_report", lambda *args: {})
    bench_run.bench_run(work_dir=tmp_path / "work", steps=4, eval_at=2, echo=lambda line: None)
    assert ran == [(0, "warm-up"), (0, "before"), (0, "after"), (1, "after"), (1, "before"), (2, "before"),
                   (2, "after"), (3, "after"), (3, "before")]
