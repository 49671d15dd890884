"""The multi-call regime's warm-up corpus and gate.

The gate's measures are checked on hand-made trajectory and execution tables whose shares are counted by hand;
the chain corpus runs in the real local sandbox (its transcripts bind the previous call's output, keep
correctness through fixes, and are dropped when an output differs).
"""

from __future__ import annotations

import json

import polars as pl
import pytest

from tasks.training.chain_gate import chain_gate_metrics, verdict
from tasks.training.config import ChainGateConfig


def tables(rows: list[tuple], execs: list[tuple]) -> tuple[pl.DataFrame, pl.DataFrame]:
    trajs = pl.DataFrame(rows, schema=["traj_id", "prompt_id", "num_turns", "finish_reason", "graded", "correct"],
                         orient="row")
    ex = pl.DataFrame(execs, schema=["traj_id", "exec_idx", "position", "code", "ok", "stdout"], orient="row")
    return trajs, ex


def test_the_gate_measures_counted_by_hand():
    """Prompt p2 has 2 calls, p3 has 3 (position = the turn of the call, from 0; the k-th clean call did step k).

    t1 (p2): ok 3803 → call binding 3803, ok → answers in turn 3        all clean, correct
    t2 (p2): ok 3803 → call binding 3804, ok → answers in turn 3        all clean, wrong
    t3 (p2): one merged call, ok → answers in turn 2                    all clean, correct
    t4 (p3): fails → ok 7 (step 1) → binding 7, ok (step 2) → a 4th turn's call, cut by the budget   wrong
    t5 (p3): ok 40 → binding 40, ok "2\n4" → binding 4, fails → stop                                wrong

    next call after a clean call with steps left: t1 1/1, t2 1/1, t3 0/1, t4 2/2 (the cut call was made),
    t5 2/2 → 6/7; the answer in the next turn after the last step: t1, t2 → 2/2; together 8/9.
    binds (calls after a clean call that printed an integer; its last line counts): t1 1/1, t2 0/1, t4 1/1 (its
    call at position 1 follows only a failure: not counted), t5 2/2 (the failed call binds too) → 4/5.
    Calls 2 + 2 + 1 + 3 + 3 = 11, failed 2. All calls clean: t1, t2, t3 → 2/3 correct. pass@1 2/5, cut 1/5.
    """
    rows = [("t1", "p2", 3, "stop", True, True), ("t2", "p2", 3, "stop", True, False),
            ("t3", "p2", 2, "stop", True, True), ("t4", "p3", 4, "turn_cap", True, False),
            ("t5", "p3", 4, "stop", True, False)]
    execs = [("t1", 0, 0, "print(a % b)", True, "3803"), ("t1", 1, 1, "r = 3803\nprint(r % 7)", True, "2"),
             ("t2", 0, 0, "print(a % b)", True, "3803"), ("t2", 1, 1, "r = 3804\nprint(r % 7)", True, "3"),
             ("t3", 0, 0, "r = a % b\nprint(r % 7)", True, "2"),
             ("t4", 0, 0, "print(a %% b)", False, "SyntaxError"), ("t4", 1, 1, "print(a % b)", True, "7"),
             ("t4", 2, 2, "r = 7\nprint(r + 1)", True, "8"),
             ("t5", 0, 0, "print(x)", True, "40"), ("t5", 1, 1, "r = 40\nprint(len(str(r)))", True, "2\n4"),
             ("t5", 2, 2, "u = 4\nprint(u // q)", False, "ZeroDivisionError")]
    m = chain_gate_metrics(*tables(rows, execs), {"p2": 2, "p3": 3})
    assert m["next_step_after_clean"] == pytest.approx(8 / 9)
    assert m["next_call_after_clean"] == pytest.approx(6 / 7) and m["answer_after_last_clean"] == pytest.approx(2 / 2)
    assert m["binds_previous"] == pytest.approx(4 / 5) and m["n_later_calls"] == 5
    assert m["call_failure_rate"] == pytest.approx(2 / 11)
    assert m["p_correct_all_clean"] == pytest.approx(2 / 3) and m["n_all_clean"] == 3
    assert m["pass@1"] == pytest.approx(2 / 5) and m["turn_cap"] == pytest.approx(1 / 5)
    checks = verdict(m, ChainGateConfig(min_trajectories=5))
    assert checks == {"trajectories": True, "next_step_after_clean": True, "binds_previous": False,
                      "call_failure_rate": False, "p_correct_all_clean": True}


