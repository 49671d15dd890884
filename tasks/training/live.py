"""The process-wide caches of live objects: chat formats, inference engines and sandbox pools.

An engine (a loaded model) and a sandbox pool (warm executors or containers) are expensive to
build, so a process keeps one per config and reuses it across steps and evaluations; the
engine receives each new checkpoint's weights on every ``get_engine`` (the weight sync).
The stages and the evaluation both take their live objects from here, so neither imports the
other. ``close_live`` shuts the sandbox pools and the process's lanes down (flows call it when they end;
``atexit`` covers a crash).
"""

from __future__ import annotations

import atexit
import json
from pathlib import Path

from models.chat import ChatFormat
from models.config import ChatConfig, EngineConfig
from sandbox.base import make_sandbox
from sandbox.config import SandboxConfig

_live: dict[str, object] = {}


def get_chat(ckpt: str, chat_cfg: ChatConfig | None) -> ChatFormat:
    """The chat format of checkpoint ``ckpt`` (its tokenizer) framed by ``chat_cfg``."""
    from transformers import AutoTokenizer

    chat_cfg = chat_cfg or ChatConfig()
    key = f"chat:{ckpt}:{chat_cfg.model_dump_json()}"
    if key not in _live:
        _live[key] = ChatFormat(AutoTokenizer.from_pretrained(ckpt), chat_cfg.system_prompt, fewshot=chat_cfg.fewshot)
    return _live[key]  # type: ignore[return-value]


def architecture(ckpt: str) -> str:
    """What a checkpoint's weights must fit: its model config (or adapter config) without the bookkeeping keys
    that differ between checkpoints of one model (``_name_or_path``, ``transformers_version``)."""
    for name in ("config.json", "adapter_config.json"):
        path = Path(ckpt) / name
        if path.exists():
            conf = json.loads(path.read_text())
            return json.dumps({k: v for k, v in conf.items() if not k.startswith("_") and k != "transformers_version"},
                              sort_keys=True)
    return ""


def get_engine(cfg: EngineConfig, ckpt: str, chat: ChatFormat):
    """The engine of ``cfg`` for ``ckpt``'s architecture and special tokens, built once, holding ``ckpt``'s weights.

    Checkpoints of one model share the engine (the weight sync); a process that meets another model (another
    run, an evaluation of another checkpoint family) gets its own engine rather than a shape mismatch.
    """
    from models.engine import make_engine  # torch: loaded by the first engine, not by importing this module

    pad = chat.tokenizer.pad_token_id if chat.tokenizer.pad_token_id is not None else chat.eos_id
    key = f"engine:{cfg.model_dump_json()}:{architecture(ckpt)}:{chat.eos_id}:{pad}"
    if key not in _live:
        _live[key] = make_engine(cfg, ckpt, chat.eos_id, pad)
    engine = _live[key]
    engine.load_weights(ckpt)
    return engine


def get_sandbox(cfg: SandboxConfig):
    """The sandbox pool of ``cfg``, built once (closed by ``close_live`` or at exit)."""
    key = "sandbox:" + cfg.model_dump_json()
    if key not in _live:
        box = make_sandbox(cfg)
        atexit.register(box.close)
        _live[key] = box
    return _live[key]


def close_live() -> None:
    """Close every sandbox pool of this process (engines and chat formats stay loaded) and stop its lanes
    (``tasks.training.lanes``: their workers close theirs)."""
    from tasks.training.lanes import close_lanes

    close_lanes()
    for key in [k for k in _live if k.startswith("sandbox:")]:
        _live.pop(key).close()
