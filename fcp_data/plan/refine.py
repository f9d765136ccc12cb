"""Refinement of a placed plan with its ranks fixed (:func:`refine_moves`), the last step of every FCP track."""

from __future__ import annotations

from itertools import chain, filterfalse

import numpy as np

from fcp_data.cost import CostModel, sequence_terms
from fcp_data.jit import kernel
from fcp_data.plan.placement import intra_flags, placed_times
from fcp_data.plan.refine_kernel import SIGNATURE, refine_loop
from fcp_data.plan.types import CPGroup, MicroBatchPlan

__all__ = ["refine_moves", "JIT_MIN_WORK"]

# sequences × groups from which refinement runs the compiled move loop (fcp_data.plan.refine_kernel) when numba is
# installed: below it numpy is fast enough, and a small plan never pays numba's import (~0.5 s per process)
JIT_MIN_WORK = 2048


refine_kernel = kernel(refine_loop, SIGNATURE)  # () -> the compiled move loop, or None (no numba, or FCP_JIT=0)


class _Groups:
    """Per-group aggregates ``S, Q, B, V``, times ``T``, degrees, memory caps of a plan's groups, and the
    sequence → group ``label``, updated move by move."""

    def __init__(self, mb: MicroBatchPlan, terms, cost_model: CostModel, n: int) -> None:
        K = len(mb.groups)
        s, q, bq, v = terms
        sizes = [len(g.seq_ids) for g in mb.groups]
        self.label = np.empty(n, dtype=np.int64)
        self.label[np.fromiter(chain.from_iterable(g.seq_ids for g in mb.groups), dtype=np.int64, count=sum(sizes))] = \
            np.repeat(np.arange(K), sizes)
        self.d = np.array([g.degree for g in mb.groups], dtype=np.float64)
        self.intra = intra_flags([g.ranks for g in mb.groups], cost_model.ranks_per_node)
        self.cap = self.d * cost_model.tokens_per_rank
        # one (4, K) array (rows S, Q, B, V; the attributes are views of it): a move's with/without matrices are
        # built for all four in one broadcast (:func:`_with_and_without`)
        self.X = np.stack([np.bincount(self.label, weights=w, minlength=K) for w in (s, q, bq, v)])
        self.S, self.Q, self.B, self.V = self.X
        self.T = np.atleast_1d(cost_model.time(self.S, self.Q, self.d, self.intra, B=self.B, V=self.V))
        # the groups' fixed-degree constants (CostModel.time_fixed) + a column K for the slowest group, set per move
        self.cols = cost_model.fixed_columns(np.append(self.d, 1.0), np.append(self.intra, True))


def refine_moves(mb: MicroBatchPlan, lengths: np.ndarray, etas: np.ndarray, cost_model: CostModel,
                 max_moves: int = 32, visual: np.ndarray | None = None, *, terms=None) -> MicroBatchPlan:
    """Local search on a plan with fixed ranks: move one sequence out of the slowest group into the group
    where ``max(T_slowest', T_target')`` is smallest, while that is below ``T_slowest`` and memory holds.
    Vectorised over (sequence of the slowest group × target group); from :data:`JIT_MIN_WORK` on, the same moves
    by the compiled loop of :mod:`fcp_data.plan.refine_kernel` when numba is installed. Never increases the
    makespan. ``terms``: ``sequence_terms(lengths, etas, visual)`` when the caller has it (one micro-batch's
    tracks are refined with the same terms)."""
    if len(mb.groups) < 2:
        return mb
    terms = sequence_terms(lengths, etas, visual) if terms is None else terms
    st = _Groups(mb, terms, cost_model, lengths.size)
    start = st.label.copy()
    terms4 = np.stack(terms)
    # the B and V terms apply (a zero term adds exactly 0.0: leaving it out gives the same floats)
    use_b, use_v = bool(cost_model.alpha_blk), bool(cost_model.alpha_vis and visual is not None)
    loop = refine_kernel() if lengths.size * len(mb.groups) >= JIT_MIN_WORK else None
    if loop is not None:
        moved = np.empty(max_moves, dtype=np.int64)
        coef = np.array([cost_model.alpha1, cost_model.alpha2, cost_model.alpha_blk, cost_model.alpha_vis,
                         cost_model.beta1, cost_model.alpha3])
        count = loop(st.label, st.X, st.T, st.cols, st.cap, terms4, coef, use_b, use_v, max_moves, moved)
        touched = set(moved[:count].tolist())
    else:
        touched = _numpy_moves(st, terms, terms4, cost_model, visual is not None, [0, 1] + [2] * use_b + [3] * use_v,
                               max_moves)
    if not touched:
        return mb
    return _rebuilt(mb, st.label, start, touched, terms, cost_model)


def _numpy_moves(st: _Groups, terms, terms4: np.ndarray, cost_model: CostModel, has_visual: bool, rows: list[int],
                 max_moves: int) -> set[int]:
    """Up to ``max_moves`` moves of :func:`_best_move` (``rows``: the aggregates the times need); the moved sequences."""
    terms_r = terms4[rows]
    touched: set[int] = set()
    for _ in range(max_moves):
        k = _best_move(st, terms, terms4, terms_r, cost_model, has_visual, rows)
        if k is None:
            break
        touched.add(k)
    return touched


