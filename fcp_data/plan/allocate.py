"""Stage 2 of FCP: give each atomic group a degree so that the slowest group finishes first (DESIGN §5).

Input: the groups' aggregates ``S = Σ s``, ``Q = Σ (1+η)s²`` (§4.1: ``B``, ``V``); the time table
``T[i, d−1]`` of group ``i`` on ``d`` ranks (§4, intra-node when ``d ≤ ranks_per_node`` — the placement's
best case — ``inf`` where memory ``S ≤ d·E`` fails or the degree is not allowed). Two allocators, same optimum:

* :func:`~fcp_data.plan.allocate_dp.allocate_dp` — the paper's Algorithm 1, ``DP[i][j] = min_d max(DP[i−1][j−d], T_i(d))`` with
  ``DP[0][j] = 0``, O(K·N²) (each row vectorised over ``(j, d)``).
* :func:`allocate_fast` — exact: with idle ranks allowed, ``T̃_i(d) = min_{d'≤d} T_i(d')`` is
  non-increasing, so the least ``d`` with ``T̃_i(d) ≤ τ`` is ``f_i(τ) = 1 + #{d : T̃_i(d) > τ}`` and a
  makespan ``τ`` is feasible iff ``Σ_i f_i(τ) = K + #{(i,d) : T̃_i(d) > τ} ≤ N``. On a dense table the
  optimum is the ``(N−K)``-th largest entry (0-based) of ``T̃`` — one ``np.partition``. Each group then
  takes the fastest degree ``d ≤ f_i(τ*)`` (fewest ranks on ties); leftover ranks idle.

The sparse table (:class:`TimeTable`, ``time_table(..., sparse=True)``) stores, per group, only its useful
degrees: from the memory minimum ``d_min = ⌈S/E⌉`` to the degree past which ``T`` stops falling
(:func:`useful_degree_bound`), and of those only as many as the allocation needs (widened by doubling
until every stored row reaches ``τ*``). Memory is O(K·useful degrees), not O(K·N), and
``allocate_fast`` on it gives the dense optimum bit for bit (the same float entries; tests compare).
"""

from __future__ import annotations

import numpy as np

from fcp_data import jit
from fcp_data.cost import CostModel
from fcp_data.cost_kernel import compiled_table
from fcp_data.plan.allocate_kernel import SIGNATURE, allocate_loop

dense_kernel = jit.kernel(allocate_loop, SIGNATURE)  # () -> the compiled dense allocation, or None

__all__ = ["time_table", "TimeTable", "RunningMin", "useful_degree_bound", "allocate_fast", "pow2_mask"]

_FIRST_WIDTH = 16  # degrees per group stored at first; a row that the optimum needs wider doubles
_DENSE_MAX = 1 << 15  # a TimeTable of at most this many entries is allocated dense (faster when small)
_CHUNK = 1 << 19  # table entries evaluated at once by RunningMin (bounds its temporaries)


def pow2_mask(num_ranks: int) -> np.ndarray:
    """Boolean mask over degrees 1..N that keeps the powers of two."""
    d = np.arange(1, num_ranks + 1)
    return (d & (d - 1)) == 0


def _column(x, rows=None) -> np.ndarray | None:
    """``x`` as a float64 column (``(K, 1)``), restricted to ``rows``; None stays None."""
    return None if x is None else (x if rows is None else x[rows])[:, None]


def time_table(S: np.ndarray, Q: np.ndarray, num_ranks: int, cost_model: CostModel,
               allowed: np.ndarray | None = None, B: np.ndarray | None = None,
               V: np.ndarray | None = None, *, sparse: bool = False) -> "np.ndarray | TimeTable":
    """``T[i, d−1]``: §4/§4.1 time of group ``i`` on ``d`` ranks, ``inf`` if memory fails or ``d`` not
    allowed; ``B``, ``V``: the groups' §4.1 aggregates ``Σ(1+η)s`` and ``Σv`` (None: 0). ``sparse=True``
    returns the lazy :class:`TimeTable` (same entries, O(K·useful degrees) memory) instead of the dense array."""
    table = TimeTable(S, Q, num_ranks, cost_model, B=B, V=V, allowed=allowed)
    return table if sparse else table.dense()


