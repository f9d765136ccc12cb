"""The FCP solver, the solver registry and :func:`plan_batch`, the one entry point (DESIGN §5).

FCP on one micro-batch: for each bin unit of :func:`~fcp_data.plan.bfd.candidate_units` (the paper's
``tokens_per_rank`` first, then finer units for light batches) run stage 1 (BFD) and stage 2 (exact
allocation, any degree and powers of two), place the groups on real ranks and keep the plan with the
smallest real makespan. ``fcp`` also evaluates the ``static-cp`` and ``megatron-dynamic`` plans and keeps
them if they are better (cheap, and it guarantees FCP is never worse than a baseline whose configuration
lies in its search space). ``fcp-dp`` is the same search with the paper's 2-D DP as stage 2 (same optimum
per grouping, slower); ``fcp-pow2`` keeps only power-of-two degrees (FlexSP-like).

Determinism: every choice is a stable sort or an ``argmin`` with index tie-breaks, so identical inputs
give identical plans on every rank; only ``solve_ms`` differs.
"""

from __future__ import annotations

import functools
import time
from typing import Any, Callable

import numpy as np

from fcp_data.cost import CostModel
from fcp_data.plan.allocate import allocate_dp, allocate_fast, pow2_mask, time_table
from fcp_data.plan.baselines import megatron_dynamic, static_cp, ulysses, work_proxy
from fcp_data.plan.bfd import bfd_groups, candidate_units, group_aggregates_of, lpt_groups
from fcp_data.plan.microbatch import plan_micro_batches
from fcp_data.plan.placement import build_micro_batch, place_groups, placed_times
from fcp_data.plan.types import MicroBatchPlan, Plan

__all__ = ["plan_batch", "SOLVERS", "SOLVER_NAMES", "fcp_micro_batch", "validate_inputs"]

SOLVER_NAMES = ("fcp", "fcp-dp", "ilp", "exhaustive", "static-cp", "ulysses", "megatron-dynamic", "fcp-pow2")


