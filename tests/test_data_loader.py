"""The data cursor: a step's prompts are distinct (and so are its trajectory ids), reruns see the same prompts."""

from __future__ import annotations

import pytest

from tasks.data.loader import batch_for_step, refill_batch
from tasks.rollout.types import PromptItem


def items(n: int) -> tuple[PromptItem, ...]:
    return tuple(PromptItem(f"q{i}", [{"role": "user", "content": f"question {i}"}], "synthetic/arith", str(i))
                 for i in range(n))


def ids(batch) -> list[str]:
    return [i.prompt_id for i in batch]


def test_issue_repro_step_across_an_epoch_boundary_has_distinct_prompts():
    # 10 prompts, 4 per step, seed 0: step 7 used to read q5, q7, q7, q0 (two epochs' orders glued together)
    batch = ids(batch_for_step(items(10), 4, 0, 7))
    assert len(batch) == 4 and len(set(batch)) == 4, batch


@pytest.mark.parametrize("size,n", [(10, 4), (7, 3), (5, 5), (9, 2), (6, 1)])
def test_every_step_distinct_and_each_epoch_a_permutation(size, n):
    data = items(size)
    per_epoch = size // n
    for epoch in range(4):
        seen: list[str] = []
        for slot in range(per_epoch):
            batch = ids(batch_for_step(data, n, 3, epoch * per_epoch + slot))
            assert len(batch) == n and len(set(batch)) == n
            seen += batch
        # within an epoch no prompt is drawn twice; size % n prompts sit the epoch out
        assert len(set(seen)) == len(seen) == per_epoch * n
    orders = {tuple(ids(batch_for_step(data, n, 3, e * per_epoch))) for e in range(6)}
    assert size == n or len(orders) > 1, "every epoch would read the prompts in the same order"


def test_pure_function_of_seed_and_step():
    data = items(10)
    assert ids(batch_for_step(data, 4, 0, 7)) == ids(batch_for_step(data, 4, 0, 7))
    assert [ids(batch_for_step(data, 4, 0, s)) for s in range(6)] != [ids(batch_for_step(data, 4, 1, s)) for s in range(6)]


@pytest.mark.parametrize("n", [0, 11])
def test_batch_larger_than_the_data_is_an_error_naming_the_key(n):
    with pytest.raises(ValueError, match="data.prompts_per_step"):
        batch_for_step(items(10), n, 0, 0)


def test_refill_rounds_never_repeat_a_prompt_of_the_step():
    data = items(10)
    used: set[str] = set()
    drawn: list[str] = []
    for round_, n in enumerate([4, 3, 3]):
        batch = ids(refill_batch(data, n, 0, 7, round_, used))
        used.update(batch)
        drawn += batch
    assert len(drawn) == len(set(drawn)) == 10
    assert refill_batch(data, 2, 0, 7, 3, used) == []


def test_synthetic_files_come_from_the_data_seed_not_the_runs(tmp_path):
    """A run started alone on seed 22 must read the files a comparison (seed 0) wrote: the files' seed is
    ``data.seed``; a rerun from a clean clone once drew other prompts and another held-out set."""
    import pyarrow.parquet as pq

    from flows.config import load_config
    from tasks.data.loader import ensure_files

    def rows(seed_overrides, folder):
        cfg = load_config("configs/tiny.yaml", [f"data.train_path={tmp_path / folder / 'rl.parquet'}",
                                                f"data.eval_path={tmp_path / folder / 'eval.parquet'}",
                                                "data.n_train=12", "data.n_eval=6", *seed_overrides])
        ensure_files(cfg.data)
        return [pq.read_table(tmp_path / folder / f).to_pylist() for f in ("rl.parquet", "eval.parquet")]

    first = rows(["seed=0"], "a")
    assert rows(["seed=22"], "b") == first
    other = rows(["data.seed=22"], "c")
    assert other[0] != first[0] and other[1] != first[1]
    assert [r["extra_info"]["split"] for r in first[0]] == ["rl"] * 12 and len(first[1]) == 6
