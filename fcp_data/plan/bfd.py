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
import itertools
import math

import numpy as np

from fcp_data.cost import sequence_terms
from fcp_data.plan.bfd_kernel import SIGNATURE, bfd_loop
from fcp_data.jit import kernel

# the LPT packers used to live here; re-exported for callers that import them from this module
from fcp_data.plan.lpt import labels_to_groups, lpt_exact, lpt_groups, lpt_heap, lpt_labels, lpt_place, stable_order

__all__ = ["bfd_groups", "group_aggregates_of", "group_terms_of", "candidate_units", "lpt_groups", "lpt_labels", "lpt_heap", "lpt_place",
           "lpt_exact", "labels_to_groups"]


# sequences from which bfd_groups runs the compiled loop (fcp_data.plan.bfd_kernel) when numba is installed
JIT_MIN_SEQUENCES = 256
_compiled_loop = kernel(bfd_loop, SIGNATURE)


def bfd_groups(lengths: np.ndarray, unit: float) -> list[list[int]]:
    """Best-fit-decreasing bins of ``lengths`` with bin unit ``unit``; returns lists of sequence ids.

    Groups come out in the order they were opened (so the first group holds the longest sequence).
    Integer lengths are placed a run of equal lengths at a time: best fit sends the next equal sequence to
    the same bin for as long as it holds one more (its room stays the smallest that does), so a run costs
    one search per bin it touches instead of one per sequence — same bins, O(distinct lengths · log)
    instead of O(n) Python steps on long batches.
    """
    if unit <= 0:
        raise ValueError(f"bin unit must be > 0, got {unit}")
    lengths = np.asarray(lengths)
    order_arr = np.lexsort((np.arange(lengths.size), -lengths))
    if lengths.size and unit >= float(lengths.sum()):
        return [order_arr.tolist()]  # what the loop below yields: the first bin holds everything
    loop = _compiled_loop() if lengths.size >= JIT_MIN_SEQUENCES else None
    if loop is not None:  # the same bins (fcp_data.plan.bfd_kernel)
        return _kernel_bins(loop, lengths, order_arr, unit)
    order = order_arr.tolist()
    values = lengths.tolist()
    n = len(order)
    run_end = _run_ends(lengths, order_arr)
    groups: list[list[int]] = []
    rooms: list[float] = []  # headroom of the bins that have some, ascending
    ids: list[int] = []      # their bin ids, parallel to rooms
    bisect_left = bisect.bisect_left
    p = 0
    while p < n:
        i = order[p]
        s = values[i]
        if s > unit:
            room = math.ceil(s / unit) * unit - s
            b = len(groups)
            groups.append([i])
            p += 1
        else:
            pos = bisect_left(rooms, s)
            if pos < len(rooms):
                r, b = rooms.pop(pos), ids.pop(pos)
                end = p + 1 if run_end is None else run_end[p]
                if end == p + 1:  # a run of one (r >= s): what _run_take gives, without the call
                    groups[b].append(i)
                    room = r - s
                    p += 1
                else:
                    k = _run_take(r, s, p, end)
                    groups[b].extend(order[p:p + k])
                    room = r - k * s
                    p += k
            else:
                room = unit - s
                b = len(groups)
                groups.append([i])
                p += 1
        if room > 0:
            j = bisect_left(rooms, room)
            rooms.insert(j, room)
            ids.insert(j, b)
    return groups


def _kernel_bins(loop, lengths: np.ndarray, order_arr: np.ndarray, unit: float) -> list[list[int]]:
    """:func:`bfd_groups` by the compiled loop: the bin of each sequence, then the bins' lists in visiting order
    (every bin the loop opens holds a sequence)."""
    bin_of = np.empty(lengths.size, dtype=np.int64)
    count = loop(lengths[order_arr].astype(np.float64), float(unit), bin_of)
    by_bin = order_arr[stable_order(bin_of, count)].tolist()  # visiting order kept inside each bin
    ends = np.cumsum(np.bincount(bin_of, minlength=count)).tolist()
    return [by_bin[a:b] for a, b in zip([0] + ends[:-1], ends)]


def _run_ends(lengths: np.ndarray, order: np.ndarray) -> list[int] | None:
    """Per position of ``order`` (lengths descending), where its run of equal lengths ends; None for float
    lengths (``r - k·s`` may round differently from ``k`` subtractions: one at a time)."""
    n = order.size
    if not (np.issubdtype(lengths.dtype, np.integer) and n):
        return None
    starts = np.flatnonzero(np.diff(lengths[order])) + 1
    return np.repeat(np.append(starts, n), np.diff(np.concatenate(([0], starts, [n])))).tolist()


def _run_take(r: float, s: float, p: int, end: int) -> int:
    """How many of the equal sequences ``p … end−1`` (``s`` tokens each) a bin with room ``r`` takes: as many as
    fit, at least one (best fit keeps sending them there while one more fits)."""
    k = min(end - p, int(r // s))
    while k > 1 and r - (k - 1) * s < s:  # exact integer-step arithmetic, float-safe
        k -= 1
    while p + k < end and r - k * s >= s:
        k += 1
    return max(k, 1)


def group_aggregates_of(groups: list[list[int]], lengths: np.ndarray, etas: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(S, Q)`` arrays (one entry per group) of §4: ``S = Σ s``, ``Q = Σ (1+η)s²``."""
    s = np.asarray(lengths, dtype=np.float64)
    q = (1.0 + np.asarray(etas, dtype=np.float64)) * s * s
    gid = np.empty(s.size, dtype=np.int64)
    for g, members in enumerate(groups):
        gid[members] = g
    k = len(groups)
    return np.bincount(gid, weights=s, minlength=k), np.bincount(gid, weights=q, minlength=k)


def group_terms_of(groups: list[list[int]], lengths: np.ndarray, etas: np.ndarray, visual: np.ndarray | None = None,
                   *, terms=None, gid: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """``(S, Q, B, V)`` arrays (one entry per group) of §4/§4.1: ``B = Σ (1+η)s``, ``V = Σ v`` (None
    when ``visual`` is None). ``terms``: ``sequence_terms(lengths, etas, visual)`` when the caller has it; ``gid``:
    the position in ``groups`` of each sequence's group, when the caller has it (:func:`labels_to_groups` with
    ``gid=True``; every sequence in a group)."""
    s, q, b, v = sequence_terms(lengths, etas, visual) if terms is None else terms
    k = len(groups)
    if gid is None:
        gid = np.empty(s.size, dtype=np.int64)
        sizes = [len(members) for members in groups]
        flat = np.fromiter(itertools.chain.from_iterable(groups), dtype=np.int64, count=sum(sizes))
        gid[flat] = np.repeat(np.arange(k), sizes)  # one scatter instead of one per group (groups are disjoint)
    sums = [np.bincount(gid, weights=x, minlength=k) for x in (s, q, b)]
    return sums[0], sums[1], sums[2], None if visual is None else np.bincount(gid, weights=v, minlength=k)


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
