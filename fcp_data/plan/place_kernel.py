"""Rank placement (:func:`fcp_data.plan.placement.place_groups`) as one kernel, compiled by numba when it is
installed (:mod:`fcp_data.jit`).

The same ranks: groups in descending degree (index order on ties, a stable sort); a group larger than a node first
takes whole free nodes, lowest id first; the rest goes to the best-fit node (fewest free ranks that still hold it,
lowest id on ties) or, when no node holds it, is spread over the nodes with the most free ranks (that order taken
once, lowest id on ties); a node's free ranks are always a suffix of its range and a group takes the lowest of
them; once only degree-1 groups are left, the nodes are drained in (free ranks, id) order. The numpy path keeps
one heap of node ids per free count for the best fit; a scan over the nodes finds the same node (counts only fall,
so a node never returns to a count it left). Each group's ranks come out ascending, as the numpy path sorts a
group of several parts. ``tests/plan/test_place_kernel.py`` holds the two paths to the same ranks.
"""

from __future__ import annotations

import numpy as np

__all__ = ["place_loop", "SIGNATURE"]

# degrees (per group), num_ranks, ranks_per_node, ranks (out, flat), start (group g's ranks at start[g]:start[g+1])
SIGNATURE = "void(int64[:], int64, int64, int64[:], int64[:])"


def place_loop(degrees, num_ranks, R, out, start):
    """Write each group's ranks, ascending, into ``out[start[g]:start[g + 1]]`` (``Σ degrees ≤ num_ranks``)."""
    K = degrees.size
    num_nodes = (num_ranks + R - 1) // R
    nxt = np.empty(num_nodes, dtype=np.int64)
    end = np.empty(num_nodes, dtype=np.int64)
    count = np.empty(num_nodes, dtype=np.int64)
    for n in range(num_nodes):
        nxt[n] = n * R
        end[n] = min((n + 1) * R, num_ranks)
        count[n] = end[n] - nxt[n]
    order = np.argsort(-degrees, kind="mergesort")  # stable: (−degree, index)
    for pos in range(K):
        g = order[pos]
        need = degrees[g]
        if need == 1:  # drain the nodes in (free count, id) order into the degree-1 groups left
            key = np.empty(num_nodes, dtype=np.int64)
            for n in range(num_nodes):
                key[n] = count[n] * num_nodes + n
            h = pos
            for n in np.argsort(key):
                for r in range(nxt[n], end[n]):
                    if h < K:
                        out[start[order[h]]] = r
                        h += 1
            return
        w = start[g]
        parts = 0
        if degrees[g] > R:  # whole free nodes, lowest first
            while need >= R:
                n = -1
                for m in range(num_nodes):
                    if count[m] == R:
                        n = m
                        break
                if n < 0:
                    break
                for r in range(nxt[n], nxt[n] + R):
                    out[w] = r
                    w += 1
                nxt[n] += R
                count[n] -= R
                need -= R
                parts += 1
        if need > 0:
            n = -1
            for m in range(num_nodes):  # best fit: fewest free ranks that hold it, lowest id on ties
                if count[m] >= need and (n < 0 or count[m] < count[n]):
                    n = m
            if n >= 0:
                for r in range(nxt[n], nxt[n] + need):
                    out[w] = r
                    w += 1
                nxt[n] += need
                count[n] -= need
                parts += 1
            else:  # spread over the nodes with most free ranks (that order, taken once)
                key = np.empty(num_nodes, dtype=np.int64)
                for m in range(num_nodes):
                    key[m] = (R - count[m]) * num_nodes + m
                for m in np.argsort(key):
                    k = min(need, count[m])
                    for r in range(nxt[m], nxt[m] + k):
                        out[w] = r
                        w += 1
                    nxt[m] += k
                    count[m] -= k
                    need -= k
                    parts += 1
                    if need == 0:
                        break
        if parts > 1:  # one part is ascending already
            out[start[g]: start[g + 1]].sort()
