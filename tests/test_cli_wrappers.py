"""Commands that wrap others hand them plain values: ``demo`` → warm-up and train, ``train --profile`` → two flow
runs, ``compare`` → ``cleaner train`` processes; and a missing ``model.path`` is an error naming it within seconds.

The flows themselves are replaced by recorders here (what they do is tested elsewhere, and CI runs the real
``make demo``): these tests pin what each command passes on. The bug they guard against: ``demo`` once called the
Typer function ``train(config, overrides, None)``, so the parameters it left out kept their ``typer.Option`` objects
as values and the flow refused them (``parent_mlflow_run: Input should be a valid string``).
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows import cli

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()
PLAIN = (str, list, int, float, bool, type(None))


def _stores(tmp_path: Path) -> list[str]:
    sets = [f"tracking.mlflow_uri=sqlite:///{tmp_path / 'mlflow.db'}", f"tracking.duckdb_path={tmp_path / 'c.duckdb'}",
            f"tracking.artifact_root={tmp_path / 'art'}", f"output_dir={tmp_path / 'runs'}"]
    return [x for s in sets for x in ("--set", s)]


class Recorder:
    """Stands in for a flow function: records its arguments, returns what a finished train flow returns."""

    def __init__(self, tmp_path: Path, make: Path | None = None):
        self.calls: list[tuple] = []
        self.tmp, self.make = tmp_path, make

    def __call__(self, *args):
        self.calls.append(args)
        if self.make is not None:
            self.make.mkdir(parents=True, exist_ok=True)
        return {"run_id": "r1", "final_checkpoint": str(self.tmp / "ckpt"), "step_wall_s": {0: 1.0}}


def _plain(call: tuple) -> None:
    for value in call:
        assert isinstance(value, PLAIN), f"{value!r} ({type(value).__name__}) is not a plain value"
        if isinstance(value, list):
            assert all(isinstance(v, str) for v in value), value


def test_demo_warms_up_a_missing_model_then_trains_with_plain_values(tmp_path, monkeypatch):
    import flows.train
    import flows.warmup

    model = tmp_path / "model"
    warm, train = Recorder(tmp_path, make=model), Recorder(tmp_path)
    monkeypatch.setattr(flows.warmup, "warmup_flow", warm)
    monkeypatch.setattr(flows.train, "train", train)
    sets = [*_stores(tmp_path), "--set", f"model.path={model}"]
    res = runner.invoke(cli.app, ["demo", "--config", "configs/tiny.yaml", *sets])
    assert res.exit_code == 0, res.output
    overrides = [s for s in sets if s != "--set"]
    assert warm.calls == [("configs/tiny.yaml", overrides)]
    assert train.calls == [("configs/tiny.yaml", ["tracking.register_models=true", *overrides], None, None)]
    _plain(train.calls[0])
    out = " ".join(res.output.split())
    assert "warm-up of" in out and "about 25 minutes" in out
    for head in ("MLflow UI:", "cleaner ui --config configs/tiny.yaml", "workflowType=machine_learning", "Policy:",
                 "models:/tiny@best", "DuckDB:", str(tmp_path / "c.duckdb")):
        assert head in out, (head, out)


def test_demo_skips_the_warm_up_of_an_existing_model(tmp_path, monkeypatch, warm_model_dir):
    import flows.train
    import flows.warmup

    warm, train = Recorder(tmp_path), Recorder(tmp_path)
    monkeypatch.setattr(flows.warmup, "warmup_flow", warm)
    monkeypatch.setattr(flows.train, "train", train)
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "project" / ".prefect"))
    (tmp_path / "runs" / "r1").mkdir(parents=True)
    (tmp_path / "runs" / "r1" / "prefect.json").write_text('{"flow_run_id": "0a1b-fr", "deployment_id": null}')
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    from prefect.settings import PREFECT_API_URL, PREFECT_UI_URL, temporary_settings

    with temporary_settings(restore_defaults={PREFECT_API_URL, PREFECT_UI_URL}):  # whatever a harness set before
        res = runner.invoke(cli.app, ["demo", *_stores(tmp_path), "--set", f"model.path={warm_model_dir}"])
    assert res.exit_code == 0, res.output
    assert warm.calls == [] and len(train.calls) == 1
    _plain(train.calls[0])
    out = " ".join(res.output.split())
    assert (f"Prefect: .venv/bin/cleaner serve start serves this project's Prefect history "
            f"({tmp_path / 'project' / '.prefect'}) → its flow run http://127.0.0.1:4200/flow-runs/flow-run/0a1b-fr"
            ) in out, out


def test_train_profile_reruns_the_same_run_and_prints_the_table(tmp_path, monkeypatch, warm_model_dir):
    import flows.step_profile
    import flows.train

    train, tables = Recorder(tmp_path), []
    monkeypatch.setattr(flows.train, "train", train)
    monkeypatch.setattr(flows.step_profile, "profile_table", lambda *a: tables.append(a) or "PROFILE TABLE")
    res = runner.invoke(cli.app, ["train", "--profile", *_stores(tmp_path), "--set", f"model.path={warm_model_dir}"])
    assert res.exit_code == 0, res.output
    assert [c[2] for c in train.calls] == [None, "r1"]  # the second flow run reruns the first run, fully cached
    for call in train.calls:
        _plain(call)
    assert tables == [(str(tmp_path / "c.duckdb"), "r1", {0: 1.0}, {0: 1.0})] and "PROFILE TABLE" in res.output


def test_compare_starts_train_processes_whose_arguments_the_cli_takes(tmp_path, monkeypatch, warm_model_dir):
    """The argv of a compare's child run, parsed by the real CLI, reaches the train flow as plain values."""
    import flows.compare
    import flows.train

    seen: list[list[str]] = []
    monkeypatch.setattr(flows.compare.subprocess, "run",
                        lambda argv, **kw: seen.append(argv) or subprocess.CompletedProcess(argv, 0))
    overrides = [f"model.path={warm_model_dir}", f"tracking.duckdb_path={tmp_path / 'c.duckdb'}",
                 f"tracking.mlflow_uri=sqlite:///{tmp_path / 'mlflow.db'}", "train.steps=3"]
    flows.compare._train_process("configs/tiny.yaml", overrides, "cmp-dapo-s0", "parent123", tmp_path / "l.log", None)
    [argv] = seen
    assert argv[:4] == [sys.executable, "-m", "flows.cli", "train"]
    train = Recorder(tmp_path)
    monkeypatch.setattr(flows.train, "train", train)
    res = runner.invoke(cli.app, argv[3:])
    assert res.exit_code == 0, res.output
    assert train.calls == [("configs/tiny.yaml", overrides, "cmp-dapo-s0", "parent123")]
    _plain(train.calls[0])


