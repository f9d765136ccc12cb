"""Longest-processing-time packing: heaviest sequence first into the least-loaded group with token room.

Used by the FCP candidates (LPT on work into ``K`` groups), the makespan-driven groupings
(:mod:`fcp_data.plan.tau`), the baselines and the micro-batch split. Four entry points:

* :func:`lpt_place` — the reference: items in the given order, each to the group of least load (lowest id
  on ties) that still holds it; a heap plus *parking* of full groups, O(log k) per item in pure Python.
* :func:`lpt_exact` — the same choices, bit for bit, in numpy: it pairs the next items with the groups in
  load order and keeps the longest prefix for which that pairing provably *is* the one-by-one choice (every
  group that took an earlier item of the block is now heavier than the group paired with the next one, and
  that group has room), then continues from there; blocks that keep diverging go to :func:`lpt_place`. On
  40k sequences into 1000 groups: 3 ms instead of 23 ms.
* :func:`lpt_heap` — classic LPT of items already sorted heaviest first (:func:`lpt_exact` from empty groups).
* :func:`lpt_labels` / :func:`lpt_groups` — LPT from unsorted work; with 16 or more groups in rounds
  (see there).

All are deterministic (stable sorts, id tie-breaks): every rank computes the same packing.
"""

from __future__ import annotations

import bisect
import heapq

import numpy as np

from fcp_data.jit import active as jit_active
from fcp_data.jit import kernel
from fcp_data.plan.lpt_kernel import SIGNATURE, lpt_loop

__all__ = ["lpt_groups", "lpt_labels", "lpt_heap", "lpt_exact", "lpt_place", "labels_to_groups", "stable_order", "JIT_MIN_WORK",
           "JIT_ACTIVE_MIN_WORK", "JIT_MAX_GROUPS"]

# items × groups from which lpt_labels / lpt_heap run the compiled loop (fcp_data.plan.lpt_kernel) when numba is
# installed: below it the numpy path is fast enough, and a small plan never pays numba's import. Above
# JIT_MAX_GROUPS the kernel's O(groups) scan per item loses to the heap of lpt_place / the blocks of lpt_exact.
# Once a kernel has loaded numba in the process (jit.active()), from JIT_ACTIVE_MIN_WORK: the few-group packings
# of a large micro-batch (512 sequences into 2 groups: 0.2 ms by the heap) then cost no import.
JIT_MIN_WORK = 2048
JIT_ACTIVE_MIN_WORK = 256
JIT_MAX_GROUPS = 256
_compiled_loop = kernel(lpt_loop, SIGNATURE)


def _kernel(n: int, k: int):
    """The compiled LPT loop for ``n`` items into ``k`` groups, or None (small, too many groups, no numba, or
    ``FCP_JIT=0``)."""
    if k > JIT_MAX_GROUPS or n * k < (JIT_ACTIVE_MIN_WORK if jit_active() else JIT_MIN_WORK):
        return None
    return _compiled_loop()


def _run_kernel(loop, work, sizes, order, k: int, cap: float, rounds: bool) -> np.ndarray | None:
    """The labels the compiled loop gives from empty groups, or None when an item fits nowhere."""
    label = np.empty(work.size, dtype=np.int64)
    ok = loop(work, sizes, order, int(k), float(cap), rounds, label, np.zeros(int(k)), np.zeros(int(k)))
    return label if ok else None

_MIN_VECTOR_GROUPS = 32  # below this a numpy block costs more than the heap steps it saves
_MIN_PREFIX = 16         # a verified prefix shorter than this: the next block goes through the heap


def lpt_groups(work: np.ndarray, lengths: np.ndarray, num_groups: int, capacity: float) -> list[list[int]] | None:
    """:func:`lpt_labels` as lists of sequence ids (ascending), empty groups dropped; None if it fails."""
    label = lpt_labels(work, lengths, num_groups, capacity)
    if label is None:
        return None
    return labels_to_groups(label, int(num_groups))


