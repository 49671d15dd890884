"""Engine log-probs, their recomputation in the trainer, the DAPO loss, GRPO advantages, filters."""

from __future__ import annotations

import polars as pl
import pytest
import torch

from models.config import EngineConfig, TrainerConfig
from models.engine import GenRequest, TransformersEngine, load_causal_lm
from models.forward import response_logprobs
from models.trainer import Sample, dapo_loss, update
from tasks.training.config import MixConfig
from tasks.training.mixing import grpo_advantages, mix_rows


@pytest.fixture(scope="module")
def engine(warm_model_dir, chat):
    return TransformersEngine(EngineConfig(max_batch=3), warm_model_dir, chat.eos_id, chat.tokenizer.pad_token_id)


def test_batched_generation_respects_budgets_and_stops_at_eos(engine, chat):
    prompts = [chat.prompt_ids([{"role": "user", "content": q}]) for q in ("What is 12 * 34?", "Sum of 1 2 3?", "x", "y")]
    outs = engine.generate([GenRequest(p, 5 + i) for i, p in enumerate(prompts)], seed=1)
    for i, out in enumerate(outs):
        assert len(out.token_ids) == len(out.logprobs) <= 5 + i
        assert (out.finish_reason == "stop") == (out.token_ids[-1] == chat.eos_id)
        assert all(lp <= 0 for lp in out.logprobs)
    again = engine.generate([GenRequest(p, 5 + i) for i, p in enumerate(prompts)], seed=1)
    assert [o.token_ids for o in outs] == [o.token_ids for o in again]


def test_trainer_recomputes_the_engines_logprobs(engine, chat, warm_model_dir):
    prompts = [chat.prompt_ids([{"role": "user", "content": f"What is {a} * 7?"}]) for a in (123, 45678)]
    outs = engine.generate([GenRequest(p, 24) for p in prompts], seed=3)
    samples = [Sample(p, o.token_ids, [1] * len(o.token_ids), 1.0) for p, o in zip(prompts, outs)]
    model = load_causal_lm(warm_model_dir)
    with torch.no_grad():
        lp, mask = response_logprobs(model, samples, chat.tokenizer.pad_token_id)
    for i, o in enumerate(outs):
        assert torch.allclose(lp[i, : len(o.logprobs)], torch.tensor(o.logprobs), atol=2e-3)
        assert mask[i].sum() == len(o.token_ids)


def test_dapo_loss_clips_asymmetrically():
    old = torch.zeros(1, 4)
    new = torch.log(torch.tensor([[0.5, 0.9, 1.2, 1.5]]))
    mask = torch.ones(1, 4)
    pos, clipped, _ = dapo_loss(new, old, torch.tensor([1.0]), mask, 0.2, 0.28, 4.0)
    assert pos.item() == pytest.approx(-(0.5 + 0.9 + 1.2 + 1.28) / 4)
    neg, _, _ = dapo_loss(new, old, torch.tensor([-1.0]), mask, 0.2, 0.28, 4.0)
    assert neg.item() == pytest.approx((0.8 + 0.9 + 1.2 + 1.5) / 4)
    assert clipped.item() == 2
    masked, _, _ = dapo_loss(new, old, torch.tensor([1.0]), torch.tensor([[1.0, 0, 0, 0]]), 0.2, 0.28, 1.0)
    assert masked.item() == pytest.approx(-0.5)


