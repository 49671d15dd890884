"""LoRA adapters on a frozen base (models/lora.py), on the tiny model: loading, weight sync, RL update, merge."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from models.checkpoint import copy_checkpoint
from models.config import EngineConfig, LoraSpec, TrainerConfig
from models.engine import GenRequest, TransformersEngine
from models.forward import response_logprobs
from models.lora import (
    ADAPTER_WEIGHTS,
    add_lora,
    base_of,
    copy_tokenizer,
    is_adapter,
    link_adapter,
    load_policy,
    merge_adapter,
)
from models.trainer import Sample, update


def _adapter(base, out, seed: int, spec=LoraSpec(r=4, target_modules=["q_proj", "v_proj", "down_proj"])):
    """An adapter on ``base`` whose B matrices are random (a fresh adapter is a no-op: B = 0)."""
    torch.manual_seed(seed)
    model = add_lora(load_policy(base), spec)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    model.save_pretrained(out)
    copy_tokenizer(base, out)
    return out


@pytest.fixture(scope="module")
def adapters(warm_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    return _adapter(warm_model_dir, root / "a", 0), _adapter(warm_model_dir, root / "b", 1)


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0]


def test_an_adapter_folder_loads_as_base_plus_peft_and_through_from_pretrained(adapters, warm_model_dir, chat):
    from transformers import AutoModelForCausalLM

    a, _ = adapters
    assert is_adapter(a) and not is_adapter(warm_model_dir)
    assert not (a / "model.safetensors").exists() and (a / ADAPTER_WEIGHTS).exists()
    ids = chat.prompt_ids([{"role": "user", "content": "What is 12 * 34?"}])
    ours = _logits(load_policy(a), ids)
    assert torch.allclose(ours, _logits(AutoModelForCausalLM.from_pretrained(str(a)), ids), atol=1e-5)
    assert not torch.allclose(ours, _logits(load_policy(warm_model_dir), ids), atol=1e-3)  # the adapter acts


def test_merged_weights_give_the_adapters_outputs(adapters, tmp_path, chat):
    a, _ = adapters
    merged = merge_adapter(a, tmp_path / "merged")
    assert not is_adapter(merged) and (merged / "model.safetensors").exists() and (merged / "tokenizer.json").exists()
    ids = chat.prompt_ids([{"role": "user", "content": "Sum of 1 2 3?"}])
    assert torch.allclose(_logits(load_policy(a), ids), _logits(load_policy(merged), ids), atol=1e-4)


def test_a_missing_base_is_named(adapters, tmp_path):
    a, _ = adapters
    moved = shutil.copytree(a, tmp_path / "moved")
    conf = json.loads((moved / "adapter_config.json").read_text())
    conf["base_model_name_or_path"] = str(tmp_path / "no-such-base")
    (moved / "adapter_config.json").write_text(json.dumps(conf))
    with pytest.raises(FileNotFoundError, match="no-such-base"):
        load_policy(moved)


def test_link_points_a_copy_at_another_base(adapters, warm_model_dir, tmp_path):
    a, _ = adapters
    copy = shutil.copytree(warm_model_dir, tmp_path / "base-copy")
    linked = link_adapter(a, copy, tmp_path / "linked")
    assert base_of(linked) == copy.resolve() and base_of(a) != copy.resolve()
    with pytest.raises(FileNotFoundError, match="model.base"):
        link_adapter(a, tmp_path / "nothing", tmp_path / "x")


def test_engine_syncs_only_the_adapter(adapters, chat):
    a, b = adapters
    pad = chat.tokenizer.pad_token_id
    engine = TransformersEngine(EngineConfig(max_batch=2), a, chat.eos_id, pad)
    base_before = {k: v.clone() for k, v in engine.model.named_parameters() if "lora_" not in k}
    prompt = chat.prompt_ids([{"role": "user", "content": "What is 7 * 8?"}])
    engine.load_weights(b)
    synced = engine.generate([GenRequest(prompt, 12)], seed=5)[0]
    fresh = TransformersEngine(EngineConfig(max_batch=2), b, chat.eos_id, pad).generate([GenRequest(prompt, 12)], seed=5)[0]
    assert synced.token_ids == fresh.token_ids
    assert synced.logprobs == pytest.approx(fresh.logprobs, abs=1e-5)
    assert all(torch.equal(v, dict(engine.model.named_parameters())[k]) for k, v in base_before.items())
    with pytest.raises(ValueError, match="LoRA adapter"):
        engine.load_weights(base_of(a))


def test_rl_update_trains_the_adapter_only_and_writes_an_adapter_checkpoint(adapters, chat, tmp_path):
    a, _ = adapters
    pad = chat.tokenizer.pad_token_id
    prompts = [chat.prompt_ids([{"role": "user", "content": f"What is {x} * 3?"}]) for x in (12, 345, 6, 78)]
    engine = TransformersEngine(EngineConfig(max_batch=4), a, chat.eos_id, pad)
    outs = engine.generate([GenRequest(p, 16) for p in prompts], seed=2)
    samples = [Sample(p, o.token_ids, [1] * len(o.token_ids), adv) for p, o, adv in zip(prompts, outs, (1, -1, 1, -1))]
    # old log-probs are recomputed with the adapter: they match what the engine sampled with
    with torch.no_grad():
        lp, _ = response_logprobs(load_policy(a), samples, pad)
    for i, o in enumerate(outs):
        assert torch.allclose(lp[i, : len(o.logprobs)], torch.tensor(o.logprobs), atol=2e-3)
    cfg = TrainerConfig(lr=1e-2, mini_batches=2, micro_batch=2)
    metrics = update(a, samples, cfg, tmp_path / "p1", pad, seed=0, state={"step": 0})
    out = tmp_path / "p1"
    assert is_adapter(out) and not (out / "model.safetensors").exists() and base_of(out) == base_of(a)
    assert torch.isfinite(torch.tensor(metrics["train/loss"])) and metrics["train/optimizer_steps"] == 2
    before, after = load_file(str(a / ADAPTER_WEIGHTS)), load_file(str(out / ADAPTER_WEIGHTS))
    assert before.keys() == after.keys()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    opt = torch.load(out / "optimizer.pt", weights_only=True)
    assert len(opt["state"]) == len(before)  # moments for the adapter's tensors only, none for the base
    # a second update reuses the process's base and starts from p1's adapter, not from whatever it trained last
    update(a, samples, cfg, tmp_path / "p1-again", pad, seed=0, state={"step": 0})
    again = load_file(str(tmp_path / "p1-again" / ADAPTER_WEIGHTS))
    assert all(torch.allclose(after[k], again[k], atol=1e-6) for k in after)


def test_copy_checkpoint_keeps_the_adapter_and_records_the_state(adapters, tmp_path):
    a, _ = adapters
    out = copy_checkpoint(a, tmp_path / "same", {"step": 3})
    assert load_file(str(out / ADAPTER_WEIGHTS)).keys() == load_file(str(a / ADAPTER_WEIGHTS)).keys()
    assert json.loads((out / "trainer_state.json").read_text())["step"] == 3


def test_a_step_with_no_informative_group_logs_a_count_not_a_loss(adapters, tmp_path, capsys):
    from flows.train_log import step_line
    from tasks.training.setups import UpdateSetup
    from tasks.training.stages import update_stage

    a, _ = adapters
    step_dir = tmp_path / "000004"
    step_dir.mkdir()
    keys = {"run_id": ["r"] * 4, "step": [4] * 4, "traj_id": [f"t{i}" for i in range(4)]}
    import polars as pl

    pl.DataFrame({**keys, "prompt_ids": [[1, 2]] * 4, "response_ids": [[3]] * 4,
                  "response_mask": [[1]] * 4}).write_parquet(step_dir / "trajectories.parquet")
    pl.DataFrame({**keys, "advantage": [0.0] * 4}).write_parquet(step_dir / "advantages.parquet")
    pl.DataFrame({**keys, "reward": [1.0] * 4}).write_parquet(step_dir / "scores.parquet")
    pl.DataFrame({**keys, "kept": [False] * 4}).write_parquet(step_dir / "mix.parquet")
    (step_dir / "mix.metrics.json").write_text(json.dumps({"mix/groups": 2, "mix/groups_kept": 0}))
    out = update_stage(step_dir, str(a), tmp_path / "policy_000005", UpdateSetup(trainer=TrainerConfig(), seed=0))
    metrics = json.loads((step_dir / "update.metrics.json").read_text())
    assert metrics["train/skipped"] == 1 and metrics["train/no_informative_groups"] == 2
    assert "train/loss" not in metrics
    assert is_adapter(out) and load_file(str(out / ADAPTER_WEIGHTS)).keys() == load_file(str(a / ADAPTER_WEIGHTS)).keys()
    assert "step 4: no informative groups (2 groups" in capsys.readouterr().out
    line = step_line(4, metrics)
    assert "no informative groups (2 dropped)" in line and "loss" not in line


def _transcripts(n: int) -> list[list[dict]]:
    out = []
    for i in range(n):
        a, b = 10 + i, 3 + i % 5
        call = f'I multiply them.\n<tool_call>{{"name": "code_interpreter", "arguments": {{"code": "print({a} * {b})"}}}}</tool_call>'
        out.append([{"role": "user", "content": f"What is {a} * {b}?"}, {"role": "assistant", "content": call},
                    {"role": "tool", "content": str(a * b)},
                    {"role": "assistant", "content": f"The answer is \\boxed{{{a * b}}}."}])
    return out


def test_sft_loss_is_the_models_own_loss(warm_model_dir, chat):
    from models.chat import build_sft_example
    from models.sft import collate, sft_loss

    model = load_policy(warm_model_dir)
    ids, attn, labels = collate([build_sft_example(chat, t) for t in _transcripts(3)], chat.tokenizer.pad_token_id)
    with torch.no_grad():
        ours = sft_loss(model, ids, attn, labels)
        theirs = model(input_ids=ids, attention_mask=attn, labels=labels).loss
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-5)


def test_lora_warmup_writes_an_adapter_and_resumes_from_its_state(warm_model_dir, tmp_path):
    from models.config import ChatConfig, WarmupConfig
    from models.lora import compact_adapter
    from models.sft import warmup, write_adapter_card

    cfg = WarmupConfig(lora=LoraSpec(r=2, target_modules=["q_proj", "v_proj"]), lr=5e-3, warmup_steps=0,
                       batch_size=2, max_steps=2, checkpoint_every=1, log_every=1, time_budget_s=None)
    state, logged = tmp_path / "state", []
    first = warmup(warm_model_dir, _transcripts(8), cfg, tmp_path / "a2", state_dir=state,
                   on_log=lambda step, m: logged.append(step))
    assert first["steps"] == 2 and json.loads((state / "state.json").read_text())["step"] == 2
    straight = warmup(warm_model_dir, _transcripts(8), cfg.model_copy(update={"max_steps": 4}), tmp_path / "s4")
    resumed = warmup(warm_model_dir, _transcripts(8), cfg.model_copy(update={"max_steps": 4}), tmp_path / "r4",
                     state_dir=state, on_log=lambda step, m: logged.append(step))
    assert logged == [1, 2, 3, 4] and resumed["steps"] == 4
    assert [c[0] for c in resumed["loss_curve"]] == [1, 2, 3, 4]
    assert [c[1] for c in resumed["loss_curve"]] == pytest.approx([c[1] for c in straight["loss_curve"]], abs=1e-4)
    out = tmp_path / "r4"
    assert is_adapter(out) and not (out / "model.safetensors").exists()
    ids = torch.tensor([[1, 2, 3, 4]])
    before = _logits(load_policy(out), ids[0].tolist())
    compact_adapter(out)
    card = write_adapter_card(out, cfg, ChatConfig(system_prompt="Use the tool."), {**resumed, "transcripts": 8})
    assert "| 4 |" in card.read_text() and "Use the tool." in card.read_text() and "<!-- gate -->" in card.read_text()
    assert card.name == "MODEL_CARD.md" and not (out / "tokenizer.json").exists() and not (out / "README.md").exists()
    assert load_file(str(out / ADAPTER_WEIGHTS))[next(iter(load_file(str(out / ADAPTER_WEIGHTS))))].dtype == torch.float16
    linked = link_adapter(out, warm_model_dir, tmp_path / "linked")
    assert (linked / "tokenizer.json").exists()
    assert torch.allclose(_logits(load_policy(linked), ids[0].tolist()), before, atol=1e-3)
