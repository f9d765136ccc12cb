"""Placement: map group degrees to concrete global ranks, node-aware (DESIGN §5).

Nodes hold ``ranks_per_node`` consecutive ranks (node of a rank = ``rank // ranks_per_node``; the last
node may be partial). Groups are placed largest first:

* a group of at most one node goes to the node with the fewest free ranks that still holds it whole
  (best fit, lowest node id on ties), taking that node's lowest free ranks;
* a larger group takes whole free nodes first, then places its remainder like a small group;
* only when no node can hold a (remainder of a) group is it spread over the nodes with most free ranks.

Ranks of a group are returned in ring order (ascending). The times a solver reports are recomputed
from these ranks (:func:`placed_times`), so a group that had to cross nodes is charged the inter-node
bandwidth.

:func:`place_for_times` then decides *which* groups of one degree get the rank sets that cross nodes:
every group is at least as slow across nodes as inside one, so the makespan of a degree class is
``max(max intra time, k-th smallest inter time)`` for ``k`` crossing sets — reached by giving the
crossing sets to the ``k`` groups that are fastest across nodes (exact, ties by group order).
"""

from __future__ import annotations

import heapq

import numpy as np

from fcp_data.cost import CostModel

__all__ = ["place_groups", "place_for_times", "placed_times", "build_micro_batch"]


def place_groups(degrees: list[int] | np.ndarray, num_ranks: int, ranks_per_node: int) -> list[tuple[int, ...]]:
    """Global ranks for each group (same order as ``degrees``); ``Σ degrees ≤ num_ranks`` required."""
    degrees = [int(d) for d in degrees]
    if any(d < 1 for d in degrees):
        raise ValueError(f"degrees must be >= 1, got {degrees}")
    if sum(degrees) > num_ranks:
        raise ValueError(f"degrees sum to {sum(degrees)} but only {num_ranks} ranks exist")
    return _place(degrees, int(num_ranks), int(ranks_per_node))


