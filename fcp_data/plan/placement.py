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
    R = int(ranks_per_node)
    num_nodes = -(-num_ranks // R)
    free: list[list[int]] = [list(range(n * R, min((n + 1) * R, num_ranks))) for n in range(num_nodes)]
    out: list[tuple[int, ...] | None] = [None] * len(degrees)
    order = sorted(range(len(degrees)), key=lambda g: (-degrees[g], g))

    count = np.array([len(f) for f in free], dtype=np.int64)  # free ranks per node

    def take(node: int, k: int) -> list[int]:
        got, free[node] = free[node][:k], free[node][k:]
        count[node] -= len(got)
        return got

    for g in order:
        need = degrees[g]
        ranks: list[int] = []
        if need > R:
            for n in np.flatnonzero(count == R).tolist():  # whole free nodes, lowest first
                if need < R:
                    break
                ranks += take(n, R)
                need -= R
        if need > 0:
            fits = np.flatnonzero(count >= need)
            if fits.size:  # best fit: fewest free ranks that still hold it, lowest node on ties
                ranks += take(int(fits[np.argmin(count[fits])]), need)
            else:  # spread over the nodes with most free ranks
                for n in np.lexsort((np.arange(num_nodes), -count)).tolist():
                    k = min(need, int(count[n]))
                    ranks += take(n, k)
                    need -= k
                    if need == 0:
                        break
        out[g] = tuple(sorted(ranks))
    return out  # type: ignore[return-value]


def placed_times(S: np.ndarray, Q: np.ndarray, ranks: list[tuple[int, ...]], cost_model: CostModel,
                 B: np.ndarray | None = None, V: np.ndarray | None = None) -> np.ndarray:
    """§4 time of each group on its real ranks (intra-node only when all its ranks share a node);
    ``B``, ``V``: the groups' §4.1 aggregates (see :meth:`CostModel.time`)."""
    d = np.array([len(r) for r in ranks], dtype=np.float64)
    intra = np.array([cost_model.is_intra_node(r) for r in ranks], dtype=bool)
    return np.atleast_1d(cost_model.time(np.asarray(S, dtype=np.float64), np.asarray(Q, dtype=np.float64), d, intra,
                                         B=B, V=V))


def _sub(x, idx):
    return None if x is None else np.asarray(x, dtype=np.float64)[idx]


def place_for_times(S: np.ndarray, Q: np.ndarray, degrees, num_ranks: int, cost_model: CostModel, *,
                    time_fn=None, B=None, V=None) -> list[tuple[int, ...]]:
    """:func:`place_groups`, then the node-crossing rank sets of each degree go to the groups that lose
    least by crossing (see the module docstring). ``time_fn(S, Q, ranks, B, V)`` as in :func:`build_micro_batch`."""
    ranks = place_groups(degrees, num_ranks, cost_model.ranks_per_node)
    intra = [cost_model.is_intra_node(r) for r in ranks]
    if all(intra):
        return ranks
    time_fn = time_fn or (lambda s, q, r, b, v: placed_times(s, q, r, cost_model, b, v))
    S = np.asarray(S, dtype=np.float64)
    Q = np.asarray(Q, dtype=np.float64)
    degrees = [int(d) for d in degrees]
    for d in sorted(set(degrees)):
        members = [g for g in range(len(degrees)) if degrees[g] == d]
        sets_in = [ranks[g] for g in members if intra[g]]
        sets_out = [ranks[g] for g in members if not intra[g]]
        if not sets_in or not sets_out:
            continue
        t_out = np.asarray(time_fn(S[members], Q[members], [sets_out[0]] * len(members),
                                       _sub(B, members), _sub(V, members)), dtype=np.float64)
        cross = set(np.lexsort((np.arange(len(members)), t_out))[: len(sets_out)].tolist())
        it_in, it_out = iter(sets_in), iter(sets_out)
        for j, g in enumerate(members):
            ranks[g] = next(it_out) if j in cross else next(it_in)
    return ranks


def build_micro_batch(groups: list[list[int]], degrees, S: np.ndarray, Q: np.ndarray, num_ranks: int,
                      cost_model: CostModel, *, time_fn=None, B=None, V=None):
    """Place ``groups`` with ``degrees`` and return the :class:`MicroBatchPlan` with real-placement times.

    ``B``, ``V``: the groups' §4.1 aggregates. ``time_fn(S, Q, ranks, B, V) -> times`` replaces the §4
    ring formula (the Ulysses baseline uses it).
    """
    from fcp_data.plan.types import CPGroup, MicroBatchPlan

    ranks = place_for_times(S, Q, degrees, num_ranks, cost_model, time_fn=time_fn, B=B, V=V)
    times = (time_fn or (lambda s, q, r, b, v: placed_times(s, q, r, cost_model, b, v)))(S, Q, ranks, B, V)
    cp = tuple(CPGroup(ranks=r, seq_ids=tuple(g), time=float(t)) for g, r, t in zip(groups, ranks, times))
    return MicroBatchPlan(groups=cp, makespan=float(max(times)) if len(cp) else 0.0)
