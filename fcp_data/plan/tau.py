"""Makespan-driven stage-1 groupings: single out the long sequences, LPT-balance the rest (DESIGN §5).

Why: packing on memory (BFD with ``tokens_per_rank``) puts many short sequences into a few big bins,
which then get high ring degrees. In §4 the ring traffic per rank, ``alpha3·S·(d−1)/d/v``, barely shrinks
with ``d`` while compute falls as ``1/d``, so a wide ring over short sequences is slow; short sequences
are best on one rank each (or two), and only sequences whose solo time exceeds the makespan deserve a
ring of their own.

For a target makespan ``τ`` (sequences ordered by solo time on one rank, memory-overflowing ones first):
the sequences whose solo time ``T_k(1) > τ`` (or that do not fit one rank) each take the fewest ranks
``f_k(τ)`` with ``T_k(d) ≤ τ``; the others are counted as degree-1 bins of work ``τ − beta1`` (work is
additive on one rank): each sequence heavier than half a bin opens one, the lighter ones fill the
headroom, then new bins. ``τ*`` is the smallest ``τ`` whose rank count fits ``N`` (bisection to 1e-4,
vectorised over the long sequences and degrees). The candidate groupings are ``{each long sequence
alone} ∪ LPT(rest, N − Σ f_k groups)``, without and with the lightest sequences best-fitted into the long
groups' headroom at ``τ*`` (``filled``); they go to the exact allocator like every other candidate (which
re-chooses all degrees), so ``τ*`` only shapes the grouping. Coarse variants (``filled is None``): for
``c`` in ``coarsen``, only the sequences needing more than ``c`` ranks at ``τ*`` stay alone and the rest
is LPT-balanced into ``(ranks left) // c`` groups — rings of about ``c`` ranks that mix the sequences too
slow alone on one rank with light ones.
Deterministic: stable sorts and fixed bisection steps only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fcp_data import jit
from fcp_data.cost import CostModel, sequence_terms
from fcp_data.cost_kernel import kernel_switches
from fcp_data.plan.allocate import RunningMin, time_table
from fcp_data.plan.lpt import labels_to_groups, lpt_heap
from fcp_data.plan.tau_kernel import SIGNATURE, headroom_loop

__all__ = ["tau_groupings", "min_ranks_for"]

headroom_kernel = jit.kernel(headroom_loop, SIGNATURE)  # () -> the compiled headroom fill, or None

_BISECT_STEPS = 48
_DENSE_TAU_MAX = 1 << 15  # long-sequence candidates × ranks up to which the running minimum is kept dense


def min_ranks_for(Tt: np.ndarray | RunningMin, tau: float, rows: int | None = None) -> np.ndarray:
    """Fewest ranks per row of the running-minimum time table ``Tt`` (K × N) meeting ``τ``; ``N + 1``
    where no degree does; ``rows``: only the first ``rows`` rows."""
    if isinstance(Tt, RunningMin):
        return Tt.min_ranks(tau, rows)
    return 1 + (Tt[:rows] > tau).sum(axis=1)


def _rest_bins(tau: float, m: int, work_sorted: np.ndarray, neg_work: np.ndarray, suffix_work: np.ndarray,
               beta1: float) -> float:
    """Degree-1 bins of time ≤ ``τ`` for the sequences ``order[m:]`` (work descending): items heavier than
    half a bin cannot share one, so each opens its own; the lighter ones fill their headroom, then new bins
    (the first-fit-decreasing count up to the fragmentation of the light items). ``neg_work``: ``−work_sorted``, made
    once for the bisection's many calls."""
    room = tau - beta1
    if suffix_work[m] <= 0:
        return 0.0
    if room <= 0:
        return np.inf
    rest = work_sorted[m:]
    if rest[0] > room * (1 + 1e-12):
        return np.inf
    n_big = int(np.searchsorted(neg_work[m:], -0.5 * room, side="left"))  # work > room/2
    big_work = suffix_work[m] - suffix_work[m + n_big]
    light = suffix_work[m + n_big]
    spill = light - (n_big * room - big_work)
    return n_big + (max(0.0, float(np.ceil(spill / room - 1e-9))) if spill > 0 else 0.0)


def _fill_headroom(groups, per, rest, terms, tau, cost_model):
    """Best-fit the lightest remaining sequences into the long groups' headroom: each long group (on its
    ``per`` ranks) takes the longest prefix of the remaining sequences, lightest first, that keeps its
    time ≤ ``τ`` (one vectorised prefix scan per long group). ``terms``: per-sequence ``(s, q, b, v)``.
    Returns the groups and what is left."""
    s, q, b, v = terms
    light = rest[::-1]  # rest is heaviest first
    if (take := _compiled_take(groups, per, light, terms, tau, cost_model)) is not None:
        taken = 0
        for k, j in enumerate(take.tolist()):
            if j:
                groups[k] = groups[k] + light[taken:taken + j].tolist()
                taken += j
        return groups, light[taken:][::-1]
    taken = 0
    for k, d in enumerate(per.tolist()):
        if d < 2 or taken >= light.size:
            continue
        cand = light[taken:]
        j = _fitting_prefix(groups[k], cand, terms, d, tau, cost_model)
        if j:
            groups[k] = groups[k] + cand[:j].tolist()
            taken += j
    return groups, light[taken:][::-1]