def _candidate_groupings(lengths: np.ndarray, etas: np.ndarray, num_ranks: int, cost_model: CostModel):
    """Stage-1 groupings FCP tries, as ``(groups, uniform_degree | None)``: BFD on memory for each bin
    unit, then LPT on work into ``K = N/d`` groups for every divisor ``d`` of ``N`` and ``K = N, N/2, …``
    (balances the quadratic attention that token-packing ignores). For ``K = N/d`` the uniform degree
    ``d`` — the static-cp configuration — is evaluated as well."""
    E = cost_model.tokens_per_rank
    for unit in candidate_units(float(lengths.sum()), num_ranks, E):
        yield bfd_groups(lengths, unit), None
    work = work_proxy(lengths, etas, cost_model)
    ks = {num_ranks // d for d in range(1, num_ranks + 1) if num_ranks % d == 0}
    k = num_ranks
    while k >= 1:
        ks.add(k)
        k //= 2
    for k in sorted(ks, reverse=True):
        groups = lpt_groups(work, lengths, k, (num_ranks // k) * E)
        if groups is not None:
            yield groups, (num_ranks // k if num_ranks % k == 0 else None)


def fcp_micro_batch(lengths: np.ndarray, etas: np.ndarray, num_ranks: int, cost_model: CostModel, *,
                    allocator: str = "fast", degrees: str = "any", with_baselines: bool = True) -> MicroBatchPlan:
    """FCP on one micro-batch (see the module docstring). ``degrees``: ``"any"`` (tries powers of two
    too) or ``"pow2"``; ``allocator``: ``"fast"`` or ``"dp"``."""
    alloc = {"fast": allocate_fast, "dp": allocate_dp}[allocator]
    pow2 = pow2_mask(num_ranks)
    masks = [pow2] if degrees == "pow2" else [None, pow2]
    R = cost_model.ranks_per_node
    best = None  # (makespan, groups, degrees, S, Q)
    seen: set[tuple[tuple[int, ...], ...]] = set()
    for groups, uniform in _candidate_groupings(lengths, etas, num_ranks, cost_model):
        if len(groups) > num_ranks:
            continue
        key = tuple(tuple(g) for g in groups)
        if key in seen:  # membership only; iteration order never reaches the result
            continue
        seen.add(key)
        S, Q = group_aggregates_of(groups, lengths, etas)
        table = time_table(S, Q, num_ranks, cost_model)
        options: list[np.ndarray] = []
        for mask in masks:
            T = table if mask is None else np.where(mask[None, :], table, np.inf)
            value, deg = alloc(T, num_ranks)
            if deg is not None and (best is None or value < best[0] * (1 + 1e-12) or value == 0):
                options.append(deg)
        if uniform is not None and with_baselines and (degrees == "any" or pow2[uniform - 1]):
            value = float(table[:, uniform - 1].max())  # inf when memory fails
            if np.isfinite(value) and (best is None or value < best[0] * (1 + 1e-12)):
                options.append(np.full(len(groups), uniform, dtype=np.int64))
        done: list[tuple[int, ...]] = []
        for deg in options:
            if tuple(deg) in done:
                continue
            done.append(tuple(deg))
            ranks = place_groups(deg, num_ranks, R)
            span = float(placed_times(S, Q, ranks, cost_model).max())
            if best is None or span < best[0]:
                best = (span, groups, deg, S, Q)
    result = None
    if best is not None:
        result = build_micro_batch(best[1], best[2], best[3], best[4], num_ranks, cost_model)
    if with_baselines:
        for baseline in (megatron_dynamic,):  # static-cp is the uniform option of the LPT groupings
            try:
                mb = baseline(lengths, etas, num_ranks, cost_model)
            except ValueError:
                continue
            if result is None or mb.makespan < result.makespan:
                result = mb
    if result is None:
        total = int(lengths.sum())
        need = sum(cost_model.min_degree(float(lengths[g].sum())) for g in map(np.asarray, bfd_groups(lengths, cost_model.tokens_per_rank)))
        raise ValueError(f"the micro-batch ({lengths.size} sequences, {total} tokens) does not fit on {num_ranks} "
                         f"ranks: its groups need {need} ranks at tokens_per_rank={cost_model.tokens_per_rank}; "
                         "split it into more micro-batches (micro_batches='auto')")
    return result


def _exact(name: str) -> Callable[..., tuple[MicroBatchPlan, bool | None]]:
    def run(lengths, etas, num_ranks, cost_model, **opts):
        if name == "ilp":
            from fcp_data.plan.ilp import solve_ilp

            return solve_ilp(lengths, etas, num_ranks, cost_model, **opts)
        from fcp_data.plan.exhaustive import solve_exhaustive

        return solve_exhaustive(lengths, etas, num_ranks, cost_model, **opts)

    return run


def _plain(fn: Callable[..., MicroBatchPlan], **fixed: Any) -> Callable[..., tuple[MicroBatchPlan, bool | None]]:
    def run(lengths, etas, num_ranks, cost_model, **opts):
        return fn(lengths, etas, num_ranks, cost_model, **fixed, **opts), None

    return run


_MB_SOLVERS: dict[str, Callable[..., tuple[MicroBatchPlan, bool | None]]] = {
    "fcp": _plain(fcp_micro_batch),
    "fcp-dp": _plain(fcp_micro_batch, allocator="dp"),
    "ilp": _exact("ilp"),
    "exhaustive": _exact("exhaustive"),
    "static-cp": _plain(static_cp),
    "ulysses": _plain(ulysses),
    "megatron-dynamic": _plain(megatron_dynamic),
    "fcp-pow2": _plain(fcp_micro_batch, degrees="pow2", with_baselines=False),
}


def validate_inputs(lengths, etas, num_ranks: int, cost_model: CostModel) -> tuple[np.ndarray, np.ndarray]:
    """Checked int64 lengths and float64 etas; ``ValueError`` naming the offending entry otherwise."""
    if not isinstance(cost_model, CostModel):
        raise TypeError(f"cost_model must be a CostModel, got {type(cost_model).__name__}")
    if isinstance(num_ranks, bool) or not isinstance(num_ranks, (int, np.integer)) or num_ranks < 1:
        raise ValueError(f"num_ranks must be a positive int, got {num_ranks!r}")
    arr = np.asarray(lengths)
    if arr.ndim != 1:
        raise ValueError(f"lengths must be a 1-D sequence of token counts, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError("no sequences to plan: lengths is empty")
    if not np.issubdtype(arr.dtype, np.number) or np.issubdtype(arr.dtype, np.complexfloating):
        raise ValueError(f"lengths must be integers, got dtype {arr.dtype}")
    if np.issubdtype(arr.dtype, np.floating):
        bad = np.flatnonzero(~np.isfinite(arr) | (arr != np.round(arr)))
        if bad.size:
            raise ValueError(f"lengths must be whole token counts; sequence {bad[0]} is {arr[bad[0]]}")
    arr = arr.astype(np.int64)
    bad = np.flatnonzero(arr <= 0)
    if bad.size:
        raise ValueError(f"lengths must be > 0; sequence {bad[0]} has {arr[bad[0]]} tokens (drop empty sequences)")
    cap = int(num_ranks) * cost_model.tokens_per_rank
    over = np.flatnonzero(arr > cap)
    if over.size:
        i = int(over[np.argmax(arr[over])])
        raise ValueError(f"sequence {i} has {arr[i]} tokens but {num_ranks} ranks × {cost_model.tokens_per_rank} "
                         f"tokens_per_rank hold at most {cap} ({over.size} such sequence(s)); truncate or drop it "
                         "(--on-overlong truncate|drop) or add ranks")
    if etas is None:
        e = np.zeros(arr.size)
    else:
        e = np.asarray(etas, dtype=np.float64)
        if e.shape != arr.shape:
            raise ValueError(f"etas has shape {e.shape} but lengths has {arr.shape}; give one η per sequence")
        if not np.all(np.isfinite(e)) or np.any(e < 0):
            raise ValueError("etas must be finite and >= 0 (0 causal, 1 full attention)")
    return arr, e


def plan_batch(lengths, *, num_ranks: int, cost_model: CostModel, etas=None, solver: str = "fcp",
               micro_batches: int | str = 1, **solver_options: Any) -> Plan:
    """Plan a global batch of sequence ``lengths`` onto ``num_ranks`` ranks.

    ``micro_batches``: an int ``M`` (exactly M micro-batches) or ``"auto"`` (micro-batch planner).
    ``solver``: one of :data:`SOLVER_NAMES`. ``solver_options`` go to the solver (``ulysses``:
    ``num_heads``, ``num_kv_heads``; ``ilp``: ``time_limit``). ``seq_ids`` in the plan index ``lengths``.
    Raises ``ValueError`` with the fix for infeasible input.
    """
    t0 = time.perf_counter()
    if solver not in _MB_SOLVERS:
        raise ValueError(f"unknown solver {solver!r}; valid: {', '.join(SOLVER_NAMES)}")
    arr, e = validate_inputs(lengths, etas, num_ranks, cost_model)
    fn = _MB_SOLVERS[solver]
    num_ranks = int(num_ranks)

    def solve_one(ids: np.ndarray):
        return fn(arr[ids], e[ids], num_ranks, cost_model, **solver_options)

    mbs, optimal = plan_micro_batches(arr, e, num_ranks, cost_model, solve_one, micro_batches)
    return Plan(num_ranks=num_ranks, solver=solver, solve_ms=(time.perf_counter() - t0) * 1e3,
                makespan=float(sum(mb.makespan for mb in mbs)), micro_batches=tuple(mbs), optimal=optimal)


SOLVERS: dict[str, Callable[..., Plan]] = {name: functools.partial(plan_batch, solver=name) for name in SOLVER_NAMES}