def stable_order(label: np.ndarray, num_groups: int) -> np.ndarray:
    """``np.argsort(label, kind="stable")`` for group ids ``0 ≤ label < num_groups``: the same permutation (a stable
    sort has one answer), by numpy's radix sort on 16-bit keys when the ids fit (2-4× faster than its merge sort
    of int64 keys at 500-4,000 sequences)."""
    if num_groups <= 1 << 16:
        label = label.astype(np.uint16)
    return np.argsort(label, kind="stable")


def labels_to_groups(label: np.ndarray, num_groups: int, ids: np.ndarray | None = None, *, gid: bool = False):
    """Group id per sequence -> lists of sequence ids (ascending) per non-empty group, in group-id order; with
    ``ids``, each sequence ``i`` is listed as ``ids[i]`` (same order). ``gid=True``: ``(lists, gid)`` with ``gid[i]``
    the position of sequence ``i``'s list (the labels renumbered over the non-empty groups: what
    :func:`~fcp_data.plan.bfd.group_terms_of` would build from the lists)."""
    members = stable_order(label, num_groups)
    members = (members if ids is None else ids[members]).tolist()
    counts = np.bincount(label, minlength=num_groups)
    bounds = [0] + np.cumsum(counts).tolist()
    groups = [members[a:b] for a, b in zip(bounds[:-1], bounds[1:]) if b > a]  # list slices: no np.split overhead
    if not gid:
        return groups
    dense = np.cumsum(counts > 0) - 1
    return groups, dense[label]


def lpt_labels(work: np.ndarray, lengths: np.ndarray, num_groups: int, capacity: float, *,
               presorted: bool = False) -> np.ndarray | None:
    """Longest-processing-time packing into ``num_groups`` groups of at most ``capacity`` tokens.

    Sequences are taken heaviest ``work`` first. With fewer than 16 groups each goes to the least loaded
    group that still has room (classic LPT, lowest group id on ties). With 16 or more groups, LPT runs in
    rounds (vectorised): the next ``num_groups`` sequences go, heaviest first, to the groups in ascending
    order of load; a round where some pair breaks the capacity is placed one by one instead
    (:func:`lpt_exact`, the same choices as :func:`lpt_place`).
    Returns the group id of each sequence, or None when some sequence fits nowhere. ``presorted``: the items are
    already heaviest first with index order on ties (the order the sort below would give; it is skipped).
    """
    work = np.asarray(work, dtype=np.float64)
    lengths = np.asarray(lengths, dtype=np.float64)
    n, K = work.size, int(num_groups)
    if K == 1:
        return np.zeros(n, dtype=np.int64) if float(lengths.sum()) <= capacity else None
    order = np.arange(n) if presorted else np.lexsort((np.arange(n), -work))
    loop = _kernel(n, K) if K >= 16 else None  # (below 16 groups lpt_heap runs it)
    if loop is not None:  # the same labels (fcp_data.plan.lpt_kernel); numpy decides whether capacity can bind
        return _run_kernel(loop, work, lengths, order, K, np.inf if float(lengths.sum()) <= capacity else capacity, True)
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
            sub = lpt_exact(work[idx], lengths[idx], load, tokens, capacity)  # updates load, tokens
            if sub is None:
                return None
            label[idx] = sub
    else:
        sub = lpt_heap(work[order], lengths[order], K, capacity)
        if sub is None:
            return None
        label[order] = sub
    return label


def lpt_heap(work: np.ndarray, tokens: np.ndarray, k: int, capacity: float) -> np.ndarray | None:
    """Exact LPT (items already heaviest first): each goes to the least-loaded group with token room,
    lowest group id on ties; None when an item fits nowhere."""
    cap = float(capacity) if float(np.sum(tokens)) > capacity else np.inf  # no group can overflow: no checks
    loop = _kernel(np.size(work), int(k))
    if loop is not None:  # the same labels (fcp_data.plan.lpt_kernel)
        w, t = np.asarray(work, dtype=np.float64), np.asarray(tokens, dtype=np.float64)
        return _run_kernel(loop, w, t, np.arange(w.size), k, cap, False)
    return lpt_exact(np.asarray(work, dtype=np.float64), np.asarray(tokens, dtype=np.float64),
                     np.zeros(int(k)), np.zeros(int(k)), cap)


