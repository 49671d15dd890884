"""SAAR off and SAAR on in one pass: the SAAR-off twin of a trajectory forks at its first failed call.

An evaluation rolls the same prompts out twice, with SAAR off (the policy alone) and on (raw share 0). The two
rollouts of a trajectory are the same until its first tool call fails with SAAR able to act: before it, no
handler of ``tasks.rollout.machine`` reads the SAAR switch. And each turn's draws are the trajectory's own — the
in-process engine seeds a turn by (the rollout's seed, the trajectory id, the input length)
(``models.decode``, ``TransformersEngine.row_seeded``) — so the shared turns sample the same tokens in both
passes. ``PairedRollout`` therefore rolls out SAAR on once and, at a trajectory's first failure that SAAR acts
on, forks a copy with SAAR off (a deep copy taken before the failure is handled, then handed the same result),
which decodes on beside its original under its own stream key (its own cache, started from the original's
cached prefix) but with the original's draws (``seed_key`` = the trajectory id). A trajectory that never
fails that way is its own SAAR-off twin.

Right after the fork the twin's next turn and the original's regeneration are the same request (the error's tool
turn appended to the same ids, the same draws): the stream decodes them as one row (``DecodeStream.submit`` joins
queued requests of one seed key and the same ids; the smaller budget is cut from the larger's ids).

So one pass gives the two separate passes' trajectories — the same token ids, the same tool calls and results,
the same statistics — while the turns before the first failure (the whole of every trajectory without one) are
decoded and executed once. What can differ: the log-probs by float noise (~1e-6; the decoding batch has another
make-up, as between any two runs of the continuous driver), and, at a near-tie that noise flips, a token.

Needs the continuous driver and a row-seeded engine (``shares_work``): elsewhere (rounds scheduling, an SGLang
server sampling on its own) the draws are not a trajectory's own, and an evaluation runs the two passes.
"""

from __future__ import annotations

import copy
from dataclasses import replace

from sandbox.result import ExecutionResult
from tasks.rollout.machine import Rollout
from tasks.rollout.types import PromptItem, Trajectory

TWIN_SUFFIX = "/saar_off"
"""A twin's stream key: its trajectory id plus this."""


def shares_work(scheduling: str, engine) -> bool:
    """Whether one paired pass gives what two separate passes give: the continuous driver on a row-seeded engine."""
    return scheduling == "continuous" and hasattr(engine, "stream") and getattr(engine, "row_seeded", False)


class PairedRollout(Rollout):
    """A SAAR-on rollout (raw share 0) that forks each trajectory's SAAR-off twin at its first failure SAAR acts on."""

    def __init__(self, cfg, engine, chat, sandbox):
        if not cfg.saar.enabled or cfg.saar.raw_share != 0.0:
            raise ValueError("PairedRollout: rollout.saar must be enabled with raw_share 0 (the SAAR-on evaluation)")
        if not shares_work(cfg.scheduling, engine):
            raise ValueError("PairedRollout needs rollout.scheduling: continuous and an engine whose draws are each "
                             "row's own (the in-process engine); run the two modes separately otherwise")
        super().__init__(cfg, engine, chat, sandbox)
        self.twins: dict[str, Trajectory] = {}

    def on_executed(self, t: Trajectory, res: ExecutionResult) -> None:
        """Before the first failure SAAR would act on, fork the SAAR-off twin and hand it the same result."""
        if (not res.ok and t.stream_key is None and t.traj_id not in self.twins and t.snapshot is None
                and self._saar_active(t)):
            twin = copy.deepcopy(t)
            twin.saar_on, twin.stream_key = False, t.traj_id + TWIN_SUFFIX
            self.twins[t.traj_id] = twin
            super().on_executed(twin, res)
            self.spawned.append(twin)
        super().on_executed(t, res)

    def run_pair(self, items: list[PromptItem], seed: int, step: int) -> tuple[list[Trajectory], list[Trajectory]]:
        """(SAAR off, SAAR on) trajectories of ``items``, in the same order, as two separate passes would give."""
        self.twins = {}
        on = self.run(items, seed, step, progress=False)
        for twin in self.twins.values():
            twin.truncate(self.budget(twin))
        off = [self.twins.get(t.traj_id) or replace(t, saar_on=False) for t in on]
        return off, on