def useful_degree_bound(S, Q, cost_model: CostModel, intra: bool, B=None, V=None) -> np.ndarray:
    """Per group, a degree ``U`` (float, may be ``inf``) from which the group time is non-decreasing in ``d``
    on one bandwidth ``v`` (intra- or inter-node). Derivation from §4/§4.1: for ``d ≥ 2``,
    ``C + M − min(A, X) = max(A, X) + (rest)``, so with ``P = alpha2·S + alpha_vis·V``, ``G = alpha1·Q``,
    ``c = alpha3·S/v``::

        T(d) = const + P/d + gamma·(d−1) + max(G/d, c·(1 − 1/d))

    If ``P ≥ c`` both branches of the max, ``(P+G)/d`` and ``c + (P−c)/d``, are convex, so ``T`` is convex
    and every subgradient is at least ``gamma − (P+G)/d²``: ``T`` is non-decreasing for
    ``d ≥ sqrt((P+G)/gamma)``. If ``P < c`` the same holds, and from ``d_x = 1 + G/c`` (where ``X`` overtakes
    ``A``) on ``T' = (c−P)/d² + gamma ≥ 0`` as well. Hence ``U = sqrt((P+G)/gamma)`` (``inf`` when
    ``gamma = 0``), lowered to ``d_x`` when ``P ≤ c``. ``d = 1`` (no ring) is always stored separately."""
    cm = cost_model
    S = np.asarray(S, dtype=np.float64)
    P = cm.alpha2 * S
    if cm.alpha_vis and V is not None:
        P = P + cm.alpha_vis * np.asarray(V, dtype=np.float64)
    G = cm.alpha1 * np.asarray(Q, dtype=np.float64)
    c = cm.alpha3 * S / (cm.bandwidth_intra if intra else cm.bandwidth_inter)
    with np.errstate(divide="ignore", invalid="ignore"):
        U = np.sqrt((P + G) / cm.gamma) if cm.gamma else np.full(S.shape, np.inf)
        d_x = np.where(c > 0, 1.0 + G / c, np.inf)
    return np.where(P <= c, np.minimum(U, d_x), U)


