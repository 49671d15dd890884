"""The tiny model's pieces: tokenizer + chat template, build/reload, SFT mask, warm-up SFT (the task and its
corpus: tests/test_synthetic.py)."""

from __future__ import annotations

import json

import pytest
import torch

from models.chat import ChatFormat, build_sft_example, render_call
from models.config import TinyModelConfig, WarmupConfig
from models.sft import check_lengths, collate, length_census, lr_at, warmup
from models.tiny import SPECIAL_TOKENS, TOOL_TOKENS, build_tiny, make_model, render_text
from tasks.data.synthetic import make_problems, read_sft_corpus

SMALL = TinyModelConfig(vocab_size=400, num_layers=1, hidden_size=32, num_heads=2, num_kv_heads=1,
                        intermediate_size=64, max_positions=512, seed=3)


def _fake_transcript(p) -> list[dict]:
    return [
        {"role": "user", "content": p.question},
        {"role": "assistant", "content": p.right[0].plan + "\n" + render_call(p.right[0].code)},
        {"role": "tool", "content": str(p.answer)},
        {"role": "assistant", "content": f"The answer is \\boxed{{{p.answer}}}."},
    ]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    transcripts = [_fake_transcript(p) for p in make_problems(200, 0, "sft")]
    return build_tiny(tmp_path_factory.mktemp("tiny"), SMALL, (render_text(m) for m in transcripts))


@pytest.fixture(scope="module")
def tokenizer(tiny_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_dir)


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


def test_sft_mask_is_exactly_the_assistant_tokens(tokenizer):
    chat = ChatFormat(tokenizer)
    msgs = _fake_transcript(make_problems(1, 9, "sft")[0])
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
    batch = [build_sft_example(chat, _fake_transcript(p)) for p in make_problems(4, 11, "sft")]
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
    corpus.write_text("".join(json.dumps({"messages": _fake_transcript(p)}) + "\n" for p in make_problems(8, 3, "sft")))
    out = tmp_path / "warm"
    cfg = WarmupConfig(max_steps=3, batch_size=4, warmup_steps=1, time_budget_s=None)
    result = warmup(tiny_dir, read_sft_corpus(corpus), cfg, out)
    assert result["steps"] == 3 and result["final_loss"] > 0
    assert AutoModelForCausalLM.from_pretrained(out) is not None and len(AutoTokenizer.from_pretrained(out)) > 0
    assert not list(tmp_path.glob(".warm.*"))


def test_warmup_counts_and_refuses_what_it_would_skip(tiny_dir, tmp_path, caplog):
    """Issue 18: a whole kind of transcript (R3L reflections) once vanished silently as longer than max_len."""
    transcripts = [_fake_transcript(p) for p in make_problems(6, 5, "sft")]
    long = [{**t[0], "content": t[0]["content"] + " filler" * 200} for t in transcripts[:2]]
    long = [[lg, *t[1:]] for lg, t in zip(long, transcripts[:2])]
    from transformers import AutoTokenizer

    chat = ChatFormat(AutoTokenizer.from_pretrained(tiny_dir), None)
    n_short = [len(build_sft_example(chat, t)[0]) for t in transcripts]
    max_len = max(n_short)
    kinds = ["solve"] * 6 + ["reflection"] * 2
    census = length_census([*transcripts, *long], chat, max_len, kinds)
    assert census["solve"] == {"n": 6, "too_long": 0, "longest": max_len}
    assert census["reflection"]["n"] == 2 and census["reflection"]["too_long"] == 2
    with pytest.raises(ValueError, match=r"every transcript of kind reflection \(2, shortest > \d+\)"):
        check_lengths(census, max_len)
    cfg = WarmupConfig(max_steps=1, batch_size=2, warmup_steps=0, max_len=max_len)
    with pytest.raises(ValueError, match="reflection"):
        warmup(tiny_dir, [*transcripts, *long], cfg, tmp_path / "never", kinds=kinds)
    assert not (tmp_path / "never").exists()
    census = length_census([*transcripts, long[0], transcripts[0], long[1]], chat, max_len,
                           ["solve"] * 6 + ["reflection"] * 3)
    with caplog.at_level("WARNING", logger="models.sft"):
        check_lengths(census, max_len)
    assert "2 of 3 'reflection' transcripts are longer than max_len" in caplog.text
    result = warmup(tiny_dir, [*transcripts, *long], cfg.model_copy(update={"max_len": max(n_short) * 10}),
                    tmp_path / "ok", kinds=kinds)
    assert result["lengths"]["reflection"]["too_long"] == 0 and result["steps"] == 1
