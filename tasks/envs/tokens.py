"""Token ids of an environment conversation, built turn by turn (the rollout and the warm-up share them).

    prompt_ids   = chat template(system + first user message, no tools, generation prompt) + "<think>"
    response_ids | assistant turn 1 + <|im_end|> | user frame(reward + next state) + gen prompt + "<think>" | turn 2 …
    mask         | 1 1 1 … 1                     | 0 0 0 … 0 (observation, injected)                         | 1 …

The forced ``<think>`` (RAGEN starts every generation with it) is injected, so it has mask 0;
the model's own turn text starts after it. The user frame (the tokens around a user message
and the next generation prompt) is read once from the tokenizer's chat template, as
``ChatFormat`` does for tool turns: any ChatML-style template works. Nothing is re-tokenised as a
whole conversation. ``sft_example`` builds the same ids from a transcript's messages, so the
warm-up trains on exactly what the rollout shows the policy.
"""

from __future__ import annotations

from functools import cached_property

from tasks.envs.prompt import THINK_PREFIX


class EnvChat:
    """Turn-by-turn ids of environment conversations for one tokenizer."""

    _PLACEHOLDER = "\x00OBS\x00"

    def __init__(self, tokenizer, think: bool = True):
        self.tokenizer = tokenizer
        self.think = think
        eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.eos_id: int = eos if isinstance(eos, int) and eos != tokenizer.unk_token_id else tokenizer.eos_token_id
        self.eos_token: str = tokenizer.convert_ids_to_tokens(self.eos_id)
        self.prefix_ids: list[int] = self.encode(THINK_PREFIX) if think else []

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        """Ids of the opening messages + generation prompt + the forced prefix."""
        ids = self.tokenizer.apply_chat_template(messages, tools=[], add_generation_prompt=True, tokenize=True,
                                                 return_dict=False)
        return list(ids["input_ids"] if isinstance(ids, dict) else ids) + self.prefix_ids

    @cached_property
    def _user_frame(self) -> tuple[str, str]:
        msgs = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"},
                {"role": "user", "content": self._PLACEHOLDER}]
        text = self.tokenizer.apply_chat_template(msgs, tools=[], add_generation_prompt=True, tokenize=False)
        anchor = "a" + self.eos_token
        cut = text.index(anchor) + len(anchor)
        before, after = text[cut:].split(self._PLACEHOLDER)
        return before, after

    def observation_ids(self, text: str) -> list[int]:
        """Ids injected after an assistant turn that ended in eos: the user turn, generation prompt, prefix."""
        before, after = self._user_frame
        return self.encode(before + text + after) + self.prefix_ids

    def turn_text(self, generated: list[int]) -> str:
        """The full turn text the parser reads: forced prefix + the generated tokens."""
        return (THINK_PREFIX if self.think else "") + self.decode(generated)

    def assistant_ids(self, content: str) -> list[int]:
        """Ids of a scripted assistant turn (its text includes the forced prefix, which is not re-encoded)."""
        prefix = THINK_PREFIX if self.think else ""
        if not content.startswith(prefix):
            raise ValueError(f"assistant turn must start with the forced prefix {prefix!r}: {content[:40]!r}")
        return self.encode(content[len(prefix):]) + [self.eos_id]

    def sft_example(self, messages: list[dict]) -> tuple[list[int], list[int]]:
        """Ids and loss mask (1 on assistant tokens) of a transcript: system, user, then assistant/user turns."""
        if [m["role"] for m in messages[:3]] != ["system", "user", "assistant"]:
            raise ValueError("an environment transcript starts with system, user, assistant messages")
        ids = self.prompt_ids(messages[:2])
        mask = [0] * len(ids)
        for msg in messages[2:]:
            if msg["role"] == "assistant":
                part, bit = self.assistant_ids(msg["content"]), 1
            elif msg["role"] == "user":
                part, bit = self.observation_ids(msg["content"]), 0
            else:
                raise ValueError(f"transcript turn with role {msg['role']!r}: only assistant/user may follow the prompt")
            ids += part
            mask += [bit] * len(part)
        return ids, mask
