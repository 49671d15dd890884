"""The key/value cache of a continuous decoding batch (``models.decode.DecodeStream``), two ways.

The batch's cache is one left-padded block per layer, ``[rows, kv_heads, width, head_dim]``: row ``i``'s
``n`` cached positions are its last ``n`` columns. Both holders keep that view and offer the same five
operations — the view, one decode step, rows joining (``merge``), rows leaving (``drop``), one row's
positions (``row``):

* ``ConcatKV`` (``engine.kv_cache: concat``, the previous path): a decode step lets transformers'
  ``DynamicCache`` concatenate the new column to a copy of the whole cache, in every layer, for every token;
  joining and leaving rows copy the whole cache again.
* ``SlotKV`` (``preallocated``): the block is a window ``[lo, hi)`` of preallocated buffers
  ``[max_batch, kv_heads, capacity, head_dim]``; a decode step writes the new column in place at ``hi``
  (``SlotLayer``, a cache layer transformers' attention updates like its own), a leaving row's slot is
  filled by a row from the end of the batch (only that row's own positions are copied), trimming moves
  ``lo``, and the buffers are re-laid out only when the window reaches an end (capacity doubles).

Both hand the attention the same tensors at every real position; what the masked (padding) columns
hold differs — zeros in ``ConcatKV``, stale finite values of departed rows in ``SlotKV`` — and a masked
column weighs exactly 0, so the logits are the same bit for bit (``tests/test_decode.py`` pins it).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


class ConcatKV:
    """The cache as plain tensors, rebuilt by concatenation (``engine.kv_cache: concat``)."""

    def __init__(self):
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []

    @property
    def width(self) -> int:
        return self.keys[0].shape[2] if self.keys else 0

    def views(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        return self.keys, self.values

    def decode_cache(self) -> DynamicCache:
        return DynamicCache(list(zip(self.keys, self.values)))

    lean_cache = decode_cache

    def stepped(self, cache: DynamicCache) -> None:
        """Take the grown cache of a decode forward."""
        self.keys = [lay.keys for lay in cache.layers]
        self.values = [lay.values for lay in cache.layers]

    def merge(self, keys: list[torch.Tensor], values: list[torch.Tensor]) -> None:
        if not self.keys:
            self.keys, self.values = keys, values
            return
        width = max(self.width, keys[0].shape[2])
        self.keys = [torch.cat([left_pad(a, width), left_pad(b, width)]) for a, b in zip(self.keys, keys)]
        self.values = [torch.cat([left_pad(a, width), left_pad(b, width)]) for a, b in zip(self.values, values)]

    def drop(self, keep: list[int], longest: int, lengths: list[int] | None = None) -> None:
        """New row ``j`` is old row ``keep[j]`` (any order); trim to ``longest``."""
        if not keep:
            self.keys, self.values = [], []
            return
        sel, width = torch.tensor(keep), self.width
        self.keys = [k[sel, :, width - longest :] for k in self.keys]
        self.values = [v[sel, :, width - longest :] for v in self.values]

    def row(self, i: int, n: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        w = self.width
        return [k[i, :, w - n :].clone() for k in self.keys], [v[i, :, w - n :].clone() for v in self.values]


class SlotLayer(DynamicLayer):
    """A decode step's cache layer over a window of preallocated buffers: ``update`` writes the new column at
    ``hi`` in place and returns the window one column wider (no copy of the cache)."""

    def __init__(self, kbuf: torch.Tensor, vbuf: torch.Tensor, rows: int, lo: int, hi: int):
        super().__init__()
        self.kbuf, self.vbuf, self.rows, self.lo, self.hi = kbuf, vbuf, rows, lo, hi
        self.keys, self.values = kbuf[:rows, :, lo:hi], vbuf[:rows, :, lo:hi]
        self.dtype, self.device, self.is_initialized = kbuf.dtype, kbuf.device, True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if key_states.shape[2] != 1 or key_states.shape[0] != self.rows:
            raise ValueError(f"SlotLayer: a decode step feeds one token for each of {self.rows} rows, "
                             f"got keys of shape {tuple(key_states.shape)}")
        self.kbuf[: self.rows, :, self.hi : self.hi + 1] = key_states
        self.vbuf[: self.rows, :, self.hi : self.hi + 1] = value_states
        self.keys = self.kbuf[: self.rows, :, self.lo : self.hi + 1]
        self.values = self.vbuf[: self.rows, :, self.lo : self.hi + 1]
        return self.keys, self.values


class SlotWindow:
    """``update(keys, values, layer)`` of one decode step over a ``SlotKV``: the new column written in place at
    ``hi``, the window one column wider returned — what ``SlotLayer.update`` does, without a cache object per layer
    and step (``models.lean_decode``)."""

    __slots__ = ("kv",)

    def __init__(self, kv: SlotKV):
        self.kv = kv

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer: int):
        kv = self.kv
        rows, lo, hi = kv.rows, kv.lo, kv.hi
        if key_states.shape[2] != 1 or key_states.shape[0] != rows:
            raise ValueError(f"SlotWindow: a decode step feeds one token for each of {rows} rows, "
                             f"got keys of shape {tuple(key_states.shape)}")
        kbuf, vbuf = kv.kbuf[layer], kv.vbuf[layer]
        kbuf[:rows, :, hi : hi + 1] = key_states
        vbuf[:rows, :, hi : hi + 1] = value_states
        return kbuf[:rows, :, lo : hi + 1], vbuf[:rows, :, lo : hi + 1]


class SlotKV:
    """The cache as a window ``[lo, hi)`` of preallocated buffers (``engine.kv_cache: preallocated``)."""

    def __init__(self, max_rows: int, capacity: int = 256):
        self.max_rows, self.capacity = max_rows, capacity
        self.kbuf: list[torch.Tensor] = []
        self.vbuf: list[torch.Tensor] = []
        self.rows, self.lo, self.hi = 0, 0, 0
        self.moves = 0
        """Times the window was re-laid out (moved to the middle of the buffers, or into bigger ones)."""

    @property
    def width(self) -> int:
        return self.hi - self.lo

    def views(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        r, lo, hi = self.rows, self.lo, self.hi
        return [k[:r, :, lo:hi] for k in self.kbuf], [v[:r, :, lo:hi] for v in self.vbuf]

    def decode_cache(self) -> DynamicCache:
        self._room(0, 1)
        cache = DynamicCache()
        cache.layers = [SlotLayer(k, v, self.rows, self.lo, self.hi) for k, v in zip(self.kbuf, self.vbuf)]
        return cache

    def lean_cache(self) -> SlotWindow:
        """A decode step's cache for ``models.lean_decode``: ``SlotLayer``'s writes without a ``DynamicCache``."""
        self._room(0, 1)
        return SlotWindow(self)

    def stepped(self, cache) -> None:
        self.hi += 1

    def merge(self, keys: list[torch.Tensor], values: list[torch.Tensor]) -> None:
        """Append rows (``[j, h, w, d]``, left-padded) below the batch, right-aligned with it."""
        j, w = keys[0].shape[0], keys[0].shape[2]
        if self.rows + j > self.max_rows:
            raise ValueError(f"SlotKV: {self.rows} rows + {j} joining exceed max_batch={self.max_rows}")
        if not self.kbuf:
            shape = (self.max_rows, keys[0].shape[1], max(self.capacity, 2 * w), keys[0].shape[3])
            self.kbuf = [k.new_zeros(shape) for k in keys]
            self.vbuf = [v.new_zeros(shape) for v in values]
        if not self.rows:
            self.lo = self.hi = self.kbuf[0].shape[2] // 2
        self._room(max(w - self.width, 0), 0)
        self.lo = min(self.lo, self.hi - w)
        for buf, new in zip(self.kbuf + self.vbuf, keys + values):
            buf[self.rows : self.rows + j, :, self.hi - w : self.hi] = new
        self.rows += j

    def drop(self, keep: list[int], longest: int, lengths: list[int] | None = None) -> None:
        """New row ``j`` is old row ``keep[j]``; trim to ``longest``. A row that moves copies its last ``lengths[j]``
        columns (its own positions; the whole window without ``lengths``). No row may move onto a row that another
        moves from later: ``keep`` ascending, or holes filled from the end (``fill_from_end``), both qualify."""
        for j, i in enumerate(keep):
            if i != j:
                lo = self.hi - lengths[j] if lengths is not None else self.lo
                for buf in self.kbuf + self.vbuf:
                    buf[j, :, lo : self.hi] = buf[i, :, lo : self.hi]
        self.rows = len(keep)
        self.lo = self.hi - longest if keep else self.hi

    def row(self, i: int, n: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        return ([k[i, :, self.hi - n : self.hi].clone() for k in self.kbuf],
                [v[i, :, self.hi - n : self.hi].clone() for v in self.vbuf])

    def _room(self, left: int, right: int) -> None:
        """Make sure ``left`` free columns precede the window and ``right`` follow it: else the window moves to
        the middle of the buffers (doubled when it would fill more than half of them)."""
        cap, width = self.kbuf[0].shape[2], self.width
        if self.lo >= left and cap - self.hi >= right:
            return
        need = left + width + right
        new_cap = cap if 2 * need <= cap else max(2 * cap, 2 * need)
        start = left + (new_cap - need) // 2
        olds = [b[: self.rows, :, self.lo : self.hi].clone() for b in self.kbuf + self.vbuf]
        if new_cap != cap:
            shape = (self.max_rows, self.kbuf[0].shape[1], new_cap, self.kbuf[0].shape[3])
            self.kbuf = [k.new_zeros(shape) for k in self.kbuf]
            self.vbuf = [v.new_zeros(shape) for v in self.vbuf]
        for buf, old in zip(self.kbuf + self.vbuf, olds):
            buf[: self.rows, :, start : start + width] = old
        self.lo, self.hi = start, start + width
        self.moves += 1


def fill_from_end(n: int, gone: set[int]) -> list[int]:
    """The rows kept when rows ``gone`` of ``n`` leave, as ``drop``'s ``keep``: each hole below the new row count is
    filled by a kept row from above it (the rest keep their place), so at most ``len(gone)`` rows move."""
    size = n - len(gone)
    keep = list(range(size))
    movers = [i for i in range(size, n) if i not in gone]
    for hole, mover in zip(sorted(i for i in gone if i < size), movers):
        keep[hole] = mover
    return keep


def left_pad(t: torch.Tensor, width: int) -> torch.Tensor:
    """Left-pad the sequence axis (-2) of a cache tensor with zeros to ``width``."""
    missing = width - t.shape[-2]
    if missing <= 0:
        return t
    return torch.cat([t.new_zeros(t.shape[:-2] + (missing, t.shape[-1])), t], dim=-2)
