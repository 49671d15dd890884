"""The paired pass (``tasks.rollout.paired``) where a SAAR-off twin reaches its response budget, and on the
multi-call regime, against two separate passes (issue 50, item 4).

A twin keeps the error turns its original splices away, so it is the one that runs out of response tokens: at
the end of the pass it is cut to its own budget (``Trajectory.truncate``), as a separate SAAR-off pass would have
stopped it. The budget cases use the tiny policy with a response budget small enough that failed trajectories
reach it; the multi-call case is the chain task (2-3 dependent calls, each prompt with its own turn budget) on the
chain-warmed policy, ``configs/regimes/multicall.yaml``'s turn and token settings.
"""

from __future__ import annotations

import pytest
import torch

from flows.config import load_config
from tasks.data.loader import load_prompts
from tasks.data.synthetic import write_task_parquet
from tasks.training import evaluation
from tests.test_paired_eval import LP_NOISE, TRAJ_COLUMNS

CASES = {
    "budget": ("configs/tiny.yaml", "assets/tiny-warm", "single", ["rollout.max_response_tokens=40"]),
    "multicall": ("configs/regimes/multicall.yaml", "assets/tiny-chain-warm", "chain", []),
}


@pytest.fixture(scope="module", params=list(CASES))
def both(request, tmp_path_factory):
    """(case, the setup's budget, paired, separate): per mode (metrics, tables), 8 prompts × 4 samples."""
    torch.set_num_threads(1)
    config, model, family, sets = CASES[request.param]
    cfg = load_config(config, ["sandbox.backend=local", "rollout.saar.raw_share=0.3", *sets])
    setup = cfg.setups().eval
    setup = setup.model_copy(update={"eval": setup.eval.model_copy(update={"n_prompts": 8, "samples": 4})})
    path = write_task_parquet(tmp_path_factory.mktemp(request.param) / "eval.parquet", 8, 0, "eval", family=family)
    items = list(load_prompts(str(path)))
    paired = evaluation.evaluate_pair(model, items, setup)
    separate = {mode: evaluation.evaluate_mode(model, items, setup, mode) for mode in ("saar_off", "saar_on")}
    return request.param, cfg.rollout.max_response_tokens, paired, separate


@pytest.mark.slow
def test_the_paired_pass_gives_the_separate_passes_where_twins_reach_their_budget(both):
    case, budget, paired, separate = both
    assert paired is not None
    for mode in ("saar_off", "saar_on"):
        (m_pair, t_pair), (m_sep, t_sep) = paired[mode], separate[mode]
        assert m_pair == m_sep, mode
        a, b = t_pair["trajectories"].sort("traj_id"), t_sep["trajectories"].sort("traj_id")
        for col in TRAJ_COLUMNS:
            assert a[col].to_list() == b[col].to_list(), (mode, col)
        worst = max(abs(x - y) for ra, rb in zip(a["rollout_logprobs"], b["rollout_logprobs"])
                    for x, y in zip(ra, rb))
        assert worst <= LP_NOISE
    on = paired["saar_on"][1]["trajectories"].sort("traj_id")
    off = paired["saar_off"][1]["trajectories"].sort("traj_id")
    twins = off.filter(on["rollbacks_triggered"] > 0)
    assert twins.height > 0, f"{case}: no call failed, no twin forked: nothing was tested"
    if case == "budget":  # the test means something: some twin ran out of response tokens
        assert (twins["finish_reason"] == "length").any(), twins["finish_reason"].to_list()
    else:  # prompts of 3 and 4 turns: budgets differ per prompt
        assert off["num_turns"].n_unique() > 1
