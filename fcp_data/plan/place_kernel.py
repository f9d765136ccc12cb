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
    nxt = np.arange(num_nodes) * R  # a node's free ranks: nxt[n] .. its end
    count = np.minimum(nxt + R, num_ranks) - nxt
    part_node = np.empty(num_nodes, dtype=np.int64)  # this group's parts: node and ranks taken there
    part_size = np.empty_like(part_node)
    key = np.empty_like(part_node)
    order = np.argsort(-degrees, kind="mergesort")  # stable: (−degree, index)
    for pos in range(K):
        g = order[pos]
        need, parts = degrees[g], 0
        if need == 1:  # drain the nodes in (free count, id) order into the degree-1 groups left
            for n in range(num_nodes):
                key[n] = count[n] * num_nodes + n
            h = pos
            for n in np.argsort(key):
                for r in range(nxt[n], nxt[n] + count[n]):
                    if h < K:
                        out[start[order[h]]] = r
                        h += 1
            return
        while degrees[g] > R and need >= R:  # whole free nodes, lowest first
            n = 0
            while n < num_nodes and count[n] != R:  # the lowest fully free node (a scan: no temporary per node)
                n += 1
            if n == num_nodes:
                break
            part_node[parts], part_size[parts], parts = n, R, parts + 1
            count[n] -= R
            need -= R
        if need > 0:
            n = -1
            for m in range(num_nodes):  # best fit: fewest free ranks that hold it, lowest id on ties
                if count[m] >= need and (n < 0 or count[m] < count[n]):
                    n = m
            if n >= 0:
                part_node[parts], part_size[parts], parts = n, need, parts + 1
                count[n] -= need
            else:  # spread over the nodes with most free ranks (that order, taken once)
                for m in range(num_nodes):
                    key[m] = (R - count[m]) * num_nodes + m
                for m in np.argsort(key):
                    k = min(need, count[m])
                    if k > 0:
                        part_node[parts], part_size[parts], parts = m, k, parts + 1
                        count[m] -= k
                        need -= k
                    if need == 0:
                        break
        w = start[g]
        for p in range(parts):  # a node is in at most one part of a group: its lowest free ranks
            n = part_node[p]
            for r in range(nxt[n], nxt[n] + part_size[p]):
                out[w] = r
                w += 1
            nxt[n] += part_size[p]
        if parts > 1:  # one part is ascending already
            out[start[g]: start[g + 1]].sort()
