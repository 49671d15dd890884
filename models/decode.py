"""Continuous batching for the in-process engine: rows join and leave one decoding batch.

A ``DecodeStream`` holds the rows being decoded and their key/value cache as one left-padded
batch (``[rows, kv_heads, width, head_dim]`` per layer). Every ``step()``:

1. **decode**: one forward of one token for every row in the batch; each samples its next token.
2. **admit**: queued requests join while fewer than ``max_batch`` rows decode. A joiner's
   prompt is prefilled in one forward with the other joiners; when the stream keeps prefixes
   (``keep_prefix``) and the same key was decoded before, the cached keys/values of the longest
   common prefix are reused and only the new suffix is fed (a multi-turn trajectory re-feeds
   only its tool response, not its whole history). With ``share_prefill``, joiners feeding the same
   ids from scratch (the samples of one prompt) are prefilled once and the result copied. The
   joiners' caches are merged into the batch.
3. **leave**: rows that sampled the end-of-turn id or used their budget leave the batch at
   once (their cache is kept under their key when ``keep_prefix``); the batch is trimmed to the
   longest remaining row.

``abort(keys)`` stops rows (and queued requests) between steps and hands back what each sampled
so far: partial rollouts (``tasks.rollout.partial``) and the test server's ``/abort_request``.

Two queued requests with the same ``seed_key`` (a rollout's fork and its original, ``tasks.rollout.paired``) and the
same ids would sample the same tokens: ``submit`` joins them into one request, decoded as one row keyed by the
larger budget; the other gets its ids cut at its own budget (``stop`` when they end on the end-of-turn id).

So no row ever decodes padding after it finished, a long turn does not hold back the others,
and only the sampled tokens' log-probs are kept (never full logits). Positions are explicit
(``position_ids`` = each row's own token count), so padding anywhere in the cache is masked
out and never shifts a row.

Sampling (``models.sampling``): temperature, optional nucleus (``top_p``), one uniform draw per row and token from
a generator seeded by (seed, key, turn), so what a row samples does not depend on which other
rows share its batch (up to floating-point noise of different batch shapes). The log-prob of a
sampled token is under the temperature-scaled distribution, as the static engine reports. The draws are
made on the CPU (the same numbers on any device). Temperature 0 is greedy decoding (the arg-max, its
log-prob at temperature 1): ``models.gpu_check`` compares a device's tokens with the CPU's that way.

Cache: ``kv_cache`` picks its holder (``models.kv_cache``): ``preallocated`` buffers written in place
(the engine's default) or ``concat``, transformers' cache copied for every token (the previous path);
the logits are the same bit for bit. With ``lean_decode`` a decode step runs the model's own modules
layer by layer (``models.lean_decode``) instead of transformers' forward, over the cache's in-place window
(``SlotKV.lean_cache``): same logits, less Python. ``timing`` sums the seconds of each part of a step and
``shapes`` (when a list) records every decode step's (rows, width): ``flows.bench_decode`` measures against them.

Attention (``models.decode_attention``): the stream switches its model from ``sdpa`` to ``decode_gqa``:
a one-token decode step attends with each key/value head's query heads stacked as queries,
instead of copying the whole cache once per query head (transformers' ``repeat_kv``); prefill
and training-size inputs run transformers' ``sdpa`` unchanged.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import torch

from models.decode_attention import gqa_decode_attention, use_decode_attention
from models.kv_cache import ConcatKV, SlotKV, fill_from_end, left_pad
from models.sampling import RowDraws, row_seed, sample

KV_CACHES = {"concat": lambda max_batch: ConcatKV(), "preallocated": lambda max_batch: SlotKV(max_batch)}
"""``engine.kv_cache`` → the batch cache's holder (``models.kv_cache``)."""


@dataclass
class _Row:
    key: object
    budget: int
    fed: list[int]
    """Ids whose keys/values are in the cache (the prompt, then every sampled token but the last)."""
    next_id: int = -1
    out: list[int] = field(default_factory=list)
    lps: list[float] = field(default_factory=list)
    draws: RowDraws | None = None
    followers: list[tuple[object, int]] = field(default_factory=list)
    """(key, budget) of identical requests this row decodes for: each gets this row's ids cut at its budget."""


