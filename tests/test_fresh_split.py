"""The fresh evaluation split (issue 41): a second held-out file nothing was selected on — written from another
generator seed, ``eval``-split questions only and none of the study's held-out file's, checked disjoint from the
training and held-out files — scored at a run's last evaluation (``eval_fresh/<mode>/…``) and reported by the
compare report per seed and paired by seed; and the report's compute totals.

Run: ``pytest tests/test_fresh_split.py``.
"""

from __future__ import annotations

import polars as pl
import pytest

from tasks.data.config import DataConfig
from tasks.data.loader import ensure_files, load_prompts, questions
from tasks.data.synthetic import split_of, write_task_parquet
from tasks.reports.compare import ACC, markdown, summarize
from tasks.reports.compare_extra import FRESH_ACC, FRESH_ACC_ON


def data(tmp_path, **kw) -> DataConfig:
    return DataConfig(train_path=str(tmp_path / "rl.parquet"), eval_path=str(tmp_path / "eval.parquet"),
                      fresh_path=str(tmp_path / "fresh.parquet"), n_train=40, n_eval=30, n_fresh=50, **kw)


def test_the_fresh_file_is_eval_split_and_disjoint_from_both_files(tmp_path):
    cfg = data(tmp_path)
    ensure_files(cfg)
    fresh = questions(cfg.fresh_path)
    assert len(fresh) == len(set(fresh)) == 50
    assert all(split_of(q) == "eval" for q in fresh)
    assert not set(fresh) & set(questions(cfg.eval_path)) and not set(fresh) & set(questions(cfg.train_path))
    assert fresh != questions(cfg.eval_path)[:50]


def test_excluding_the_held_out_questions_is_by_construction(tmp_path):
    """Drawn from the held-out file's own seed, the fresh file would repeat it; the exclusion skips every one."""
    held = write_task_parquet(tmp_path / "held.parquet", 20, 0, "eval")
    same = write_task_parquet(tmp_path / "same.parquet", 20, 0, "eval")
    apart = write_task_parquet(tmp_path / "apart.parquet", 20, 0, "eval", exclude=frozenset(questions(str(held))))
    assert questions(str(same)) == questions(str(held))
    assert not set(questions(str(apart))) & set(questions(str(held))) and len(questions(str(apart))) == 20


def test_a_fresh_file_sharing_a_question_is_an_error(tmp_path):
    cfg = data(tmp_path)
    ensure_files(cfg.model_copy(update={"fresh_path": None}))
    write_task_parquet(tmp_path / "fresh.parquet", 30, 0, "eval")  # the held-out file's questions again
    user = cfg.model_copy(update={"synthetic": False})
    with pytest.raises(ValueError, match=r"data.fresh_path: .* shares 30 question\(s\) with data.eval_path"):
        ensure_files(user)
    with pytest.raises(FileNotFoundError, match="data.fresh_path"):
        ensure_files(user.model_copy(update={"fresh_path": str(tmp_path / "missing.parquet")}))


def test_the_fresh_file_must_be_another_file_from_another_seed(tmp_path):
    with pytest.raises(ValueError, match="fresh_seed"):
        data(tmp_path, fresh_seed=0)
    with pytest.raises(ValueError, match="also the training or held-out file"):
        DataConfig(fresh_path="data/synthetic-v2/eval.parquet")


def test_evaluate_fresh_scores_the_fresh_prompts_under_its_own_names(tmp_path, monkeypatch):
    """The fresh evaluation reads ``fresh_path``'s first ``eval.fresh_prompts`` prompts at ``eval.fresh_samples``
    and names every metric ``eval_fresh/…`` (the policy's rollouts are ``evaluate``'s, replaced here)."""
    from flows.config import load_config
    from tasks.training import evaluation

    cfg = data(tmp_path)
    ensure_files(cfg)
    seen = {}

    def fake(ckpt, items, setup, on_mode=None, rolled=None):
        seen.update(n=len(items), samples=setup.eval.samples, first=items[0].prompt_id)
        return {"eval/saar_off/all/pass_at_1": 0.25, "eval/saar_on/eval/graded": 8.0}

    monkeypatch.setattr(evaluation, "evaluate", fake)
    run = load_config("configs/tiny.yaml", [f"data.fresh_path={cfg.fresh_path}", "eval.fresh_prompts=12",
                                            "eval.fresh_samples=3", "data.fresh_seed=1"])
    out = evaluation.evaluate_fresh("ckpt", run.setups().eval_setup(final=True))
    assert out == {"eval_fresh/saar_off/all/pass_at_1": 0.25, "eval_fresh/saar_on/eval/graded": 8.0}
    assert seen == {"n": 12, "samples": 3, "first": load_prompts(cfg.fresh_path)[0].prompt_id}
    too_many = run.setups().eval_setup(final=True)
    too_many = too_many.model_copy(update={"eval": too_many.eval.model_copy(update={"fresh_prompts": 51})})
    with pytest.raises(ValueError, match="eval.fresh_prompts=51: .* holds only 50 prompts"):
        evaluation.evaluate_fresh("ckpt", too_many)


