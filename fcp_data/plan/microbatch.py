"""Micro-batch planner: split a global batch into micro-batches that fit, keep the cheapest split (DESIGN §5).

A split into ``M`` micro-batches is built by LPT on the work proxy ``alpha1·(1+η)s² + alpha2·s`` (+ the §4.1
terms ``alpha_blk·(1+η)s + alpha_vis·v``)
(heaviest sequence first into the micro-batch with least work whose tokens stay within ``N·E``). It fits
when the solver finds a plan for each micro-batch (DESIGN §5: ``Σs ≤ N·E`` each and every stage-2 problem
feasible). Memory alone decides nothing more: one group of all ``N`` ranks holds any ``Σs ≤ N·E``, even when
stage-1 bins of unit ``E`` would need ``N + 1`` ranks (a tight batch), so such a split is solved, not skipped.

``"auto"`` starts at ``M = ⌈Σs / (N·E)⌉``, moves up to the first ``M`` whose micro-batches' stage-1 bins each
need at most ``N`` ranks, tries ``extra`` more, and keeps the split with the smallest sum of makespans (fewer
micro-batches on ties). Tight splits below that ``M`` are solved too: they only add candidates, so auto never
ends above the search that skipped them.

Pruning (:func:`split_lower_bound`): ``auto`` solves a split of ``M`` only when a lower bound on the total
makespan of *any* ``M``-split can still beat the best split found; the bound grows with ``M``, so the
search stops there. The chosen ``M`` and makespan are those of the unpruned search (a pruned ``M`` costs
at least the bound, which is not below the best, and ties keep fewer micro-batches).

Time-limited solvers (the ILP) get one budget for the whole call, never one per micro-batch: ``solve_one``
receives how many micro-batches of its split are still to solve and divides what is left; when the budget
runs out (:class:`TimeBudgetExceeded`) ``auto`` keeps the best split solved so far, or says so.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from fcp_data.cost import CostModel, sequence_terms
from fcp_data.plan.allocate import TimeTable
from fcp_data.plan.baselines import work_proxy
from fcp_data.plan.bfd import bfd_groups
from fcp_data.plan.fixed_split import fallback_methods, fallback_splits
from fcp_data.plan.inputs import OptionError
from fcp_data.plan.lpt import lpt_exact
from fcp_data.plan.types import CPGroup, MicroBatchPlan

__all__ = ["split_micro_batches", "plan_micro_batches", "min_micro_batches", "split_lower_bound", "TimeBudgetExceeded"]

# solve_one(ids, left=k): plan lengths[ids]; k micro-batches of this split (this one included) are unsolved
SolveOne = Callable[..., tuple[MicroBatchPlan, "bool | None"]]


class TimeBudgetExceeded(ValueError):
    """A time-limited solver's budget for the whole :func:`plan_micro_batches` call ran out."""


def min_micro_batches(lengths: np.ndarray, num_ranks: int, cost_model: CostModel) -> int:
    """Lower bound on the micro-batch count: ``⌈Σs / (N·E)⌉`` (at least 1)."""
    return max(1, math.ceil(float(np.sum(lengths)) / (num_ranks * cost_model.tokens_per_rank)))


_BOUND_TOP = 8  # sequences (heaviest by work) whose best time on any degree bounds the heaviest micro-batch


def split_lower_bound(lengths: np.ndarray, etas: np.ndarray, num_ranks: int, cost_model: CostModel,
                      visual: np.ndarray | None = None) -> Callable[[int], float]:
    """``LB(M)``: a lower bound on the sum of makespans of any split into ``M`` micro-batches, each planned
    in any way on ``N`` ranks (§4/§4.1, any grouping, any degrees, any placement)::

        LB(M) = max(W/N + M·beta1,  m* + (M−1)·(beta1 + alpha_blk·min_k b_k))

    Proof. A group on ``d`` ranks takes ``T ≥ C = w_g/d + alpha_blk·B_g + beta1`` (``M − min(A, X) ≥ 0``), with
    ``w = alpha1·Q + alpha2·S + alpha_vis·V``. So ``d·(τ_j − beta1) ≥ w_g + alpha_blk·B_g`` for every group of
    micro-batch ``j`` (``d ≥ 1``); summing over its groups (``Σ d ≤ N``) gives ``τ_j ≥ W_j/N + beta1``, ``W``
    the work proxy of :func:`~fcp_data.plan.baselines.work_proxy` summed; summing over ``j`` the first term.
    Second: ``T`` grows with a group's ``S, Q, B, V`` and intra-node bandwidth is the best case, so the
    micro-batch holding sequence ``k`` takes at least ``m_k = min_d T_k(d)`` (sequence ``k`` alone, one node
    when it fits); ``m*`` is the largest ``m_k`` over the :data:`_BOUND_TOP` heaviest sequences (a lower
    bound of the largest over all), and each of the other ``M − 1`` micro-batches holds a group with
    ``T ≥ alpha_blk·B_g + beta1``.

    A third term, ``H + (M−1)·beta1`` (:func:`_held_bound`), charges the micro-batch that holds a heavy
    sequence for the ranks its group keeps: a long sequence alone on a wide ring can be within a few % of its
    best time and still leave the other ranks too little time for the rest of the batch."""
    N = int(num_ranks)
    work = work_proxy(lengths, etas, cost_model, visual)
    s, q, b, v = sequence_terms(lengths, etas, visual)
    top = np.lexsort((np.arange(s.size), -work))[:_BOUND_TOP]
    m_star = float(TimeTable(s[top], q[top], N, cost_model, B=b[top], V=v[top]).row_min().max()) if s.size else 0.0
    per_mb = cost_model.beta1 + cost_model.alpha_blk * (float(b.min()) if b.size else 0.0)
    W = float(work.sum())
    held = _held_bound(s, q, b, v, top, N, cost_model) if s.size else 0.0

    def bound(M: int) -> float:
        return max(W / N + M * cost_model.beta1, m_star + (M - 1) * per_mb, held + (M - 1) * cost_model.beta1)

    return bound


