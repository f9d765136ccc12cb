"""The FCP solver, the solver registry and :func:`plan_batch`, the one entry point (DESIGN §5).

FCP on one micro-batch searches over stage-1 groupings: BFD on memory with the paper's unit
``tokens_per_rank`` and with units ``total/K`` (:func:`~fcp_data.plan.bfd.candidate_units`), and LPT on
work into ``K`` groups (token packing ignores the quadratic attention; LPT balances it). Each grouping
gets stage 2 (exact allocation, any degree and powers of two), is placed on real ranks, and the plan with
the smallest real makespan wins; a local search then moves sequences out of the slowest group while that
helps (:func:`refine_moves`, ranks fixed). The makespan-driven groupings (:mod:`fcp_data.plan.tau`:
sequences slower than the target makespan alone on the fewest ranks that meet it, the rest LPT-balanced
on single ranks) keep wide rings off short sequences, whose ring traffic does not shrink with ``d``. ``fcp`` also
evaluates the static-cp configuration (uniform degree ``N/K`` on the LPT groupings, identical to the ``static-cp``
baseline) and the ``megatron-dynamic`` plan (for micro-batches of at most :data:`MEGATRON_CANDIDATE_MAX` sequences
× ranks, see there), so it is never worse than a baseline whose configuration lies in its search space. Where best
fit placement strands the slowest group across nodes, an in-node packing is tried (track ``"packed"`` and every
refined plan: :func:`~fcp_data.plan.placement.repack_stranded`). ``fcp-dp``
is the same search with the paper's 2-D DP as stage 2 (same optimum per grouping, slower); ``fcp-pow2``
keeps only power-of-two degrees (FlexSP-like).

On small micro-batches (at most :data:`~fcp_data.plan.search.SEARCH_MAX_SEQUENCES` sequences and
:data:`~fcp_data.plan.search.SEARCH_MAX_RANKS` ranks) a last track, ``any-search``, runs the stage-1
local search of :mod:`fcp_data.plan.search` (issue 12: near ``N·tokens_per_rank`` BFD scatters headroom
and the candidates above never form mixed splits such as 1 + 2 ranks): it starts from every other track's
incumbent grouping, so the plan is never slower than the planner without it (``search=False``), which
the tests keep as the reference. On a nearly full micro-batch (:data:`~fcp_data.plan.search.ESCALATE_FILL`) whose
best plan stays more than :data:`~fcp_data.plan.search.ESCALATE_GAP` above its lower bound, the search runs a second, longer
time, then from wider bins (``escalate``, default on; off with ``solver_options={"escalate": False}``). ``robust_tol > 0`` (opt-in) trades up to that share of predicted makespan
for insensitivity to profiling error (:mod:`fcp_data.plan.robust`: least mean regret over joint ±20 % scenarios
of every coefficient).

Determinism: every choice is a stable sort or an ``argmin`` with index tie-breaks, so identical inputs give identical
plans on every rank; only ``solve_ms`` differs."""

from __future__ import annotations

import contextlib
import time
from typing import Any

import numpy as np

from fcp_data.cost import MAX_RANKS, MAX_SEQUENCE_TOKENS, CostModel, sequence_terms
from fcp_data.plan.allocate import allocate_fast, pow2_mask, time_table
from fcp_data.plan.allocate_dp import allocate_dp
from fcp_data.plan.baselines import megatron_dynamic, work_proxy
from fcp_data.plan.bfd import bfd_groups, candidate_units, group_terms_of
from fcp_data.plan.inputs import check_seconds_option, does_not_fit, require_arrays, validate_inputs, validate_visual
from fcp_data.plan.lpt import labels_to_groups, lpt_labels
from fcp_data.plan.microbatch import TimeBudgetExceeded, plan_micro_batches
from fcp_data.plan.placed_search import PLACED_MAX_EVALS, placed_descent
from fcp_data.plan.placement import build_micro_batch, packed_placement, place_for_times, placed_times, repack_stranded
from fcp_data.plan.refine import refine_moves
from fcp_data.plan.registry import (MAX_DP_RANKS, SOLVER_NAMES, TIME_LIMIT_OPTION, InvalidPlanError, SolverCalls, SolverSpec,
                                     check_micro_batch, get_solver)
