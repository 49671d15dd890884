"""The tiny model's pieces: tokenizer + chat template, build/reload, synthetic task, SFT corpus, warm-up SFT."""

from __future__ import annotations

import contextlib
import difflib
import io
import json
import random

import pytest
import torch

from models.chat import ChatFormat, build_sft_example, parse_tool_call, render_call
from models.config import TinyModelConfig, WarmupConfig
from models.sft import collate, lr_at, warmup
from models.tiny import SPECIAL_TOKENS, TOOL_TOKENS, build_tiny, make_model, render_text
from tasks.synthetic import (
    GENERATORS,
    MISTAKES,
    make_problems,
    plan_transcript,
    read_sft_corpus,
    similarity,
    split_of,
    write_sft_corpus,
    write_task_parquet,
)

SMALL = TinyModelConfig(vocab_size=400, num_layers=1, hidden_size=32, num_heads=2, num_kv_heads=1,
                        intermediate_size=64, max_positions=512, seed=3)


def _fake_transcript(p) -> list[dict]:
    return [
        {"role": "user", "content": p.question},
        {"role": "assistant", "content": "Let me compute it.\n" + render_call(p.code)},
        {"role": "tool", "content": str(p.answer)},
        {"role": "assistant", "content": f"The answer is \\boxed{{{p.answer}}}."},
    ]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    transcripts = [_fake_transcript(p) for p in make_problems(200, 0, "train")]
    return build_tiny(tmp_path_factory.mktemp("tiny"), SMALL, (render_text(m) for m in transcripts))


@pytest.fixture(scope="module")
def tokenizer(tiny_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_dir)


@pytest.fixture(scope="module")
def sandbox():
    from sandbox.base import make_sandbox
    from sandbox.config import SandboxConfig

    with make_sandbox(SandboxConfig(backend="local", workers=2)) as sb:
        yield sb


def _run(code: str) -> str:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        exec(code, {})
    return buf.getvalue().strip()


def test_digits_and_special_tokens_are_single(tokenizer):
    ids = tokenizer.encode("x = 9876543210", add_special_tokens=False)
    pieces = [tokenizer.decode([i]) for i in ids]
    assert [p for p in pieces if p.strip().isdigit()] == list("9876543210")
    for token in SPECIAL_TOKENS + TOOL_TOKENS:
        assert len(tokenizer.encode(token, add_special_tokens=False)) == 1, token
        assert tokenizer.convert_tokens_to_ids(token) != tokenizer.unk_token_id or token == tokenizer.unk_token
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"


