"""A run's last evaluation rolled out in parts by several lanes at once, then graded in one place.

At a run's end with the rollout beside training (``rollout.staleness`` ≥ 1) and the evaluations beside it
(``eval.beside_training``), the last evaluation (the largest: ``eval.final_*``, and the fresh split) would run alone
on the evaluation lane while the rollout lane, done with the last rollout, sits idle. So its prompts are cut into
``PARTS_PER_LANE`` contiguous parts a lane, and each lane pulls the next part not yet taken once it is free
(``roll_across``): a lane still busy with the evaluation before it (the evaluation lane, often, when training ends)
joins late and takes fewer. The parts are joined in the prompts' order (``join``) and graded by
``tasks.training.stages.eval_stage`` as one evaluation.

Why the rows are those of the evaluation rolled out whole, whichever lane rolled which part: a prompt's
trajectories are its own — every turn is seeded by (the rollout's seed, the trajectory id, the input length)
(``models.decode``), never by which prompts share its decoding batch — and joining the parts in order gives the
whole run's order, so every sum over them adds in the same order. Only a sampled token's log-prob may move by the
float noise of another batch make-up (``tests/test_paired_eval.py``'s ``LP_NOISE``), which no evaluation figure
reads. Checked token for token and figure for figure in ``tests/test_eval_shards.py``.

    rolled = roll_across([lane.call for lane in lanes], ckpt, setup)   # parts pulled as lanes come free
    eval_stage(run_id, version, ckpt, mlrun, setup, rolled=rolled, parts=part_count(len(lanes)))
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from tasks.data.loader import load_prompts
from tasks.rollout.types import PromptItem, Trajectory
from tasks.training.evaluation import fresh_split, roll_modes
from tasks.training.setups import EvalSetup

MODULE = __name__
PARTS_PER_LANE = 2
"""Parts a lane on average: enough that a lane joining late takes fewer and the lanes end close together, few
enough that every part keeps the engine's batch full most of its time (at 128 prompts × 8 samples, eight parts
cost +6 % core-seconds over two, measured once on a bench policy, 2026-12-02; docs/step_time.md)."""
Rolled = dict[str, dict[str, list[Trajectory]]]
"""Split (``eval``, and ``fresh`` when the setup scores the fresh split) → mode → trajectories, in prompt order."""


def part(items: list[PromptItem], i: int, of: int) -> list[PromptItem]:
    """The ``i``-th of ``of`` contiguous parts of ``items`` (sizes differ by at most one; the first are larger)."""
    if not 0 <= i < of:
        raise ValueError(f"eval shards: part {i} of {of} does not exist (parts 0..{of - 1})")
    size, extra = divmod(len(items), of)
    start = i * size + min(i, extra)
    return items[start:start + size + (i < extra)]


def roll_part(ckpt: str, setup: EvalSetup, i: int, of: int) -> Rolled:
    """Every mode's trajectories of part ``i`` of ``of`` of the evaluation's prompts (and of the fresh split's,
    when ``setup.fresh_path``), rolled out in this process."""
    items = list(load_prompts(setup.eval_path))[: setup.eval.n_prompts]
    out = {"eval": roll_modes(ckpt, part(items, i, of), setup)}
    if setup.fresh_path:
        fresh_items, fresh = fresh_split(setup)
        out["fresh"] = roll_modes(ckpt, part(fresh_items, i, of), fresh)
    return out


def join(parts: list[Rolled]) -> Rolled:
    """The parts' trajectories joined split by split and mode by mode, in the parts' order."""
    return {split: {mode: [t for p in parts for t in p[split][mode]] for mode in parts[0][split]}
            for split in parts[0]}


def part_count(lanes: int) -> int:
    """How many parts an evaluation rolled out by ``lanes`` lanes is cut into."""
    return lanes * PARTS_PER_LANE


def free() -> None:
    """Nothing: called on a lane, it returns once the lane is free (its calls run one at a time), so a part is
    taken only by a lane ready to roll it."""


def roll_across(calls: list[Callable[..., object]], ckpt: str, setup: EvalSetup,
                parts: int | None = None) -> Rolled:
    """The evaluation's trajectories rolled out in ``parts`` parts (``part_count(len(calls))`` by default) by
    ``len(calls)`` lanes at once, joined in order. ``calls[i]`` is lane i's ``call`` (bound to nothing else:
    ``calls[i](MODULE, "roll_part", ckpt, setup, j, parts)``); each lane, once free (``free``), takes the next part
    no lane took yet, until none is left. A part that fails raises after the parts in flight end; no part starts
    after it: no evaluation is graded from fewer prompts."""
    of = parts or part_count(len(calls))
    out: list[Rolled | None] = [None] * of
    taken, failed, lock = iter(range(of)), threading.Event(), threading.Lock()

    def pull(call: Callable[..., object]) -> None:
        try:
            call(MODULE, "free")
            while not failed.is_set():
                with lock:
                    j = next(taken, None)
                if j is None:
                    return
                out[j] = call(MODULE, "roll_part", ckpt, setup, j, of)
        except BaseException:
            failed.set()
            raise

    with ThreadPoolExecutor(max_workers=len(calls), thread_name_prefix="eval-part") as pool:
        futures = [pool.submit(pull, call) for call in calls]
        for fut in futures:
            fut.result()
    return join(out)