def lpt_exact(work: np.ndarray, sizes: np.ndarray, load: np.ndarray, tok: np.ndarray,
              capacity: float) -> np.ndarray | None:
    """:func:`lpt_place` on numpy arrays, vectorised over blocks (see the module docstring); ``load`` and
    ``tok`` (float64, one entry per group) are updated in place. Returns the group of each item, or None."""
    m_all, K = int(work.size), int(load.size)
    if K < _MIN_VECTOR_GROUPS:
        ld, tk = load.tolist(), tok.tolist()
        sub = lpt_place(work.tolist(), sizes.tolist(), ld, tk, capacity)
        load[:], tok[:] = ld, tk
        return None if sub is None else np.asarray(sub, dtype=np.int64)
    out = np.empty(m_all, dtype=np.int64)
    ids = np.arange(K)
    p = 0
    while p < m_all:
        m = min(K, m_all - p)
        w, s = work[p:p + m], sizes[p:p + m]
        g = np.lexsort((ids, load))[:m]  # groups by (load, id): what a heap would pop
        lg = load[g]
        u = lg + w  # the paired group's load after taking its item (the same float add as the heap)
        # item j goes to g[j] one by one iff g[j] has room and no group that took an earlier item of this
        # block is lighter than g[j] now (groups after g[j] in load order are heavier anyway)
        before = np.minimum.accumulate(np.concatenate(([np.inf], u[:-1])))
        good = (tok[g] + s <= capacity) & (before > lg)
        P = m if good.all() else int(np.argmin(good))
        if P:
            out[p:p + P] = g[:P]
            load[g[:P]] = u[:P]
            tok[g[:P]] += s[:P]
            p += P
        if P < _MIN_PREFIX and p < m_all:  # the pairing keeps diverging here: one block by the heap
            q = min(m_all, p + K)
            ld, tk = load.tolist(), tok.tolist()
            sub = lpt_place(work[p:q].tolist(), sizes[p:q].tolist(), ld, tk, capacity)
            if sub is None:
                return None
            out[p:q] = sub
            load[:], tok[:] = ld, tk
            p = q
    return out


def lpt_place(work: list, sizes: list, load: list, tok: list, capacity: float) -> list[int] | None:
    """Items in the given order, each to the group of least ``load`` (lowest id on ties) whose ``tok``
    still holds it (``tok + size ≤ capacity``); ``load``/``tok`` (one entry per group) are updated in
    place. Returns the group of each item, or None when one fits nowhere.

    A heap on ``(load, id)`` holds the groups that may take the next item; a group found full at the top
    is *parked* (sorted by tokens) and comes back only when an item small enough for it arrives. So a
    full group costs O(log k) once per park instead of a pop and push for every later item — with
    nearly full groups (a micro-batch close to ``N·E``) the plain skip-and-push-back loop was
    O(n·k). The choice is exactly the plain one: every group that holds the item is in the heap."""
    heap = [(load[g], g) for g in range(len(load))]
    heapq.heapify(heap)
    parked: list[tuple[float, int]] = []  # (-tokens, id): the emptiest group last
    out: list[int] = []
    push, pop, replace, insort, take = heapq.heappush, heapq.heappop, heapq.heapreplace, bisect.insort, out.append
    for w, s in zip(work, sizes):
        while parked and s - parked[-1][0] <= capacity:  # tok + s ≤ capacity, tok = -key
            g = parked.pop()[1]
            push(heap, (load[g], g))
        while heap and tok[heap[0][1]] + s > capacity:
            g = pop(heap)[1]
            insort(parked, (-tok[g], g))
        if not heap:
            return None
        ld, g = heap[0]
        ld += w
        load[g] = ld
        tok[g] += s
        replace(heap, (ld, g))
        take(g)
    return out
