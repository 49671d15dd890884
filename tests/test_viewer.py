"""The HTML trajectory viewer and the run plots, on hand-made step tables (no model, no flow)."""

from __future__ import annotations

import json
import re

import polars as pl
import pytest

from tasks.reports.plots import PLOTS, plot_panels, plot_run, with_rates
from tasks.reports.viewer import render_step_viewer

EVIL = "<script>alert('pwned')</script>"


def _traj(traj_id: str, prompt: str, raw: bool, messages: list[dict], **stats) -> dict:
    base = {"tool_calls": 1, "tool_success": 1, "rollbacks_triggered": 0, "rollbacks_recovered": 0,
            "shallow": 0, "deep": 0}
    return {"run_id": "r", "step": 3, "traj_id": traj_id, "prompt_id": prompt, "raw": raw,
            "messages": json.dumps(messages), "reward": 1.0, "correct": True, "finish_reason": "stop",
            **base, **stats}


def _ev(traj_id: str, idx: int, kind: str, attempt: int, **kw) -> dict:
    row = {"run_id": "r", "step": 3, "traj_id": traj_id, "event_idx": idx, "position": 1, "attempt": attempt,
           "kind": kind, "similarity": None, "error_kind": None, "error_text": None, "failed_turn": None,
           "new_turn": None}
    return {**row, **kw}


@pytest.fixture
def step_tables():
    user = {"role": "user", "content": "What is 7*6?"}
    call = '<tool_call>{"name": "python", "arguments": {"code": "print(7*6)"}}</tool_call>'
    saar = [user, {"role": "assistant", "content": "Let me think " + EVIL},
            {"role": "tool", "content": "ok"}, {"role": "assistant", "content": "I compute. " + call},
            {"role": "tool", "content": "42"}, {"role": "assistant", "content": "\\boxed{42}"}]
    raw = [user, {"role": "assistant", "content": '<tool_call>{"name": "python", "arguments": {"code": "print(x)"}}</tool_call>'},
           {"role": "tool", "content": "NameError: name 'x' is not defined"},
           {"role": "assistant", "content": call}, {"role": "tool", "content": "42"},
           {"role": "assistant", "content": "\\boxed{42}"}]
    trajs = pl.DataFrame([
        _traj("3:p1:0", "p1", False, saar, tool_calls=4, tool_success=2, rollbacks_triggered=1,
              rollbacks_recovered=1, shallow=1, deep=1),
        _traj("3:p1:1", "p1", True, raw, tool_calls=2, tool_success=1),
        _traj("3:p2:0", "p2", False, [user, {"role": "assistant", "content": "\\boxed{41}"}], tool_calls=0,
              tool_success=0, reward=0.0, correct=False),
    ])
    events = pl.DataFrame([
        _ev("3:p1:0", 0, "triggered", 0, error_kind="NameError", error_text="NameError: name 'y' is not defined"),
        _ev("3:p1:0", 1, "shallow", 1, similarity=0.8125, error_kind="NameError",
            error_text="NameError: name 'y' is not defined", failed_turn="I compute. <tool_call>print(y)",
            new_turn="<tool_call>print(z)"),
        _ev("3:p1:0", 2, "deep", 2, similarity=0.21, error_kind="SyntaxError",
            error_text="SyntaxError: " + EVIL, failed_turn="I compute. <tool_call>print(z", new_turn=call),
        _ev("3:p1:0", 3, "recovered", 2),
    ])
    return trajs, events


def test_viewer_shows_pairs_events_and_header(step_tables):
    trajs, events = step_tables
    html = render_step_viewer(trajs, events, 3, 2, {"rollout/accuracy": 0.625, "time/rollout_s": 9.0})
    assert html.startswith("<!DOCTYPE html>") and "Step 3" in html
    assert "rollout/accuracy <b>0.625</b>" in html and "time/rollout_s" not in html
    assert "trajectories <b>3</b>" in html and "raw <b>1</b>" in html
    assert "reward mean" in render_step_viewer(trajs, events, 3, 2)
    assert html.index("data-traj='3:p1:0'") < html.index("data-traj='3:p1:1'") < html.index("data-traj='3:p2:0'")
    cut = re.search(r"<details class='cut' open data-position='1'>.*?</details>", html, re.S).group(0)
    assert "2 attempt(s) cut" in cut and "recovered at attempt 2" in cut
    assert "0.812" in cut and "0.21" in cut
    kinds = re.findall(r"data-kind='(\w+)'", cut)
    assert kinds == ["shallow", "deep"]
    assert "print(y)" in cut and "NameError: name &#x27;y&#x27; is not defined" in cut
    saar_card = html[html.index("data-traj='3:p1:0'"):html.index("data-traj='3:p1:1'")]
    assert saar_card.index("data-position='1'") < saar_card.index("I compute. &lt;tool_call&gt;{")
    assert saar_card.index("Let me think") < saar_card.index("data-position='1'")
    raw_card = html[html.index("data-traj='3:p1:1'"):]
    assert "msg tool error retry" in raw_card and "name &#x27;x&#x27; is not defined" in raw_card
    assert "no raw trajectory of this prompt" in html


def test_viewer_escapes_model_text(step_tables):
    trajs, events = step_tables
    html = render_step_viewer(trajs, events, 3, 4)
    assert EVIL not in html
    assert html.count("&lt;script&gt;alert(&#x27;pwned&#x27;)&lt;/script&gt;") == 2
    assert html.count("<script>") == 1
    assert "http://" not in html and "https://" not in html


