"""Data stage: the prompts of each RL step, from a verl-format RL parquet file.

``DataConfig`` names the train and held-out files; when ``synthetic`` is on and a file is
missing it is written from ``tasks.data.synthetic`` (DESIGN §9; training prompts from its ``rl``
split, held-out ones from ``eval``, never a warm-up question). ``batch_for_step`` is a pure
function of (seed, step): every epoch is a seeded permutation cut into ``len // n`` whole
batches (the last ``len % n`` prompts of each epoch's order are left out, as a data loader with
``drop_last`` does), so a step's prompts are always distinct — a batch never straddles two
epochs — and a rerun of step N sees exactly the prompts it saw before.

``data.fresh_path`` is a second held-out file (issue 41) that nothing was ever selected on: synthetic, it is
written from ``data.fresh_seed`` with ``eval``-split questions only (the split is a hash of the question, so
never a training one) and none of ``eval_path``'s; any fresh file, a user's too, is checked on every
``ensure_files``: a question shared with the training or held-out file is an error naming it. Synthetic files
are written from the task family ``data.family`` (``single``, or ``chain``: the multi-call regime's).

``PromptCursor`` serves partial rollouts, which take a varying number of fresh prompts per step: it walks
the same seeded epoch permutations from a position the run keeps (``partial_state.json``), skipping prompts
still being rolled out.
"""

from __future__ import annotations

import json
import random
from functools import lru_cache
from pathlib import Path

from tasks.data.config import DataConfig
from tasks.rollout.types import PromptItem


def ensure_files(cfg: DataConfig) -> None:
    """Write the synthetic train/eval files when missing, from ``cfg.seed`` (no-op for user-supplied data)."""
    for path, n, field, split in ((cfg.train_path, cfg.n_train, "train", "rl"), (cfg.eval_path, cfg.n_eval, "eval", "eval")):
        if Path(path).exists():
            continue
        if not cfg.synthetic:
            raise FileNotFoundError(f"data.{field}_path: {path} does not exist")
        from tasks.data.synthetic import write_task_parquet

        Path(path).parent.mkdir(parents=True, exist_ok=True)
        write_task_parquet(Path(path), n, cfg.seed, split, family=cfg.family)
    if cfg.fresh_path is not None:
        ensure_fresh(cfg)


def ensure_fresh(cfg: DataConfig) -> None:
    """Write the fresh split when missing (synthetic), then check it shares no question with the other two files."""
    path = cfg.fresh_path
    if not Path(path).exists():
        if not cfg.synthetic:
            raise FileNotFoundError(f"data.fresh_path: {path} does not exist")
        from tasks.data.synthetic import write_task_parquet

        write_task_parquet(Path(path), cfg.n_fresh, cfg.fresh_seed, "eval", exclude=frozenset(questions(cfg.eval_path)),
                           family=cfg.family)
    for field, other in (("train_path", cfg.train_path), ("eval_path", cfg.eval_path)):
        shared = sorted(set(questions(path)) & set(questions(other)))
        if shared:
            raise ValueError(f"data.fresh_path: {path} shares {len(shared)} question(s) with data.{field} ({other}), "
                             f"e.g. {shared[0]!r}: a fresh split must be disjoint from both")


def questions(path: str) -> list[str]:
    """The last user message of every row of a task file (the question a prompt asks)."""
    return [next(m["content"] for m in reversed(item.messages) if m.get("role") == "user")
            for item in load_prompts(path)]


@lru_cache(maxsize=8)
def load_prompts(path: str) -> tuple[PromptItem, ...]:
    """All rows of a task file (verl RL parquet, AIME, GPQA, LiveCodeBench) as ``PromptItem``.

    Parsing and validation are ``tasks.data.formats.load_tasks``'s: a malformed row is an error
    naming the file, row and column.
    """
    from tasks.data.formats import load_tasks

    rows = load_tasks(path)
    if not rows:
        raise ValueError(f"{path}: no rows")
    return tuple(
        PromptItem(r.id, r.prompt, r.data_source,
                   r.ground_truth if isinstance(r.ground_truth, str) else json.dumps(r.ground_truth), dict(r.extra_info))
        for r in rows
    )


def batch_for_step(items: tuple[PromptItem, ...], n: int, seed: int, step: int) -> list[PromptItem]:
    """Batch ``step`` of the seeded epoch-wise permutations: ``n`` distinct prompts, never across two epochs."""
    if not 0 < n <= len(items):
        raise ValueError(f"data.prompts_per_step={n} must be between 1 and the {len(items)} training prompts")
    epoch, slot = divmod(step, len(items) // n)
    perm = _permutation(len(items), seed, epoch)
    return [items[i] for i in perm[slot * n : slot * n + n]]


def refill_batch(items: tuple[PromptItem, ...], n: int, seed: int, step: int, round_: int,
                 used: set[str]) -> list[PromptItem]:
    """``n`` fresh prompts for refill round ``round_`` of a step (deterministic; never one in ``used``)."""
    if round_ == 0:
        return batch_for_step(items, n, seed, step)
    perm = _permutation(len(items), seed, 1_000_003 * (step + 1) + round_)
    return [items[i] for i in perm if items[i].prompt_id not in used][:n]


@lru_cache(maxsize=16)
def _permutation(size: int, seed: int, epoch: int) -> tuple[int, ...]:
    order = list(range(size))
    random.Random(f"{seed}:{epoch}").shuffle(order)
    return tuple(order)


class PromptCursor:
    """Fresh prompts in the seeded epoch permutations, from ``position`` on (partial rollouts persist it)."""

    def __init__(self, items: tuple[PromptItem, ...], seed: int, position: int = 0):
        self.items, self.seed, self.position = items, seed, position

    def take(self, n: int, exclude: set[str]) -> list[PromptItem]:
        """Up to ``n`` prompts whose ids are not in ``exclude`` (those positions are passed over), looking at
        most one epoch ahead."""
        out: list[PromptItem] = []
        for _ in range(len(self.items)):
            if len(out) >= n:
                break
            epoch, slot = divmod(self.position, len(self.items))
            item = self.items[_permutation(len(self.items), self.seed, epoch)[slot]]
            self.position += 1
            if item.prompt_id not in exclude:
                out.append(item)
                exclude = exclude | {item.prompt_id}
        return out
