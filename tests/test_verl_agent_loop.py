"""Parity: the verl agent loop ``cleaner_agent`` and the pipeline's ``Rollout`` give the same trajectories.

verl's real ``AgentLoopWorker`` (config composed from verl's own ``ppo_trainer.yaml``, our loop
registered through ``configs/verl/agent_loops.yaml``) runs a batch through
``generate_sequences``; its server manager and the pipeline's engine answer from the same
per-prompt scripts (real tokenizer, real end-of-turn id), and code runs in the local sandbox on
both sides. Prompt ids, response ids, response masks, rollout log-probs and the SAAR decisions
must be identical, scenario by scenario.
"""

from __future__ import annotations

import asyncio
import os
import re

import pytest

from models.chat import render_call
from models.engine import GenOutput
from sandbox.base import make_sandbox
from sandbox.config import SandboxConfig
from tasks.rollout.machine import PromptItem, Rollout
from tests.test_saar_rollout import LONG_FIX

verl = pytest.importorskip("verl", reason="verl is not installed: pip install -e '.[verl]' (CPU is fine)")
pytestmark = [pytest.mark.verl, pytest.mark.slow]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = {
    "shallow": ["I multiply. " + render_call("pritn(6 * 7)"), "Fixing. " + render_call("print(6 * 7)"), "\\boxed{42}"],
    "deep": ["Go. " + render_call("print(6 * 7"), "A loop instead. " + render_call(LONG_FIX), "\\boxed{56088}"],
    "exhausted": [f"T{i}. " + render_call(f"print(1/0 + {i})") for i in range(4)] + ["I give up."],
    "no_call": ["Compute. " + render_call("print(undefined_name)"), "It is \\boxed{42}."],
    "clean": ["Easy. " + render_call("print(40 + 2)"), "\\boxed{42}"],
}


class KeyedScript:
    """Answers a request from the script of the case named in its prompt (``case <name>``)."""

    def __init__(self, chat):
        self.chat = chat
        self.left = {k: list(v) for k, v in SCRIPTS.items()}
        self.calls = 0

    def answer(self, input_ids: list[int]) -> tuple[list[int], list[float]]:
        case = re.search(r"case (\w+)", self.chat.decode(input_ids)).group(1)
        self.calls += 1
        ids = self.chat.encode(self.left[case].pop(0)) + [self.chat.eos_id]
        return ids, [-0.001 * (len(self.left[case]) + 1)] * len(ids)


class ScriptEngine:
    def __init__(self, script: KeyedScript):
        self.script, self.eos_id = script, script.chat.eos_id

    def generate(self, requests, seed):
        return [GenOutput(*self.script.answer(r.input_ids), "stop") for r in requests]

    def load_weights(self, path):
        return None


class ScriptServerManager:
    """Stands in for verl's ``LLMServerClient`` (same ``generate`` signature, returns ``TokenOutput``)."""

    def __init__(self, script: KeyedScript):
        self.script = script

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        assert sampling_params["logprobs"] and sampling_params["max_new_tokens"] >= 1
        ids, lps = self.script.answer(prompt_ids)
        return TokenOutput(token_ids=ids, log_probs=lps, stop_reason="completed")


def item(case: str) -> PromptItem:
    return PromptItem(case, [{"role": "user", "content": f"case {case}: what is 6 * 7?"}], "synthetic/arith", "42",
                      {"index": case})