def test_the_bars_are_inclusive_ranges_and_the_size_counts():
    m = {"trajectories": 256.0, "next_step_after_clean": 0.8, "binds_previous": 0.9, "call_failure_rate": 0.45,
         "p_correct_all_clean": 0.3}
    assert all(verdict(m, ChainGateConfig()).values())
    assert not verdict({**m, "trajectories": 255.0}, ChainGateConfig())["trajectories"]
    assert not verdict({**m, "call_failure_rate": 0.19}, ChainGateConfig())["call_failure_rate"]
    assert not verdict({**m, "p_correct_all_clean": 0.71}, ChainGateConfig())["p_correct_all_clean"]


def test_an_empty_rollout_is_an_error():
    with pytest.raises(ValueError, match="no trajectories"):
        chain_gate_metrics(*tables([], []), {})


@pytest.fixture(scope="module")
def box():
    from sandbox.base import make_sandbox
    from sandbox.config import SandboxConfig

    with make_sandbox(SandboxConfig(backend="local", workers=2)) as sb:
        yield sb


def test_the_chain_corpus_binds_each_result_and_mixes_in_single_calls(tmp_path, box):
    from models.chat import parse_tool_call
    from tasks.data.synthetic.chain_corpus import write_warmup_corpus
    from tasks.data.synthetic.corpus import CorpusMix
    from tasks.data.synthetic.problems import split_of

    path = write_warmup_corpus(tmp_path / "c.jsonl", 60, 4, box, CorpusMix(mistake_share=0.5, reflect_share=0.0,
                                                                               retry_share=0.0), 0.5, 0.25)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    chains = [r for r in rows if r["meta"].get("family") == "chain"]
    stats = json.loads(path.with_suffix(".stats.json").read_text())
    assert len(chains) == stats["chains_written"] == 30 - sum(stats["dropped"].values())
    assert len(rows) - len(chains) == stats["single_written"] > 0
    assert sum(bool(r["meta"]["mistakes"]) for r in chains) > 0
    for row in chains:
        msgs = row["messages"]
        assert split_of(msgs[0]["content"]) == "sft"
        tools = [m["content"] for m in msgs if m["role"] == "tool"]
        ok_outputs = [t for t in tools if "Error" not in t]
        assert len(ok_outputs) == row["meta"]["calls"]
        calls = [parse_tool_call(m["content"]).code for m in msgs if m["role"] == "assistant" and "<tool_call>" in m["content"]]
        later_clean = [c for c in calls if c.split("\n", 1)[0] in {f"r = {ok_outputs[0]}", f"u = {ok_outputs[-2]}"}]
        assert len({c.split(chr(10))[0] for c in later_clean}) == row["meta"]["calls"] - 1, "each later call binds"
        assert msgs[-1]["content"] == f"The answer is \\boxed{{{ok_outputs[-1]}}}."


def test_the_chain_warmup_stage_has_its_own_work_folder_start_and_gate():
    """The regime's warm-up continues from tiny-warm in a folder of its own (never the single-call corpus's) and
    ends with the chain gate."""
    from pathlib import Path

    from flows.config import load_config
    from flows.warmup import GATES, _work_dir, chain_gate_task, gate_task

    root = Path(__file__).resolve().parents[1] / "configs"
    chain = load_config(root / "regimes" / "multicall.yaml")
    assert _work_dir(chain).name == "regime-multicall-seed2-n30000-chain0.5"
    assert chain.warmup.init_from == "assets/tiny-warm" and chain.data.family == "chain"
    assert _work_dir(load_config(root / "tiny.yaml")).name == "seed0-n40000"
    assert GATES[chain.data.family] is chain_gate_task and GATES["single"] is gate_task