from fcp_data.plan.robust import retime, robust_choice, scenario_models
from fcp_data.plan.search import (ESCALATE_BUDGET, ESCALATE_ENUMERATE, ESCALATE_STARTS, ESCALATE_UNITS, ESCALATE_UNITS_BUDGET,
                                  SEARCH_STARTS, escalation_due, polisher, search_groupings, wider_bins)
from fcp_data.plan.tau import tau_groupings
from fcp_data.plan.types import MicroBatchPlan, Plan

__all__ = ["plan_batch", "SOLVERS", "SOLVER_NAMES", "fcp_micro_batch", "refine_moves", "validate_inputs",
           "MAX_RANKS", "MAX_SEQUENCE_TOKENS", "MAX_DP_RANKS"]

# Above this many (sequences × ranks) FCP does not evaluate the megatron-dynamic candidate: its greedy runs up
# to N/2 LPTs of all n sequences, O(N·n) Python steps per micro-batch (at 1024 ranks and 40k sequences 2 s of
# every 3), while FCP's makespan-driven power-of-two groupings (``pow2-tau``: long sequences alone on
# power-of-two rings, the rest LPT-balanced on single ranks) cover the same family of configurations: on the
# large micro-batches measured (benchmarks/bench_planner.py --only nscaling) megatron's makespan was 1.3-2.4×
# FCP's. Every test instance (and 64 ranks × 512 sequences, the paper's setting) stays far below the bound.
MEGATRON_CANDIDATE_MAX = 1 << 23
ROBUST_POOL = 0  # stage-1 candidates the robust mode also weighs (32: bench_plan_robustness v2 ±20 % +3.62 % vs +2.89 %)
_TAU_REFINE_SLACK = 1.05  # a makespan-driven candidate is refined only if within 5 % of the best refined plan