@pytest.fixture(scope="module")
def verl_config(warm_model_dir):
    import verl.trainer.config as verl_configs
    from hydra import compose, initialize_config_dir

    overrides = [
        f"actor_rollout_ref.model.path={warm_model_dir}", "actor_rollout_ref.rollout.name=sglang",
        "actor_rollout_ref.rollout.mode=async", "actor_rollout_ref.rollout.multi_turn.enable=true",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=4",
        "actor_rollout_ref.rollout.prompt_length=1024", "actor_rollout_ref.rollout.response_length=512",
        "actor_rollout_ref.rollout.agent.default_agent_loop=cleaner_agent",
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={ROOT}/configs/verl/agent_loops.yaml",
        "+cleaner.saar.raw_share=0.0", "+cleaner.max_new_tokens=128",
        "+cleaner.sandbox.backend=local", "+cleaner.sandbox.workers=1",
    ]
    with initialize_config_dir(config_dir=os.path.dirname(verl_configs.__file__), version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


@pytest.fixture(scope="module")
def both_paths(verl_config, chat):
    import numpy as np
    import torch
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.protocol import DataProto

    from tasks.rollout.verl_loop import close_sandboxes, rollout_config

    torch.set_num_threads(1)
    cases = list(SCRIPTS)
    cfg = rollout_config(verl_config)
    with make_sandbox(SandboxConfig(backend="local", workers=1)) as box:
        pipeline = Rollout(cfg, ScriptEngine(KeyedScript(chat)), chat, box).run([item(c) for c in cases], 0, 0, False)
    rows = np.empty(len(cases), dtype=object)
    rows[:] = [[{"role": "user", "content": f"case {c}: what is 6 * 7?"}] for c in cases]
    extra = np.array([{"index": c} for c in cases], dtype=object)
    batch = DataProto.from_dict(non_tensors={"raw_prompt": rows, "extra_info": extra}, meta_info={"global_steps": 1})
    worker = AgentLoopWorker(verl_config, ScriptServerManager(KeyedScript(chat)))
    try:
        out = asyncio.run(worker.generate_sequences(batch))
    finally:
        close_sandboxes()
    return cases, cfg, pipeline, out


def unpadded(out, row: int) -> tuple[list[int], list[int], list[int], list[float]]:
    width = out.batch["prompts"].shape[1]
    attn = out.batch["attention_mask"][row]
    prompt = out.batch["prompts"][row][attn[:width].bool()].tolist()
    n = int(attn[width:].sum())
    resp = out.batch["responses"][row][:n].tolist()
    mask = out.batch["response_mask"][row][:n].tolist()
    lps = out.batch["rollout_log_probs"][row][:n].tolist()
    return prompt, resp, mask, lps


def test_verl_keys_configure_our_rollout(both_paths):
    _, cfg, _, _ = both_paths
    assert cfg.max_turns == 4 and cfg.max_response_tokens == 512 and cfg.max_new_tokens == 128
    assert cfg.saar.raw_share == 0.0 and cfg.saar.similarity_threshold == 0.5


def test_same_tokens_masks_and_logprobs(both_paths):
    cases, _, pipeline, out = both_paths
    for row, (case, traj) in enumerate(zip(cases, pipeline)):
        prompt, resp, mask, lps = unpadded(out, row)
        assert prompt == traj.prompt_ids, case
        assert resp == traj.response_ids, case
        assert mask == traj.response_mask, case
        assert lps == pytest.approx(traj.logprobs, abs=1e-6), case


def test_same_saar_decisions(both_paths):
    cases, _, pipeline, out = both_paths
    seen = set()
    for row, (case, traj) in enumerate(zip(cases, pipeline)):
        events = out.non_tensor_batch["cleaner_events"][row]
        assert [(e["kind"], e["similarity"]) for e in events] == [(e.kind, e.similarity) for e in traj.events], case
        stats = out.non_tensor_batch["cleaner_stats"][row]
        assert {k: stats[k] for k in traj.stats.scalars()} == traj.stats.scalars(), case
        seen.update(e.kind for e in traj.events)
    assert {"shallow", "deep", "recovered", "exhausted", "no_call"} <= seen


def test_purified_trajectories_carry_no_error_text(both_paths, chat):
    cases, _, _, out = both_paths
    for row, case in enumerate(cases):
        text = chat.decode(unpadded(out, row)[1])
        if case in ("shallow", "deep", "clean"):
            assert "Error" not in text and text.count("<tool_call>") == 1, case


def test_paper_config_composes_with_verl_defaults():
    from hydra import compose, initialize_config_dir

    from tasks.rollout.verl_loop import rollout_config

    with initialize_config_dir(config_dir=f"{ROOT}/configs/verl", version_base=None):
        cfg = compose(config_name="cleaner_grpo")
    actor, rollout = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
    assert (actor.clip_ratio_low, actor.clip_ratio_high, actor.use_kl_loss, actor.optim.lr) == (0.2, 0.28, False, 2e-6)
    assert (cfg.data.train_batch_size, rollout.n, rollout.response_length) == (128, 16, 20480)
    assert (rollout.name, rollout.mode, rollout.agent.default_agent_loop) == ("sglang", "async", "cleaner_agent")
    assert cfg.algorithm.adv_estimator == "grpo" and cfg.algorithm.rollout_correction.bypass_mode is False
    ours = rollout_config(cfg)
    assert (ours.max_turns, ours.max_response_tokens, ours.saar.raw_share) == (16, 20480, 0.3)


def test_reward_adapter_uses_our_graders():
    from tasks.rollout.verl_loop import close_sandboxes, compute_score

    try:
        assert compute_score("synthetic/arith", "So \\boxed{42}.", "42")["score"] == 1.0
        assert compute_score("synthetic/arith", "So \\boxed{41}.", "42")["acc"] == 0.0
    finally:
        close_sandboxes()
