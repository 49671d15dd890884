"""RAGEN's prompt and parse for text games: what the policy reads each turn and how its answer is read.

Conversation (RAGEN ``ContextManager.get_lm_inputs``)::

    system     "You're a helpful assistant. "
    user       instruction [+ symbol legend] [+ action list and budget] + turn_text(1, state, ...)
    assistant  <think> … </think> <answer> Down || Left </answer>     (generation starts after a forced <think>)
    user       reward_text(r) + turn_text(2, state, ...)
    assistant  …

``parse_response`` applies RAGEN's regex ``<think>(.*?)</think>\\s*<answer>(.*?)</answer>``
(DOTALL; ``<answer>(.*?)</answer>`` without thinking), strips special tokens from both parts,
splits the answer on the separator and keeps at most ``max_actions`` non-empty actions. No match
gives no actions: the turn is then a format-penalised no-op (``tasks.envs.episode``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from tasks.envs.base import Env

SYSTEM_PROMPT = "You're a helpful assistant. "
THINK_PREFIX = "<think>"
FORMAT_THINK = "<think> [Your thoughts] </think> <answer> [your answer] </answer>"
FORMAT_ANSWER = "<answer> [your answer] </answer>"
SPECIAL = ("<think>", "</think>", "<answer>", "</answer>", "<|im_start|>", "<|im_end|>")
_THINK_RE = re.compile(r"<think>(.*?)</think>\s*<answer>(.*?)</answer>", re.DOTALL)
_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def instruction(env: Env, max_actions_per_traj: int, sep: str = "||") -> str:
    """The task text before the first turn: instruction, symbol legend, action list and budget."""
    text = env.instruction
    if env.symbols:
        text += "\nThe meaning of each symbol in the state is:\n" + ", ".join(f"{k}: {v}" for k, v in env.symbols.items())
    if env.list_actions:
        text += "\nYour available actions are:\n" + ", ".join(env.actions)
        text += f"\nYou can make up to {max_actions_per_traj} actions, separated by the action separator \" {sep} \"\n"
    return text


def turn_text(k: int, state: str, actions_left: int, max_tokens: int, think: bool = True) -> str:
    """Turn ``k``'s state and the format reminder (appended to the user message)."""
    fmt = FORMAT_THINK if think else FORMAT_ANSWER
    return (f"\nTurn {k}:\nState:\n{state}\nYou have {actions_left} actions left. Always output: {fmt} with no "
            f"extra text. Strictly follow this format. Max response length: {max_tokens} words (tokens).\n")


def format_number(x: float) -> str:
    """A reward as the policy reads it: ``0``, ``1``, ``0.1``, ``-0.3`` (no float noise)."""
    return f"{x:g}"


def reward_text(reward: float) -> str:
    return f"Reward:\n{format_number(reward)}\n"


@dataclass(frozen=True)
class Parsed:
    matched: bool
    think: str = ""
    answer: str = ""
    actions: list[str] = field(default_factory=list)


def _clean(text: str) -> str:
    for tok in SPECIAL:
        text = text.replace(tok, "")
    return text.strip()


def parse_response(text: str, max_actions: int, sep: str = "||", think: bool = True) -> Parsed:
    """RAGEN's parse of one assistant turn (full text, forced ``<think>`` included)."""
    m = (_THINK_RE if think else _ANSWER_RE).search(text)
    if m is None:
        return Parsed(False)
    thought, answer = (_clean(m.group(1)), _clean(m.group(2))) if think else ("", _clean(m.group(1)))
    actions = [a.strip() for a in answer.split(sep) if a.strip()]
    return Parsed(True, thought, answer, actions[:max_actions])