@dataclass
class _Pending:
    key: object
    input_ids: list[int]
    budget: int
    seed_key: object = None
    """What the row's draws are seeded by in place of ``key`` (a fork decoding beside its original)."""
    followers: list[tuple[object, int]] = field(default_factory=list)


class DecodeStream:
    """Rows join (``submit``), decode together (``step``) and leave when done (see module docstring)."""

    def __init__(self, model, eos_id: int, pad_id: int, temperature: float = 1.0, top_p: float = 1.0,
                 max_batch: int = 64, seed: int = 0, keep_prefix: bool = False, counters: dict | None = None,
                 kv_cache: str = "concat", share_prefill: bool = False, lean_decode: bool = False):
        self.model = model
        self.eos_id, self.pad_id = eos_id, pad_id
        self.temperature, self.top_p = temperature, top_p
        self.max_batch, self.seed, self.keep_prefix, self.share_prefill = max_batch, seed, keep_prefix, share_prefill
        self.device = next(model.parameters()).device
        use_decode_attention(model)
        from models.lean_decode import supports

        self.lean = lean_decode and supports(model)
        """Decode steps through ``models.lean_decode`` (same logits, less Python per forward)."""
        self.queue: deque[_Pending] = deque()
        self.waiting: dict[object, _Pending] = {}
        """Queued requests by the key their draws are seeded by (``submit`` joins identical ones)."""
        self.rows: list[_Row] = []
        if kv_cache not in KV_CACHES:
            raise ValueError(f"engine.kv_cache: unknown {kv_cache!r}; valid: {sorted(KV_CACHES)}")
        self.kv = KV_CACHES[kv_cache](max_batch)
        self.store: dict[object, tuple[list[int], list[torch.Tensor], list[torch.Tensor]]] = {}
        self.stats = {"forwards": 0, "row_tokens": 0, "prefill_tokens": 0, "reused_tokens": 0, "shared_tokens": 0}
        self.counters = counters if counters is not None else {}
        """Shared with the engine: ``generated`` tokens and ``decode_slots`` (equal here: no row decodes padding)."""
        self.timing: dict[str, float] = {}
        """Seconds spent in ``decode`` forwards, ``sample``, ``prefill`` (admission) and ``leave`` (``flows.bench_decode``)."""
        self.shapes: list[tuple[int, int]] | None = None
        """When a list: (rows, cache width) of every decode step is appended (``flows.bench_decode``'s bound)."""

    @property
    def busy(self) -> bool:
        return bool(self.queue or self.rows)

    def submit(self, key: object, input_ids: list[int], max_new_tokens: int, seed_key: object = None) -> None:
        """Queue a turn under ``key``; its draws are seeded by ``seed_key`` when given (else ``key``): two keys
        with the same ``seed_key`` and input length sample the same tokens from the same logits."""
        if not input_ids:
            raise ValueError(f"request {key!r}: empty input_ids")
        req, sk = _Pending(key, list(input_ids), max(1, max_new_tokens), seed_key), key if seed_key is None else seed_key
        same = self.waiting.get(sk)
        if same is not None and same.input_ids == req.input_ids:
            _join(same, req, sk)
            return
        self.waiting[sk] = req
        self.queue.append(req)

    def release(self, key: object) -> None:
        """Forget the cached prefix of ``key`` (its trajectory ended)."""
        self.store.pop(key, None)

    def copy_prefix(self, src: object, dst: object) -> None:
        """``dst`` reuses the cached prefix of ``src`` (a trajectory forked from it; the tensors are shared, never
        written in place)."""
        if src in self.store:
            self.store[dst] = self.store[src]

    @torch.no_grad()
    def step(self) -> list[tuple[object, list[int], list[float], str]]:
        """Decode one token for every row, admit queued requests, retire finished rows.

        Returns (key, token ids, log-probs, finish reason) of the rows that finished.
        """
        decoded = list(range(len(self.rows)))
        if decoded:
            self._decode()
        t0 = time.perf_counter()
        admitted = self._admit()
        self._spent("prefill", t0)
        return self._retire(decoded + admitted)

    def _spent(self, part: str, t0: float) -> float:
        now = time.perf_counter()
        self.timing[part] = self.timing.get(part, 0.0) + now - t0
        return now

    # -- admission ----------------------------------------------------------------------------

    def _admit(self) -> list[int]:
        joiners: list[tuple[_Pending, int]] = []
        while self.queue and len(self.rows) + len(joiners) < self.max_batch:
            req = self.queue.popleft()
            sk = req.key if req.seed_key is None else req.seed_key
            if self.waiting.get(sk) is req:
                del self.waiting[sk]
            joiners.append((req, self._reusable(req)))
        if not joiners:
            return []
        first = len(self.rows)
        keys, values, lasts = self._prefill(joiners)
        for (req, _), logits in zip(joiners, lasts):
            seed_key = req.key if req.seed_key is None else req.seed_key
            row = _Row(req.key, req.budget, req.input_ids, followers=req.followers,
                       draws=RowDraws(row_seed(self.seed, seed_key, len(req.input_ids))))
            self.rows.append(row)
            self._sample([row], logits[None])
        self._merge(keys, values, [len(req.input_ids) for req, _ in joiners])
        return list(range(first, len(self.rows)))

    def _reusable(self, req: _Pending) -> int:
        """Length of the cached prefix of ``req.key`` that ``req.input_ids`` starts with (keeps ≥ 1 id to feed)."""
        if not self.keep_prefix or req.key not in self.store:
            return 0
        ids = self.store[req.key][0]
        n = 0
        limit = min(len(ids), len(req.input_ids) - 1)
        while n < limit and ids[n] == req.input_ids[n]:
            n += 1
        return n

    def _prefill(self, joiners: list[tuple[_Pending, int]]):
        """The joiners' caches and last logits; with ``share_prefill``, joiners that feed the same ids from scratch
        (the samples of one prompt, admitted together) are prefilled once and the result copied to each."""
        slot: dict[tuple, int] = {}
        unique: list[tuple[_Pending, int]] = []
        where = []
        for n, (req, c) in enumerate(joiners):
            key = ("ids", tuple(req.input_ids)) if self.share_prefill and not c else ("row", n)
            if key not in slot:
                slot[key] = len(unique)
                unique.append((req, c))
            where.append(slot[key])
        if len(unique) == len(joiners):
            return self._prefill_rows(joiners)
        keys, values, lasts = self._prefill_rows(unique)
        self.stats["shared_tokens"] += sum(len(req.input_ids) for req, _ in joiners) - sum(
            len(req.input_ids) for req, _ in unique)
        idx = torch.tensor(where, device=lasts.device)
        return [k[idx] for k in keys], [v[idx] for v in values], lasts[idx]

    def _prefill_rows(self, joiners: list[tuple[_Pending, int]]):
        """One forward over the joiners' new suffixes on top of their reused prefixes (left-padded)."""
        n_layers = self.model.config.num_hidden_layers
        c_max = max(c for _, c in joiners)
        s_max = max(len(req.input_ids) - c for req, c in joiners)
        ids = torch.full((len(joiners), s_max), self.pad_id, dtype=torch.long)
        pos = torch.zeros((len(joiners), s_max), dtype=torch.long)
        attn = torch.zeros((len(joiners), c_max + s_max), dtype=torch.long)
        past = None
        if c_max:
            past_k, past_v = [], []
            some = self.store[next(req.key for req, c in joiners if c)]  # shapes for joiners with nothing cached
            for layer in range(n_layers):
                ks, vs = [], []
                for req, c in joiners:
                    cached = self.store[req.key] if c else some
                    k, v = cached[1][layer][:, :c], cached[2][layer][:, :c]
                    ks.append(left_pad(k, c_max))
                    vs.append(left_pad(v, c_max))
                past_k.append(torch.stack(ks))
                past_v.append(torch.stack(vs))
            past = list(zip(past_k, past_v))
        for row, (req, c) in enumerate(joiners):
            suffix = req.input_ids[c:]
            ids[row, s_max - len(suffix) :] = torch.tensor(suffix)
            pos[row, s_max - len(suffix) :] = torch.arange(c, c + len(suffix))
            attn[row, c_max - c : c_max] = 1
            attn[row, c_max + s_max - len(suffix) :] = 1
            self.stats["reused_tokens"] += c
            self.stats["prefill_tokens"] += len(suffix)
        from transformers import DynamicCache

        cache = DynamicCache(past) if past is not None else DynamicCache()
        if self.lean:
            from models.lean_decode import prefill_forward

            logits = prefill_forward(self.model, ids.to(self.device), pos.to(self.device), attn.to(self.device), cache,
                                     gqa_decode_attention)
            self.stats["forwards"] += 1
            self.stats["row_tokens"] += int(ids.shape[0] * ids.shape[1])
        else:
            cache, logits = self._forward(ids, pos, attn, cache, c_max)
        keys, values = [lay.keys for lay in cache.layers], [lay.values for lay in cache.layers]
        spans = [(c, len(req.input_ids) - c) for req, c in joiners]
        return _pack(keys, c_max, spans), _pack(values, c_max, spans), logits[:, -1]

    def _merge(self, keys: list[torch.Tensor], values: list[torch.Tensor], lengths: list[int]) -> None:
        """Append admitted rows (caches ``[n, h, w, d]``, left-padded) to the batch cache."""
        self.kv.merge(keys, values)

    # -- decoding -----------------------------------------------------------------------------

    def _decode(self) -> None:
        """One token for every row in the batch."""
        t0 = time.perf_counter()
        width = self.kv.width
        if self.shapes is not None:
            self.shapes.append((len(self.rows), width))
        ids = torch.tensor([[row.next_id] for row in self.rows])
        pos = torch.tensor([[len(row.fed)] for row in self.rows])
        attn = (torch.arange(width + 1) >= width - pos).long()  # row j's last len(fed) columns and the new one
        if self.lean:
            from models.lean_decode import decode_forward

            cache = self.kv.lean_cache()
            logits = decode_forward(self.model, ids.to(self.device), pos.to(self.device), attn.to(self.device), cache,
                                    gqa_decode_attention)
            self.stats["forwards"] += 1
            self.stats["row_tokens"] += len(self.rows)
        else:
            cache, logits = self._forward(ids, pos, attn, self.kv.decode_cache(), width)
        self.kv.stepped(cache)
        for row in self.rows:
            row.fed.append(row.next_id)
        t0 = self._spent("decode", t0)
        self._sample(self.rows, logits[:, -1])
        self._spent("sample", t0)

    def _forward(self, ids, pos, attn, cache, past_len: int):
        """One forward over ``cache`` (grown in place); returns it and the last position's logits."""
        cache_position = torch.arange(past_len, past_len + ids.shape[1])
        out = self.model(input_ids=ids.to(self.device), position_ids=pos.to(self.device),
                         attention_mask=attn.to(self.device), past_key_values=cache,
                         cache_position=cache_position.to(self.device), use_cache=True, logits_to_keep=1)
        self.stats["forwards"] += 1
        self.stats["row_tokens"] += int(ids.shape[0] * ids.shape[1])
        return out.past_key_values, out.logits.float()

    def _sample(self, rows: list[_Row], logits: torch.Tensor) -> None:
        tokens, chosen = sample(logits, self.temperature, self.top_p, [row.draws for row in rows])
        for row, tok, lp in zip(rows, tokens, chosen):
            row.next_id = tok
            row.out.append(tok)
            row.lps.append(lp)
        for name in ("generated", "decode_slots"):
            self.counters[name] = self.counters.get(name, 0) + len(rows)

    # -- retirement ---------------------------------------------------------------------------

    def _retire(self, rows: list[int]) -> list[tuple[object, list[int], list[float], str]]:
        done, finished = [], []
        for i in rows:
            row = self.rows[i]
            if row.next_id == self.eos_id:
                done.append((i, "stop"))
            elif len(row.out) >= row.budget:
                done.append((i, "length"))
            if row.followers:
                finished += self._followers_due(row, ended=bool(done) and done[-1][0] == i)
        for i, reason in done:
            row = self.rows[i]
            if self.keep_prefix:
                self.store[row.key] = (list(row.fed), *self.kv.row(i, len(row.fed)))
            finished.append((row.key, row.out, row.lps, reason))
        if done:
            t0 = time.perf_counter()
            self._drop({i for i, _ in done})
            self._spent("leave", t0)
        return finished

    def _followers_due(self, row: _Row, ended: bool) -> list[tuple[object, list[int], list[float], str]]:
        """The followers of ``row`` whose budget its ids reached (all of them once it ended): its ids cut there."""
        due = [(k, b) for k, b in row.followers if ended or len(row.out) >= b]
        row.followers = [f for f in row.followers if f not in due]
        return [(k, row.out[:b], row.lps[:b], "stop" if row.out[:b][-1] == self.eos_id else "length") for k, b in due]

    def _drop(self, gone: set[int]) -> None:
        """Remove rows ``gone`` from the batch (rows from its end fill their places) and trim the cache to the
        longest remaining row."""
        keep = fill_from_end(len(self.rows), gone)
        self.rows = [self.rows[i] for i in keep]
        lengths = [len(r.fed) for r in self.rows]
        self.kv.drop(keep, max(lengths, default=0), lengths)

    def abort(self, keys: set | None = None) -> list[tuple[object, list[int], list[float], str]]:
        """Stop the rows and queued requests of ``keys`` (all when None) at once; returns (key, ids sampled so
        far, their log-probs, ``"abort"``) for each — a queued request has sampled nothing. Partial rollouts
        store these and continue them later; a stopped row's cached prefix is not kept."""
        hit = (lambda k: True) if keys is None else (lambda k: k in keys)
        out = [(k, [], [], "abort") for req in self.queue if hit(req.key) for k in (req.key, *dict(req.followers))]
        self.queue = deque(req for req in self.queue if not hit(req.key))
        self.waiting = {sk: req for sk, req in self.waiting.items() if not hit(req.key)}
        gone = {i for i, row in enumerate(self.rows) if hit(row.key)}
        out = [(key, list(row.out[:b]), list(row.lps[:b]), "abort") for row in (self.rows[i] for i in sorted(gone))
               for key, b in [(row.key, len(row.out)), *row.followers]] + out
        if gone:
            self._drop(gone)
        return out


