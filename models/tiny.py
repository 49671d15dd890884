"""Build the ``tiny`` policy: a byte-level BPE tokenizer with a Qwen-style tool chat template
and a randomly initialised Qwen2 model (≈1.1M parameters with the defaults), saved so that
``AutoTokenizer/AutoModelForCausalLM.from_pretrained(dir)`` load it.

Tokenizer: byte-level BPE trained with ``tokenizers`` on the given corpus, one token per digit
(``Digits(individual_digits=True)`` before the byte-level split), ``<|endoftext|>`` (pad),
``<|im_start|>``, ``<|im_end|>`` (eos) as special tokens and ``<tool_call>``, ``</tool_call>``,
``<tool_response>``, ``</tool_response>`` as single added tokens (kept by
``skip_special_tokens`` decoding, as in Qwen2.5). The split is Qwen2's regex (see
``QWEN_SPLIT_REGEX``), so ``AutoTokenizer`` (which loads any ``qwen2`` checkpoint as
``Qwen2Tokenizer`` in transformers 5) tokenises exactly as trained. Chat template (``CHAT_TEMPLATE``)::

    <|im_start|>system\\n{system or default}[\\n\\n# Tools + one line per tool]<|im_end|>\\n
    <|im_start|>user\\n{content}<|im_end|>\\n
    <|im_start|>assistant\\n{content, may hold <tool_call>...</tool_call>}<|im_end|>\\n
    <|im_start|>user\\n<tool_response>\\n{tool content}\\n</tool_response><|im_end|>\\n
    (consecutive tool messages share one user turn, as in Qwen)
    add_generation_prompt → <|im_start|>assistant\\n

Simplifies: assistant ``tool_calls`` fields are not rendered (turn content is the raw text).
Run: ``build_tiny(Path("out"), TinyModelConfig(), texts)``; ``render_text`` gives the training
text of a transcript.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path

from models.chat import PYTHON_TOOL
from models.config import TinyModelConfig

PAD, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [PAD, IM_START, IM_END]
TOOL_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
DEFAULT_SYSTEM = "You are a helpful assistant."
QWEN_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
"""Qwen2's pre-tokenizer split: ``AutoTokenizer`` loads a ``qwen2`` checkpoint as
``Qwen2Tokenizer``, which rebuilds NFC + this split + byte level around the saved vocab and
merges; training with the same pipeline (plus the redundant ``Digits`` step) keeps ids equal."""

CHAT_TEMPLATE = (
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set system_text = messages[0]['content'] -%}{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}"
    "{%- set system_text = '" + DEFAULT_SYSTEM + "' -%}{%- set loop_messages = messages -%}"
    "{%- endif -%}"
    "{{- '<|im_start|>system\n' + system_text -}}"
    "{%- if tools -%}"
    "{{- '\n\n# Tools' -}}"
    "{%- for tool in tools -%}"
    "{%- set fn = tool['function'] if tool['function'] is defined else tool -%}"
    "{{- '\n- ' + fn['name'] + '(' + (fn['parameters']['properties'] | list | join(', ')) + '): '"
    " + fn['description'] -}}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\n' -}}"
    "{%- for message in loop_messages -%}"
    "{%- if message['role'] == 'tool' -%}"
    "{%- if loop.first or loop_messages[loop.index0 - 1]['role'] != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}"
    "{{- '\n<tool_response>\n' + message['content'] + '\n</tool_response>' -}}"
    "{%- if loop.last or loop_messages[loop.index0 + 1]['role'] != 'tool' -%}{{- '<|im_end|>\n' -}}{%- endif -%}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}"
)


@lru_cache(maxsize=1)
def _template():
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    return ImmutableSandboxedEnvironment().from_string(CHAT_TEMPLATE)


def render_text(messages: list[dict], tools: list[dict] | None = None, add_generation_prompt: bool = False) -> str:
    """A conversation rendered with ``CHAT_TEMPLATE`` (plain jinja2, no tokenizer needed)."""
    return _template().render(
        messages=messages, tools=[PYTHON_TOOL] if tools is None else tools, add_generation_prompt=add_generation_prompt
    )


def drop_atomic_merges(tok, atomic: str):
    """Remove every BPE merge that joins two pieces made only of ``atomic`` characters.

    The pre-tokenizer cannot be customised (``AutoTokenizer`` rebuilds Qwen2's), but the merges
    are kept as saved: without these, a text-game grid row such as ``_P_O`` is one token per
    cell, as digits are one token each. (Multi-byte atomic characters such as ``√`` become added
    tokens in ``train_tokenizer``.)
    """
    import json

    from tokenizers import Tokenizer

    table = _byte_decoder()

    def only_atomic(piece: str) -> bool:
        try:
            text = bytes(table[ch] for ch in piece).decode("utf-8")
        except (KeyError, UnicodeDecodeError):
            return False
        return bool(text) and all(ch in atomic for ch in text)

    spec = json.loads(tok.to_str())
    merges = spec["model"]["merges"]
    pairs = [m.split(" ", 1) if isinstance(m, str) else m for m in merges]
    spec["model"]["merges"] = [m for m, (a, b) in zip(merges, pairs) if not (only_atomic(a) and only_atomic(b))]
    return Tokenizer.from_str(json.dumps(spec))


def _byte_decoder() -> dict[str, int]:
    from models.chat import _byte_decoder as table

    return table()


def train_tokenizer(texts: Iterable[str], vocab_size: int, max_positions: int, atomic: str = ""):
    """Train the byte-level BPE on ``texts`` and wrap it as a ``PreTrainedTokenizerFast``.

    ``atomic``: characters never merged with each other (``drop_atomic_merges``); the multi-byte ones
    (``√``) are added tokens, so each is one token."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.Split(Regex(QWEN_SPLIT_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(TOOL_TOKENS),
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    if atomic:
        tok = drop_atomic_merges(tok, atomic)
    wide = [ch for ch in dict.fromkeys(atomic) if len(ch.encode()) > 1]
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TOKENS + wide])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=PAD,
        model_max_length=max_positions,
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )


def make_model(cfg: TinyModelConfig, tokenizer):
    """A randomly initialised ``Qwen2ForCausalLM`` for ``tokenizer`` (seeded by ``cfg.seed``)."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    eos, pad = tokenizer.convert_tokens_to_ids(IM_END), tokenizer.convert_tokens_to_ids(PAD)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=cfg.max_positions,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        tie_word_embeddings=cfg.tie_embeddings,
        eos_token_id=eos,
        pad_token_id=pad,
        bos_token_id=None,
    )
    torch.manual_seed(cfg.seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=pad)
    return model


def build_tiny(out_dir: Path, cfg: TinyModelConfig, corpus_texts: Iterable[str]) -> Path:
    """Train the tokenizer on ``corpus_texts``, build the seeded model and save both to ``out_dir``."""
    texts = list(corpus_texts)
    if not texts:
        raise ValueError("corpus_texts: empty; the tokenizer needs training text")
    fixed = render_text([{"role": "user", "content": "q"}, {"role": "tool", "content": "t"}], add_generation_prompt=True)
    tokenizer = train_tokenizer(texts + [fixed] * max(1, len(texts) // 4), cfg.vocab_size, cfg.max_positions,
                                cfg.atomic_chars)
    model = make_model(cfg, tokenizer)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir
