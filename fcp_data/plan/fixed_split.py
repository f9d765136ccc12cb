"""Fallback splits for a fixed micro-batch count (``micro_batches=M``, DESIGN §5).

:func:`~fcp_data.plan.microbatch.split_micro_batches` balances *work* (LPT); it can fail on token memory where a
split by tokens fits (``[5, 5, 4, 3, 3]`` into two micro-batches of 10 tokens: LPT ends ``9 | 8`` with a 3 left,
first fit decreasing gives ``5+5 | 4+3+3``), or its split may hold a micro-batch the solver cannot plan (a
restricted solver: power-of-two or head-limited degrees). Only then (the planner refused before) are these tried,
in order, each a split into exactly ``M`` non-empty micro-batches whose tokens stay within ``N·E``:

* ``"token-balanced"``: heaviest sequence (by tokens) first into the micro-batch with the most token room;
* ``"first-fit decreasing"``: heaviest first into the first micro-batch it fits;
* ``"exhaustive"`` (at most :data:`EXACT_MAX_SEQUENCES` sequences): every split by depth-first search (largest
  sequences placed first, token room pruned), at most :data:`EXACT_MAX_SPLITS` of them.

A heuristic that leaves a micro-batch empty moves the smallest sequence of the fullest multi-sequence micro-batch
into it (taking tokens out of a micro-batch never breaks its memory). Everything is deterministic (stable sorts,
lowest index on ties), so every rank finds the same split.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

__all__ = ["fallback_splits", "fallback_methods", "EXACT_MAX_SEQUENCES", "EXACT_MAX_SPLITS", "FALLBACK_METHODS"]

EXACT_MAX_SEQUENCES = 12  # the exhaustive fallback enumerates splits of at most this many sequences …
EXACT_MAX_SPLITS = 64  # … and hands at most this many token-feasible ones to the solver
FALLBACK_METHODS = ("token-balanced", "first-fit decreasing", f"exhaustive (the first {EXACT_MAX_SPLITS} that fit memory)")


def _to_split(label: np.ndarray, M: int) -> list[np.ndarray]:
    return [np.flatnonzero(label == j).astype(np.int64) for j in range(M)]


def _fill_empty(label: np.ndarray, lengths: np.ndarray, M: int) -> np.ndarray:
    """``label`` with no empty micro-batch (``M ≤ n``): see the module docstring."""
    label = label.copy()
    counts = np.bincount(label, minlength=M)
    for j in np.flatnonzero(counts == 0).tolist():
        tokens = np.bincount(label, weights=lengths, minlength=M)
        donor = int(np.argmax(np.where(np.bincount(label, minlength=M) > 1, tokens, -1.0)))
        members = np.flatnonzero(label == donor)
        label[members[np.lexsort((members, lengths[members]))[0]]] = j
    return label


def _greedy(lengths: np.ndarray, M: int, cap: float, first_fit: bool) -> list[np.ndarray] | None:
    order = np.lexsort((np.arange(lengths.size), -lengths))
    room = np.full(M, float(cap))
    label = np.empty(lengths.size, dtype=np.int64)
    for i in order.tolist():
        s = float(lengths[i])
        if first_fit:
            fits = np.flatnonzero(room >= s)
            if not fits.size:
                return None
            j = int(fits[0])
        else:
            j = int(np.argmax(room))  # the most room, lowest index on ties
            if room[j] < s:
                return None
        label[i] = j
        room[j] -= s
    return _to_split(_fill_empty(label, lengths.astype(np.float64), M), M)


def _exact(lengths: np.ndarray, M: int, cap: float) -> Iterator[list[np.ndarray]]:
    """Token-feasible splits into exactly ``M`` non-empty micro-batches (restricted growth: no split twice)."""
    n = lengths.size
    order = np.lexsort((np.arange(n), -lengths)).tolist()
    s = [float(lengths[i]) for i in order]
    label = [0] * n
    load = [0.0] * M

    def rec(k: int, used: int) -> Iterator[list[np.ndarray]]:
        if n - k < M - used:  # too few sequences left to open the remaining micro-batches
            return
        if k == n:
            out = np.empty(n, dtype=np.int64)
            out[order] = label
            yield _to_split(out, M)
            return
        for j in range(min(used + 1, M)):
            if load[j] + s[k] <= cap:
                load[j] += s[k]
                label[k] = j
                yield from rec(k + 1, max(used, j + 1))
                load[j] -= s[k]

    yield from rec(0, 0)


def fallback_methods(n: int) -> list[str]:
    """The methods :func:`fallback_splits` uses for ``n`` sequences (named in the refusal)."""
    return list(FALLBACK_METHODS if n <= EXACT_MAX_SEQUENCES else FALLBACK_METHODS[:2])


def fallback_splits(lengths: np.ndarray, M: int, cap: float) -> Iterator[tuple[str, list[np.ndarray]]]:
    """``(method, split)`` for each fallback split (module docstring), distinct, in the order to try them."""
    seen: set[bytes] = set()

    def new(split: list[np.ndarray]) -> bool:
        key = b"|".join(ids.tobytes() for ids in sorted(split, key=lambda a: int(a[0])))
        if key in seen:
            return False
        seen.add(key)
        return True

    for method, first_fit in ((FALLBACK_METHODS[0], False), (FALLBACK_METHODS[1], True)):
        split = _greedy(lengths, M, cap, first_fit)
        if split is not None and new(split):
            yield method, split
    if lengths.size <= EXACT_MAX_SEQUENCES:
        for count, split in enumerate(_exact(lengths, M, cap)):
            if count >= EXACT_MAX_SPLITS:
                return
            if new(split):
                yield FALLBACK_METHODS[2], split