class TimeTable:
    """The K × N time table of :func:`time_table`, evaluated lazily: entries are computed on demand with
    the same formula (so they equal the dense entries bit for bit).

    ``table[:, j]`` is column ``j`` (degree ``j+1``), ``np.asarray(table)`` / :meth:`dense` the full array
    (fcp-dp and tests), :meth:`masked` restricts the allowed degrees, :meth:`useful_range` gives each
    row's useful degrees; :func:`allocate_fast` works on those without building the K × N array.
    """

    __slots__ = ("S", "Q", "B", "V", "num_ranks", "cost_model", "allowed", "shape", "_unmasked")

    def __init__(self, S, Q, num_ranks: int, cost_model: CostModel, *, B=None, V=None,
                 allowed: np.ndarray | None = None) -> None:
        self.S = np.asarray(S, dtype=np.float64).reshape(-1)
        self.Q = np.asarray(Q, dtype=np.float64).reshape(-1)
        self.B = None if B is None else np.asarray(B, dtype=np.float64).reshape(-1)
        self.V = None if V is None else np.asarray(V, dtype=np.float64).reshape(-1)
        self.num_ranks = int(num_ranks)
        self.cost_model = cost_model
        if allowed is not None:
            allowed = np.asarray(allowed, dtype=bool).reshape(-1)
            if allowed.size != self.num_ranks:
                raise ValueError(f"allowed has {allowed.size} entries but num_ranks={self.num_ranks}; give one per degree")
        self.allowed = allowed
        self.shape = (self.S.size, self.num_ranks)
        self._unmasked: list[np.ndarray] = []  # the dense entries without mask, once computed (small tables only)

    def masked(self, allowed: np.ndarray | None) -> "TimeTable":
        """The same table with only the degrees in ``allowed`` (and in this table's mask) finite."""
        if allowed is None:
            return self
        mask = np.asarray(allowed, dtype=bool) if self.allowed is None else self.allowed & np.asarray(allowed, dtype=bool)
        out = TimeTable(self.S, self.Q, self.num_ranks, self.cost_model, B=self.B, V=self.V, allowed=mask)
        out._unmasked = self._unmasked  # same entries: share them
        return out

    def evaluate(self, rows, degrees: np.ndarray) -> np.ndarray:
        """Entries ``T[rows[i], degrees[i, j] − 1]`` (``degrees`` float, broadcast against ``rows[:, None]``),
        ``inf`` where memory fails; ``rows=None``: every row. The allowed mask is not applied here."""
        cm = self.cost_model
        S = _column(self.S, rows)
        T = cm.time(S, _column(self.Q, rows), degrees, degrees <= cm.ranks_per_node, B=_column(self.B, rows),
                    V=_column(self.V, rows))
        return np.where(S <= degrees * cm.tokens_per_rank, T, np.inf)

    def dense(self) -> np.ndarray:
        """The full K × N float64 array (what ``time_table(..., sparse=False)`` returns)."""
        if self._unmasked:
            T = self._unmasked[0]
        else:
            T = compiled_table(self.cost_model, self.S, self.Q, self.B, self.V, self.num_ranks)  # same floats
            if T is None:
                T = self.evaluate(None, np.arange(1, self.num_ranks + 1, dtype=np.float64)[None, :])
            if T.size <= _DENSE_MAX:  # kept for the next masked view (the solver allocates any and pow2)
                self._unmasked.append(T)
        if self.allowed is not None:
            T = np.where(self.allowed[None, :], T, np.inf)
        elif self._unmasked:
            T = T.copy()  # the caller may write to it; the kept entries stay as computed
        return np.atleast_2d(T)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        T = self.dense()
        return T if dtype is None else T.astype(dtype)

    def __getitem__(self, key):
        """``table[:, j]`` computes one column (degree ``j+1``); any other index goes through :meth:`dense`."""
        if isinstance(key, tuple) and len(key) == 2 and key[0] == slice(None) and isinstance(key[1], (int, np.integer)):
            j = int(key[1]) % self.num_ranks if -self.num_ranks <= int(key[1]) < self.num_ranks else None
            if j is None:
                raise IndexError(f"degree column {key[1]} out of range for {self.num_ranks} ranks")
            if self.allowed is not None and not self.allowed[j]:
                return np.full(self.shape[0], np.inf)
            if self._unmasked:
                return self._unmasked[0][:, j].copy()
            return self.evaluate(None, np.full((1, 1), j + 1.0))[:, 0]
        return self.dense()[key]

    def row_min(self) -> np.ndarray:
        """Per row, the least entry over all allowed degrees (``inf`` when none holds memory): the row's
        prefix minimum at its last useful degree, so only useful degrees are evaluated."""
        cand, first, last = self.useful_range()
        out = np.full(self.shape[0], np.inf)
        ok = np.flatnonzero(first < cand.size)
        if ok.size:
            out[ok] = _row_items(self, cand, ok, first[ok], last[ok] - first[ok] + 1)[3]
        return out

    def running_min(self, floor: float = -np.inf) -> "RunningMin":
        """``np.minimum.accumulate(table, axis=1)`` as a :class:`RunningMin` that answers queries at
        ``τ ≥ max(floor, largest row minimum)`` only (the entries below never count there)."""
        return RunningMin(self, floor)

    def useful_range(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(cand, first, last)``: ``cand`` the allowed degrees ascending; row ``i``'s useful degrees are
        ``cand[first[i] : last[i] + 1]`` — from the least allowed degree that holds its memory
        (``first[i] == cand.size``: none) to the first allowed degree at or past :func:`useful_degree_bound`
        in each of the intra- and inter-node ranges. Every allowed degree past ``last[i]`` is at least as
        slow as one stored degree of the same row (the degree bounds' monotonicity; intra-node times are
        never above inter-node ones), so ``T̃`` of the row is constant from ``cand[last[i]]`` to ``N``."""
        cm, N, R = self.cost_model, self.num_ranks, self.cost_model.ranks_per_node
        cand = (np.arange(1, N + 1) if self.allowed is None else np.flatnonzero(self.allowed) + 1).astype(np.int64)
        E = float(cm.tokens_per_rank)
        d_min = np.maximum(np.ceil(self.S / E), 1.0)
        d_min = np.where(self.S <= (d_min - 1.0) * E, d_min - 1.0, d_min)  # the same float test as evaluate()
        d_min = np.where(self.S <= d_min * E, d_min, d_min + 1.0)
        first = np.searchsorted(cand, np.minimum(d_min, N + 1.0), side="left")
        last = first.copy()
        for intra in (True, False):
            if not intra and N <= R:
                continue
            U = useful_degree_bound(self.S, self.Q, cm, intra, B=self.B, V=self.V)
            bound = np.ceil(np.minimum(U, N + 1.0)) + 1.0  # one degree of slack against rounding
            bound = np.minimum(bound, R) if intra else np.maximum(bound, R + 1.0)
            last = np.maximum(last, np.searchsorted(cand, bound, side="left"))
        return cand, first, np.minimum(last, cand.size - 1)


class RunningMin:
    """The running minimum ``T̃`` of a :class:`TimeTable` for queries at makespans ``τ ≥ floor``, where
    ``floor`` is at least the largest row minimum (no row meets a lower ``τ``). Stores each row's minimum
    and the items of :func:`_row_items` whose ``T̃`` is above ``floor``, rows in order: ``table[:m]`` are
    the first ``m`` rows, ``table[:, -1]`` the row minima, :meth:`min_ranks` the dense
    ``1 + (T̃ > τ).sum(axis=1)``. Rows are evaluated in chunks of at most :data:`_CHUNK` entries."""

    __slots__ = ("num_rows", "num_ranks", "floor", "_first", "_min", "_row", "_key", "_w")

    def __init__(self, table: TimeTable, floor: float = -np.inf) -> None:
        cand, first, last = table.useful_range()
        K, N = table.shape
        self.num_rows, self.num_ranks = K, N
        self._first = np.where(first < cand.size, cand[np.minimum(first, cand.size - 1)], N + 1)
        self._min = np.full(K, np.inf)
        level = float(floor)
        parts = []
        ok = np.flatnonzero(first < cand.size)
        step = max(1, _CHUNK // max(1, int((last - first + 1).max(initial=1))))
        for lo in range(0, ok.size, step):  # rows in order, so the level (a floor) rises early
            rows = ok[lo: lo + step]
            r, k, w, m = _row_items(table, cand, rows, first[rows], last[rows] - first[rows] + 1, level)
            self._min[rows] = m
            level = max(level, float(m.max()))
            keep = k > level
            parts.append((r[keep], k[keep], w[keep]))
        self.floor = max(level, float(self._min.max(initial=-np.inf)))
        row, key, w = (np.concatenate([p[j] for p in parts]) if parts else np.zeros(0) for j in range(3))
        keep = key > self.floor
        order = np.argsort(row[keep], kind="stable")
        self._row, self._key, self._w = row[keep][order].astype(np.int64), key[keep][order], w[keep][order]

    @property
    def shape(self) -> tuple[int, int]:
        return (self.num_rows, self.num_ranks)

    def __getitem__(self, key):
        """``[:m]``: the first ``m`` rows; ``[:, -1]``: the row minima (the last column of ``T̃``)."""
        if isinstance(key, slice) and key.start in (None, 0) and key.step in (None, 1):
            view = object.__new__(RunningMin)
            for name in RunningMin.__slots__:
                setattr(view, name, getattr(self, name))
            view.num_rows = len(range(self.num_rows)[key])
            return view
        if key == (slice(None), -1) or key == (slice(None), self.num_ranks - 1):
            return self._min[: self.num_rows].copy()
        raise TypeError(f"RunningMin supports [:m] and [:, -1], got {key!r}")

    def min_ranks(self, tau: float, rows: int | None = None) -> np.ndarray:
        """Fewest ranks per row with ``T̃ ≤ τ`` (``N + 1`` where none), for ``τ ≥ floor``; ``rows``: only the first
        ``rows`` rows (what ``self[:rows].min_ranks(tau)`` gives, without the view)."""
        if not tau >= self.floor:
            raise ValueError(f"RunningMin answers τ >= {self.floor!r} only, got {tau!r}")
        m = self.num_rows if rows is None else min(int(rows), self.num_rows)
        end = int(np.searchsorted(self._row, m, side="left"))
        above = self._key[:end] > tau
        extra = np.bincount(self._row[:end][above], weights=self._w[:end][above], minlength=m)
        out = self._first[:m] + extra.astype(np.int64)
        return np.where(self._min[:m] <= tau, out, self.num_ranks + 1)


def _table(T, num_ranks: int | None, allowed: np.ndarray | None = None) -> tuple[np.ndarray, int, int]:
    """``(T as float64 K × N, K, N)``; the table's width must be ``num_ranks`` when that is given."""
    T = np.asarray(T, dtype=np.float64)
    K, N = T.shape
    if num_ranks is not None and num_ranks != N:
        raise ValueError(f"time table has {N} degree columns but num_ranks={num_ranks}")
    if allowed is not None:
        T = np.where(np.asarray(allowed, dtype=bool)[None, :], T, np.inf)
    return T, K, N


def allocate_fast(T, num_ranks: int | None = None, allowed: np.ndarray | None = None
                  ) -> tuple[float, np.ndarray | None]:
    """Exact min-max degree allocation on the table ``T`` (K × N array or :class:`TimeTable`), only the
    degrees in ``allowed`` (None: all). Returns ``(makespan, degrees)``; ``(inf, None)`` when no
    allocation with ``Σ d ≤ N`` meets memory. A :class:`TimeTable` never becomes a K × N array."""
    if isinstance(T, TimeTable):
        if num_ranks is not None and num_ranks != T.num_ranks:
            raise ValueError(f"time table has {T.num_ranks} degree columns but num_ranks={num_ranks}")
        if T.shape[0] * T.shape[1] > _DENSE_MAX:
            return _allocate_sparse(T.masked(allowed))
        T = T.dense()  # small: one vectorised pass beats the sparse bookkeeping (same optimum, tests compare)
    T, K, N = _table(T, num_ranks, allowed)
    if K == 0:
        return 0.0, np.zeros(0, dtype=np.int64)
    if K > N:
        return float("inf"), None
    if jit.active() and (kern := dense_kernel()) is not None:  # the same answer (fcp_data/plan/allocate_kernel.py)
        tau = kern(T, degrees := np.empty(K, dtype=np.int64))
        return (float(tau), degrees) if np.isfinite(tau) else (float("inf"), None)
    Tt = np.minimum.accumulate(T, axis=1)
    flat = Tt.ravel()
    k = N - K  # the answer is the k-th largest entry (0-based)
    tau = float(-np.partition(-flat, k)[k])
    if not np.isfinite(tau):
        return float("inf"), None
    budget = 1 + (Tt > tau).sum(axis=1)  # f_i(τ*)
    cols = np.arange(N)[None, :]
    masked = np.where(cols < budget[:, None], T, np.inf)
    degrees = masked.argmin(axis=1) + 1  # fastest degree within budget, fewest ranks on ties
    return tau, degrees.astype(np.int64)


def _row_items(table: TimeTable, cand: np.ndarray, rows: np.ndarray, start: np.ndarray, width: np.ndarray,
               floor: float = -np.inf):
    """Prefix minima of ``rows`` over ``cand[start : start + width]``, as allocation items: for consecutive
    stored degrees ``d_j < d_{j+1}`` of a row the item ``(T̃(d_j), d_{j+1} − d_j)`` — the ranks the row
    needs beyond ``d_j`` while the makespan is below ``T̃(d_j)``. Rows are padded to power-of-two widths
    (grouped by width, so a few wide rows do not widen the rest); items with key ``≤ floor`` are left out.
    Returns ``(row, key, weight, last)``."""
    out_row, out_key, out_w = [], [], []
    last = np.empty(rows.size)
    level = np.ceil(np.log2(np.maximum(width, 1))).astype(np.int64)
    for lv in np.unique(level).tolist():
        sel = np.flatnonzero(level == lv)
        r, w = rows[sel], 1 << lv
        j = np.arange(w)[None, :]
        valid = j < width[sel][:, None]
        d = cand[np.minimum(start[sel][:, None] + j, cand.size - 1)].astype(np.float64)
        Tt = np.minimum.accumulate(np.where(valid, table.evaluate(r, d), np.inf), axis=1)
        last[sel] = Tt[:, -1]
        ok = valid[:, 1:] & (Tt[:, :-1] > floor)
        out_row.append(np.broadcast_to(r[:, None], ok.shape)[ok])
        out_key.append(Tt[:, :-1][ok])
        out_w.append((d[:, 1:] - d[:, :-1])[ok])
    return np.concatenate(out_row), np.concatenate(out_key), np.concatenate(out_w), last


def _allocate_sparse(table: TimeTable) -> tuple[float, np.ndarray | None]:
    """:func:`allocate_fast` on useful degrees only. ``Σ_i f_i(τ) = Σ_i first_i + Σ {w : item key > τ}``,
    so ``τ*`` is the least ``τ ≥ max_i min T̃_i`` with item weight above ``τ`` at most ``N − Σ first_i``:
    one sort of the stored items. A row stored only in part (its last stored ``T̃`` above ``τ``) may hide
    items, so it is widened (doubling) and ``τ`` recomputed; with every partial row at or below ``τ`` the
    hidden items cannot count and ``τ`` is exact — the same entry the dense ``np.partition`` returns."""
    K, N = table.shape
    if K == 0:
        return 0.0, np.zeros(0, dtype=np.int64)
    if K > N:
        return float("inf"), None
    cand, first, last_idx = table.useful_range()
    if (first >= cand.size).any():
        return float("inf"), None
    budget = N - int(cand[first].sum())
    if budget < 0:
        return float("inf"), None
    full = last_idx - first + 1
    width = np.minimum(full, _FIRST_WIDTH)
    unit = cand.size == 0 or int(cand[-1] - cand[0]) == cand.size - 1
    item_row, item_key, item_w, last = _row_items(table, cand, np.arange(K), first, width)
    while True:
        complete = width >= full
        lb = float(last[complete].max()) if complete.any() else -np.inf
        keep = item_key > lb  # items at or below τ* never count
        key, w = item_key[keep], item_w[keep]
        if unit:  # consecutive degrees: every weight is 1, the answer is the budget-th largest key (0-based)
            tau = max(float(-np.partition(-key, budget)[budget]), lb) if budget < key.size else lb
        else:
            order = np.argsort(-key, kind="stable")
            pos = int(np.searchsorted(np.cumsum(w[order]), budget, side="right"))
            tau = max(float(key[order[pos]]), lb) if pos < key.size else lb
        grow = np.flatnonzero(~complete & (last > tau))
        if grow.size == 0:
            break
        width[grow] = np.minimum(width[grow] * 2, full[grow])
        drop = np.isin(item_row, grow, assume_unique=False)
        r, k, ww, l2 = _row_items(table, cand, grow, first[grow], width[grow])
        item_row = np.concatenate((item_row[~drop], r))
        item_key = np.concatenate((item_key[~drop], k))
        item_w = np.concatenate((item_w[~drop], ww))
        last[grow] = l2
    if not np.isfinite(tau):
        return float("inf"), None
    above = item_key > tau
    degrees = cand[first] + np.bincount(item_row[above], weights=item_w[above], minlength=K).astype(np.int64)
    return tau, degrees
