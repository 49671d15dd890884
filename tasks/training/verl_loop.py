"""SAAR as a verl agent loop: ``@register("cleaner_agent")`` for verl's Ray + FSDP trainer, V1 or legacy.

What: ``CleanerAgentLoop.run`` rolls out one sample with the pipeline's own rollout — the
handlers of ``tasks.rollout.machine.Rollout`` driven one trajectory at a time (``Rollout.drive``) and the
rules of ``tasks.rollout.saar`` — so both paths share one SAAR implementation. Generation goes through
verl's server manager (``server_manager.generate(request_id, prompt_ids=..., sampling_params=...)``,
SGLang or vLLM behind it); code runs in our sandbox (one pool per worker process, closed at exit).
The output is verl's ``AgentLoopOutput`` (prompt_ids, response_ids, response_mask 1 = policy
tokens, rollout log-probs, ``AgentLoopMetrics``: seconds in the server and in the sandbox); SAAR statistics
and events ride in ``extra_fields``, beside the server's own ``TokenOutput.extra_fields`` (``min_global_steps`` /
``max_global_steps``, which V1's staleness tags read), merged over the turns as verl's tool agent loop does, and so
does the trajectory's record (``extra_fields["rollout"]``, ``tasks.rewards.record``: its turns and executions),
which verl's reward loop merges into the ``extra_info`` it hands ``compute_score`` (the chain grader reads it).

Rows, as the pipeline's loader makes them (``prompt_item``): the id is ``tasks.data.formats.task_id``'s
(``{data_source}/{extra_info.index}``, ...), the paper's prompt wrapper (``tasks.data.prompts.wrap_train_prompt``)
is applied by the loader's own rule (``tasks.data.formats.train_messages``: not for ``UNWRAPPED`` sources nor rows
whose prompt is final) unless ``cleaner.prompt_template`` is off, and a prompt longer than ``rollout.prompt_length``
after our chat template is an error naming the row (verl would pad it to a ragged row).

Config: verl's own keys under ``actor_rollout_ref.rollout.multi_turn`` are honoured
(``max_assistant_turns`` → turns, ``max_tool_response_length`` → tool text chars,
``tool_response_truncate_side`` → the side of a long tool text that is cut) and
``rollout.response_length`` is the response budget; ours live in a top-level ``cleaner:`` section
(``cleaner.saar`` = ``SAARConfig``, ``cleaner.sandbox`` = ``SandboxConfig``,
``cleaner.max_new_tokens``, ``cleaner.system_prompt``, ``cleaner.seed``, ``cleaner.validation_saar``,
``cleaner.prompt_template``), see ``configs/verl/cleaner_grpo.yaml``. verl imports this module through
``configs/verl/agent_loops.yaml`` (``rollout.agent.agent_loop_config_path``); the reward function
``compute_score`` gets ``cleaner.sandbox`` through ``reward.custom_reward_function.reward_kwargs``.

Raw draws: ``CleanerAgentLoopManager`` (``rollout.agent.agent_loop_manager_class``) tags the batch before verl
splits it over workers with what each row's draw is keyed on (``tasks.training.verl_draws``), and its ``create``
builds the manager the trainer needs: this one under the legacy trainer (``trainer.use_v1=false``), V1's
TransferQueue one (``tasks.training.verl_v1``) under V1, verl's default. The draw is then the pipeline's,
``is_raw(seed, step, prompt id, sample index)``. A validation batch draws nothing raw and runs SAAR only when
``cleaner.validation_saar`` is on (default, as the reference's evaluation does).

Stops: the server's stop reason is mapped explicitly (``gen_output``): ``stop`` (SGLang) and
``completed`` ending on a stop id (vLLM says ``completed`` for stops and cuts alike) are stops — the
ids are exactly what was sampled, and the rollout closes a turn that ended on another eos id with an
untrained end-of-turn id; ``length`` and ``completed`` without a stop id are cuts (a server may clamp
a turn below ``max_new_tokens`` at its context limit); ``aborted``, an empty stop, missing log-probs
or an unknown reason raise: never an invented token, never an empty turn.

Run: ``bash infra/verl/run_cleaner_grpo.sh`` (GPU), or see ``docs/run_at_scale.md``.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import time
from dataclasses import asdict
from typing import Any
from uuid import uuid4

from omegaconf import OmegaConf
from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopManager,
    AgentLoopMetrics,
    AgentLoopOutput,
    register,
)
from verl.experimental.agent_loop.tool_agent_loop import SPEC_DECODE_EXTRA_KEYS
from verl.utils.ray_utils import auto_await

from models.chat import ChatFormat
from models.engine import GenOutput, GenRequest
from sandbox.config import SandboxConfig
from tasks.data.formats import task_id, train_messages
from tasks.rewards.record import ROLLOUT, trajectory_info
from tasks.rollout.config import RolloutConfig, SAARConfig
from tasks.rollout.machine import Rollout
from tasks.rollout.types import PromptItem, Trajectory
from tasks.training.verl_draws import annotate_draws, draw_of

_sandboxes: dict[str, Any] = {}


def cleaner_settings(trainer_config) -> dict:
    """Our ``cleaner:`` section of the verl config as a plain dict (empty when absent)."""
    section = trainer_config.get("cleaner") if hasattr(trainer_config, "get") else None
    return OmegaConf.to_container(section, resolve=True) if section is not None else {}


def rollout_config(trainer_config) -> RolloutConfig:
    """Our ``RolloutConfig`` from verl's rollout / multi_turn keys (verl's defaults where absent) plus ``cleaner:``."""
    rollout = trainer_config.actor_rollout_ref.rollout
    ours = cleaner_settings(trainer_config)
    response_length = int(rollout.response_length)
    multi_turn = rollout.get("multi_turn") or {}
    return RolloutConfig(
        n_samples=1,
        max_turns=int(multi_turn.get("max_assistant_turns") or 16),
        extra_turns=int(ours.get("extra_turns") or 0),
        max_new_tokens=int(ours.get("max_new_tokens") or response_length),
        max_response_tokens=response_length,
        max_tool_response_chars=int(multi_turn.get("max_tool_response_length") or 256),
        tool_response_truncate_side=str(multi_turn.get("tool_response_truncate_side") or "middle"),
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


def compute_score(data_source, solution_str, ground_truth, extra_info=None, sandbox=None, **kwargs) -> dict:
    """verl custom reward function (``reward.custom_reward_function``): our graders (``tasks.rewards.registry``).

    ``sandbox`` is ``cleaner.sandbox`` (a ``SandboxConfig`` mapping) that verl passes from
    ``reward.custom_reward_function.reward_kwargs.sandbox``; absent, the default ``SandboxConfig()``.
    """
    from tasks.rewards.registry import compute_reward

    if sandbox is not None and not isinstance(sandbox, dict):
        sandbox = OmegaConf.to_container(sandbox, resolve=True)
    res = compute_reward(data_source, solution_str, ground_truth, dict(extra_info or {}),
                         sandbox=shared_sandbox(SandboxConfig(**(sandbox or {}))))
    return {"score": float(res.reward), "acc": float(bool(res.correct))}


class CleanerAgentLoopManager(AgentLoopManager):
    """verl's agent-loop manager plus the draw tags; ``create`` builds the one the trainer's kind needs."""

    @classmethod
    def create(cls, *args, **kwargs):
        """Legacy trainer: this class. V1 (``trainer.use_v1``, verl's default): ``CleanerAgentLoopManagerTQ``."""
        config = kwargs["config"] if "config" in kwargs else args[0]
        if cls is CleanerAgentLoopManager and config.trainer.get("use_v1", False):
            from tasks.training.verl_v1 import CleanerAgentLoopManagerTQ

            return CleanerAgentLoopManagerTQ.create(*args, **kwargs)
        return super().create(*args, **kwargs)

    @auto_await
    async def generate_sequences(self, prompts):
        annotate_draws(prompts)
        return await AgentLoopManager.generate_sequences(self, prompts)


def prompt_item(kwargs: dict, template: bool = True) -> PromptItem:
    """A verl dataset row (``raw_prompt``, ``extra_info``, ``reward_model``, ``data_source``) as our item, made as
    ``tasks.data.loader.load_prompts`` makes it from the same row: its id (``task_id``; the raw-share draw is keyed
    on it), its messages (role and content) with the paper's wrapper unless ``template`` is off, the source is
    ``UNWRAPPED`` or the row's prompt is final (``formats.train_messages``: a row ``cleaner data to-verl`` wrote
    from another format), its ground truth as text (JSON when structured)."""
    extra = dict(kwargs.get("extra_info") or {})
    source = str(kwargs.get("data_source", ""))
    pid = task_id(source, extra, kwargs.get("id"))
    if pid is None:
        raise ValueError(f"cleaner_agent: the verl row of data_source {source!r} (uid {kwargs.get('uid')!r}) has no "
                         "id: give it extra_info.index (or id, question_id, task_id); its raw-share draw is keyed on it")
    messages = [{"role": m["role"], "content": m["content"]} for m in kwargs["raw_prompt"]]
    if template:
        messages = train_messages(messages, source, extra)
    truth = (kwargs.get("reward_model") or {}).get("ground_truth", "")
    return PromptItem(pid, messages, source, truth if isinstance(truth, str) else json.dumps(truth), extra)


def merge_extra_fields(into: dict, new: dict) -> None:
    """One turn's ``TokenOutput.extra_fields`` into the trajectory's, as verl's tool agent loop merges them: the
    first non-empty set whole, then only a newer ``max_global_steps`` and the sums of speculative-decoding counts."""
    if not into:
        into.update(new)
        return
    if new.get("max_global_steps"):
        into["max_global_steps"] = new["max_global_steps"]
    for key in SPEC_DECODE_EXTRA_KEYS:
        if key in new and key in into:
            into[key] = int(into[key]) + int(new[key])


def to_output(t: Trajectory, metrics: AgentLoopMetrics, server_fields: dict) -> AgentLoopOutput:
    """verl's output of one finished trajectory; SAAR statistics and events in ``extra_fields``, beside the
    server's."""
    return AgentLoopOutput(
        prompt_ids=list(t.prompt_ids),
        response_ids=list(t.response_ids),
        response_mask=list(t.response_mask),
        response_logprobs=list(t.logprobs),
        num_turns=len(t.messages),
        metrics=metrics,
        extra_fields={
            **server_fields,
            "cleaner_raw": t.raw,
            "cleaner_finish_reason": t.finish_reason,
            "cleaner_stats": {**t.stats.scalars(), "failure_reasons": dict(t.stats.failure_reasons),
                              "similarities": list(t.stats.similarities)},
            "cleaner_events": [asdict(e) for e in t.events],
            ROLLOUT: trajectory_info(t)[ROLLOUT],
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
        self.validation_saar = bool(ours.get("validation_saar", True))
        self.template = bool(ours.get("prompt_template", True))
        self.sandbox_cfg = SandboxConfig(**(ours.get("sandbox") or {}))
        self.chat = ChatFormat(self.tokenizer, ours.get("system_prompt"))
        self.stop_ids = stop_ids(self.chat)
        self.rollout = Rollout(self.cfg, engine=None, chat=self.chat, sandbox=None)

    def new_trajectory(self, item: PromptItem, draw: dict) -> Trajectory:
        """One row's trajectory: the pipeline's raw draw in training; validation draws nothing raw. A prompt over
        ``rollout.prompt_length`` tokens is an error naming the row."""
        traj = self.rollout.new_trajectory(item, self.seed, draw["step"], draw["sample"])
        limit = int(self.rollout_config.prompt_length)
        if len(traj.prompt_ids) > limit:
            raise ValueError(f"cleaner_agent: prompt {item.prompt_id!r} is {len(traj.prompt_ids)} tokens in our chat "
                             f"template, over actor_rollout_ref.rollout.prompt_length={limit}: raise it "
                             "(data.max_prompt_length) or drop the row")
        if draw["validate"]:
            traj.raw, traj.saar_on = False, self.cfg.saar.enabled and self.validation_saar
        return traj

    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        draw = draw_of(kwargs)
        traj = self.new_trajectory(prompt_item(kwargs, self.template), draw)
        request_id = uuid4().hex
        metrics, server_fields, preempted = AgentLoopMetrics(), {}, []

        async def agenerate(req: GenRequest) -> GenOutput:
            params = {**sampling_params, "max_new_tokens": req.max_new_tokens, "logprobs": True,
                      "stop_token_ids": sorted(self.stop_ids)}
            start = time.perf_counter()
            out = await self.server_manager.generate(request_id, prompt_ids=req.input_ids, sampling_params=params)
            metrics.generate_sequences += time.perf_counter() - start
            preempted.append(getattr(out, "num_preempted", None))
            merge_extra_fields(server_fields, dict(getattr(out, "extra_fields", None) or {}))
            return self.gen_output(out, req)

        async def aexecute(code: str, setup: str | None = None):
            box = shared_sandbox(self.sandbox_cfg)
            start = time.perf_counter()
            res = (await asyncio.to_thread(box.run_many, [code], [setup]))[0]
            metrics.tool_calls += time.perf_counter() - start
            return res

        traj = await self.rollout.drive(traj, agenerate, aexecute)
        if any(p is not None for p in preempted):  # verl's -1 (not reported) otherwise
            metrics.num_preempted = sum(p or 0 for p in preempted)
        return to_output(traj, metrics, server_fields)

    def gen_output(self, out, req: GenRequest) -> GenOutput:
        """verl ``TokenOutput`` → our ``GenOutput``, every stop reason explicit (see module docstring)."""
        reason = getattr(out, "stop_reason", None)
        ids = list(out.token_ids)
        where = f"verl server manager ({len(req.input_ids)} prompt tokens, stop_reason={reason!r})"
        if reason in ("aborted", "abort"):
            raise RuntimeError(f"{where}: the generation was aborted")
        lps = list(out.log_probs or [])
        if len(lps) != len(ids):
            raise RuntimeError(f"{where}: {len(ids)} tokens but {len(lps)} log-probs")
        stopped = reason == "stop" or (reason in ("completed", None) and bool(ids) and ids[-1] in self.stop_ids)
        if stopped and not ids:
            raise RuntimeError(f"{where}: an empty turn that claims to have stopped")
        if stopped:
            return GenOutput(ids, lps, "stop")
        if reason in ("length", "completed", None):
            return GenOutput(ids, lps, "length")
        raise RuntimeError(f"{where}: unknown stop reason; known: stop, length, completed, aborted")


def stop_ids(chat: ChatFormat) -> frozenset[int]:
    """Ids a turn may stop on: the end-of-turn id, the tokenizer's eos and its ``<|endoftext|>`` (Qwen ends
    turns on either); all are sent as ``stop_token_ids``, so every server stops on the same set."""
    tok = chat.tokenizer
    ids = {chat.eos_id}
    if tok.eos_token_id is not None:
        ids.add(int(tok.eos_token_id))
    eot = tok.get_vocab().get("<|endoftext|>")  # not convert_tokens_to_ids: Qwen's unk token is <|endoftext|>
    if eot is not None and eot in tok.all_special_ids:
        ids.add(eot)
    return frozenset(ids)
