"""A descent on the *placed* makespan for tight micro-batches on several nodes (issue 12).

The stage-1 search (:mod:`fcp_data.plan.search`) scores a grouping by its exact allocation, which times every group
of at most one node as if it ran inside one. Near capacity that is not what the plan gets: on 26 sequences and 33
ranks (nodes of 16 + 16 + 1) the searches end in groupings of allocation value 1.11 s whose memory-minimum degrees
(e.g. 5 + 6 + 7 + 7 + 8) cannot all be placed inside nodes, so a group crosses them and takes 1.34-3.06 s, and the
plan stays at 1.32 s, although a grouping whose crossing group has slack exists (1.17 s).

:func:`placed_descent` starts from a grouping and takes, while one improves by a relative 1e-9, the best neighbour
(one sequence moved to another group or to a new group of its own; two sequences of different groups swapped) by
the time the plan would really have: the exact allocation (:func:`~fcp_data.plan.allocate.allocate_fast`), the
placement (:func:`~fcp_data.plan.placement.place_for_times`) and, when it lowers the makespan, the in-node packing
(:func:`~fcp_data.plan.placement.packed_placement`) — what FCP's candidates get. Bounded by
:data:`PLACED_MAX_EVALS` evaluations; deterministic (neighbours in a fixed order, first on ties).
"""

from __future__ import annotations

import numpy as np

from fcp_data.cost import CostModel
from fcp_data.plan.allocate import allocate_fast, time_table
from fcp_data.plan.bfd import group_terms_of
from fcp_data.plan.placement import packed_placement, place_for_times, placed_times

__all__ = ["placed_descent", "placed_value", "PLACED_MAX_EVALS"]

# evaluations (allocation + placement, ~0.1-0.2 ms each on 20-64 ranks) per descent: the two instances it improved
# in bench_search_escalation's stream needed 2,269 and 4,582
PLACED_MAX_EVALS = 5_000


def placed_value(groups: list[list[int]], lengths: np.ndarray, etas: np.ndarray, num_ranks: int,
                 cost_model: CostModel, visual: np.ndarray | None = None) -> tuple[float, float, np.ndarray | None, tuple]:
    """``(placed makespan, allocation value, degrees, (S, Q, B, V))`` of a grouping (``inf`` and None degrees when
    memory fails on ``num_ranks``)."""
    agg = group_terms_of(groups, lengths, etas, visual)
    S, Q, B, V = agg
    value, deg = allocate_fast(time_table(S, Q, num_ranks, cost_model, B=B, V=V, sparse=True), num_ranks)
    if deg is None:
        return float("inf"), float("inf"), None, agg
    ranks = place_for_times(S, Q, deg, num_ranks, cost_model, B=B, V=V)
    times = placed_times(S, Q, ranks, cost_model, B, V)
    packed = packed_placement(ranks, S, Q, num_ranks, cost_model, B, V, times=times)
    return float((times if packed is None else packed[1]).max()), float(value), deg, agg


def _neighbours(groups: list[list[int]]):
    """Moves (to every other group, then to a new group) and swaps, as new groupings (members ascending, empty
    groups dropped), in a fixed order."""
    K = len(groups)
    for gi in range(K):
        for s in groups[gi]:
            for gj in range(K + 1):
                if gj == gi or (gj == K and len(groups[gi]) == 1):
                    continue
                new = [list(g) for g in groups] + [[]]
                new[gi].remove(s)
                new[gj] = sorted(new[gj] + [s])
                yield [g for g in new if g]
    for gi in range(K):
        for gj in range(gi + 1, K):
            for a in groups[gi]:
                for b in groups[gj]:
                    new = [list(g) for g in groups]
                    new[gi] = sorted([x for x in new[gi] if x != a] + [b])
                    new[gj] = sorted([x for x in new[gj] if x != b] + [a])
                    yield new


def placed_descent(groups: list[list[int]], lengths: np.ndarray, etas: np.ndarray, num_ranks: int,
                   cost_model: CostModel, visual: np.ndarray | None = None, max_evals: int = PLACED_MAX_EVALS):
    """The best grouping the descent reaches from ``groups`` (module docstring) as ``(allocation value, degrees,
    groups, (S, Q, B, V))`` — the arguments of a candidate — or None when no step improved the placed makespan. On
    one node (``num_ranks ≤ ranks_per_node``) every group runs inside it, the placed makespan is the allocation the
    search descended on already, and it returns None at once."""
    if num_ranks <= cost_model.ranks_per_node:
        return None
    cur = [sorted(int(x) for x in g) for g in groups]
    span = placed_value(cur, lengths, etas, num_ranks, cost_model, visual)[0]
    found, evals = None, 0
    while evals < max_evals:
        step = None
        for cand in _neighbours(cur):
            evals += 1
            got = placed_value(cand, lengths, etas, num_ranks, cost_model, visual)
            if got[0] < (step[0][0] if step else span) * (1 - 1e-9):
                step = (got, cand)
            if evals >= max_evals:
                break
        if step is None:
            break
        (span, value, deg, agg), cur = step
        found = (value, deg, cur, agg)
    return found
