"""SAAR off and on in one pass (``tasks.rollout.paired``) against two separate passes, on the committed tiny policy.

The separate passes are today's evaluation (``evaluate_mode`` per mode); the paired pass must give the same
trajectories token for token, the same tool calls, SAAR events and metrics — log-probs up to the float noise of
another decoding batch. And the compare's initial evaluation is computed once: no child run evaluates step 0,
dispatched or not, and a rerun reads it back.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from flows.config import load_config
from tasks.data.loader import load_prompts
from tasks.data.synthetic import write_task_parquet
from tasks.rollout.config import RolloutConfig, SAARConfig
from tasks.rollout.paired import PairedRollout, shares_work
from tasks.training import evaluation
from tests.scripted import ScriptedEngine

MODEL = "assets/tiny-warm"
LP_NOISE = 2e-5
"""Log-probs of one turn decoded in batches of other make-ups (``engine.share_prefill``'s figure in docs/step_time.md)."""
TRAJ_COLUMNS = ("response_ids", "response_mask", "finish_reason", "num_turns", "messages", "spliced", "tool_calls",
                "tool_success", "rollbacks_triggered", "rollbacks_recovered", "errors_kept", "correct", "reward")
EXEC_COLUMNS = ("traj_id", "exec_idx", "position", "attempt", "code", "ok", "error_kind", "stdout", "stderr")


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    """(paired, separate): per mode, (metrics, tables) of 8 held-out prompts × 4 samples, local sandbox."""
    torch.set_num_threads(1)
    cfg = load_config("configs/tiny.yaml", ["sandbox.backend=local"])
    setup = cfg.setups().eval
    setup = setup.model_copy(update={"eval": setup.eval.model_copy(update={"n_prompts": 8, "samples": 4})})
    path = write_task_parquet(tmp_path_factory.mktemp("paired") / "eval.parquet", 8, 0, "eval")
    items = list(load_prompts(str(path)))
    paired = evaluation.evaluate_pair(MODEL, items, setup)
    separate = {mode: evaluation.evaluate_mode(MODEL, items, setup, mode) for mode in ("saar_off", "saar_on")}
    return paired, separate


@pytest.mark.parametrize("mode", ["saar_off", "saar_on"])
def test_one_pass_gives_the_two_separate_passes(both, mode):
    paired, separate = both
    assert paired is not None, "the in-process engine with continuous scheduling shares the pass"
    (m_pair, t_pair), (m_sep, t_sep) = paired[mode], separate[mode]
    assert m_pair == m_sep  # every figure, exactly
    a, b = t_pair["trajectories"].sort("traj_id"), t_sep["trajectories"].sort("traj_id")
    assert a["traj_id"].to_list() == b["traj_id"].to_list() and a.height == 32
    for col in TRAJ_COLUMNS:
        assert a[col].to_list() == b[col].to_list(), col
    worst = max(abs(x - y) for ra, rb in zip(a["rollout_logprobs"], b["rollout_logprobs"]) for x, y in zip(ra, rb))
    assert worst <= LP_NOISE
    ea, eb = (t["executions"].select(EXEC_COLUMNS).sort("traj_id", "exec_idx") for t in (t_pair, t_sep))
    assert ea.equals(eb)
    sa, sb = (t["saar_events"].drop("run_id", "step").sort("traj_id", "event_idx") for t in (t_pair, t_sep))
    assert sa.equals(sb)


def test_the_pass_forks_where_a_call_failed_and_only_there(both):
    """The test means something: some trajectories failed a call (a twin forked) and their modes differ after it;
    the others are the same trajectory in both modes."""
    paired, _ = both
    off = paired["saar_off"][1]["trajectories"].sort("traj_id")
    on = paired["saar_on"][1]["trajectories"].sort("traj_id")
    failed = on["rollbacks_triggered"] > 0
    assert 0 < failed.sum() < on.height
    assert off.filter(failed)["rollbacks_triggered"].sum() == 0 and off.filter(failed)["errors_kept"].min() >= 1
    assert off.filter(~failed)["response_ids"].to_list() == on.filter(~failed)["response_ids"].to_list()
    differ = [x != y for x, y in zip(off.filter(failed)["response_ids"].to_list(),
                                     on.filter(failed)["response_ids"].to_list())]
    assert all(differ)  # SAAR off keeps the error turn, SAAR on splices it away


def _decode(model, requests: list[tuple], seed: int = 3) -> tuple[dict, dict]:
    from models.decode import DecodeStream

    counters: dict = {}
    stream = DecodeStream(model, 2, 0, 1.0, 1.0, 8, seed=seed, keep_prefix=True, counters=counters)
    for key, prompt, budget, seed_key in requests:
        stream.submit(key, prompt, budget, seed_key=seed_key)
    out = {}
    while stream.busy:
        out.update({k: (ids, lps, reason) for k, ids, lps, reason in stream.step()})
    return out, counters


def test_a_twin_samples_with_its_originals_draws_and_an_identical_turn_is_decoded_once():
    """``seed_key``: a twin alone samples what its original samples (the draws are the seed key's, not the key's or
    the batch slot's); another key samples otherwise. Queued together with the same ids, the two are decoded as one
    row: the twin gets the original's ids cut at its own budget."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(MODEL).eval()
    prompt = [5, 17, 40, 8, 99, 3]
    out, counters = _decode(model, [("t", prompt, 24, None), ("u", prompt, 24, None)])
    t_ids, t_lps, _ = out["t"]
    assert len(t_ids) > 5 and out["u"][0] != t_ids
    alone, _ = _decode(model, [("u", prompt, 24, None), ("t/saar_off", prompt, 24, "t")])
    assert alone["t/saar_off"][0] == t_ids
    both, counters_both = _decode(model, [("t/saar_off", prompt, 5, "t"), ("t", prompt, 24, None),
                                          ("u", prompt, 24, None)])
    assert both["t"][0] == t_ids and both["t/saar_off"] == (t_ids[:5], t_lps[:5], "length")
    assert counters_both["generated"] == counters["generated"] == len(t_ids) + len(out["u"][0])
    longer, _ = _decode(model, [("t", prompt, 24, None), ("t/saar_off", prompt, 30, "t")])  # the twin leads
    assert longer["t"][0] == t_ids and longer["t"][2] == out["t"][2] and longer["t/saar_off"][0][:24] == t_ids
    assert longer["t"][1] == pytest.approx(t_lps, abs=LP_NOISE)  # a batch of one row, not two: float noise


def test_paired_rollout_refuses_what_cannot_share_a_pass(chat):
    cfg = RolloutConfig(n_samples=1, saar=SAARConfig(raw_share=0.0))
    scripted = ScriptedEngine(chat, [])  # its stream is not row-seeded
    assert not shares_work("continuous", scripted)
    with pytest.raises(ValueError, match="scheduling: continuous"):
        PairedRollout(cfg, scripted, chat, None)
    with pytest.raises(ValueError, match="raw_share 0"):
        PairedRollout(cfg.model_copy(update={"saar": SAARConfig(raw_share=0.3)}), scripted, chat, None)
    row_seeded = type("RowSeeded", (), {"row_seeded": True, "stream": None})()
    assert shares_work("continuous", row_seeded) and not shares_work("rounds", row_seeded)


def test_evaluate_takes_the_paired_pass_only_when_it_is_on(monkeypatch):
    """``eval.shared_pass`` off, or one mode only: each mode rolled out alone (today's path)."""
    calls = []
    monkeypatch.setattr(evaluation, "roll_pair", lambda *a: calls.append("pair") or {
        m: [1.0] for m in ("saar_off", "saar_on")})
    monkeypatch.setattr(evaluation, "roll_mode", lambda c, i, s, mode: calls.append(mode) or [2.0])
    monkeypatch.setattr(evaluation, "grade_modes", lambda c, s, rolled: {
        m: ({"x": trajs[0]}, {}) for m, trajs in rolled.items()})
    setup = load_config("configs/tiny.yaml").setups().eval
    with_modes = lambda modes, shared: setup.model_copy(update={"eval": setup.eval.model_copy(  # noqa: E731
        update={"modes": modes, "shared_pass": shared})})
    assert evaluation.evaluate(MODEL, [], with_modes(["saar_off", "saar_on"], True)) == {
        "eval/saar_off/x": 1.0, "eval/saar_on/x": 1.0} and calls == ["pair"]
    calls.clear()
    evaluation.evaluate(MODEL, [], with_modes(["saar_off", "saar_on"], False))
    evaluation.evaluate(MODEL, [], with_modes(["saar_off"], True))
    assert calls == ["saar_off", "saar_on", "saar_off"]


@pytest.mark.parametrize("dispatch", [None, "train/train-tiny-fanout"])
def test_compare_children_never_evaluate_the_start_again(dispatch):
    """The shared initial evaluation is step 0 of every run: no child, dispatched or not, evaluates it again."""
    from flows.compare import compare_jobs

    cfg = load_config("configs/tiny.yaml", [f"compare.dispatch={dispatch}"] if dispatch else [])
    jobs = compare_jobs(cfg, [], "cmp")
    assert len(jobs) == sum(len(cfg.compare.seeds_of(a)) for a in cfg.compare.arms)
    for _, _, _, overrides in jobs:
        child = load_config("configs/tiny.yaml", overrides)
        assert child.train.eval_at_start is False and "train.eval_at_start=false" in overrides


def test_the_initial_evaluation_is_read_back_not_recomputed(tmp_path, monkeypatch):
    from flows.compare import initial_eval_task
    from tasks.training import stages

    monkeypatch.setattr(stages, "eval_stage", lambda *a, **k: pytest.fail("the initial evaluation ran again"))
    (tmp_path / "initial_eval.json").write_text(json.dumps({"eval/saar_off/all/pass_at_1": 0.25}))
    cfg = load_config("configs/tiny.yaml")
    assert initial_eval_task.fn(cfg, "cmp-initial", "parent", str(tmp_path)) == {"eval/saar_off/all/pass_at_1": 0.25}
    assert Path(tmp_path / "initial_eval.json").exists()


def test_the_kept_initial_evaluation_is_refused_under_another_configuration(tmp_path, monkeypatch):
    """Kept with the configuration that made it: read back under the same one (however spelled), refused under
    another, naming the field, and nothing is evaluated or overwritten."""
    from flows.compare import initial_eval_task
    from tasks.stores.run_records import RecordMismatch
    from tasks.training import live, stages

    calls = []
    monkeypatch.setattr(stages, "eval_stage", lambda *a, **k: calls.append(a) or {"eval/saar_off/all/pass_at_1": 0.5})
    monkeypatch.setattr(live, "close_live", lambda: None)
    monkeypatch.setattr("flows.prepare.ensure_policy", lambda cfg: None)
    cfg = load_config("configs/tiny.yaml")
    assert initial_eval_task.fn(cfg, "cmp-initial", "parent", str(tmp_path)) == {"eval/saar_off/all/pass_at_1": 0.5}
    kept = (tmp_path / "initial_eval.json").read_text()
    same = load_config("configs/tiny.yaml", [f"eval.n_prompts={cfg.eval.n_prompts}"])
    assert initial_eval_task.fn(same, "cmp-initial", "parent", str(tmp_path)) == {"eval/saar_off/all/pass_at_1": 0.5}
    assert len(calls) == 1
    other = load_config("configs/tiny.yaml", [f"eval.n_prompts={cfg.eval.n_prompts + 1}"])
    with pytest.raises(RecordMismatch, match=r"initial evaluation .*initial_eval.json was made under another "
                                             r"configuration \(fields that differ: eval.n_prompts\)"):
        initial_eval_task.fn(other, "cmp-initial", "parent", str(tmp_path))
    assert len(calls) == 1 and (tmp_path / "initial_eval.json").read_text() == kept
