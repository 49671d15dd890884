"""Chat and tool-call format: hermes ``<tool_call>{json}</tool_call>`` calls, built turn by turn in ids.

The rollout and the warm-up SFT both build token ids with this module, so what the policy
is trained on is exactly what it sees at rollout time:

    prompt_ids   = chat template(system + user, tools, add_generation_prompt=True)
    assistant    = encode(turn text) + [eos]                        (mask 1, model tokens)
    tool turn    = encode(before + tool text + after)               (mask 0, injected)

``before``/``after`` are read once from the tokenizer's own chat template, so any template
(the tiny model's, SmolLM2's ChatML, Qwen's) works. Nothing is ever re-tokenised as a whole
conversation: ids are appended turn by turn.

A tool call is ``<tool_call>{"name": "code_interpreter", "arguments": {"code": "..."}}</tool_call>``.
``parse_tool_call`` tells apart: no call at all; a call that is not valid JSON
(``malformed_call``); valid JSON naming an unknown tool or with the wrong argument shape
(``tool_call_format_error``); and a good call.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
TOOL_NAME = "code_interpreter"
MALFORMED_CALL = "malformed_call"
FORMAT_ERROR = "tool_call_format_error"

PYTHON_TOOL = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": "Run Python code and return what it prints.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "Python code to run."}},
            "required": ["code"],
        },
    },
}


@dataclass(frozen=True)
class ParsedCall:
    """A tool call found in an assistant turn.

    ``code`` is set for a well-formed call; otherwise ``error_kind`` is ``malformed_call``
    or ``tool_call_format_error`` and ``error_text`` is what the model is told.
    """

    raw: str
    code: str | None = None
    error_kind: str | None = None
    error_text: str | None = None


def render_call(code: str, name: str = TOOL_NAME) -> str:
    """The assistant text for one call of ``name`` with ``code``."""
    payload = json.dumps({"name": name, "arguments": {"code": code}}, ensure_ascii=False)
    return f"{CALL_OPEN}{payload}{CALL_CLOSE}"


def parse_tool_call(text: str, tool_name: str = TOOL_NAME) -> ParsedCall | None:
    """Parse the first tool call in ``text``; ``None`` when the turn contains no ``<tool_call>``."""
    start = text.find(CALL_OPEN)
    if start < 0:
        return None
    end = text.find(CALL_CLOSE, start)
    body = text[start + len(CALL_OPEN) : end if end >= 0 else len(text)]
    raw = text[start : end + len(CALL_CLOSE) if end >= 0 else len(text)]
    if end < 0:
        return ParsedCall(raw, error_kind=MALFORMED_CALL, error_text="Error: tool call is not closed with </tool_call>")
    try:
        payload = json.loads(body.strip())
    except json.JSONDecodeError as err:
        return ParsedCall(raw, error_kind=MALFORMED_CALL, error_text=f"Error: tool call is not valid JSON ({err.msg})")
    if not isinstance(payload, dict) or payload.get("name") != tool_name:
        name = payload.get("name") if isinstance(payload, dict) else None
        return ParsedCall(raw, error_kind=FORMAT_ERROR, error_text=f"Error: unknown tool {name!r}; use {tool_name!r}")
    args = payload.get("arguments")
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            args = None
    if not isinstance(args, dict) or not isinstance(args.get("code"), str):
        return ParsedCall(raw, error_kind=FORMAT_ERROR, error_text='Error: arguments must be {"code": "<python>"}')
    return ParsedCall(raw, code=args["code"])


class ChatFormat:
    """Token-level chat building for one tokenizer (see module docstring)."""

    _PLACEHOLDER = "\x00TOOL\x00"
    _PLACEHOLDER2 = "\x00SYSTEM\x00"

    def __init__(self, tokenizer, system_prompt: str | None = None, tools: list[dict] | None = None,
                 fewshot: list[dict] | None = None):
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt
        self.fewshot = list(fewshot or [])
        self.tools = tools if tools is not None else [PYTHON_TOOL]
        eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.eos_id: int = eos if isinstance(eos, int) and eos != tokenizer.unk_token_id else tokenizer.eos_token_id
        self.eos_token: str = tokenizer.convert_ids_to_tokens(self.eos_id)

    def messages(self, user_messages: list[dict]) -> list[dict]:
        """The conversation the model starts from: system prompt (if any), few-shot turns, the task's messages."""
        has_system = bool(user_messages) and user_messages[0]["role"] == "system"
        head = [{"role": "system", "content": self.system_prompt}] if self.system_prompt and not has_system else []
        if has_system:
            head, user_messages = [user_messages[0]], user_messages[1:]
        return [*head, *self.fewshot, *user_messages]

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        """Ids of the conversation so far plus the assistant generation prompt."""
        ids = self.tokenizer.apply_chat_template(
            messages, tools=self.tools, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        return list(ids["input_ids"] if isinstance(ids, dict) else ids)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def assistant_ids(self, text: str) -> list[int]:
        """Ids of a complete assistant turn written as text (SFT, scripted tests): text + eos."""
        return self.encode(text) + [self.eos_id]

    @cached_property
    def _tool_frame(self) -> tuple[str, str]:
        msgs = [
            {"role": "user", "content": "u"},
            {"role": "assistant", "content": "a"},
            {"role": "tool", "content": self._PLACEHOLDER},
        ]
        text = self.tokenizer.apply_chat_template(msgs, tools=self.tools, add_generation_prompt=True, tokenize=False)
        anchor = "a" + self.eos_token
        cut = text.index(anchor) + len(anchor)
        before, after = text[cut:].split(self._PLACEHOLDER)
        return before, after

    def tool_response_ids(self, text: str) -> list[int]:
        """Ids injected after an assistant turn that ended in eos: the tool turn + the next generation prompt."""
        before, after = self._tool_frame
        return self.encode(before + text + after)

    @cached_property
    def _tool_system_frame(self) -> tuple[str, str, str]:
        msgs = [
            {"role": "user", "content": "u"},
            {"role": "assistant", "content": "a"},
            {"role": "tool", "content": self._PLACEHOLDER},
            {"role": "system", "content": self._PLACEHOLDER2},
        ]
        text = self.tokenizer.apply_chat_template(msgs, tools=self.tools, add_generation_prompt=True, tokenize=False)
        anchor = "a" + self.eos_token
        rest = text[text.index(anchor) + len(anchor):]
        before, rest = rest.split(self._PLACEHOLDER)
        mid, after = rest.split(self._PLACEHOLDER2)
        return before, mid, after

    def tool_system_ids(self, text: str, system: str) -> list[int]:
        """Ids injected after an assistant turn: the tool turn, a system message, the next generation prompt.

        R3L puts its guidance here (a system message at the pivot); the frame is read from the
        chat template like ``tool_response_ids``, so the ids are what the template would render.
        """
        before, mid, after = self._tool_system_frame
        return self.encode(before + text + mid + system + after)

    @cached_property
    def token_bytes(self) -> list[bytes]:
        """Byte string of every vocabulary id, so call boundaries are found in one pass over ids."""
        tok = self.tokenizer
        size = max(len(tok), tok.vocab_size)
        table: list[bytes] = [b""] * size
        byte_decoder = _byte_decoder()
        special = set(tok.all_special_ids) | set(getattr(tok, "added_tokens_decoder", {}).keys())
        for token, idx in tok.get_vocab().items():
            if idx >= size:
                continue
            if idx in special:
                table[idx] = token.encode("utf-8")
            else:
                try:
                    table[idx] = bytes(byte_decoder[ch] for ch in token)
                except KeyError:
                    table[idx] = token.replace("\u2581", " ").encode("utf-8")
        return table

    def call_start(self, ids: list[int]) -> int | None:
        """Index of the token where ``<tool_call>`` starts in ``ids``, in one pass; None if absent."""
        target = CALL_OPEN.encode()
        buf = bytearray()
        owner: list[int] = []
        table = self.token_bytes
        for i, tid in enumerate(ids):
            piece = table[tid] if 0 <= tid < len(table) else b""
            buf += piece
            owner.extend([i] * len(piece))
            if len(buf) >= len(target):
                pos = buf.find(target, max(0, len(buf) - len(piece) - len(target)))
                if pos >= 0:
                    return owner[pos]
        return None


def _byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's byte-to-unicode map used by byte-level BPE vocabularies."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def build_sft_example(chat: ChatFormat, messages: list[dict]) -> tuple[list[int], list[int]]:
    """Ids and loss mask (1 on assistant tokens) of a full transcript, built turn by turn like a rollout
    (framed like a rollout's prompt too: ``chat``'s system prompt and few-shot turns come first).

    After the prompt, turns are assistant and tool messages; a system message may follow a tool
    message (R3L's guidance at the pivot) and is injected with it in one frame, as the rollout does.
    """
    first_assistant = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    ids = chat.prompt_ids(chat.messages(messages[:first_assistant]))
    mask = [0] * len(ids)
    rest = messages[first_assistant:]
    i = 0
    while i < len(rest):
        msg, nxt = rest[i], rest[i + 1] if i + 1 < len(rest) else None
        if msg["role"] == "assistant":
            part, bit = chat.assistant_ids(msg["content"]), 1
        elif msg["role"] == "tool" and nxt is not None and nxt["role"] == "system":
            part, bit = chat.tool_system_ids(msg["content"], nxt["content"]), 0
            i += 1
        elif msg["role"] == "tool":
            part, bit = chat.tool_response_ids(msg["content"]), 0
        else:
            raise ValueError(f"transcript turn {first_assistant + i} with role {msg['role']!r}: after the prompt only "
                             "assistant and tool turns (and a system turn right after a tool turn) may follow")
        ids += part
        mask += [bit] * len(part)
        i += 1
    return ids, mask
