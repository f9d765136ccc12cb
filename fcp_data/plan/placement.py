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

Best fit decreasing can leave a group that fits in a node straddling two although a packing with every such
group inside one node exists (degrees 6, 6, 6, 5, 4, 4 on nodes of 16 + 15: best fit strands the last 4 across
nodes; 6 + 6 + 4 | 6 + 5 + 4 fits). :func:`pack_in_nodes` searches for a packing with every group of degree
2…``ranks_per_node`` inside one node (depth first over those groups, largest first, best fit first; bounded by
:data:`PACK_MAX_STEPS` and :data:`PACK_MAX_GROUPS`). FCP uses it in two places (:mod:`fcp_data.plan.solvers`): on
its own track ``packed`` (a candidate whose slowest group best fit strands, on its packing) and on every refined
plan (:func:`repack_stranded`, so its plans keep every group that fits in a node inside one whenever the search
finds how, DESIGN §5). A plan can only get faster. Using the packing inside :func:`place_groups` instead, for every
candidate, changed which candidates refinement started from and made some Wikipedia plans slower (one of 40
batches on 64 ranks by 1.2 %).
"""

from __future__ import annotations

import functools
import heapq

import numpy as np

from fcp_data import jit
from fcp_data.cost import CostModel
from fcp_data.plan.place_kernel import SIGNATURE, place_loop

__all__ = ["place_groups", "pack_in_nodes", "packed_placement", "repack_stranded", "place_for_times", "placed_times",
           "intra_flags", "build_micro_batch", "PACK_MAX_STEPS", "PACK_MAX_GROUPS", "PLACE_JIT_MIN_GROUPS"]

# node trials of the in-node packing search (:func:`pack_in_nodes`) per placement: on the planner digest, 512 x 64
# Wikipedia batches and 42 tight 2-64-rank instances (725 searches) every packing found took <= 611 trials, and the
# searches without one took a median of 2 (the lost-space bound and the dead-end memo), p90 1380
PACK_MAX_STEPS = 1_000
PACK_MAX_GROUPS = 128  # above this many groups of degree 2…ranks_per_node the search is not tried


place_kernel = jit.kernel(place_loop, SIGNATURE)  # () -> the compiled placement, or None
PLACE_JIT_MIN_GROUPS = 8  # from this many groups the compiled placement runs, once numba is loaded (jit.active())


def place_groups(degrees: list[int] | np.ndarray, num_ranks: int, ranks_per_node: int) -> list[tuple[int, ...]]:
    """Global ranks for each group (same order as ``degrees``); ``Σ degrees ≤ num_ranks`` required. From
    :data:`PLACE_JIT_MIN_GROUPS` groups, once a planner kernel has loaded numba in this process, by the compiled
    loop of :mod:`fcp_data.plan.place_kernel` (the same ranks)."""
    degrees = degrees.tolist() if isinstance(degrees, np.ndarray) and degrees.dtype.kind in "iu" else \
        [int(d) for d in degrees]
    if any(d < 1 for d in degrees):
        raise ValueError(f"degrees must be >= 1, got {degrees}")
    if sum(degrees) > num_ranks:
        raise ValueError(f"degrees sum to {sum(degrees)} but only {num_ranks} ranks exist")
    if len(degrees) >= PLACE_JIT_MIN_GROUPS and jit.active() and (loop := place_kernel()) is not None:
        deg = np.array(degrees, dtype=np.int64)
        start = np.zeros(deg.size + 1, dtype=np.int64)
        np.cumsum(deg, out=start[1:])
        out = np.empty(int(start[-1]), dtype=np.int64)
        loop(deg, int(num_ranks), int(ranks_per_node), out, start)
        flat, bounds = out.tolist(), start.tolist()
        return [tuple(flat[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
    return _place(degrees, int(num_ranks), int(ranks_per_node))


def pack_in_nodes(degrees: list[int] | np.ndarray, num_ranks: int, ranks_per_node: int) -> list[tuple[int, ...]] | None:
    """Global ranks for each group with every group of degree 2…``ranks_per_node`` inside one node, or None when
    the search finds no such packing (module docstring); ``Σ degrees ≤ num_ranks`` required."""
    degrees = [int(d) for d in degrees]
    if any(d < 1 for d in degrees) or sum(degrees) > num_ranks:
        raise ValueError(f"degrees must be >= 1 and sum to at most {num_ranks}, got {degrees}")
    num_ranks, R = int(num_ranks), int(ranks_per_node)
    return _pack(degrees, num_ranks, R, True) or _pack(degrees, num_ranks, R, False)


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


@functools.lru_cache(maxsize=1024)  # tracks and refined plans often repeat one degree multiset
def _fit_rigid(sizes: tuple[int, ...], free: tuple[int, ...]) -> tuple[int, ...] | None:
    """Node of each item (``sizes`` in non-increasing order) such that every node's items fit its ``free`` ranks,
    or None (none exists, or :data:`PACK_MAX_STEPS` node trials ran out). Depth first, best fit first; nodes with
    equal free space are interchangeable, so one of each is tried per item, and a dead end is remembered by its
    multiset of free counts (which nodes hold which count does not matter)."""
    where, steps = [0] * len(sizes), 0
    tails = np.cumsum(sizes[::-1])[::-1].tolist() + [0]  # Σ sizes[i:]
    free = list(free)
    dead: set[tuple[int, ...]] = set()

    def fill(i: int) -> bool:
        nonlocal steps
        if i == len(sizes):
            return True
        if tails[i] > sum(f for f in free if f >= sizes[-1]):  # space no remaining group fits in is lost
            return False
        state = (i, *sorted(free))
        if state in dead:
            return False
        first: dict[int, int] = {}  # free count -> lowest node with it (one per count: interchangeable)
        for m, f in enumerate(free):
            if f >= sizes[i] and f not in first:
                first[f] = m
        for f in sorted(first):  # best fit first
            n = first[f]
            steps += 1
            if steps > PACK_MAX_STEPS:
                return False
            free[n] -= sizes[i]
            where[i] = n
            if fill(i + 1):
                return True
            free[n] += sizes[i]
        if steps <= PACK_MAX_STEPS:  # a real dead end, not the step bound
            dead.add(state)
        return False

    return tuple(where) if fill(0) else None


def _pack(degrees: list[int], num_ranks: int, R: int, whole: bool) -> list[tuple[int, ...]] | None:
    """:func:`pack_in_nodes` once: first with ``whole`` (groups larger than a node take whole free nodes, lowest
    ids), then without (they fill whatever the others leave: they cross nodes either way, so their time is the
    same). Then the rigid groups go where :func:`_fit_rigid` puts them, then the rest (what the large groups
    still need, largest first, then degree-1 groups) take the free ranks by :func:`_place`'s rules; within a
    node ranks are taken lowest first, in that order."""
    num_nodes = -(-num_ranks // R)
    free = [min((n + 1) * R, num_ranks) - n * R for n in range(num_nodes)]
    nxt = [n * R for n in range(num_nodes)]
    out: list[list[int]] = [[] for _ in degrees]

    def take(g: int, n: int, k: int) -> None:
        out[g] += range(nxt[n], nxt[n] + k)
        nxt[n] += k
        free[n] -= k

    large = sorted((g for g, d in enumerate(degrees) if d > R), key=lambda g: (-degrees[g], g))
    for g in large if whole else ():
        for _ in range(degrees[g] // R):
            n = next((m for m in range(num_nodes) if free[m] == R), -1)
            if n < 0:
                return None
            take(g, n, R)
    rigid = sorted((g for g, d in enumerate(degrees) if 1 < d <= R), key=lambda g: (-degrees[g], g))
    if len(rigid) > PACK_MAX_GROUPS:
        return None
    where = _fit_rigid(tuple(degrees[g] for g in rigid), tuple(free))
    if where is None:
        return None
    for g, n in zip(rigid, where):
        take(g, n, degrees[g])
    for g in large:
        need = degrees[g] - len(out[g])
        if not need:
            continue
        fits = [m for m in range(num_nodes) if free[m] >= need]
        if fits:  # best fit, lowest node on ties
            take(g, min(fits, key=lambda m: (free[m], m)), need)
            continue
        for m in sorted(range(num_nodes), key=lambda m: (-free[m], m)):
            k = min(need, free[m])
            if k:
                take(g, m, k)
                need -= k
    singles = iter(g for g, d in enumerate(degrees) if d == 1)  # as in _place: nodes by (free count, id)
    for n in sorted((n for n in range(num_nodes) if free[n]), key=lambda n: (free[n], n)):
        for r, g in zip(range(nxt[n], nxt[n] + free[n]), singles):
            out[g].append(r)
    return [tuple(sorted(r)) for r in out]


def intra_flags(ranks: list[tuple[int, ...]], ranks_per_node: int) -> np.ndarray:
    """Per group: do all its ranks lie on one node (``min // R == max // R``)?"""
    R = ranks_per_node
    return np.fromiter((len(r) == 1 or min(r) // R == max(r) // R for r in ranks), dtype=bool, count=len(ranks))


def placed_times(S: np.ndarray, Q: np.ndarray, ranks: list[tuple[int, ...]], cost_model: CostModel,
                 B: np.ndarray | None = None, V: np.ndarray | None = None) -> np.ndarray:
    """§4 time of each group on its real ranks (intra-node only when all its ranks share a node);
    ``B``, ``V``: the groups' §4.1 aggregates (see :meth:`CostModel.time`)."""
    sizes = list(map(len, ranks))
    if 0 in sizes:
        raise ValueError("a CP group needs at least one rank")
    d = np.array(sizes, dtype=np.float64)
    intra = intra_flags(ranks, cost_model.ranks_per_node)
    return np.atleast_1d(cost_model.time(np.asarray(S, dtype=np.float64), np.asarray(Q, dtype=np.float64), d, intra,
                                         B=B, V=V))


def _sub(x, idx):
    return None if x is None else np.asarray(x, dtype=np.float64)[idx]


def place_for_times(S: np.ndarray, Q: np.ndarray, degrees, num_ranks: int, cost_model: CostModel, *,
                    time_fn=None, B=None, V=None) -> list[tuple[int, ...]]:
    """:func:`place_groups`, then the node-crossing rank sets of each degree go to the groups that lose
    least by crossing (see the module docstring). ``time_fn(S, Q, ranks, B, V)`` as in :func:`build_micro_batch`."""
    ranks = place_groups(degrees, num_ranks, cost_model.ranks_per_node)
    intra = intra_flags(ranks, cost_model.ranks_per_node)
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


def packed_placement(ranks: list[tuple[int, ...]], S, Q, num_ranks: int, cost_model: CostModel, B=None, V=None, *,
                     slowest: bool = True, times: np.ndarray | None = None):
    """``(ranks, times)`` of :func:`pack_in_nodes` for the groups placed on ``ranks`` when a group that fits in a
    node crosses nodes there (with ``slowest``: and is the slowest, and the packing lowers the makespan; without:
    and the packing does not raise it); None otherwise. ``times``: :func:`placed_times` on ``ranks``, when the
    caller has them."""
    R = cost_model.ranks_per_node
    stranded = np.fromiter((1 < len(r) <= R and r[0] // R != r[-1] // R for r in ranks), dtype=bool, count=len(ranks))
    if not stranded.any():
        return None
    times = placed_times(S, Q, ranks, cost_model, B, V) if times is None else times
    if slowest and not times[stranded].max() >= times.max():
        return None
    packed = pack_in_nodes([len(r) for r in ranks], num_ranks, R)
    if packed is None:
        return None
    new = placed_times(S, Q, packed, cost_model, B, V)  # (checked: a model whose inter-node bandwidth beats intra-node)
    return (packed, new) if new.max() < times.max() or not slowest and new.max() <= times.max() else None


def repack_stranded(mb, lengths: np.ndarray, etas: np.ndarray, num_ranks: int, cost_model: CostModel, visual=None):
    """``mb`` (a :class:`~fcp_data.plan.types.MicroBatchPlan`), or, when a group that fits in a node crosses nodes,
    its groups and degrees on :func:`pack_in_nodes`'s placement (every such group inside a node, as DESIGN §5
    asks; the makespan drops or stays: checked)."""
    from fcp_data.plan.bfd import group_terms_of
    from fcp_data.plan.types import CPGroup, MicroBatchPlan

    R = cost_model.ranks_per_node
    if not any(1 < len(g.ranks) <= R and g.ranks[0] // R != g.ranks[-1] // R for g in mb.groups):
        return mb  # nothing stranded (what packed_placement checks first; here without computing the aggregates)
    S, Q, B, V = group_terms_of([list(g.seq_ids) for g in mb.groups], lengths, etas, visual)
    alt = packed_placement([g.ranks for g in mb.groups], S, Q, num_ranks, cost_model, B, V, slowest=False)
    if alt is None:
        return mb
    return MicroBatchPlan(groups=tuple(CPGroup(ranks=r, seq_ids=g.seq_ids, time=float(t))
                                       for g, r, t in zip(mb.groups, alt[0], alt[1].tolist())), makespan=float(alt[1].max()))


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
    # placement's ranks are tuples of distinct Python ints, the ids Python ints, the times finite floats
    cp = tuple(CPGroup.prechecked(tuple(r), tuple(g), t)
               for g, r, t in zip(ids, ranks, np.asarray(times, dtype=np.float64).tolist()))
    # placement hands out each free rank once: the groups' ranks are disjoint
    return MicroBatchPlan.prechecked(cp, float(max(times)) if len(cp) else 0.0)
