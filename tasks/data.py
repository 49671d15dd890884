"""Data stage: the prompts of each RL step, from a verl-format RL parquet file.

``DataConfig`` names the train and held-out files; when ``synthetic`` is on and a file is
missing it is written from ``tasks.synthetic`` (DESIGN §9). ``batch_for_step`` is a pure
function of (seed, step): the data cursor walks a seeded permutation epoch by epoch, so a
rerun of step N sees exactly the prompts it saw before.
"""

from __future__ import annotations

import json
import random
from functools import lru_cache
from pathlib import Path

import polars as pl
from pydantic import BaseModel, ConfigDict, Field

from tasks.rollout import PromptItem


class DataConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    train_path: str = "data/synthetic/train.parquet"
    """verl RL parquet with the training prompts."""

    eval_path: str = "data/synthetic/eval.parquet"
    """verl RL parquet with held-out prompts (evaluation)."""

    synthetic: bool = True
    """Write the synthetic task files when they are missing."""

    n_train: int = Field(4000, ge=1)
    """Synthetic training prompts to write."""

    n_eval: int = Field(200, ge=1)
    """Synthetic held-out prompts to write."""

    prompts_per_step: int = Field(8, ge=1)
    """Prompts per RL step (each is rolled out ``rollout.n_samples`` times)."""


def ensure_files(cfg: DataConfig, seed: int) -> None:
    """Write the synthetic train/eval files when missing (no-op for user-supplied data)."""
    for path, n, split in ((cfg.train_path, cfg.n_train, "train"), (cfg.eval_path, cfg.n_eval, "eval")):
        if Path(path).exists():
            continue
        if not cfg.synthetic:
            raise FileNotFoundError(f"data.{split}_path: {path} does not exist")
        from tasks.synthetic import write_task_parquet

        Path(path).parent.mkdir(parents=True, exist_ok=True)
        write_task_parquet(Path(path), n, seed, split)


@lru_cache(maxsize=8)
def load_prompts(path: str) -> tuple[PromptItem, ...]:
    """All rows of a verl RL parquet as ``PromptItem`` (errors name the file, row and column)."""
    df = pl.read_parquet(path)
    missing = {"prompt", "data_source", "reward_model"} - set(df.columns)
    if missing:
        raise ValueError(f"{path}: missing column(s) {sorted(missing)}; verl RL format needs prompt, data_source, reward_model")
    items = []
    for i, row in enumerate(df.iter_rows(named=True)):
        prompt, rm = row["prompt"], row["reward_model"]
        if isinstance(rm, str):
            rm = json.loads(rm)
        if not isinstance(prompt, list) or not all(isinstance(m, dict) and "role" in m and "content" in m for m in prompt):
            raise ValueError(f"{path}: row {i}, column 'prompt': expected a list of {{role, content}} messages")
        if not isinstance(rm, dict) or "ground_truth" not in rm:
            raise ValueError(f"{path}: row {i}, column 'reward_model': expected a struct with 'ground_truth'")
        extra = row.get("extra_info") or {}
        if isinstance(extra, str):
            extra = json.loads(extra)
        pid = f"{extra.get('split', Path(path).stem)}-{extra.get('index', i)}"
        messages = [{"role": m["role"], "content": m["content"]} for m in prompt]
        items.append(PromptItem(pid, messages, row["data_source"], str(rm["ground_truth"]), dict(extra)))
    if not items:
        raise ValueError(f"{path}: no rows")
    return tuple(items)


def batch_for_step(items: tuple[PromptItem, ...], n: int, seed: int, step: int) -> list[PromptItem]:
    """Prompts ``[step*n, step*n+n)`` of the seeded epoch-wise permutation of ``items``."""
    out = []
    for pos in range(step * n, step * n + n):
        epoch, idx = divmod(pos, len(items))
        perm = _permutation(len(items), seed, epoch)
        out.append(items[perm[idx]])
    return out


@lru_cache(maxsize=16)
def _permutation(size: int, seed: int, epoch: int) -> tuple[int, ...]:
    order = list(range(size))
    random.Random(f"{seed}:{epoch}").shuffle(order)
    return tuple(order)