def _held_bound(s, q, b, v, top, N: int, cm: CostModel) -> float:
    """``H = max_k min_d [t_k(d) + max(0, C_k(d) − (N−d)·(t_k(d) − beta1)) / N]`` over the heavy sequences
    ``k`` (``top``) and the degrees ``d`` of ``k``'s group that hold it in memory; ``H + (M−1)·beta1`` is a lower
    bound on the sum of makespans of any ``M``-split.

    Proof. Let micro-batch ``j`` hold ``k`` in a group of ``d`` ranks. With ``T = max(A, X) + alpha2·S/d +
    alpha_blk·B + alpha_vis·V/d + beta1 + [d>1]·(beta2 + gamma·(d−1))`` (``C + M − min(A, X)`` rewritten), adding
    sequences ``O`` to a group raises ``T`` by at least ``alpha2·S_O/d + alpha_blk·B_O + alpha_vis·V_O/d +
    min(A_O, X_O)`` (``max(a+a', x+x') − max(a, x) ≥ min(a', x')``), so ``d·ΔT ≥ Σ_o c_o(d)`` with
    ``c_o(d) = alpha2·s_o + alpha_blk·b_o + alpha_vis·v_o + min(alpha1·q_o, alpha3·s_o·(d−1)/v_d)`` (``v_d`` the
    best bandwidth a ``d``-rank group can have) — at most ``o``'s work proxy ``w_o``. ``k``'s group therefore holds
    its ``d`` ranks for ``τ_j ≥ t_k(d) + Σ_{o in it} c_o/d`` (``t_k(d)``: ``k`` alone, best bandwidth); every
    other group of ``j`` needs ``d_g·(τ_j − beta1) ≥ w_g``, and every other micro-batch ``i`` has
    ``N·(τ_i − beta1) ≥ W_i`` (see :func:`split_lower_bound`). Adding rank-time over the ``N`` ranks:
    ``N·τ_j ≥ d·t_k(d) + (N−d)·beta1 + C_j`` and ``Σ_{i≠j} τ_i ≥ (C − C_j)/N + (M−1)·beta1`` with
    ``C = Σ_{o≠k} c_o(d)`` split as ``C_j`` in ``j`` and the rest elsewhere; also ``τ_j ≥ t_k(d)``. The sum is
    smallest when ``j`` takes ``C_j = min(C, (N−d)·(t_k(d) − beta1))`` (the rest of ``j`` then ends with ``k``),
    which gives the bracket; minimising over ``d`` and maximising over ``k`` keeps it a bound for any split."""
    d = np.arange(1, N + 1, dtype=np.float64)
    intra = d <= cm.ranks_per_node
    ring = cm.alpha3 * (d - 1.0) / np.where(intra, cm.bandwidth_intra, cm.bandwidth_inter)  # per token, × d
    u = np.divide(cm.alpha1 * q, s, out=np.zeros_like(s), where=s > 0)  # alpha1·(1+η)·s: min(alpha1·q, r·s) = s·min(u, r)
    base = cm.alpha2 * s + cm.alpha_blk * b + cm.alpha_vis * v
    order = np.argsort(u, kind="stable")
    us, ss = u[order], s[order]
    su = np.concatenate(([0.0], np.cumsum(ss * us)))
    sc = np.concatenate(([0.0], np.cumsum(ss)))
    cut = np.searchsorted(us, ring, side="right")  # sequences with u ≤ ring pay alpha1·q, the others ring·s
    c_all = float(base.sum()) + su[cut] + ring * (sc[-1] - sc[cut])
    held = 0.0
    for k in top:
        fits = d >= max(1, math.ceil(float(s[k]) / cm.tokens_per_rank))
        t = np.asarray(cm.time(s[k], q[k], d, intra, B=b[k], V=v[k]), dtype=np.float64)
        c = c_all - (base[k] + s[k] * np.minimum(u[k], ring))
        lb = t + np.maximum(0.0, c - (N - d) * (t - cm.beta1)) / N
        if fits.any():
            held = max(held, float(lb[fits].min()))
    return held