def test_viewer_limits_samples_and_handles_empty_step(step_tables):
    trajs, events = step_tables
    html = render_step_viewer(trajs, events, 3, 1)
    assert "data-traj='3:p1:0'" in html and "data-traj='3:p2:0'" not in html
    empty = render_step_viewer(trajs.clear(), events.clear(), 0, 4)
    assert "no trajectories in this step" in empty


def _metrics() -> pl.DataFrame:
    rows = []
    for step in range(3):
        vals = {"rollout/reward_mean": 0.1 * step, "rollout/accuracy": 0.5 + 0.1 * step, "tools/calls": 20.0,
                "tools/success_rate": 0.8, "tools/first_attempt_success_rate": 0.7,
                "saar/rollbacks_triggered": 4.0 - step, "saar/rollbacks_recovered": 3.0 - step,
                "saar/rollbacks_failed": 1.0, "saar/global_recovery_rate": 0.75, "saar/shallow": 2.0, "saar/deep": 1.0}
        rows += [{"step": step, "key": k, "value": v} for k, v in vals.items()]
    return pl.DataFrame(rows)


def test_rates_are_derived_per_step():
    m = with_rates(_metrics())
    rate = dict(m.filter(pl.col("key") == "saar/rollback_rate").select("step", "value").iter_rows())
    failed = dict(m.filter(pl.col("key") == "saar/failed_rate").select("step", "value").iter_rows())
    assert rate == pytest.approx({0: 0.2, 1: 0.15, 2: 0.1})
    assert failed == pytest.approx({0: 0.25, 1: 1 / 3, 2: 0.5})


def test_plots_write_pngs(tmp_path):
    png = plot_run(_metrics(), tmp_path / "summary.png", "r")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    panels = plot_panels(_metrics(), tmp_path / "panels", "r")
    assert [p.name for p in panels] == [k.replace(" ", "_").lower() + ".png" for k in PLOTS]
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in panels)
    assert plot_run(_metrics().clear(), tmp_path / "empty.png", "r").exists()


def test_a_plot_of_chosen_panels(tmp_path):
    png = plot_run(_metrics(), tmp_path / "three.png", "r", panels=["reward", "tool calls", "loss"])
    head = png.read_bytes()
    assert int.from_bytes(head[16:20], "big") == 3 * 4 * 110  # 3 panels of 4 in at 110 dpi
    assert int.from_bytes(plot_run(_metrics(), tmp_path / "all.png", "r").read_bytes()[16:20], "big") == len(PLOTS) * 440
    with pytest.raises(ValueError, match="unknown \\['rewards'\\]; valid: \\['reward', 'tool calls'"):
        plot_run(_metrics(), tmp_path / "x.png", "r", panels=["rewards"])


def test_env_step_shows_episodes_turn_by_turn():
    """An environment step: episodes of one start state (success beside failure), each turn's observation, thought,
    actions asked → run, reward and penalty; no SAAR pairs; model text escaped."""
    grid = "_ _ G\n_ O _\nP _ _"
    msgs = [{"role": "user", "content": grid}, {"role": "assistant", "content": "x"}, {"role": "user", "content": "END"}]
    trajs = pl.DataFrame([
        {"traj_id": f"t{i}", "prompt_id": "frozen_lake:7", "data_source": "frozen_lake", "ground_truth": "7",
         "messages": json.dumps(msgs), "env_success": i == 1, "env_score": float(i == 1), "env_penalty": -0.1 * (i == 0),
         "env_actions": 2, "num_turns": 2, "reward": float(i == 1), "advantage": 0.5 - (i == 0)} for i in range(2)])
    step = {"run_id": "r", "step": 3, "env": "frozen_lake", "seed": 7, "effective": True, "actions_left": 8}
    env_steps = pl.DataFrame([
        {**step, "traj_id": "t0", "turn_idx": 0, "state": grid, "response": "?", "think": EVIL, "parsed": False,
         "actions": "[]", "executed": "[]", "invalid": "[]", "reward": 0.0, "penalty": -0.1, "done": False},
        {**step, "traj_id": "t0", "turn_idx": 1, "state": grid, "response": "", "think": "go", "parsed": True,
         "actions": json.dumps(["Up", "Jump"]), "executed": json.dumps(["Up"]), "invalid": json.dumps(["Jump"]),
         "reward": 0.0, "penalty": 0.0, "done": True},
        {**step, "traj_id": "t1", "turn_idx": 0, "state": grid, "response": "", "think": "The goal is up.",
         "parsed": True, "actions": json.dumps(["Up", "Right"]), "executed": json.dumps(["Up", "Right"]),
         "invalid": "[]", "reward": 1.0, "penalty": 0.0, "done": True},
    ])
    html = render_step_viewer(trajs, pl.DataFrame(), 3, 4, {"frozen_lake/success": 0.5, "tools/success_rate": 1.0},
                              env_steps=env_steps)
    assert "frozen_lake episodes turn by turn" in html and "SAAR (purified)" not in html
    assert EVIL not in html and "&lt;script&gt;" in html
    assert html.index("data-traj='t1'") < html.index("data-traj='t0'")  # the success first, then the failure
    assert "unparsable: no-op" in html and "<span class='inv'>Jump</span>" in html and "Up ‖ Right" in html
    assert html.count("<pre class='state'>_ _ G\n_ O _\nP _ _</pre>") == 3 and "END" in html
    assert "frozen_lake/success <b>0.5</b>" in html and "tools/success_rate" not in html
    assert "success" in html and "advantage 0.5" in html and "advantage -0.5" in html
