"""CLEANER's agent-loop manager under verl's V1 trainer (``trainer.use_v1``, verl 0.9's default; TransferQueue).

V1's trainer hands the manager a ``TensorDict`` of prompts, one row each (``uid``, the dataset's columns, the
batch's ``global_steps``, and ``validate`` in validation), and returns at once: each worker
(``AgentLoopWorkerTQ``, verl's own) runs a prompt's ``rollout.n`` sessions, passing the loop ``session_id`` and
the row's fields, and puts the outputs into TransferQueue, where the trainer's replay buffer waits for them.
``CleanerAgentLoopManagerTQ`` tags the batch first (``tasks.training.verl_draws.tag_draws_v1``).
``CleanerAgentLoopManager.create`` (``tasks.training.verl_loop``) builds it when the trainer is V1; importing
this module needs ``transfer_queue``.

Errors: V1's worker catches a session's error (a prompt over ``rollout.prompt_length``, an aborted generation, a
sandbox failure), logs it and marks the prompt's group ``failure``; verl 0.9.1's replay buffer (its docstring) keeps
such a group sampleable and pads its missing trajectories with no-op ones, mask 0 (``trainer.v1.sampler.
sync_refill_failed_groups`` replaces a group left with none), where the legacy trainer stops on the error. Watch
the workers' log for ``Error in _run_prompt``.
"""

from __future__ import annotations

from verl.trainer.ppo.v1 import AgentLoopManagerTQ

from tasks.training.verl_draws import tag_draws_v1


class CleanerAgentLoopManagerTQ(AgentLoopManagerTQ):
    """verl's V1 agent-loop manager, plus ``tag_draws_v1`` before the batch is split over workers."""

    def generate_sequences(self, prompts) -> None:
        tag_draws_v1(prompts)
        return AgentLoopManagerTQ.generate_sequences(self, prompts)