def _loose(lengths: np.ndarray, split: list[np.ndarray], num_ranks: int, E: int) -> bool:
    """Whether every micro-batch of ``split`` fits its stage-1 bins (BFD with unit ``E``) in ``num_ranks`` ranks."""
    for ids in split:
        sub = lengths[ids]
        if sum(max(1, math.ceil(float(sub[g].sum()) / E)) for g in map(np.asarray, bfd_groups(sub, E))) > num_ranks:
            return False
    return True


def split_micro_batches(lengths: np.ndarray, etas: np.ndarray, num_ranks: int, cost_model: CostModel,
                        num_micro_batches: int, visual: np.ndarray | None = None) -> list[np.ndarray] | None:
    """Indices of each micro-batch (ascending), or None when this ``M`` does not fit."""
    M = int(num_micro_batches)
    if M < 1 or M > lengths.size:
        return None
    cap = num_ranks * cost_model.tokens_per_rank
    if M == 1:  # LPT into one micro-batch keeps every sequence, in index order, when the tokens fit
        return [np.arange(lengths.size, dtype=np.int64)] if float(lengths.sum()) <= cap else None
    work = work_proxy(lengths, etas, cost_model, visual)
    order = np.lexsort((np.arange(lengths.size), -work))
    # each to the micro-batch of least work with token room, lowest index on ties (lpt_exact: O(n log M))
    label = lpt_exact(work[order], lengths[order].astype(np.float64), np.zeros(M), np.zeros(M), float(cap))
    if label is None:
        return None
    mb = np.empty(lengths.size, dtype=np.int64)
    mb[order] = label
    counts = np.bincount(mb, minlength=M)
    if not counts.all():
        return None
    return np.split(np.argsort(mb, kind="stable"), np.cumsum(counts)[:-1])  # ascending ids per micro-batch


def _solve_split(split: list[np.ndarray], solve_one: SolveOne, swallow: bool = True, errors: list[str] | None = None
                 ) -> tuple[list[MicroBatchPlan], bool | None] | None:
    plans: list[MicroBatchPlan] = []
    optimal: bool | None = None
    for j, ids in enumerate(split):
        try:
            mb, opt = solve_one(ids, left=len(split) - j)
        except (TimeBudgetExceeded, OptionError):
            raise
        except ValueError as e:
            if not swallow:
                raise
            if errors is not None:
                errors.append(str(e))
            return None
        id_list = ids.tolist()
        groups = tuple(CPGroup(ranks=g.ranks, seq_ids=tuple(id_list[s] for s in g.seq_ids), time=g.time) for g in mb.groups)
        plans.append(MicroBatchPlan(groups=groups, makespan=mb.makespan))
        if opt is not None:
            optimal = opt if optimal is None else (optimal and opt)
    return plans, optimal


def _plan_fixed(lengths, etas, num_ranks, cost_model, solve_one, micro_batches, visual, lo):
    """Exactly ``micro_batches`` micro-batches (an int), or a ``ValueError`` that says what to change. When the
    work-balanced split finds none, or its split does not plan, the fallback splits of
    :mod:`~fcp_data.plan.fixed_split` are tried (only where this used to refuse: a split that plans is kept)."""
    n = lengths.size
    if isinstance(micro_batches, bool) or not isinstance(micro_batches, (int, np.integer)) or micro_batches < 1:
        raise ValueError(f"micro_batches must be a positive int or 'auto', got {micro_batches!r}")
    M = int(micro_batches)
    if M > n:
        raise ValueError(f"cannot split {n} sequences into {M} micro-batches (each needs at least one); use fewer")
    cap = num_ranks * cost_model.tokens_per_rank
    if M == 1:  # the hot path: the solver itself reports infeasibility
        if lengths.sum() <= cap:
            return _solve_split([np.arange(n, dtype=np.int64)], solve_one, swallow=False)
        split, errors, tried = None, [], []
    else:
        split, errors, tried = split_micro_batches(lengths, etas, num_ranks, cost_model, M, visual), [], ["work-balanced (LPT)"]
        if split is not None and (solved := _solve_split(split, solve_one, errors=errors)) is not None:
            return solved
        if (found := _fallback(lengths, M, cap, solve_one, tried)) is not None:
            return found
    why = f" (tried splits: {', '.join(tried)})" if tried else ""
    if errors:  # the work-balanced split exists but does not plan: the solver's reason, as before
        raise ValueError(f"{errors[0]}{why}")
    raise ValueError(f"the batch ({n} sequences, {int(lengths.sum())} tokens) does not fit in {M} micro-batch(es) "
                     f"on {num_ranks} ranks × {cost_model.tokens_per_rank} tokens_per_rank (at least {lo} "
                     f"needed by memory){why}; use micro_batches='auto' (--micro-batches auto) or a larger M")