def _place(degrees: list[int], num_ranks: int, R: int) -> list[tuple[int, ...]]:
    """:func:`place_groups` without the input checks. A node's free ranks are always a suffix of its
    range (groups take the lowest free ones), so a node is ``(next free rank, end)``; nodes are kept in
    one min-heap of ids per free count (stale entries skipped), which makes the best fit O(R) per group.
    Once only degree-1 groups are left, best fit drains the nodes in (free count, id) order: one pass."""
    num_nodes = -(-num_ranks // R)
    nxt = [n * R for n in range(num_nodes)]
    end = [min((n + 1) * R, num_ranks) for n in range(num_nodes)]
    count = [e - s for s, e in zip(nxt, end)]
    top = min(R, num_ranks)  # no node has more free ranks than this
    buckets: list[list[int]] = [[] for _ in range(top + 1)]
    for n in range(num_nodes):
        buckets[count[n]].append(n)  # ascending ids: already a heap

    def lowest(c: int) -> int:
        if c > top:
            return -1
        h = buckets[c]
        while h and count[h[0]] != c:
            heapq.heappop(h)
        return h[0] if h else -1

    def take(n: int, k: int) -> range:
        got = range(nxt[n], nxt[n] + k)
        nxt[n] += k
        count[n] -= k
        heapq.heappush(buckets[count[n]], n)
        return got

    out: list[tuple[int, ...] | None] = [None] * len(degrees)
    order = sorted(range(len(degrees)), key=lambda g: (-degrees[g], g))
    for pos, g in enumerate(order):
        need = degrees[g]
        if need == 1:  # the rest are degree 1: fill nodes by (free count, id), each from its lowest rank
            free = [r for n in sorted((n for n in range(num_nodes) if count[n]), key=lambda n: (count[n], n))
                    for r in range(nxt[n], end[n])]
            for r, h in zip(free, order[pos:]):
                out[h] = (r,)
            break
        parts: list[range] = []
        while need >= R and need > 0:  # whole free nodes, lowest first (only when the group is larger than a node)
            n = lowest(R) if degrees[g] > R else -1
            if n < 0:
                break
            parts.append(take(n, R))
            need -= R
        if need > 0:
            n = next((m for m in (lowest(c) for c in range(need, top + 1)) if m >= 0), -1)
            if n >= 0:  # best fit: fewest free ranks that still hold it, lowest node on ties
                parts.append(take(n, need))
            else:  # spread over the nodes with most free ranks
                for m in sorted(range(num_nodes), key=lambda m: (-count[m], m)):
                    k = min(need, count[m])
                    if k:
                        parts.append(take(m, k))
                        need -= k
                    if need == 0:
                        break
        out[g] = tuple(parts[0]) if len(parts) == 1 else tuple(sorted(r for p in parts for r in p))
    return out  # type: ignore[return-value]


def _intra(ranks: list[tuple[int, ...]], ranks_per_node: int) -> np.ndarray:
    """Per group: do all its ranks lie on one node (``min // R == max // R``)?"""
    R = ranks_per_node
    return np.fromiter((len(r) == 1 or min(r) // R == max(r) // R for r in ranks), dtype=bool, count=len(ranks))


def placed_times(S: np.ndarray, Q: np.ndarray, ranks: list[tuple[int, ...]], cost_model: CostModel,
                 B: np.ndarray | None = None, V: np.ndarray | None = None) -> np.ndarray:
    """§4 time of each group on its real ranks (intra-node only when all its ranks share a node);
    ``B``, ``V``: the groups' §4.1 aggregates (see :meth:`CostModel.time`)."""
    if any(len(r) == 0 for r in ranks):
        raise ValueError("a CP group needs at least one rank")
    d = np.fromiter(map(len, ranks), dtype=np.float64, count=len(ranks))
    intra = _intra(ranks, cost_model.ranks_per_node)
    return np.atleast_1d(cost_model.time(np.asarray(S, dtype=np.float64), np.asarray(Q, dtype=np.float64), d, intra,
                                         B=B, V=V))


def _sub(x, idx):
    return None if x is None else np.asarray(x, dtype=np.float64)[idx]


def place_for_times(S: np.ndarray, Q: np.ndarray, degrees, num_ranks: int, cost_model: CostModel, *,
                    time_fn=None, B=None, V=None) -> list[tuple[int, ...]]:
    """:func:`place_groups`, then the node-crossing rank sets of each degree go to the groups that lose
    least by crossing (see the module docstring). ``time_fn(S, Q, ranks, B, V)`` as in :func:`build_micro_batch`."""
    ranks = place_groups(degrees, num_ranks, cost_model.ranks_per_node)
    intra = _intra(ranks, cost_model.ranks_per_node)
    if intra.all():
        return ranks
    time_fn = time_fn or (lambda s, q, r, b, v: placed_times(s, q, r, cost_model, b, v))
    S = np.asarray(S, dtype=np.float64)
    Q = np.asarray(Q, dtype=np.float64)
    deg = np.fromiter(map(len, ranks), dtype=np.int64, count=len(ranks))
    for d in np.unique(deg[~intra]).tolist():  # only degrees with a crossing set can swap
        members = np.flatnonzero(deg == d)
        inside = intra[members]
        if not inside.any():
            continue
        sets_in = [ranks[g] for g in members[inside].tolist()]
        sets_out = [ranks[g] for g in members[~inside].tolist()]
        t_out = np.asarray(time_fn(S[members], Q[members], [sets_out[0]] * len(members),
                                   _sub(B, members), _sub(V, members)), dtype=np.float64)
        cross = np.zeros(len(members), dtype=bool)
        cross[np.lexsort((np.arange(len(members)), t_out))[: len(sets_out)]] = True
        it_in, it_out = iter(sets_in), iter(sets_out)
        for j, g in enumerate(members.tolist()):
            ranks[g] = next(it_out) if cross[j] else next(it_in)
    return ranks


def build_micro_batch(groups: list[list[int]], degrees, S: np.ndarray, Q: np.ndarray, num_ranks: int,
                      cost_model: CostModel, *, time_fn=None, B=None, V=None, ranks=None):
    """Place ``groups`` with ``degrees`` and return the :class:`MicroBatchPlan` with real-placement times.

    ``B``, ``V``: the groups' §4.1 aggregates. ``time_fn(S, Q, ranks, B, V) -> times`` replaces the §4
    ring formula (the Ulysses baseline uses it). ``ranks``: what :func:`place_for_times` returned for these
    arguments, when the caller has it already (it is not recomputed).
    """
    from fcp_data.plan.types import CPGroup, MicroBatchPlan

    if ranks is None:
        ranks = place_for_times(S, Q, degrees, num_ranks, cost_model, time_fn=time_fn, B=B, V=V)
    times = (time_fn or (lambda s, q, r, b, v: placed_times(s, q, r, cost_model, b, v)))(S, Q, ranks, B, V)
    ids = [np.asarray(g, dtype=np.int64).tolist() if not isinstance(g, list) or g and type(g[0]) is not int else g
           for g in groups]  # Python ints: CPGroup takes them without a per-item conversion
    cp = tuple(CPGroup(ranks=r, seq_ids=tuple(g), time=t) for g, r, t in zip(ids, ranks, np.asarray(times, dtype=np.float64).tolist()))
    return MicroBatchPlan(groups=cp, makespan=float(max(times)) if len(cp) else 0.0)
