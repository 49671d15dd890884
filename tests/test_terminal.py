"""What a ``cleaner`` command prints (``flows.terminal``, ``flows.train_log``): the project's lines on the terminal,
Prefect's bookkeeping only in the Prefect API; one line a step and an evaluation, a summary at the end."""

from __future__ import annotations

import math
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from flows.terminal import QUIET_ENV, command_of, quiet_libraries
from flows.train_log import best_checkpoint_line, eval_line, outcome_line, step_line, train_summary

ROOT = Path(__file__).resolve().parents[1]

FLOW_CODE = """
import sys
sys.argv = ["cleaner", *sys.argv[1:]]
import flows.cli  # what `cleaner` does first: the quiet libraries, unless -v
from prefect import flow, get_run_logger, task

@task
def double(x):
    print(f"the task printed {x}")
    return 2 * x

@flow(log_prints=True)
def noisy():
    print("the flow printed a line")
    get_run_logger().warning("a warning of the flow")
    return double(21)

print("result", noisy())
"""


def _run_flow(tmp_path: Path, *argv: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in QUIET_ENV and not k.startswith("PREFECT_API")}
    env.update({"PREFECT_HOME": str(tmp_path / "prefect"), "PYTHONPATH": str(ROOT)})
    done = subprocess.run([sys.executable, "-c", FLOW_CODE, *argv], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def test_a_quiet_command_prints_the_project_lines_and_prefect_keeps_its_own(tmp_path):
    """`cleaner train`'s terminal: prints and warnings of the flow and its task; no task or flow state lines, no
    temporary-server banner, no dead "View at" link. The Prefect API (its database) still holds every line."""
    out = _run_flow(tmp_path, "train")
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert "the flow printed a line" in lines and "the task printed 21" in lines and "result 42" in lines, out
    warning = next(ln for ln in lines if "a warning of the flow" in ln)
    assert "WARNING" in warning and "Flow run" in warning  # a warning keeps its level and source
    for noise in ("Finished in state", "Beginning flow run", "View at", "temporary server", "Created task run"):
        assert noise not in out, (noise, out)
    assert len(lines) == 4, out
    with sqlite3.connect(tmp_path / "prefect" / "prefect.db") as db:
        logged = [m for (m,) in db.execute("SELECT message FROM log")]
    assert "Finished in state Completed()" in logged and "the task printed 21" in logged, logged


@pytest.mark.slow
def test_verbose_brings_prefects_task_and_flow_states_back(tmp_path):
    out = _run_flow(tmp_path, "-v", "train")
    assert "Task run 'double-" in out and "Finished in state Completed()" in out, out
    assert "Beginning flow run" in out and "Starting temporary server" in out, out


def test_verbose_and_other_commands_keep_the_libraries_defaults():
    assert command_of(["-v", "train", "--set", "a=1"]) == ("train", True)
    assert command_of(["--verbose", "demo"]) == ("demo", True)
    assert command_of(["compare", "-v"]) == ("compare", False)  # an option of the command, not before it
    env: dict[str, str] = {}
    assert quiet_libraries(["-v", "demo"], env) == {} and env == {}
    assert quiet_libraries(["serve", "start"], env) == {} and env == {}  # the stack's processes log as Prefect does
    env = {"MLFLOW_LOGGING_LEVEL": "INFO"}  # an exported setting wins
    assert quiet_libraries(["train"], env) == {k: v for k, v in QUIET_ENV.items() if k != "MLFLOW_LOGGING_LEVEL"}
    assert env["MLFLOW_LOGGING_LEVEL"] == "INFO" and env["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"
    assert Path(env["PREFECT_LOGGING_SETTINGS_PATH"]).exists()


STEP = {"rollout/reward_mean": 0.625, "rollout/accuracy": 0.5, "tools/first_attempt_success_rate": 0.8125,
        "saar/rollbacks_triggered": 3, "saar/rollbacks_recovered": 2, "train/loss": -3.31e-05, "train/skipped": 0}


def test_a_step_is_one_line_with_the_figures_that_matter():
    assert step_line(3, STEP, 11.94) == ("step 3 | reward 0.625 | accuracy 0.5 | first try 0.812 | "
                                         "rollbacks 3 (2 recovered) | loss -3.31e-05 | 11.9 s")
    skipped = step_line(4, {**STEP, "train/skipped": 1, "train/no_informative_groups": 2})
    assert skipped.endswith("| no informative groups (2 dropped)") and "loss" not in skipped
    assert "first try n/a" in step_line(0, {"tools/first_attempt_success_rate": math.nan})


def _eval(off: float, on: float, first: float) -> dict:
    return {"eval/saar_off/all/pass_at_1": off, "eval/saar_on/all/pass_at_1": on,
            "eval/saar_off/tools/first_attempt_success_rate": first, "time/eval_s": 20.04}


def test_an_evaluation_line_sets_each_figure_beside_the_starting_policys():
    start = _eval(0.5, 0.5625, 0.75)
    assert eval_line(0, start, start) == ("eval policy 0 (the starting policy) | pass@1 SAAR off 0.5 | "
                                          "pass@1 SAAR on 0.562 | first try 0.75 | 20.0 s")
    assert eval_line(5, _eval(0.53125, 0.59375, 0.8), start) == (
        "eval policy 5 | pass@1 SAAR off 0.531 (start 0.5) | pass@1 SAAR on 0.594 (start 0.562) | "
        "first try 0.8 (start 0.75) | 20.0 s")
    assert eval_line(5, _eval(0.5, 0.5, 0.5), None).count("start") == 0  # a run that did not evaluate its start
    env = eval_line(2, {"eval/sokoban/success": 0.25}, {"eval/sokoban/success": 0.125})
    assert env == "eval policy 2 | sokoban success 0.25 (start 0.125)"


def test_the_summary_says_start_final_best_and_wall_time(tmp_path):
    run_dir = tmp_path / "runs" / "r1"
    (run_dir / "checkpoints" / "policy_000005").mkdir(parents=True)
    evals = {0: _eval(0.5, 0.5, 0.7), 5: _eval(0.625, 0.6, 0.8), 10: _eval(0.5625, 0.6, 0.8)}
    result = {"run_id": "r1", "run_dir": str(run_dir), "start_ckpt": "assets/tiny-warm", "evaluations": evals,
              "final_checkpoint": str(run_dir / "checkpoints" / "policy_000010"),
              "registered": {"final": "4", "run_best": "3", "best": "3"}}
    text = train_summary(result, "tiny", 195.4).splitlines()
    assert text == [f"run r1 finished in 3 min 15 s; final checkpoint {result['final_checkpoint']}",
                    "held-out pass@1 SAAR off: 0.5 at the start → 0.562 after 10 steps",
                    f"best checkpoint: policy 5 (pass@1 SAAR off 0.625): {run_dir / 'checkpoints' / 'policy_000005'}"
                    " | models:/tiny/3 (@best is version 3)"]
    tie = {0: _eval(0.5, 0.5, 0.7), 5: _eval(0.5, 0.5, 0.7)}  # the newest of a tie, as the registry picks @best
    pruned = best_checkpoint_line({**result, "evaluations": tie, "registered": {}}, "tiny")
    assert pruned.startswith("best checkpoint: policy 5 ") and "pruned" not in pruned
    pruned = best_checkpoint_line({**result, "evaluations": {10: _eval(0.5, 0.5, 0.5)}, "registered": {}}, "tiny")
    assert "its folder pruned" in pruned
    assert outcome_line({}) == "held-out evaluation: none in this run (train.eval_every=0)"
    assert train_summary({**result, "evaluations": {}}, "tiny", 42).splitlines()[1:] == [outcome_line({})]


def _check_demo():
    import importlib.util

    spec = importlib.util.spec_from_file_location("check_demo", ROOT / "infra" / "check_demo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _demo_log(tmp_path: Path, steps: int, versions: list[int]) -> str:
    """What `make demo` prints, built from the functions the run prints with (a fake run, real formatting)."""
    run_dir = tmp_path / "runs" / "r1"
    evals = {v: _eval(0.5 + v / 100, 0.55, 0.7) for v in versions}
    lines = ["──────── training ────────", "10 RL steps with CLEANER, …; a line per step follows"]
    lines += [eval_line(0, evals[0])] if 0 in versions else []
    for step in range(steps):
        lines.append(step_line(step, STEP, 3.2))
        if step + 1 in versions:
            lines.append(eval_line(step + 1, evals[step + 1], evals.get(0)))
    result = {"run_id": "r1", "run_dir": str(run_dir), "start_ckpt": "assets/tiny-warm", "evaluations": evals,
              "final_checkpoint": str(run_dir / "checkpoints" / f"policy_{steps:06d}"),
              "registered": {"final": "2", "run_best": "2", "best": "2"}}
    lines += ["MLflow run r1: http://127.0.0.1:5000/#/experiments/1/runs/abc?workflowType=machine_learning",
              train_summary(result, "tiny", 200), "──────── results ────────", "MLflow UI: …", "  runs, traces",
              "Policy: …", "DuckDB: …", "Prefect: …"]
    return "\n".join(lines) + "\n"


def test_the_demo_check_passes_what_the_demo_prints_and_names_what_is_wrong(tmp_path):
    """infra/check_demo.py (CI, on the real demo's log) reads the lines the run prints with today's formatting; and
    names each thing a newcomer should not see: a loading bar, a task state line, a missing step or evaluation, too
    many lines."""
    check = _check_demo().check_output
    good = _demo_log(tmp_path, 10, [0, 5, 10])
    assert check(good, 10, [0, 5, 10]) == []
    assert len([ln for ln in good.splitlines() if ln.strip()]) <= 28  # the bound for the demo's 10 steps
    noisy = good.replace("step 3 |", "Loading weights: 100%|██████████| 50/50\n"
                                    "12:00:01.000 | INFO    | Task run 'score-279' - Finished in state Completed()\n"
                                    "step 3 |")
    problems = check(noisy, 10, [0, 5, 10])
    assert problems == ["no 'Loading weights' in the output", "no 'Finished in state' in the output",
                        "no \"Task run '\" in the output"]
    n = len([ln for ln in good.splitlines() if ln.strip()])
    long = good.replace("step 3 |", "a line of its own\n" * (29 - n) + "step 3 |")
    assert check(long, 10, [0, 5, 10]) == ["at most 28 lines from the training rule on (found 29)"]
    short = check(good.replace("step 4 |", "stop 4 |"), 10, [0, 5, 10])
    assert short == [f"one line per step, steps 0..9 in order (found steps {[0, 1, 2, 3, 5, 6, 7, 8, 9]})"]
    assert check(good, 10, [0, 5, 10, 15]) == ["an evaluation line for policies [0, 5, 10, 15] (found [0, 5, 10])"]
    no_summary = "\n".join(ln for ln in good.splitlines() if not ln.startswith("best checkpoint"))
    assert check(no_summary, 10, [0, 5, 10]) == [
        "the summary line 'best checkpoint: policy <v> (pass@1 SAAR off <x>): <folder> | models:/<name>/<version>'"]