def _fallback(lengths, M: int, cap: float, solve_one, tried: list[str]):
    """The first fallback split (:func:`~fcp_data.plan.fixed_split.fallback_splits`) that plans, or None; ``tried``
    gets each method looked at."""
    tried += fallback_methods(lengths.size)
    for _, split in fallback_splits(lengths, M, cap):
        if (solved := _solve_split(split, solve_one)) is not None:
            return solved
    return None


def plan_micro_batches(lengths: np.ndarray, etas: np.ndarray, num_ranks: int, cost_model: CostModel,
                       solve_one: SolveOne, micro_batches: int | str = "auto", *, extra: int = 2,
                       max_search: int = 16, visual: np.ndarray | None = None, prune: bool = True,
                       finish: Callable[[list[MicroBatchPlan]], list[MicroBatchPlan]] | None = None
                       ) -> tuple[list[MicroBatchPlan], bool | None]:
    """Plan a global batch; ``solve_one(ids)`` plans the sub-batch ``lengths[ids]`` (local seq ids).
    ``auto`` looks for the first ``M`` with loose stage-1 bins among ``⌈Σs/(N·E)⌉ … +max_search``, then ``extra`` more;
    ``prune=False`` solves every such ``M`` (the reference the pruned search must equal). ``finish`` (``auto`` only:
    :func:`~fcp_data.plan.solvers.plan_batch` re-plans the winner with the local search) is applied to the best split
    and, when a tight split beat the loose ones, to the best loose split too; the better finished one is returned, so
    solving tight splits never ends above the search without them."""
    lo = min_micro_batches(lengths, num_ranks, cost_model)
    if micro_batches != "auto":
        return _plan_fixed(lengths, etas, num_ranks, cost_model, solve_one, micro_batches, visual, lo)
    best, loose = _search_splits(lengths, etas, num_ranks, cost_model, solve_one, lo, extra, max_search, visual, prune)
    if finish is None:
        return best
    out = (finish(best[0]), best[1])
    if loose is not None and loose is not best:
        alt = (finish(loose[0]), loose[1])
        if sum(mb.makespan for mb in alt[0]) < sum(mb.makespan for mb in out[0]):
            out = alt
    return out


def _search_splits(lengths, etas, num_ranks, cost_model, solve_one, lo, extra, max_search, visual, prune):
    """``auto``'s search (module docstring): the best split over all, and the best loose one (None: none solved)."""
    n, E = lengths.size, cost_model.tokens_per_rank
    errors: list[str] = []
    best = loose_best = None
    best_cost = loose_cost = math.inf
    first_fit: int | None = None
    bound = None
    for M in range(lo, min(n, lo + max_search) + 1):
        if first_fit is not None and M > first_fit + extra:
            break
        lb = -math.inf
        if prune and best is not None:
            bound = bound or split_lower_bound(lengths, etas, num_ranks, cost_model, visual)
            lb = bound(M) * (1.0 - 1e-9)
            if lb >= loose_cost:
                break  # no M-split (and, the bound growing with M, no larger one) beats the best loose split
        split = split_micro_batches(lengths, etas, num_ranks, cost_model, M, visual)
        if split is None:
            continue
        loose = _loose(lengths, split, num_ranks, E)
        if not loose and lb >= best_cost:
            continue  # a tight split that cannot beat the best
        try:
            solved = _solve_split(split, solve_one, errors=errors)
        except TimeBudgetExceeded as e:
            if best is not None:
                break  # keep the best split solved within the budget
            raise TimeBudgetExceeded(f"{e} before any split of the {n} sequences into micro-batches was solved "
                                     f"(tried M = {lo}..{M}); raise the time limit or plan fewer sequences") from None
        if solved is None:
            continue
        cost = sum(mb.makespan for mb in solved[0])
        if loose:  # the window counts from the first split whose stage-1 bins fit: tight ones only add to it
            first_fit = M if first_fit is None else first_fit
            if cost < loose_cost:
                loose_best, loose_cost = solved, cost
        if cost < best_cost:
            best, best_cost = solved, cost
    if best is None:
        why = f"; the solver said: {errors[-1]}" if errors else ""
        raise ValueError(f"no split of the batch ({n} sequences) into micro-batches fits {num_ranks} ranks × "
                         f"{cost_model.tokens_per_rank} tokens_per_rank{why}")
    return best, loose_best
