"""What a verl row's raw-share draw is keyed on, under either verl trainer: the step, the sample index, validation.

verl hands an agent loop neither its sample index within the group (legacy trainer) nor whether it validates (V1),
so our agent-loop manager tags the batch before verl splits it over workers (``DRAW_KEY``), and the loop reads its
draw back with ``draw_of``:

- legacy (``trainer.use_v1=false``; ``DataProto`` batches, ``n`` rows per prompt): ``annotate_draws`` tags every
  row with verl's global step, the row's index among the rows of its prompt, and validation;
- V1 (verl's default; ``TensorDict`` batches, one row per prompt): ``tag_draws_v1`` tags the batch with its step
  and validation (V1's worker drops ``validate`` before the loop sees it); the sample index is the ``session_id``
  V1's worker gives each of a prompt's ``n`` sessions.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

DRAW_KEY = "cleaner_draw"
"""What the manager tags: legacy, a non-tensor column of ``{"step", "sample", "validate"}`` per row; V1, one
``{"step", "validate"}`` for the batch."""


def annotate_draws(batch) -> None:
    """Tag each row of a legacy verl batch with what its raw draw is keyed on (column ``DRAW_KEY``).

    ``step`` = ``meta_info["global_steps"]``, ``validate`` = ``meta_info["validate"]``, ``sample`` = the
    row's index among the rows of its prompt (same ``uid``, else same ``extra_info.index``) in batch
    order. Done once per batch, before verl splits it over workers, so a group split across two
    workers keeps distinct sample indices.
    """
    rows, n = batch.non_tensor_batch, len(batch)
    step, validate = int(batch.meta_info.get("global_steps", -1)), bool(batch.meta_info.get("validate", False))
    if "uid" in rows:
        keys = [str(u) for u in rows["uid"]]
    else:
        extra = rows.get("extra_info", [None] * n)
        keys = [str(dict(e or {}).get("index", i)) for i, e in enumerate(extra)]
    seen: Counter = Counter()
    tags = np.empty(n, dtype=object)
    for i, key in enumerate(keys):
        tags[i] = {"step": step, "sample": seen[key], "validate": validate}
        seen[key] += 1
    rows[DRAW_KEY] = tags


def tag_draws_v1(batch) -> None:
    """Tag a V1 batch (a ``TensorDict``) with the step and validation its rows' draws are keyed on."""
    from verl.utils import tensordict_utils as tu

    if "global_steps" not in batch.keys():
        raise ValueError("cleaner_agent: a V1 batch without global_steps; the raw-share draw is keyed on the step")
    step = int(tu.get_non_tensor_data(batch, "global_steps", None))
    validate = bool(tu.get_non_tensor_data(batch, "validate", False))
    tu.assign_non_tensor_data(batch, DRAW_KEY, {"step": step, "validate": validate})


def draw_of(kwargs: dict) -> dict:
    """A row's draw, ``{"step", "sample", "validate"}``, from the manager's tag; under V1 the sample index is the
    ``session_id`` of the prompt's session."""
    if DRAW_KEY not in kwargs:
        raise RuntimeError("cleaner_agent: the rows carry no raw-draw key; set actor_rollout_ref.rollout.agent."
                           "agent_loop_manager_class=tasks.training.verl_loop.CleanerAgentLoopManager")
    draw = dict(kwargs[DRAW_KEY])
    if "session_id" in kwargs:
        draw["sample"] = int(kwargs["session_id"])
    return draw
