"""The LPT packers of :mod:`fcp_data.plan.lpt` as one kernel, compiled by numba when it is installed
(:mod:`fcp_data.jit`).

Each item goes to the group of least load (lowest id on ties) that still holds it — :func:`~fcp_data.plan.lpt.lpt_place`'s
choice, found by a scan of the groups instead of a heap — and a load grows by the same single float add; in
``rounds`` mode (:func:`~fcp_data.plan.lpt.lpt_labels` with 16 or more groups) each round of ``K`` items first tries
the groups in stable ascending order of load, one item each, and falls back to the one-by-one choice when a pair
breaks the capacity, as there. The sums that decide whether capacity can bind are numpy's, made by the caller
(``cap``), so the two paths take the same branches. ``tests/plan/test_lpt_kernel.py`` holds them to the same labels.
"""

from __future__ import annotations

import numpy as np

__all__ = ["lpt_loop", "SIGNATURE"]

# work, sizes, order, K, cap, rounds, label (out), load, tok (in/out) -> 1 when every item was placed, else 0
SIGNATURE = "int64(float64[:], float64[:], int64[:], int64, float64, boolean, int64[:], float64[:], float64[:])"


def lpt_loop(work, sizes, order, K, cap, rounds, label, load, tok):
    """Items ``order[0], order[1], …`` (``work``/``sizes`` indexed by item) into ``K`` groups: ``label[item]`` set,
    ``load``/``tok`` updated; 0 when an item fits nowhere."""
    n = order.size
    start = 0
    while start < n:
        stop = min(n, start + K) if rounds else n
        if rounds:  # the round's items to the groups in stable ascending order of load, if every pair fits
            g = np.argsort(load, kind="mergesort")
            fits = True
            for j in range(stop - start):
                if not tok[g[j]] + sizes[order[start + j]] <= cap:
                    fits = False
                    break
            if fits:
                for j in range(stop - start):
                    i, gj = order[start + j], g[j]
                    label[i] = gj
                    load[gj] += work[i]
                    tok[gj] += sizes[i]
                start = stop
                continue
        for p in range(start, stop):  # one by one: least load with room, lowest id on ties
            i, best = order[p], -1
            for gj in range(K):
                if tok[gj] + sizes[i] <= cap and (best < 0 or load[gj] < load[best]):
                    best = gj
            if best < 0:
                return 0
            label[i] = best
            load[best] += work[i]
            tok[best] += sizes[i]
        start = stop
    return 1