def _compiled_take(groups, per, light, terms, tau: float, cost_model: CostModel) -> np.ndarray | None:
    """How many light sequences each long group takes, by :mod:`fcp_data.plan.tau_kernel` (the same prefixes), when
    a kernel is in use in this process and every group is still its one long sequence; else None."""
    cm = cost_model
    if not jit.active() or any(len(g) != 1 for g in groups) or (loop := headroom_kernel()) is None:
        return None
    ids = [g[0] for g in groups]
    take = np.empty(len(groups), dtype=np.int64)
    loop(np.asarray(per, dtype=np.int64), np.stack([x[ids] for x in terms]), np.ascontiguousarray(light, dtype=np.int64),
         np.stack(terms), float(tau), float(cm.tokens_per_rank), float(cm.ranks_per_node),
         *kernel_switches(cm, terms[2], terms[3]), take)  # B and V given: the numpy path's switches
    return take


_PREFIX_FIRST = 32  # candidates scanned at first by _fitting_prefix (doubled until the prefix ends inside)


def _fitting_prefix(members: list[int], cand: np.ndarray, terms, d: int, tau: float, cost_model: CostModel) -> int:
    """The longest prefix of ``cand`` that ``members`` on ``d`` ranks can take keeping time ≤ ``τ`` and memory.
    Scans ``_PREFIX_FIRST`` candidates, doubling while the whole scanned prefix fits: ``np.cumsum`` adds in
    order, so a prefix's sums (and times) are bit for bit those of the full scan, at O(answer) cost."""
    s, q, b, v = terms
    base = [x[members].sum() for x in (s, q, b, v)]
    width = _PREFIX_FIRST
    while True:
        c = cand[:width]
        S, Q, B, V = (x0 + np.cumsum(x[c]) for x0, x in zip(base, (s, q, b, v)))
        T = np.atleast_1d(cost_model.time(S, Q, d, d <= cost_model.ranks_per_node, B=B, V=V))
        ok = (T <= tau) & (S <= d * cost_model.tokens_per_rank)
        if not ok.all():
            return int(np.argmin(ok))
        if c.size == cand.size:
            return int(c.size)
        width *= 2


@dataclass
class _Target:
    """What :func:`tau_groupings` derives once: the order (memory-overflowing first, then by solo time), the
    running-minimum table of the ``M`` heaviest, the target makespan ``tau`` and the long count ``m0`` at it."""

    s: np.ndarray
    q: np.ndarray
    b: np.ndarray
    v: np.ndarray
    solo: np.ndarray
    order: np.ndarray
    Tt: object
    M: int
    n_over: int
    tau: float = 0.0
    m0: int = 0
    neg_solo: np.ndarray | None = None  # −solo in that order, past the overflowing ones (for _long_count)


def tau_groupings(lengths: np.ndarray, etas: np.ndarray, num_ranks: int, cost_model: CostModel,
                  spread: int = 0, fill: bool = True,
                  coarsen: tuple[int, ...] = (2, 3, 4), visual: np.ndarray | None = None
                  ) -> list[tuple[list[list[int]], bool]]:
    """Candidate groupings ``(lists of sequence-id lists, filled)`` for the FCP solver, see the module
    docstring; ``filled``: the long groups also took light sequences into their headroom; ``None`` for
    the coarse variants (one per ``c`` in ``coarsen``).
    ``spread``: also try singling out up to ``spread`` sequences fewer and more than at ``τ*``."""
    s, q, b, v = sequence_terms(lengths, etas, visual)
    n, N, E = s.size, int(num_ranks), cost_model.tokens_per_rank
    if n < 2 or N < 2:
        return []
    solo = np.atleast_1d(cost_model.time(s, q, 1, True, B=b, V=v))  # additive on one rank: work = solo − beta1
    over = s > E
    # order: memory-overflowing first, then by solo time, longest first; index breaks ties
    order = np.lexsort((np.arange(n), -solo, ~over))
    # at most N/2 sequences can take ≥ 2 ranks each; overflowing ones always count
    M = int(min(n, max(int(over.sum()), N // 2)))
    top = order[:M]
    # the running minimum over useful degrees only (queried at τ ≥ lo below, its floor); a small table dense (the
    # same entries, RunningMin's items cost more to build than the whole table)
    table = time_table(s[top], q[top], N, cost_model, B=b[top], V=v[top], sparse=True)
    Tt = np.minimum.accumulate(table.dense(), axis=1) if M * N <= _DENSE_TAU_MAX else table.running_min(cost_model.beta1)
    t = _Target(s=s, q=q, b=b, v=v, solo=solo, order=order, Tt=Tt, M=M, n_over=int(over.sum()))
    if not _bisect(t, N, cost_model):
        return []
    return _single_out(t, N, cost_model, spread, fill) + _coarse(t, N, cost_model, coarsen)


def _long_count(t: _Target, tau: float) -> int:
    """Sequences singled out at τ: overflowing ones plus those slower than τ alone on one rank."""
    if t.neg_solo is None:
        t.neg_solo = -t.solo[t.order][t.n_over:]  # once: the bisection asks ~30 times
    return max(t.n_over, int(np.searchsorted(t.neg_solo, -tau, side="left")) + t.n_over)


def _bisect(t: _Target, N: int, cost_model: CostModel) -> bool:
    """Set ``t.tau`` to the smallest feasible target makespan (bisection) and ``t.m0``; False if none is."""
    beta1 = cost_model.beta1
    work_sorted = (t.solo - beta1)[t.order]
    suffix_work = np.concatenate((np.cumsum(work_sorted[::-1])[::-1], [0.0]))  # work of order[m:]
    neg_work = -work_sorted

    def feasible(tau: float) -> bool:
        m = _long_count(t, tau)
        if m > t.M:
            return False
        need = int(min_ranks_for(t.Tt, tau, m).sum()) if m else 0
        return need + _rest_bins(tau, m, work_sorted, neg_work, suffix_work, beta1) <= N

    lo = float(max(t.Tt[:, -1].max() if t.M else 0.0, beta1))  # no plan beats the longest sequence on N ranks
    # everything on one rank — and more than enough, unless memory forces the longest sequence onto a ring
    # slower than that (then the search starts at lo: RunningMin answers τ ≥ lo only)
    hi = max(float(t.solo.max() + t.solo.sum()), lo)
    if not np.isfinite(lo):
        return False
    if feasible(lo):
        hi = lo
    else:
        for _ in range(_BISECT_STEPS):
            mid = 0.5 * (lo + hi)
            if feasible(mid):
                hi = mid
            else:
                lo = mid
            if hi - lo <= 1e-4 * hi:  # τ only picks the long set and its ranks; the allocator is exact
                break
    if not feasible(hi):
        return False
    t.tau, t.m0 = hi, _long_count(t, hi)
    return True


def _single_out(t: _Target, N: int, cost_model: CostModel, spread: int, fill: bool) -> list:
    """The long sequences alone on the fewest ranks that meet τ, the rest LPT-balanced on single ranks (and the
    variant whose long groups also take light sequences into their headroom)."""
    n, E, beta1 = t.s.size, cost_model.tokens_per_rank, cost_model.beta1
    out: list[tuple[list[list[int]], bool]] = []
    for m in range(max(t.n_over, t.m0 - spread), min(t.M, t.m0 + spread) + 1):
        if m >= n:
            continue
        per = np.minimum(min_ranks_for(t.Tt[:m], t.tau), N) if m else np.zeros(0, dtype=np.int64)
        k_rest = N - int(per.sum())
        if k_rest < 1:
            continue
        for filled in ((False, True) if fill and m else (False,)):
            groups = [[k] for k in t.order[:m].tolist()]
            rest = t.order[m:]
            if filled:
                groups, rest = _fill_headroom(groups, per, rest, (t.s, t.q, t.b, t.v), t.tau, cost_model)
            if rest.size:
                k = min(k_rest, rest.size)
                label = lpt_heap(t.solo[rest] - beta1, t.s[rest], k, float(E))
                if label is None:
                    continue
                groups += labels_to_groups(label, k, rest)
            out.append((groups, filled))
    return out


def _coarse(t: _Target, N: int, cost_model: CostModel, coarsen: tuple[int, ...]) -> list:
    """Rings of about c ranks over mixed heavy and light sequences: the sequences that need more than c ranks at
    τ* stay alone, the rest is LPT-balanced into (ranks left) // c groups."""
    n, E, beta1 = t.s.size, cost_model.tokens_per_rank, cost_model.beta1
    per_all = np.minimum(min_ranks_for(t.Tt, t.tau), N)
    out: list[tuple[list[list[int]], None]] = []
    for c in coarsen:
        j = max(t.n_over, int(np.count_nonzero(per_all[:t.m0] > c)))
        k = (N - int(per_all[:j].sum())) // c
        if j >= n or k < 1:
            continue
        rest = t.order[j:]
        k = min(k, rest.size)
        label = lpt_heap(t.solo[rest] - beta1, t.s[rest], k, float(c * E))
        if label is not None:
            groups = [[i] for i in t.order[:j].tolist()]
            groups += labels_to_groups(label, k, rest)
            out.append((groups, None))
    return out
