"""A scripted engine: the test double for a model, honouring the ``Engine`` contract.

Each trajectory (by request order) answers with the next text of its script, encoded with
the real tokenizer and ended by the real end-of-turn id; log-probs are a fixed per-call value
so splices can be traced (``-0.01 * call number``, or ``lp`` for every token when given: exact binary fractions
for hand-computed sums). A script entry ``Turn(text, end)`` ends otherwise: ``endoftext`` (the
tokenizer's other eos id, a ``stop`` without the end-of-turn id, as Qwen emits it) or ``length``
(cut by the budget: no end id); its ``text`` may instead be a list of token ids, sampled as they are (a turn
that spells a special token's text with ordinary tokens, which ``encode`` would turn into the special id). ``stream`` offers the continuous-batching contract of
``models.decode.DecodeStream`` (submit / step / release / busy): a key gets the next unused
script on its first submit, and every submitted turn finishes at the next ``step``.
"""

from __future__ import annotations

from typing import NamedTuple

from models.engine import GenOutput, GenRequest


class Turn(NamedTuple):
    text: str | list[int]
    end: str = "eos"
    """``eos`` (the end-of-turn id), ``endoftext`` (another eos id, finish ``stop``) or ``length`` (cut)."""


def scripted_turn(chat, entry, lp: float) -> tuple[list[int], list[float], str]:
    """Ids, log-probs and finish reason of one script entry (a text, or a ``Turn``)."""
    turn = entry if isinstance(entry, Turn) else Turn(entry)
    ids = list(turn.text) if isinstance(turn.text, list) else chat.encode(turn.text)
    if turn.end == "eos":
        ids.append(chat.eos_id)
    elif turn.end == "endoftext":
        ids.append(chat.tokenizer.convert_tokens_to_ids("<|endoftext|>"))
    return ids, [lp] * len(ids), "length" if turn.end == "length" else "stop"


class ScriptedEngine:
    def __init__(self, chat, scripts: list[list[str]], lp: float | None = None):
        self.chat = chat
        self.lp = lp
        self.eos_id = chat.eos_id
        self.scripts = [list(s) for s in scripts]
        self.calls = 0
        self.requests: list[GenRequest] = []

    def load_weights(self, path) -> None:
        return None

    def generate(self, requests: list[GenRequest], seed: int) -> list[GenOutput]:
        live = [s for s in self.scripts if s]
        assert len(live) >= len(requests), "script ran out"
        outs = []
        for req, script in zip(requests, live):
            self.calls += 1
            self.requests.append(req)
            outs.append(GenOutput(*scripted_turn(self.chat, script.pop(0), self.turn_lp())))
        return outs

    def turn_lp(self) -> float:
        """The per-token log-prob of the turn just counted in ``calls``."""
        return self.lp if self.lp is not None else -0.01 * self.calls

    def stream(self, seed: int, keep_prefix: bool = True) -> ScriptedStream:
        return ScriptedStream(self)


class ScriptedStream:
    def __init__(self, engine: ScriptedEngine):
        self.engine = engine
        self.script_of: dict = {}
        self.queue: list[tuple[object, GenRequest]] = []
        self.released: list = []

    @property
    def busy(self) -> bool:
        return bool(self.queue)

    def submit(self, key, input_ids: list[int], max_new_tokens: int) -> None:
        self.queue.append((key, GenRequest(list(input_ids), max_new_tokens)))

    def release(self, key) -> None:
        self.released.append(key)

    def step(self) -> list[tuple[object, list[int], list[float], str]]:
        done, self.queue = self.queue, []
        out = []
        for key, req in done:
            if key not in self.script_of:
                self.script_of[key] = self.engine.scripts[len(self.script_of)]
            script = self.script_of[key]
            assert script, f"script of {key!r} ran out"
            self.engine.calls += 1
            self.engine.requests.append(req)
            out.append((key, *scripted_turn(self.engine.chat, script.pop(0), self.engine.turn_lp())))
        return out