def test_eval_and_compare_end_with_their_figures_and_wall_time(tmp_path, monkeypatch, warm_model_dir):
    """`cleaner eval` prints its table and how long it took; `cleaner compare` its wall time and steps to the
    baseline's final (the flows' own lines — an evaluation line, a line per run, the headline table — are theirs)."""
    import flows.compare
    import flows.evaluate

    metrics = {"eval/saar_off/all/pass_at_1": 0.53125, "eval/saar_on/all/pass_at_1": 0.59375}
    monkeypatch.setattr(flows.evaluate, "evaluate_flow", lambda *a: metrics)
    res = runner.invoke(cli.app, ["eval", "--checkpoint", str(warm_model_dir), *_stores(tmp_path)])
    assert res.exit_code == 0, res.output
    out = " ".join(res.output.split())
    assert "pass@1 │ 0.531 │ 0.594" in out and re.search(r"evaluated in \d+ s; MLflow experiment tiny-eval", out), out
    summary = {"wall_s": 1839.4, "steps_to_baseline_final": {"dapo": 24, "cleaner": None}}
    monkeypatch.setattr(flows.compare, "compare_flow", lambda *a: summary)
    res = runner.invoke(cli.app, ["compare", *_stores(tmp_path)])
    assert res.exit_code == 0, res.output
    assert ("compare finished in 30 min 39 s; steps to the baseline's final pass@1: {'dapo': 24, 'cleaner': None}"
            in " ".join(res.output.split())), res.output