def test_chat_template_tool_frame(tokenizer):
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a <tool_call>{}</tool_call>"},
            {"role": "tool", "content": "42"}]
    text = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert text.startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nq<|im_end|>\n")
    assert text.endswith("<|im_start|>assistant\na <tool_call>{}</tool_call><|im_end|>\n"
                         "<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    chat = ChatFormat(tokenizer)
    assert chat._tool_frame == ("\n<|im_start|>user\n<tool_response>\n", "\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    prompt = chat.decode(chat.prompt_ids([{"role": "user", "content": "q"}]))
    assert "# Tools\n- code_interpreter(code): " in prompt and prompt.endswith("<|im_start|>assistant\n")
    sys_prompt = tokenizer.apply_chat_template([{"role": "system", "content": "S"}, {"role": "user", "content": "u"}],
                                               tokenize=False)
    assert sys_prompt.startswith("<|im_start|>system\nS<|im_end|>\n")


def test_build_tiny_reloads(tiny_dir, tokenizer):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert model.config.vocab_size == len(tokenizer) <= SMALL.vocab_size
    assert model.config.tie_word_embeddings and model.config.num_key_value_heads == 1
    assert model.generation_config.eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids = torch.tensor([tokenizer.encode("What is 2 * 3?", add_special_tokens=False)])
    assert model(input_ids=ids).logits.shape == (1, ids.shape[1], len(tokenizer))


def test_default_config_is_about_1m_params(tokenizer):
    model = make_model(TinyModelConfig(), tokenizer)
    assert 0.9e6 < sum(p.numel() for p in model.parameters()) < 1.3e6


def test_problem_answers_are_correct():
    problems = make_problems(240, 7, "train")
    assert {p.kind for p in problems} == set(GENERATORS)
    for p in problems:
        assert _run(p.code) == str(p.answer), p
        assert _run(p.alt_code) == str(p.answer), p
        assert p.source in ("synthetic/arith", "synthetic/algo")


def test_splits_do_not_overlap(tmp_path):
    import pyarrow.parquet as pq

    train = {p.question for p in make_problems(3000, 1, "train")}
    held = {p.question for p in make_problems(300, 2, "eval")}
    assert not train & held and all(split_of(q) == "eval" for q in held)
    rows = pq.read_table(write_task_parquet(tmp_path / "eval.parquet", 20, 2, "eval")).to_pylist()
    assert len(rows) == 20 and rows[3]["extra_info"] == {"split": "eval", "index": 3, "kind": rows[3]["extra_info"]["kind"]}
    assert rows[0]["prompt"][0]["role"] == "user" and rows[0]["ability"] == "math"
    assert rows[0]["reward_model"]["style"] == "rule" and rows[0]["reward_model"]["ground_truth"].lstrip("-").isdigit()


def test_mistakes_fail_as_intended_and_fixes_succeed(sandbox):
    r = random.Random(0)
    problems = make_problems(60, 4, "train")
    cases = [(m, p, *m.make(p, r)) for m in MISTAKES for p in problems if m.applies(p)][::3]
    assert {c[0].name for c in cases} == {m.name for m in MISTAKES}
    runnable = [c for c in cases if c[0].kind != "malformed_call"]
    results = sandbox.run_many([bad for _, _, bad, _ in runnable] + [base for _, _, _, base in runnable])
    for (m, p, bad, _), res in zip(runnable, results):
        assert not res.ok and res.error_kind == m.kind, (m.name, bad, res.model_text())
    for (m, p, _, _), res in zip(runnable, results[len(runnable):]):
        assert res.ok and res.stdout.strip() == str(p.answer), (m.name, res.model_text())
    broken = render_call("print(1)")[: -len("}</tool_call>")] + "</tool_call>"
    assert parse_tool_call(broken).error_kind == "malformed_call"


def test_sft_corpus_is_checked_and_has_shallow_and_deep_fixes(tmp_path, sandbox):
    path = write_sft_corpus(tmp_path / "sft.jsonl", 48, 5, 1.0, sandbox, deep_fix_share=0.5)
    stats = json.loads(path.with_suffix(".stats.json").read_text())
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert stats["written"] == len(rows) == 48 and not stats["dropped"]
    for row in rows:
        roles = [m["role"] for m in row["messages"]]
        assert roles == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
        bad, fix = row["messages"][1]["content"], row["messages"][3]["content"]
        assert row["meta"]["similarity"] == round(similarity(bad, fix), 4)
        assert row["messages"][-1]["content"].endswith(f"\\boxed{{{row['messages'][-2]['content']}}}.")
    deep = [r["meta"]["similarity"] for r in rows if r["meta"]["fix"] == "deep"]
    shallow = [r["meta"]["similarity"] for r in rows if r["meta"]["fix"] == "shallow"]
    assert deep and shallow and min(shallow) >= 0.5 and sum(s < 0.5 for s in deep) >= len(deep) // 2


def test_similarity_matches_difflib():
    a, b = "x <tool_call>abc</tool_call>", "y <tool_call>abd</tool_call>"
    ref = difflib.SequenceMatcher(None, "<tool_call>abc</tool_call><|im_end|>", "<tool_call>abd</tool_call><|im_end|>")
    assert similarity(a, b) == ref.ratio()
    assert plan_transcript(make_problems(1, 0, "train")[0], random.Random(0), 0.0, 0.0).mistake is None


def test_sft_mask_is_exactly_the_assistant_tokens(tokenizer):
    chat = ChatFormat(tokenizer)
    msgs = _fake_transcript(make_problems(1, 9, "train")[0])
    ids, mask = build_sft_example(chat, msgs)
    assert len(ids) == len(mask)
    kept = [i for i, m in zip(ids, mask) if m]
    expected = [t for m in msgs if m["role"] == "assistant" for t in chat.assistant_ids(m["content"])]
    assert kept == expected
    assert chat.decode([i for i, m in zip(ids, mask) if not m]).endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n")


def test_few_sft_steps_reduce_loss(tiny_dir, tokenizer):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    chat = ChatFormat(tokenizer)
    batch = [build_sft_example(chat, _fake_transcript(p)) for p in make_problems(4, 11, "train")]
    input_ids, attention, labels = collate(batch, tokenizer.pad_token_id)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(8):
        loss = model(input_ids=input_ids, attention_mask=attention, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0]


def test_lr_schedule_stays_high_until_late():
    cfg = WarmupConfig(lr=2e-3, min_lr=2e-4, warmup_steps=10, decay_start=0.8)
    assert lr_at(0, 0.0, cfg) == pytest.approx(2e-4)
    assert lr_at(500, 0.79, cfg) == 2e-3
    assert lr_at(900, 0.9, cfg) > 1e-3 > lr_at(990, 0.99, cfg) >= 2e-4


def test_warmup_saves_a_loadable_checkpoint(tiny_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"messages": _fake_transcript(p)}) + "\n" for p in make_problems(8, 3, "train")))
    out = tmp_path / "warm"
    result = warmup(tiny_dir, read_sft_corpus(corpus), WarmupConfig(max_steps=3, batch_size=4, warmup_steps=1, time_budget_s=None), out)
    assert result["steps"] == 3 and result["final_loss"] > 0
    assert AutoModelForCausalLM.from_pretrained(out) is not None and len(AutoTokenizer.from_pretrained(out)) > 0
    assert not list(tmp_path.glob(".warm.*"))
