"""SAAR as a verl agent loop: ``@register("cleaner_agent")`` for verl's Ray + FSDP trainer.

What: ``CleanerAgentLoop.run`` rolls out one sample with the pipeline's own rollout — the
handlers of ``tasks.rollout.machine.Rollout`` driven one trajectory at a time (``Rollout.drive``) and the
rules of ``tasks.rollout.saar`` — so both paths share one SAAR implementation. Generation goes through
verl's server manager (``server_manager.generate(request_id, prompt_ids=..., sampling_params=...)``,
SGLang or vLLM behind it); code runs in our sandbox (one pool per worker process, closed at exit).
The output is verl's ``AgentLoopOutput`` (prompt_ids, response_ids, response_mask 1 = policy
tokens, rollout log-probs); SAAR statistics and events ride in ``extra_fields``.

Config: verl's own keys under ``actor_rollout_ref.rollout.multi_turn`` are honoured
(``max_assistant_turns`` → turns, ``max_tool_response_length`` → tool text chars) and
``rollout.response_length`` is the response budget; ours live in a top-level ``cleaner:`` section
(``cleaner.saar`` = ``SAARConfig``, ``cleaner.sandbox`` = ``SandboxConfig``,
``cleaner.max_new_tokens``, ``cleaner.system_prompt``, ``cleaner.seed``), see
``configs/verl/cleaner_grpo.yaml``. verl imports this module through
``configs/verl/agent_loops.yaml`` (``rollout.agent.agent_loop_config_path``).

Simplifies: verl does not hand an agent loop its sample index within the group, so the raw-share
draw is keyed by (seed, prompt id = ``extra_info.index``, the n-th rollout of that prompt in this
worker process) — reproducible for a rerun with the same worker layout, not across layouts.

Run: ``bash infra/verl/run_cleaner_grpo.sh`` (GPU), or see ``docs/run_at_scale.md``.
"""

from __future__ import annotations

import asyncio
import atexit
from collections import Counter
from dataclasses import asdict
from typing import Any
from uuid import uuid4

from omegaconf import OmegaConf
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register

from models.chat import ChatFormat
from models.engine import GenOutput, GenRequest
from sandbox.config import SandboxConfig
from tasks.rollout.config import RolloutConfig, SAARConfig
from tasks.rollout.machine import PromptItem, Rollout, Trajectory

_sandboxes: dict[str, Any] = {}
_draws: Counter = Counter()


def cleaner_settings(trainer_config) -> dict:
    """Our ``cleaner:`` section of the verl config as a plain dict (empty when absent)."""
    section = trainer_config.get("cleaner") if hasattr(trainer_config, "get") else None
    return OmegaConf.to_container(section, resolve=True) if section is not None else {}


def rollout_config(trainer_config) -> RolloutConfig:
    """Our ``RolloutConfig`` from verl's rollout / multi_turn keys plus the ``cleaner:`` section."""
    rollout = trainer_config.actor_rollout_ref.rollout
    ours = cleaner_settings(trainer_config)
    response_length = int(rollout.response_length)
    multi_turn = rollout.get("multi_turn") or {}
    return RolloutConfig(
        n_samples=1,
        max_turns=int(multi_turn.get("max_assistant_turns") or 16),
        max_new_tokens=int(ours.get("max_new_tokens") or response_length),
        max_response_tokens=response_length,
        max_tool_response_chars=int(multi_turn.get("max_tool_response_length") or 256),
        saar=SAARConfig(**(ours.get("saar") or {})),
    )


def shared_sandbox(cfg: SandboxConfig):
    """One sandbox pool per worker process and config (the reference opens one per trajectory)."""
    key = cfg.model_dump_json()
    if key not in _sandboxes:
        from sandbox.base import make_sandbox

        if not _sandboxes:
            atexit.register(close_sandboxes)
        _sandboxes[key] = make_sandbox(cfg)
    return _sandboxes[key]