def _join(queued: _Pending, req: _Pending, seed_key: object) -> None:
    """``req`` asks for what ``queued`` asks for (the same draws, the same ids): one row decodes both, keyed by the
    larger budget; the other follows it."""
    if req.budget > queued.budget:
        queued.followers.append((queued.key, queued.budget))
        queued.key, queued.budget = req.key, req.budget
    else:
        queued.followers.append((req.key, req.budget))
    queued.seed_key = seed_key


def _pack(layers: list[torch.Tensor], c_max: int, spans: list[tuple[int, int]]) -> list[torch.Tensor]:
    """Make each row's cache contiguous and right-aligned after a prefill.

    A prefilled row holds ``[pad | reused prefix (c)]`` in the first ``c_max`` slots and
    ``[pad | new suffix (s)]`` in the rest; when its suffix is shorter than the longest, a gap of
    padding sits between the two, but decoding attends to each row's last ``len(fed)`` slots.
    """
    width = layers[0].shape[2]
    index = torch.zeros((len(spans), width), dtype=torch.long)
    for row, (c, s) in enumerate(spans):
        valid = list(range(c_max - c, c_max)) + list(range(width - s, width))
        index[row, width - len(valid):] = torch.tensor(valid, dtype=torch.long)
    keep = torch.zeros((len(spans), 1, width, 1), dtype=layers[0].dtype)
    for row, (c, s) in enumerate(spans):
        keep[row, 0, width - c - s:] = 1
    gather = index.to(layers[0].device)[:, None, :, None]
    return [t.gather(2, gather.expand(-1, t.shape[1], -1, t.shape[3])) * keep.to(t.device) for t in layers]
