"""Stage 1 of FCP: best-fit-decreasing grouping of sequences into atomic CP groups (DESIGN §5).

Sequences are visited longest first. A sequence longer than the bin unit ``u`` opens a bin of capacity
``ceil(s/u)·u`` (its minimum degree times the unit when ``u = tokens_per_rank``); a shorter one goes to
the open bin whose remaining headroom is the smallest that still holds it (best fit), or opens a bin of
capacity ``u``. The bins are the groups that stage 2 gives degrees to.

With ``u = tokens_per_rank`` this is the paper's stage 1. The FCP solver also runs it with other units
(finer or coarser groups, see :func:`candidate_units`) and keeps the best plan.
Ties are broken by sequence index, so the grouping is a deterministic function of the input.
"""

from __future__ import annotations

import bisect
import heapq
import math

import numpy as np

__all__ = ["bfd_groups", "group_aggregates_of", "candidate_units", "lpt_groups", "lpt_labels", "lpt_heap", "labels_to_groups"]


def bfd_groups(lengths: np.ndarray, unit: float) -> list[list[int]]:
    """Best-fit-decreasing bins of ``lengths`` with bin unit ``unit``; returns lists of sequence ids.

    Groups come out in the order they were opened (so the first group holds the longest sequence).
    """
    if unit <= 0:
        raise ValueError(f"bin unit must be > 0, got {unit}")
    lengths = np.asarray(lengths)
    order = np.lexsort((np.arange(lengths.size), -lengths)).tolist()
    if lengths.size and unit >= float(lengths.sum()):
        return [order]  # what the loop below yields: the first bin holds everything
    values = lengths.tolist()
    groups: list[list[int]] = []
    rooms: list[float] = []  # headroom of the bins that have some, ascending
    ids: list[int] = []      # their bin ids, parallel to rooms
    for i in order:
        s = values[i]
        if s > unit:
            room = math.ceil(s / unit) * unit - s
            b = len(groups)
            groups.append([i])
        else:
            pos = bisect.bisect_left(rooms, s)
            if pos < len(rooms):
                room = rooms.pop(pos) - s
                b = ids.pop(pos)
                groups[b].append(i)
            else:
                room = unit - s
                b = len(groups)
                groups.append([i])
        if room > 0:
            j = bisect.bisect_left(rooms, room)
            rooms.insert(j, room)
            ids.insert(j, b)
    return groups


def lpt_groups(work: np.ndarray, lengths: np.ndarray, num_groups: int, capacity: float) -> list[list[int]] | None:
    """:func:`lpt_labels` as lists of sequence ids (ascending), empty groups dropped; None if it fails."""
    label = lpt_labels(work, lengths, num_groups, capacity)
    if label is None:
        return None
    return labels_to_groups(label, int(num_groups))


def labels_to_groups(label: np.ndarray, num_groups: int) -> list[list[int]]:
    """Group id per sequence -> lists of sequence ids (ascending) per non-empty group, in group-id order."""
    members = np.argsort(label, kind="stable")
    bounds = np.cumsum(np.bincount(label, minlength=num_groups))[:-1]
    return [m.tolist() for m in np.split(members, bounds) if m.size]


def lpt_labels(work: np.ndarray, lengths: np.ndarray, num_groups: int, capacity: float) -> np.ndarray | None:
    """Longest-processing-time packing into ``num_groups`` groups of at most ``capacity`` tokens.

    Sequences are taken heaviest ``work`` first. With fewer than 16 groups each goes to the least loaded
    group that still has room (classic LPT, lowest group id on ties). With 16 or more groups, LPT runs in
    rounds (vectorised): the next ``num_groups`` sequences go, heaviest first, to the groups in ascending
    order of load; a round where some pair breaks the capacity falls back to one-by-one placement.
    Returns the group id of each sequence, or None when some sequence fits nowhere.
    """
    work = np.asarray(work, dtype=np.float64)
    lengths = np.asarray(lengths, dtype=np.float64)
    n, K = work.size, int(num_groups)
    if K == 1:
        return np.zeros(n, dtype=np.int64) if float(lengths.sum()) <= capacity else None
    order = np.lexsort((np.arange(n), -work))
    label = np.empty(n, dtype=np.int64)
    load = np.zeros(K)
    tokens = np.zeros(K)
    if K >= 16:
        free_of_capacity = float(lengths.sum()) <= capacity  # no group can overflow: skip the checks
        for start in range(0, n, K):
            idx = order[start:start + K]
            g = np.argsort(load, kind="stable")[: idx.size]
            if free_of_capacity or np.all(tokens[g] + lengths[idx] <= capacity):
                label[idx] = g
                load[g] += work[idx]
                tokens[g] += lengths[idx]
                continue
            for i in idx.tolist():
                room = tokens + lengths[i] <= capacity
                if not room.any():
                    return None
                gi = int(np.argmin(np.where(room, load, np.inf)))
                label[i] = gi
                load[gi] += work[i]
                tokens[gi] += lengths[i]
    else:
        sub = lpt_heap(work[order], lengths[order], K, capacity)
        if sub is None:
            return None
        label[order] = sub
    return label


def group_aggregates_of(groups: list[list[int]], lengths: np.ndarray, etas: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(S, Q)`` arrays (one entry per group) of §4: ``S = Σ s``, ``Q = Σ (1+η)s²``."""
    s = np.asarray(lengths, dtype=np.float64)
    q = (1.0 + np.asarray(etas, dtype=np.float64)) * s * s
    gid = np.empty(s.size, dtype=np.int64)
    for g, members in enumerate(groups):
        gid[members] = g
    k = len(groups)
    return np.bincount(gid, weights=s, minlength=k), np.bincount(gid, weights=q, minlength=k)


def candidate_units(total_tokens: float, num_ranks: int, tokens_per_rank: int, ratio: float = 4.0) -> list[float]:
    """Bin units tried by the FCP solver: ``tokens_per_rank`` first (the paper's stage 1), then
    ``total / K`` for group counts ``K = N, N/4, N/16, …, 1`` (fine groups for light batches, large
    groups when packing many sequences into one wide ring pays off)."""
    units = [float(tokens_per_rank)]
    k = float(num_ranks)
    while True:
        u = max(total_tokens / k, 1.0)
        if all(abs(u - v) > 1e-3 * v for v in units):
            units.append(u)
        if k <= 1.0:
            break
        k = max(1.0, k / ratio)
    return units


def lpt_heap(work: np.ndarray, tokens: np.ndarray, k: int, capacity: float) -> np.ndarray | None:
    """Exact LPT (items already heaviest first): each goes to the least-loaded group with token room,
    lowest group id on ties; None when an item fits nowhere. O(n log k) with a heap."""
    label = np.empty(work.size, dtype=np.int64)
    heap = [(0.0, g) for g in range(k)]
    if float(tokens.sum()) <= capacity:  # no group can overflow: plain LPT
        for i, w in enumerate(work.tolist()):
            ld, g = heap[0]
            label[i] = g
            heapq.heapreplace(heap, (ld + w, g))
        return label
    tok = [0.0] * k
    for i, (w, s) in enumerate(zip(work.tolist(), tokens.tolist())):
        skipped = []
        while heap and tok[heap[0][1]] + s > capacity:
            skipped.append(heapq.heappop(heap))
        if not heap:
            return None
        ld, g = heapq.heappop(heap)
        label[i] = g
        tok[g] += s
        heapq.heappush(heap, (ld + w, g))
        for item in skipped:
            heapq.heappush(heap, item)
    return label
