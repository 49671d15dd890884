"""A run's last evaluation rolled out in parts on several lanes at once, then graded in one place.

At a run's end with the rollout beside training (``rollout.staleness`` ≥ 1) and the evaluations beside it
(``eval.beside_training``), the last evaluation (the largest: ``eval.final_*``, and the fresh split) would run alone
on the evaluation lane while the rollout lane, done with the last rollout, sits idle. So its prompts are cut into
``of`` contiguous parts; part i is rolled out (``roll_part``) on lane i, all at once, and the parts are joined in
the prompts' order (``join``) and graded by ``tasks.training.stages.eval_stage`` as one evaluation.

Why the rows are those of the evaluation rolled out whole: a prompt's trajectories are its own — every turn is
seeded by (the rollout's seed, the trajectory id, the input length) (``models.decode``), never by which prompts
share its decoding batch — and joining the parts in order gives the whole run's order, so every sum over them
adds in the same order. Only a sampled token's log-prob may move by the float noise of another batch make-up
(``tests/test_paired_eval.py``'s ``LP_NOISE``), which no evaluation figure reads. Checked token for token and
figure for figure in ``tests/test_eval_shards.py``.

    parts = [lane.call(MODULE, "roll_part", ckpt, setup, i, 2) for i, lane in enumerate(lanes)]   # at once
    eval_stage(run_id, version, ckpt, mlrun, setup, rolled=join(parts))
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from tasks.data.loader import load_prompts
from tasks.rollout.types import PromptItem, Trajectory
from tasks.training.evaluation import fresh_split, roll_modes
from tasks.training.setups import EvalSetup

MODULE = __name__
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


def roll_across(calls: list[Callable[..., Rolled]], ckpt: str, setup: EvalSetup) -> Rolled:
    """The evaluation's trajectories rolled out in ``len(calls)`` parts at once, part i by ``calls[i]`` (a lane's
    ``call``, bound to nothing else: ``calls[i](MODULE, "roll_part", ckpt, setup, i, of)``), joined. A part that
    fails raises (after the others end): no evaluation is graded from fewer prompts."""
    of = len(calls)
    with ThreadPoolExecutor(max_workers=of, thread_name_prefix="eval-part") as pool:
        futures = [pool.submit(call, MODULE, "roll_part", ckpt, setup, i, of) for i, call in enumerate(calls)]
        return join([f.result() for f in futures])