def _best_move(st: _Groups, terms, terms4: np.ndarray, terms_r: np.ndarray, cost_model: CostModel, has_visual: bool,
               rows: list[int]) -> int | None:
    """Apply the best single move out of the slowest group (updating ``st``); the moved sequence, or None when
    no move lowers the slowest group's time. ``terms4``: ``terms`` stacked, ``(4, n)``; ``rows``: the aggregates
    the times need, ``terms_r``: those rows of ``terms4``."""
    s, q, _, v = terms
    T = st.T
    K = T.size
    b = int(np.argmax(T))
    st.cols[:, K] = st.cols[:, b]
    members = np.flatnonzero(st.label == b)
    if members.size == 0:
        return None
    alone = members.size == 1
    if members.size > 32:  # equal (s, q) give equal rows; argmin below takes the first of them anyway
        members = _first_distinct(members, s, q, v if has_visual else None)
    # one time_fixed() call: columns 0..K-1 each target with member i added, column K the slowest group without it
    # (elementwise, so every entry is the float two separate calls give)
    Xm = _with_and_without(st.X[rows], terms_r[:, members], b)
    t = cost_model.time_fixed(Xm[0], Xm[1], Xm[2] if 2 in rows else None, Xm[-1] if 3 in rows else None, st.cols)
    tb = np.zeros(1) if alone else t[:, K]  # an emptied group leaves its ranks idle
    tg = t[:, :K]
    np.copyto(tg, np.inf, where=Xm[0][:, :K] > st.cap)  # memory fails
    tg[:, b] = np.inf
    pair = np.maximum(tb[:, None], tg)
    i, g = divmod(int(pair.argmin()), K)
    if not pair[i, g] < T[b] * (1 - 1e-12):
        return None
    k = int(members[i])
    st.label[k] = g
    st.X[:, b] -= terms4[:, k]
    st.X[:, g] += terms4[:, k]
    T[b] = tb[i]
    T[g] = tg[i, g]
    return k


def _with_and_without(X: np.ndarray, xm: np.ndarray, b: int) -> np.ndarray:
    """For each row ``r`` of the aggregates ``X`` ``(R, K)`` and the members' terms ``xm`` ``(R, m)`` an ``(m, K+1)``
    matrix: column ``g < K`` is ``X[r, g] + xm[r]``, column ``K`` is ``X[r, b] − xm[r]`` (elementwise: the same
    floats as one row at a time; two numpy calls for all rows, no concatenation copy)."""
    R, K = X.shape
    out = np.empty((R, xm.shape[1], K + 1))
    np.add(X[:, None, :], xm[:, :, None], out=out[:, :, :-1])
    np.subtract(X[:, b, None], xm, out=out[:, :, -1])
    return out


def _first_distinct(members: np.ndarray, s: np.ndarray, q: np.ndarray, v: np.ndarray | None) -> np.ndarray:
    """The members whose ``(s, q[, v])`` no earlier member has, in order (what ``np.unique(..., axis=0,
    return_index=True)`` finds, by one lexsort instead of a structured-array sort)."""
    keys = (members, q[members], s[members]) if v is None else (members, v[members], q[members], s[members])
    order = np.lexsort(keys)  # by s, then q (then v), then position: each run of equal rows starts at its first
    repeat = np.ones(order.size, dtype=bool)  # equal to the row before it in sorted order
    for k in keys[1:]:
        ks = k[order]
        repeat[1:] &= ks[1:] == ks[:-1]
    repeat[0] = False
    return members[np.sort(order[~repeat])]


def _rebuilt(mb: MicroBatchPlan, label: np.ndarray, start: np.ndarray, touched: set[int], terms,
             cost_model: CostModel) -> MicroBatchPlan:
    """The plan after the moves. Only the groups that lost or gained a sequence change: the members that stayed
    keep their packing order, the newcomers follow in index order (O(moves + their sizes), not O(groups ×
    sequences)). ``mb`` itself if the moves did not lower its placed makespan."""
    K = len(mb.groups)
    moved = np.sort(np.fromiter(touched, dtype=np.int64, count=len(touched)))
    moved = moved[label[moved] != start[moved]]  # ascending: the newcomers' order
    changed = set(moved.tolist())
    incoming: dict[int, list[int]] = {}
    for k, g in zip(moved.tolist(), label[moved].tolist()):
        incoming.setdefault(g, []).append(k)
    dirty = set(start[moved].tolist()) | set(incoming)
    groups = []
    for g, grp in enumerate(mb.groups):
        ids = grp.seq_ids
        if g in dirty:  # the members that stayed, in order (filterfalse: no Python step per member)
            ids = tuple(filterfalse(changed.__contains__, ids)) + tuple(incoming.get(g, ()))
        if ids:
            groups.append((g, grp.ranks, ids))
    keep = np.array([g for g, _, _ in groups], dtype=np.int64)
    S, Q, B, V = (np.bincount(label, weights=w, minlength=K)[keep] for w in terms)
    times = placed_times(S, Q, [r for _, r, _ in groups], cost_model, B, V)
    old = mb.groups  # an untouched group with the same time is kept as is (no new, re-validated CPGroup)
    # r: a checked group's ranks; i: Python ints (the plan's ids and the moved ones); t: a finite float
    cp = tuple(old[g] if g not in dirty and t == old[g].time else CPGroup.prechecked(r, i, t)
               for (g, r, i), t in zip(groups, times.tolist()))
    out = MicroBatchPlan.prechecked(cp, float(max(times)))  # each group on its ranks in ``mb``: still disjoint
    return out if out.makespan <= mb.makespan else mb