def test_update_raises_logprob_of_positive_advantage_and_writes_checkpoint(warm_model_dir, chat, tmp_path):
    prompt = chat.prompt_ids([{"role": "user", "content": "What is 2 + 2?"}])
    good = chat.encode("The answer is \\boxed{4}.") + [chat.eos_id]
    bad = chat.encode("The answer is \\boxed{5}.") + [chat.eos_id]
    samples = [Sample(prompt, good, [1] * len(good), 1.0), Sample(prompt, bad, [1] * len(bad), -1.0)]
    before = load_causal_lm(warm_model_dir)
    cfg = TrainerConfig(lr=1e-3, mini_batches=1, epochs=1)
    metrics = update(warm_model_dir, samples, cfg, tmp_path / "next", chat.tokenizer.pad_token_id, seed=0)
    after = load_causal_lm(tmp_path / "next")
    with torch.no_grad():
        lp0, _ = response_logprobs(before, samples, chat.tokenizer.pad_token_id)
        lp1, _ = response_logprobs(after, samples, chat.tokenizer.pad_token_id)
    differ = next(i for i, (g, b) in enumerate(zip(good, bad)) if g != b)
    assert lp1[0, differ] > lp0[0, differ] and lp1[1, differ] < lp0[1, differ]
    assert metrics["train/optimizer_steps"] == 1 and metrics["train/grad_norm"] > 0
    assert (tmp_path / "next" / "optimizer.pt").exists() and (tmp_path / "next" / "tokenizer.json").exists()
    assert not list(tmp_path.glob(".*tmp"))


def _scored(rewards: dict[str, list[float]]) -> pl.DataFrame:
    rows = [{"prompt_id": p, "traj_id": f"{p}{i}", "reward": r, "graded": True, "correct": r > 0, "raw": i == 0,
             "rollbacks_recovered": int(i == 1)} for p, rs in rewards.items() for i, r in enumerate(rs)]
    return pl.DataFrame(rows)


def test_dynamic_sampling_drops_uniform_groups_and_grpo_normalises():
    df, metrics = mix_rows(_scored({"a": [1, 0, 1, 0], "b": [1, 1, 1, 1], "c": [0, 0, 0, 1]}), MixConfig())
    assert set(df.filter(pl.col("kept"))["prompt_id"]) == {"a", "c"} and metrics["mix/groups_kept"] == 2
    adv = grpo_advantages(df, 1e-6)
    a = adv.filter(pl.col("prompt_id") == "a")["advantage"].to_list()
    assert a[0] == pytest.approx(-a[1]) and sum(a) == pytest.approx(0, abs=1e-6)
    assert adv.filter(pl.col("prompt_id") == "b")["advantage"].to_list() == [0.0] * 4


def test_starpo_keeps_highest_std_groups():
    df, _ = mix_rows(_scored({"a": [1, 0, 1, 0], "c": [0, 0, 0, 1]}), MixConfig(group_filter={"kind": "std", "ratio": 0.5}))
    assert set(df.filter(pl.col("kept"))["prompt_id"]) == {"a"}


def test_checkpoints_replace_a_folder_over_crash_leftovers(warm_model_dir, tmp_path):
    """A checkpoint folder is written as ``.name.tmp`` and swapped in (the replaced one goes to ``.name.old``
    first). Leftovers of a crash at any point — a half-written ``.tmp``, an ``.old`` — are cleared, an existing
    folder is replaced whole, nothing is left beside it, and ``trainer_state.json`` records the source."""
    import json

    from models.checkpoint import copy_checkpoint, save_checkpoint

    def leave_crash_leftovers(name):
        for folder in (f".{name}.tmp", f".{name}.old", name):
            (tmp_path / folder).mkdir()
            (tmp_path / folder / "junk").write_text("from a crashed save")

    leave_crash_leftovers("a")
    save_checkpoint(load_causal_lm(warm_model_dir), warm_model_dir, tmp_path / "a", extra={"step": 3})
    leave_crash_leftovers("b")
    copy_checkpoint(tmp_path / "a", tmp_path / "b", {"step": 4})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]
    for name, source, step in [("a", warm_model_dir, 3), ("b", tmp_path / "a", 4)]:
        assert not (tmp_path / name / "junk").exists() and (tmp_path / name / "model.safetensors").exists()
        assert json.loads((tmp_path / name / "trainer_state.json").read_text()) == {"source": str(source), "step": step}
