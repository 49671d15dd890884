"""Pivotal credit: mask the assistant turns before the pivot out of the loss (R3L ``_adjust_action_mask_for_retry``).

A response mask has one contiguous run of 1s per assistant turn (the model's own tokens);
tool responses, the guidance and other injected text are 0. With pivot ``k`` the first ``k``
runs are set to 0, so only the turns from the pivot on train. Drawn for pivot = 2::

    response ids    a a a <e> | t t | b b <e> | t t t | c c c <e>
    response_mask   1 1 1  1    0 0   1 1  1    0 0 0   1 1 1  1
    segments        [---0---]        [--1--]           [---2---]
    pivotal mask    0 0 0  0    0 0   0 0  0    0 0 0   1 1 1  1

A pivot at or past the number of runs masks every run; pivot 0 changes nothing. R3L applies
this to the base attempt the reflection was about, its distill copy and the guided retry.
"""

from __future__ import annotations


def assistant_segments(mask: list[int]) -> list[tuple[int, int]]:
    """``[start, end)`` of every contiguous run of 1s in ``mask``, in order."""
    runs: list[tuple[int, int]] = []
    start = None
    for i, bit in enumerate(mask):
        if bit and start is None:
            start = i
        elif not bit and start is not None:
            runs.append((start, i))
            start = None
    if start is not None:
        runs.append((start, len(mask)))
    return runs


def pivotal_mask(mask: list[int], pivot: int) -> list[int]:
    """A copy of ``mask`` with its first ``pivot`` runs of 1s set to 0 (see the drawing above)."""
    out = list(mask)
    for start, end in assistant_segments(mask)[: max(pivot, 0)]:
        out[start:end] = [0] * (end - start)
    return out