def test_a_missing_model_path_is_an_error_naming_it_within_seconds(tmp_path):
    """`cleaner train --set model.path=typo` in a fresh process: exit 2, the path and how to build one named, no
    model build started (nothing written where the model would go)."""
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "flows.cli", "train", "--set", "model.path=typo", *_stores(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    out = " ".join((proc.stdout + proc.stderr).split())
    print(f"refused after {time.monotonic() - t0:.1f} s")
    assert proc.returncode == 2, out
    assert "model.path: typo does not exist" in out and "--set model.build=tiny" in out and "cleaner warmup" in out
    assert not (ROOT / "typo").exists() and not (tmp_path / "runs").exists()


def test_a_model_the_config_asks_to_build_is_built_saying_how_long(tmp_path, monkeypatch):
    import flows.prepare
    import flows.warmup
    from flows.config import load_config

    built = []
    monkeypatch.setattr(flows.warmup, "build_and_warm", lambda cfg: built.append(cfg.model.path))
    cfg = load_config("configs/tiny.yaml", [f"model.path={tmp_path / 'new'}", "model.build=tiny"])
    assert flows.prepare.missing_policy(cfg) is None
    flows.prepare.ensure_policy(cfg)
    assert built == [str(tmp_path / "new")]
    with pytest.raises(FileNotFoundError, match=r"model.path: .*new does not exist"):
        flows.prepare.ensure_policy(load_config("configs/tiny.yaml", [f"model.path={tmp_path / 'new'}"]))


@pytest.mark.parametrize("when", [[], ["--cron", "0 3 * * *", "--interval", "60"]])
def test_serve_schedule_needs_exactly_one_of_cron_and_interval(when, tmp_path):
    res = runner.invoke(cli.app, ["serve", "schedule", "train/train-tiny", *when, "--dir", str(tmp_path)])
    assert res.exit_code == 2 and "give exactly one of --cron and --interval" in res.output


def test_serve_schedule_without_a_stack_or_api_says_so(tmp_path, monkeypatch):
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    res = runner.invoke(cli.app, ["serve", "schedule", "train/train-tiny", "--interval", "60", "--dir", str(tmp_path)])
    assert res.exit_code == 1 and f"no stack recorded in {tmp_path} and no PREFECT_API_URL set" in res.output


def test_resume_of_a_deployment_run_without_a_prefect_api_names_the_flow_run(tmp_path, monkeypatch):
    """A run a deployment started is retried through Prefect; with no API to do it through, the error names the flow
    run and the way out (--local), and nothing is trained here."""
    import json

    from prefect.settings import PREFECT_API_URL, temporary_settings

    import flows.train

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    run = tmp_path / "runs" / "nightly"
    run.mkdir(parents=True)
    (run / "config.json").write_text("{}")
    (run / "prefect.json").write_text(json.dumps({"flow_run_id": "fr-123", "deployment_id": "dep-9"}))
    train = Recorder(tmp_path)
    monkeypatch.setattr(flows.train, "train", train)
    with temporary_settings(restore_defaults={PREFECT_API_URL}):  # no API, whatever a test harness set before
        res = runner.invoke(cli.app, ["resume", "nightly", "--output-dir", str(tmp_path / "runs"), "--dir",
                                      str(tmp_path / "serve")])
    out = " ".join(res.output.split())
    assert res.exit_code == 2 and "flow run fr-123 was started by a deployment, but no stack is running here" in out \
        and "--local" in out, out
    assert train.calls == []