def _rows(values: dict[str, dict[str, float]]) -> list[dict]:
    return [{"run_id": run, "policy_version": 24, "key": key, "value": x}
            for run, by_key in values.items() for key, x in by_key.items()]


def test_the_report_pairs_the_fresh_split_by_seed_and_totals_compute():
    """Seeds 1-3; fresh SAAR-off differences mask − dapo: +0.10, +0.05, +0.00 (mean +0.05, sd 0.05, s.e.
    0.05/√3, t(2) 4.303); SAAR on − dapo off: +0.15, +0.10, +0.05. Compute: dapo 1000/1100/1200 tokens (mean 1100),
    mask 1600/1700/1800 (1700, ×1.545…); calls 10/12/14 (12) and 15/18/21 (18, ×1.5)."""
    fresh = {"dapo": [0.50, 0.55, 0.60], "mask": [0.60, 0.60, 0.60]}
    on = {"dapo": [0.52, 0.57, 0.62], "mask": [0.65, 0.65, 0.65]}
    vals = {f"{arm}-s{s}": {ACC: 0.7, FRESH_ACC: fresh[arm][i], FRESH_ACC_ON: on[arm][i]}
            for arm in fresh for i, s in enumerate((1, 2, 3))}
    runs = {arm: [f"{arm}-s{s}" for s in (1, 2, 3)] for arm in fresh}
    totals = pl.DataFrame([{"run_id": f"{arm}-s{s}", "key": key, "total": t, "steps": 24}
                           for arm, toks, calls in (("dapo", (1000, 1100, 1200), (10, 12, 14)),
                                                    ("mask", (1600, 1700, 1800), (15, 18, 21)))
                           for s, tk, c in zip((1, 2, 3), toks, calls)
                           for key, t in (("rollout/sampled_tokens", tk), ("rollout/sandbox_calls", c))])
    s = summarize(pl.DataFrame(_rows(vals)), runs, "dapo", "mask", totals=totals,
                  initial={ACC: 0.5, FRESH_ACC: 0.4, FRESH_ACC_ON: 0.45})
    f = s["fresh"]
    assert f["per_seed"]["mask"] == [{"seed": 1, "saar_off": 0.6, "saar_on": 0.65}, {"seed": 2, "saar_off": 0.6,
                                      "saar_on": 0.65}, {"seed": 3, "saar_off": 0.6, "saar_on": 0.65}]
    internal, headline = f["paired"]["mask"]["internalisation"], f["paired"]["mask"]["headline"]
    assert internal["mean"] == pytest.approx(0.05) and internal["se"] == pytest.approx(0.05 / 3 ** 0.5)
    assert internal["ci95"] == pytest.approx([0.05 - 4.303 * 0.05 / 3 ** 0.5, 0.05 + 4.303 * 0.05 / 3 ** 0.5])
    assert headline["mean"] == pytest.approx(0.10) and internal["seeds"] == [1, 2, 3]
    assert f["arms"]["dapo"]["saar_off"] == pytest.approx(0.55) and f["initial"] == {"saar_off": 0.4, "saar_on": 0.45}
    c = s["compute"]
    assert c["mask"]["sampled_tokens"] == pytest.approx(1700) and c["dapo"]["sampled_tokens"] == pytest.approx(1100)
    assert c["mask"]["sampled_tokens_ratio"] == pytest.approx(17 / 11) and c["mask"]["sandbox_calls_ratio"] == 1.5
    assert c["dapo"]["runs"]["dapo-s2"] == {"sampled_tokens": 1100, "sandbox_calls": 12, "steps": 24}
    md = markdown(s)
    assert "**Fresh split**" in md and "| mask | 3 | 0.600 ± 0.000 | 0.650 | +0.050 ± 0.029" in md
    assert "| mask | 1700 | 1.545 | 18 | 1.500 |" in md


def test_a_report_without_fresh_or_compute_rows_has_neither_section():
    vals = {f"{arm}-s{s}": {ACC: 0.7} for arm in ("dapo", "mask") for s in (1, 2)}
    s = summarize(pl.DataFrame(_rows(vals)), {a: [f"{a}-s1", f"{a}-s2"] for a in ("dapo", "mask")}, "dapo", "mask")
    assert s["fresh"] == {} and s["compute"] == {} and "Fresh split" not in markdown(s)