def _candidate_groupings(lengths: np.ndarray, etas: np.ndarray, num_ranks: int, cost_model: CostModel, visual=None):
    """Stage-1 groupings FCP tries, as ``(groups, uniform_degree | None, family, gid | None)``: BFD on memory for each
    bin unit, then LPT on work into ``K = N/d`` groups for every divisor ``d`` of ``N`` and ``K = N, N/2, …``
    (balances the quadratic attention that token-packing ignores). For ``K = N/d`` the uniform degree
    ``d`` — the static-cp configuration — is evaluated as well. Last the makespan-driven groupings of
    :func:`~fcp_data.plan.tau.tau_groupings` (long sequences alone, the rest LPT-balanced on single
    ranks), families ``"-tau"``, ``"-tau+"`` (headroom filled), ``"-tauc"`` (coarse rings): they keep
    their own incumbents, so adding them never loses a plan that refinement would have improved."""
    E = cost_model.tokens_per_rank
    for unit in candidate_units(float(lengths.sum()), num_ranks, E):
        yield bfd_groups(lengths, unit), None, "", None
    work = work_proxy(lengths, etas, cost_model, visual)
    ks = {num_ranks // d for d in range(1, num_ranks + 1) if num_ranks % d == 0}
    k = num_ranks
    while k >= 1:
        ks.add(k)
        k //= 2
    for k in sorted(ks, reverse=True):  # with each grouping its group of each sequence (group_terms_of's gid)
        if (label := lpt_labels(work, lengths, k, (num_ranks // k) * E)) is not None:
            groups, gid = labels_to_groups(label, k, gid=True)
            yield groups, (num_ranks // k if num_ranks % k == 0 else None), "", gid
    for groups, filled in tau_groupings(lengths, etas, num_ranks, cost_model, visual=visual):
        yield groups, None, {True: "-tau+", False: "-tau", None: "-tauc"}[filled], None


def fcp_micro_batch(lengths: np.ndarray, etas: np.ndarray, num_ranks: int, cost_model: CostModel, *,
                    allocator: str = "fast", degrees: str = "any", with_baselines: bool = True,
                    visual: np.ndarray | None = None, search: bool = True, robust_tol: float = 0.0,
                    escalate: bool = True) -> MicroBatchPlan:
    """FCP on one micro-batch (see the module docstring). ``degrees``: ``"any"`` (tries powers of two
    too) or ``"pow2"``; ``allocator``: ``"fast"`` or ``"dp"``; ``visual``: visual tokens per sequence;
    ``search``: also run the stage-1 local search of :mod:`fcp_data.plan.search` on small micro-batches
    (``degrees="any"`` only; ``False`` is exactly the planner before issue 12, kept as the reference);
    ``robust_tol``: when > 0, run the candidate of least mean regret over joint coefficient-error scenarios among
    those within ``(1 + robust_tol)`` of the best predicted makespan (:func:`~fcp_data.plan.robust.robust_choice`;
    it plans once per scenario, ~30x the time); the
    default 0 keeps the guarantees (never slower than a baseline or than the planner before issue 12);
    ``escalate``: let the search run a second, longer time where its plan stays more than
    :data:`~fcp_data.plan.search.ESCALATE_GAP` above the micro-batch lower bound (the robust mode's scenario plans
    are made without it: they only widen its candidate set)."""
    require_arrays("fcp_micro_batch", lengths, etas, num_ranks, cost_model)
    alloc = {"fast": allocate_fast, "dp": allocate_dp}[allocator]
    pow2 = pow2_mask(num_ranks)
    # Tracks, each with its own incumbent so that pruning in one never changes another: "pow2" is exactly
    # what fcp-pow2 computes, "uniform" exactly static-cp; FCP ends with the best of all (after refinement).
    tracks = {"pow2": pow2} if degrees == "pow2" else {"any": None, "pow2": pow2}
    inc = _Incumbents(num_ranks, cost_model, pow2, robust_tol > 0)
    best, consider, pool = inc.best, inc.consider, inc.pool
    _stage1(lengths, etas, num_ranks, cost_model, visual, tracks, alloc, inc, with_baselines)
    if search and degrees == "any":
        _search_candidates(lengths, etas, num_ranks, cost_model, visual, best, alloc, consider, escalate)
    plans = _refined_plans(best, lengths, etas, num_ranks, cost_model, visual)
    if with_baselines and lengths.size * num_ranks <= MEGATRON_CANDIDATE_MAX:
        with contextlib.suppress(ValueError):  # no megatron configuration fits: no candidate; ties go to earlier plans
            below = None if pool is not None else min((p.makespan for p, _ in plans), default=None)
            if (mb := megatron_dynamic(lengths, etas, num_ranks, cost_model, visual=visual, below=below)) is not None:
                plans.append((mb, False))
    if not plans:
        raise does_not_fit(lengths, num_ranks, cost_model, pow2=degrees == "pow2")
    if pool is not None:
        plan, refined = _robust_pick(plans, pool, lengths, etas, num_ranks, cost_model, visual, robust_tol,
                                     dict(allocator=allocator, degrees=degrees, with_baselines=with_baselines, search=search,
                                          escalate=False))
    else:
        plan, refined = min(plans, key=lambda p: p[0].makespan)  # first on ties: any, pow2, …-tau, uniform, megatron
    # a baseline plan won: refine it too (never increases the makespan), and pack a stranded slowest group
    return plan if refined else repack_stranded(refine_moves(plan, lengths, etas, cost_model, visual=visual), lengths,
                                                etas, num_ranks, cost_model, visual)


class _Incumbents:
    """Each track's best candidate ``track -> (makespan, groups, degrees, (S, Q, B, V), ranks | None)``: :meth:`consider` places a
    candidate only when its ideal (table) value can beat the track's incumbent; ``pool`` keeps every candidate
    for the robust choice (None otherwise)."""

    def __init__(self, num_ranks: int, cost_model: CostModel, pow2: np.ndarray, keep_pool: bool) -> None:
        self.num_ranks, self.cost_model, self.pow2 = num_ranks, cost_model, pow2
        R = cost_model.ranks_per_node
        self.buddy = R & (R - 1) == 0 and num_ranks % R == 0
        self.best: dict[str, tuple] = {}
        self.pool: list | None = [] if keep_pool else None

    def beaten(self, track: str, value: float) -> bool:
        """Whether :meth:`consider` would drop every candidate of ideal value ``value`` or more on ``track`` (never in the robust mode)."""
        inc = self.best.get(track)
        return self.pool is None and inc is not None and not value < inc[0] * (1 + 1e-12)

    def consider(self, track: str, value: float, deg: np.ndarray, groups, agg) -> None:
        if self.pool is not None:
            self.pool.append((value, groups, deg, agg))
        inc = self.best.get(track)
        if inc is not None and not value < inc[0] * (1 + 1e-12):
            return  # real makespan ≥ ideal value ≥ incumbent
        ranks = None  # kept with the incumbent: building its plan places it exactly so (same inputs)
        if self.buddy and bool(np.all(self.pow2[deg - 1])):
            span = value  # powers of two always pack into power-of-two nodes: placed time == table time
        else:
            S, Q, B, V = agg
            cm = self.cost_model
            ranks = place_for_times(S, Q, deg, self.num_ranks, cm, B=B, V=V)
            span = float((times := placed_times(S, Q, ranks, cm, B, V)).max())
            # the in-node packing of a stranded slowest group: its own track, so the others stay as they were
            alt = None if track.startswith("pow2") else packed_placement(ranks, S, Q, self.num_ranks, cm, B, V, times=times)
            if alt is not None and ("packed" not in self.best or alt[1].max() < self.best["packed"][0]):
                self.best["packed"] = (float(alt[1].max()), groups, deg, agg, alt[0])
        if inc is None or span < inc[0]:
            self.best[track] = (span, groups, deg, agg, ranks)


def _stage1(lengths, etas, num_ranks: int, cost_model: CostModel, visual, tracks: dict, alloc, inc: "_Incumbents",
            with_baselines: bool) -> None:
    """Every stage-1 grouping of :func:`_candidate_groupings` through stage 2 on each track (and its uniform
    degree, the static-cp configuration, when it has one). A restricted track (pow2) is not allocated when the
    unrestricted one's value already fails its incumbent: its optimum is never below (a subset of the same
    table entries), so :meth:`_Incumbents.consider` would drop it."""
    consider, terms = inc.consider, sequence_terms(lengths, etas, visual)  # the per-sequence terms, once
    seen: set[tuple[tuple[int, ...], ...]] = set()
    for groups, uniform, family, gid in _candidate_groupings(lengths, etas, num_ranks, cost_model, visual):
        if len(groups) > num_ranks:
            continue
        key = tuple(tuple(g) for g in groups)
        repeat = key in seen  # membership only; iteration order never reaches the result
        if repeat and (uniform is None or not with_baselines):
            continue
        seen.add(key)
        agg = group_terms_of(groups, lengths, etas, visual, terms=terms, gid=gid)
        table = time_table(agg[0], agg[1], num_ranks, cost_model, B=agg[2], V=agg[3], sparse=True)
        floor = None  # the unrestricted track's value (tracks: "any" first)
        for track, mask in () if repeat else tracks.items():  # a repeat still gets its uniform degree below
            if floor is not None and (not np.isfinite(floor) or inc.beaten(track + family, floor)):
                continue
            value, deg = alloc(table, num_ranks, allowed=mask)
            floor = value if mask is None else floor
            if deg is not None:
                consider(track + family, value, deg, groups, agg)
        if uniform is not None and with_baselines:
            value = float(table[:, uniform - 1].max())  # inf when memory fails
            if np.isfinite(value):
                consider("uniform", value, np.full(len(groups), uniform, dtype=np.int64), groups, agg)


def _robust_pick(plans, pool, lengths, etas, num_ranks: int, cost_model: CostModel, visual, tol: float,
                 opts: dict) -> tuple[MicroBatchPlan, bool]:
    """The robust mode's ``(plan, refined)``: the candidates are the tracks' plans, every stage-1 candidate
    whose ideal makespan is within ``(1 + tol)`` of the best plan (placed), and the plans FCP makes for the
    scenario models (:func:`~fcp_data.plan.search.scenario_models`, judged by this model);
    :func:`~fcp_data.plan.search.robust_choice` picks one."""
    limit = min(p.makespan for p, _ in plans) * (1 + tol)
    seen = set()
    for value, groups, deg, (S, Q, B, V) in sorted(pool, key=lambda c: c[0]):
        key = (tuple(tuple(g) for g in groups), tuple(deg.tolist()))
        if value <= limit and key not in seen and len(seen) < ROBUST_POOL:
            seen.add(key)
            plans.append((build_micro_batch(groups, deg, S, Q, num_ranks, cost_model, B=B, V=V), False))
    plans += [(retime(fcp_micro_batch(lengths, etas, num_ranks, m, visual=visual, **opts), lengths, etas, cost_model,
                      visual), True) for m in scenario_models(cost_model)]
    return plans[robust_choice([p for p, _ in plans], lengths, etas, cost_model, tol, visual)]


def _refined_plans(best: dict, lengths, etas, num_ranks: int, cost_model: CostModel, visual
                   ) -> list[tuple[MicroBatchPlan, bool]]:
    """Each track's incumbent placed and refined (:func:`refine_moves`; ``uniform`` is kept as the static-cp plan), as
    ``(plan, refined)`` in track order; a makespan-driven track more than :data:`_TAU_REFINE_SLACK` above the best is skipped."""
    plans: list[tuple[MicroBatchPlan, bool]] = []
    pow2_spans: list[float] = []  # the pow2 tracks prune only against each other, exactly as fcp-pow2 does
    done: dict[tuple, tuple[MicroBatchPlan, MicroBatchPlan | None]] = {}  # (grouping, degrees) -> (placed, refined)
    terms = sequence_terms(lengths, etas, visual)  # every track's refinement uses the same per-sequence terms
    for track in ("any", "pow2", "any-tau", "any-tau+", "any-tauc", "pow2-tau", "pow2-tau+", "pow2-tauc", "uniform",
                  "any-search", "packed"):
        if track in best:
            span, groups, deg, (S, Q, B, V), ranks = best[track]
            rivals = pow2_spans if track.startswith("pow2") else [p[0].makespan for p in plans]
            if "tau" in track and rivals and span >= _TAU_REFINE_SLACK * min(rivals):
                continue  # refinement rarely gains that much: not worth its time
            # tracks often share an incumbent (any = pow2 = uniform on loose batches): placement and refinement
            # are deterministic, so it is placed and refined once (the groups object is alive in best: id is safe)
            key = (id(groups), deg.tobytes())
            mb, refined = done.get(key, (None, None))
            if mb is None:
                mb = build_micro_batch(groups, deg, S, Q, num_ranks, cost_model, B=B, V=V, ranks=ranks)
            if track != "uniform" and refined is None:
                refined = repack_stranded(refine_moves(mb, lengths, etas, cost_model, visual=visual, terms=terms),
                                          lengths, etas, num_ranks, cost_model, visual)
            done[key] = (mb, refined)
            plans.append((refined, True) if track != "uniform" else (mb, False))
            if track.startswith("pow2"):
                pow2_spans.append(plans[-1][0].makespan)
    return plans


def _search_candidates(lengths, etas, num_ranks, cost_model, visual, best, alloc, consider,
                       escalate: bool = True) -> None:
    """Track ``"any-search"``: the local search of :func:`~fcp_data.plan.search.search_groupings` from the other
    tracks' incumbents (so it only improves on them) and its own starts; each grouping found is a candidate like any.
    With ``escalate``, while the plan stays far above the bound (:func:`~fcp_data.plan.search.escalation_due`): a
    longer search (``ESCALATE_*``), one from :func:`wider_bins` (``ESCALATE_UNITS``), then a descent on the placed
    makespan (:func:`~fcp_data.plan.placed_search.placed_descent`); why: the comments at those constants."""
    seeds = [best[t][1] for t in sorted(best)]
    work = work_proxy(lengths, etas, cost_model, visual)

    def run(**limits) -> None:
        for groups in search_groupings(lengths, etas, num_ranks, cost_model, seeds, work, visual, **limits):
            agg = group_terms_of(groups, lengths, etas, visual)
            value, deg = alloc(time_table(agg[0], agg[1], num_ranks, cost_model, B=agg[2], V=agg[3], sparse=True), num_ranks)
            if deg is not None:
                consider("any-search", value, deg, groups, agg)

    def far() -> bool:  # nearly full and still far above the lower bound
        return bool(best) and escalation_due(lengths, etas, num_ranks, cost_model, visual, min(b[0] for b in best.values()))

    run()
    if escalate and far():  # a longer search from every incumbent (the first one's too), then from wider bins
        seeds = [best[t][1] for t in sorted(best)]
        run(budget=ESCALATE_BUDGET, num_starts=ESCALATE_STARTS, enumerate_max=ESCALATE_ENUMERATE)
        if ESCALATE_UNITS > 1 and far():
            seeds = wider_bins(lengths, num_ranks, cost_model.tokens_per_rank, ESCALATE_UNITS)
            run(budget=ESCALATE_UNITS_BUDGET, num_starts=SEARCH_STARTS)
        if PLACED_MAX_EVALS and far() and (found := placed_descent(min(best.values(), key=lambda b: b[0])[1], lengths,
                                                                   etas, num_ranks, cost_model, visual, PLACED_MAX_EVALS)):
            consider("any-search", *found)


DEFAULT_TIME_LIMIT = 30.0  # seconds, for a time-limited solver (the ILP) when the caller gives none


def _check_options(spec: SolverSpec, options: dict[str, Any]) -> None:
    """Only the options ``spec`` declares (a ``TypeError``, as for any unexpected keyword argument)."""
    unknown = sorted(k for k in options if k not in spec.options)
    if unknown:
        raise TypeError(f"solver {spec.name!r} does not take option(s) {', '.join(unknown)}; its options: {', '.join(spec.options) or 'none'}")


def _solve(spec: SolverSpec, lengths: np.ndarray, etas: np.ndarray, num_ranks: int, cost_model: CostModel,
           visual: np.ndarray | None, options: dict[str, Any], broken: list[InvalidPlanError]):
    """``spec.solve`` on one micro-batch. A registered (validated) solver's ``ValueError`` is prefixed with its
    name and its plan is checked; a broken plan is also kept in ``broken`` so that the micro-batch planner,
    which reads a ``ValueError`` as "this split does not fit", cannot hide it."""
    if not spec.validate:
        return spec.solve(lengths, etas, num_ranks, cost_model, visual=visual, **options)
    try:
        result = spec.solve(lengths, etas, num_ranks, cost_model, visual=visual, **options)
    except TimeBudgetExceeded:
        raise
    except ValueError as err:
        raise ValueError(f"solver {spec.name!r}: {err}") from err
    try:
        return check_micro_batch(spec, result, lengths, etas, num_ranks, cost_model, visual)
    except InvalidPlanError as err:
        broken.append(err)
        raise


def plan_batch(lengths, *, num_ranks: int, cost_model: CostModel, etas=None, solver: str = "fcp",
               micro_batches: int | str = 1, visual=None, **solver_options: Any) -> Plan:
    """Plan a global batch of sequence ``lengths`` onto ``num_ranks`` ranks.

    ``micro_batches``: an int ``M`` (exactly M micro-batches) or ``"auto"`` (micro-batch planner).
    ``solver``: a registered solver (:data:`SOLVER_NAMES`, :mod:`fcp_data.plan.registry`). ``solver_options``
    go to the solver; each solver takes only the options its spec declares, another is a ``TypeError``
    (``ulysses``: ``num_heads``, ``num_kv_heads``, ``degree``; ``static-cp``: ``degree``; ``exhaustive``:
    ``max_sequences``; ``ilp``: ``max_sequences`` and ``time_limit``, the budget in seconds of the whole call —
    all micro-batches and all ``auto`` candidates together, default 30 — as for any time-limited solver).
    ``seq_ids`` in the plan index ``lengths``. ``visual``: visual tokens per sequence (§4.1; None = text only,
    ``0 ≤ v ≤ s``). Raises ``ValueError`` with the fix for infeasible input (:class:`InvalidPlanError` when a
    registered solver returns a broken plan); ``num_ranks`` is at most the solver's ``max_ranks``
    (:data:`MAX_RANKS`; ``fcp-dp``: :data:`MAX_DP_RANKS`).
    """
    t0 = time.perf_counter()
    spec = get_solver(solver)
    arr, e = validate_inputs(lengths, etas, num_ranks, cost_model)
    vis = validate_visual(visual, arr)
    num_ranks = int(num_ranks)
    _check_options(spec, solver_options)
    if num_ranks > spec.max_ranks:
        raise ValueError(f"{spec.name} ({spec.help}) plans at most {spec.max_ranks} ranks, got {num_ranks}; use fcp, "
                         f"which plans up to {MAX_RANKS} ranks")
    deadline = limit = None
    if spec.time_limited:
        limit = check_seconds_option(TIME_LIMIT_OPTION, solver_options.pop(TIME_LIMIT_OPTION, DEFAULT_TIME_LIMIT))
        deadline = t0 + limit
    broken: list[InvalidPlanError] = []

    def solve_one(ids: np.ndarray, left: int = 1):
        opts = solver_options
        if deadline is not None:  # one budget for the whole call: this micro-batch gets its share of what is left
            remaining = deadline - time.perf_counter()
            if remaining <= 0.05 * left:
                raise TimeBudgetExceeded(f"the {solver} time limit of {limit:g} s (for the whole batch) ran out")
            opts = {**solver_options, TIME_LIMIT_OPTION: remaining / left}
        return _solve(spec, arr[ids], e[ids], num_ranks, cost_model, None if vis is None else vis[ids], opts, broken)

    # the stage-1 local search (fcp) runs on the chosen split only: `auto` compares several splits with the
    # search off, then each micro-batch of the winner is re-planned with it (kept where it is faster)
    polish = micro_batches == "auto" and "search" in spec.options and "search" not in solver_options
    try:
        if polish:
            solver_options["search"] = False
        mbs, optimal = plan_micro_batches(arr, e, num_ranks, cost_model, solve_one, micro_batches, visual=vis,
                                          finish=polisher(solver_options, solve_one, num_ranks) if polish else None)
    except ValueError:
        if broken:
            raise broken[0] from None
        raise
    if broken:
        raise broken[0]
    return Plan(num_ranks=num_ranks, solver=solver, solve_ms=(time.perf_counter() - t0) * 1e3,
                makespan=float(sum(mb.makespan for mb in mbs)), micro_batches=tuple(mbs), optimal=optimal)


SOLVERS = SolverCalls(plan_batch)  # live: name -> plan_batch with the solver fixed, registered solvers included
