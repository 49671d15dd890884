"""A paced engine: the test double for partial rollouts, honouring ``models.decode.DecodeStream``'s contract.

Every sample has a script of assistant turns (texts, encoded with the real tokenizer and ended by the
end-of-turn id). The stream decodes **one token per row per step**, so a turn's length is its time, and
``abort`` cuts rows mid-turn and hands back what they sampled. The engine remembers how far each sample's
current turn got, so a later request (the next step's stream, its context ending with the carried ids)
continues the same turn; the test checks that the carried ids were really sent. Log-probs are
``-0.001 × position`` so they can be traced.
"""

from __future__ import annotations

from models.engine import GenRequest
from tests.scripted import scripted_turn


class PacedEngine:
    def __init__(self, chat, scripts: dict[str, list[list[str]]]):
        """``scripts[prompt_id][sample_idx]`` = the texts of that sample's assistant turns."""
        self.chat, self.eos_id, self.scripts = chat, chat.eos_id, scripts
        self.progress: dict[tuple[str, int], list[int]] = {}
        """(prompt, sample) → [turn index, ids of the current turn emitted so far]."""
        self.requests: dict[tuple[str, int], list[GenRequest]] = {}

    def load_weights(self, path) -> None:
        return None

    def stream(self, seed: int = 0, keep_prefix: bool = True) -> PacedStream:
        return PacedStream(self)

    def turn_ids(self, sample: tuple[str, int], turn: int) -> list[int]:
        return scripted_turn(self.chat, self.scripts[sample[0]][sample[1]][turn], 0.0)[0]


def sample_of(key: str) -> tuple[str, int]:
    """``step:prompt:k`` → (prompt, k)."""
    _, prompt, k = key.rsplit(":", 2)
    return prompt, int(k)


class PacedStream:
    def __init__(self, engine: PacedEngine):
        self.engine = engine
        self.rows: dict[str, tuple[list[int], list[float]]] = {}

    @property
    def busy(self) -> bool:
        return bool(self.rows)

    def submit(self, key: str, input_ids: list[int], max_new_tokens: int) -> None:
        sample = sample_of(key)
        self.engine.requests.setdefault(sample, []).append(GenRequest(list(input_ids), max_new_tokens))
        turn, done = self.engine.progress.setdefault(sample, [0, []])
        assert input_ids[len(input_ids) - len(done):] == done, f"{key}: the carried ids were not sent"
        self.rows[key] = ([], [])

    def release(self, key: str) -> None:
        """Nothing cached."""

    def step(self) -> list[tuple[str, list[int], list[float], str]]:
        finished = []
        for key, (ids, lps) in list(self.rows.items()):
            sample = sample_of(key)
            turn, done = self.engine.progress[sample]
            full = self.engine.turn_ids(sample, turn)
            tok = full[len(done)]
            done.append(tok)
            ids.append(tok)
            lps.append(-0.001 * len(done))
            if len(done) == len(full):
                self.engine.progress[sample] = [turn + 1, []]
                del self.rows[key]
                finished.append((key, ids, lps, "stop"))
        return finished

    def abort(self, keys: set | None = None) -> list[tuple[str, list[int], list[float], str]]:
        out = [(k, ids, lps, "abort") for k, (ids, lps) in self.rows.items() if keys is None or k in keys]
        for k, *_ in out:
            del self.rows[k]
        return out