def close_sandboxes() -> None:
    """Close this process's sandbox pools (also registered at exit)."""
    while _sandboxes:
        _sandboxes.popitem()[1].close()


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> dict:
    """verl custom reward function (``reward.custom_reward_function``): our graders (``tasks.rewards.registry``)."""
    from tasks.rewards.registry import compute_reward

    res = compute_reward(data_source, solution_str, ground_truth, dict(extra_info or {}),
                         sandbox=shared_sandbox(SandboxConfig()))
    return {"score": float(res.reward), "acc": float(bool(res.correct))}


def prompt_item(kwargs: dict) -> PromptItem:
    """A verl dataset row (``raw_prompt``, ``extra_info``, ``reward_model``, ``data_source``) as our item."""
    extra = dict(kwargs.get("extra_info") or {})
    reward = kwargs.get("reward_model") or {}
    pid = extra.get("index", kwargs.get("index", kwargs.get("uid", uuid4().hex)))
    return PromptItem(str(pid), [dict(m) for m in kwargs["raw_prompt"]], str(kwargs.get("data_source", "")),
                      str(reward.get("ground_truth", "")), extra)


def to_output(t: Trajectory) -> AgentLoopOutput:
    """verl's output of one finished trajectory; SAAR statistics and events in ``extra_fields``."""
    return AgentLoopOutput(
        prompt_ids=list(t.prompt_ids),
        response_ids=list(t.response_ids),
        response_mask=list(t.response_mask),
        response_logprobs=list(t.logprobs),
        num_turns=len(t.messages),
        metrics=AgentLoopMetrics(),
        extra_fields={
            "cleaner_raw": t.raw,
            "cleaner_finish_reason": t.finish_reason,
            "cleaner_stats": {**t.stats.scalars(), "failure_reasons": dict(t.stats.failure_reasons),
                              "similarities": list(t.stats.similarities)},
            "cleaner_events": [asdict(e) for e in t.events],
        },
    )


@register("cleaner_agent")
class CleanerAgentLoop(AgentLoopBase):
    """verl agent loop running CLEANER's rollout + SAAR on one sample (see module docstring)."""

    def __init__(self, *args, tools=None, **kwargs):
        super().__init__(*args, **kwargs)
        ours = cleaner_settings(self.config)
        self.cfg = rollout_config(self.config)
        self.seed = int(ours.get("seed", 0))
        self.sandbox_cfg = SandboxConfig(**(ours.get("sandbox") or {}))
        self.chat = ChatFormat(self.tokenizer, ours.get("system_prompt"))
        self.rollout = Rollout(self.cfg, engine=None, chat=self.chat, sandbox=None)

    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        item = prompt_item(kwargs)
        nth = _draws[item.prompt_id]
        _draws[item.prompt_id] += 1
        traj = self.rollout.new_trajectory(item, self.seed, 0, nth)
        request_id = uuid4().hex

        async def agenerate(req: GenRequest) -> GenOutput:
            params = {**sampling_params, "max_new_tokens": req.max_new_tokens, "logprobs": True,
                      "stop_token_ids": [self.chat.eos_id]}
            out = await self.server_manager.generate(request_id, prompt_ids=req.input_ids, sampling_params=params)
            return self.gen_output(out, req)

        async def aexecute(code: str, setup: str | None = None):
            box = shared_sandbox(self.sandbox_cfg)
            return (await asyncio.to_thread(box.run_many, [code], [setup]))[0]

        return to_output(await self.rollout.drive(traj, agenerate, aexecute))

    def gen_output(self, out, req: GenRequest) -> GenOutput:
        """verl ``TokenOutput`` → our ``GenOutput``; an aborted generation is an error, never an empty turn."""
        if getattr(out, "stop_reason", None) == "aborted":
            raise RuntimeError(f"verl server manager aborted a generation of {len(req.input_ids)} prompt tokens")
        ids = list(out.token_ids)
        lps = list(out.log_probs) if out.log_probs else [0.0] * len(ids)
        if ids and ids[-1] == self.chat.eos_id:
            return GenOutput(ids, lps, "stop")
        if len(ids) >= req.max_new_tokens:
            return GenOutput(ids, lps, "length")
        return GenOutput(ids + [self.chat.eos_id], lps + [0.0], "stop")

