"""A scripted engine: the test double for a model, honouring the ``Engine`` contract.

Each trajectory (by request order) answers with the next text of its script, encoded with
the real tokenizer and ended by the real end-of-turn id; log-probs are a fixed per-call value
so splices can be traced.
"""

from __future__ import annotations

from models.engine import GenOutput, GenRequest


class ScriptedEngine:
    def __init__(self, chat, scripts: list[list[str]]):
        self.chat = chat
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
            ids = self.chat.encode(script.pop(0)) + [self.eos_id]
            outs.append(GenOutput(ids, [-0.01 * self.calls] * len(ids), "stop"))
        return outs
