"""Tool-call parsing, turn-by-turn ids, and the one-pass call boundary."""

from __future__ import annotations

import pytest

from models.chat import FORMAT_ERROR, MALFORMED_CALL, build_sft_example, parse_tool_call, render_call


def test_parse_good_call_and_no_call():
    call = parse_tool_call("Let me see. " + render_call('print("hi")'))
    assert call.code == 'print("hi")' and call.error_kind is None
    assert parse_tool_call("The answer is \\boxed{3}.") is None


@pytest.mark.parametrize(
    "text, kind",
    [
        ('<tool_call>{"name": "code_interpreter", "arguments": {"code": "x"}</tool_call>', MALFORMED_CALL),
        ('<tool_call>{"name": "code_interpreter", "arguments": {"code": "x"}}', MALFORMED_CALL),
        ('<tool_call>{"name": "shell", "arguments": {"code": "ls"}}</tool_call>', FORMAT_ERROR),
        ('<tool_call>{"name": "code_interpreter", "arguments": {"src": "x"}}</tool_call>', FORMAT_ERROR),
        ('<tool_call>[1, 2]</tool_call>', FORMAT_ERROR),
    ],
)
def test_parse_errors_are_classified(text, kind):
    call = parse_tool_call(text)
    assert call.code is None and call.error_kind == kind and call.error_text


def test_arguments_as_json_string_are_accepted():
    call = parse_tool_call('<tool_call>{"name": "code_interpreter", "arguments": "{\\"code\\": \\"print(1)\\"}"}</tool_call>')
    assert call.code == "print(1)"


def test_tool_response_ids_are_the_template_frame(chat):
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}, {"role": "tool", "content": "42"}]
    full = chat.tokenizer.apply_chat_template(msgs, tools=chat.tools, add_generation_prompt=True, tokenize=False)
    assert full.endswith(chat.decode(chat.tool_response_ids("42")))
    assert "42" in chat.decode(chat.tool_response_ids("42"))


def test_call_start_one_pass_matches_text(chat):
    turn = chat.encode("Some reasoning first. " + render_call("print(1)")) + [chat.eos_id]
    idx = chat.call_start(turn)
    assert chat.decode(turn[idx:]).startswith("<tool_call>")
    assert "<tool_call>" not in chat.decode(turn[:idx])
    assert chat.call_start(chat.encode("no call here")) is None


def test_call_start_when_tag_is_split_over_plain_tokens(chat):
    """SmolLM2-like vocabularies have no ``<tool_call>`` token: the tag spans several ids."""
    pieces = ["Think. ", "<", "tool", "_", "call", ">", '{"name": 1}']
    ids = [i for p in pieces for i in chat.encode(p)]
    assert chat.decode(ids) == "Think. <tool_call>{\"name\": 1}"
    idx = chat.call_start(ids)
    assert chat.decode(ids[:idx]) == "Think. " and chat.decode(ids[idx:]).startswith("<tool_call>")


def test_sft_example_mask_is_one_exactly_on_assistant_tokens(chat):
    msgs = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "Run. " + render_call("print(2+2)")},
            {"role": "tool", "content": "4"}, {"role": "assistant", "content": "\\boxed{4}"}]
    ids, mask = build_sft_example(chat, msgs)
    assert len(ids) == len(mask)
    taught = chat.decode([i for i, m in zip(ids, mask) if m])
    assert taught == "Run. " + render_call("print(2+2)") + "<|im_end|>" + "\\boxed{4}<|im_end|>"
