"""One suite over every solver (DESIGN §5/§6): the plan invariants every solver must keep.

A failure names the solver and the instance; it means a solver returns a plan the executor cannot run
(a sequence lost or duplicated, overlapping ranks, memory overflow) or reports times that do not match
the §4 formula on the ranks it actually chose.
"""

from __future__ import annotations

import numpy as np
import pytest

from fcp_data.cost import CostModel
from fcp_data.plan import SOLVER_NAMES, SOLVERS, Plan, plan_batch
from fcp_data.plan.baselines import ulysses_time

CM = CostModel(alpha1=2e-9, alpha2=1e-4, alpha3=3e5, beta1=0.01, beta2=0.02, bandwidth_intra=1e11,
               bandwidth_inter=1.2e10, ranks_per_node=4, tokens_per_rank=8192)

# (name, lengths, etas, num_ranks): tiny ones (≤ 7 sequences) run every solver incl. exhaustive/ILP.
TINY = [
    ("one-long", [20000, 500, 300, 100], None, 8),
    ("mixed-full-attn", [9000, 4000, 4000, 2500, 700, 60], [0, 1, 0, 1, 0, 0], 8),
    ("uniform", [3000] * 7, None, 6),
    ("single", [12000], None, 4),
]
LARGER = [
    ("multi-node", list(np.random.default_rng(1).integers(50, 9000, size=60)) + [30000, 20000], None, 16),
    ("ragged-nodes", list(np.random.default_rng(2).integers(100, 6000, size=40)), None, 10),
]
FAST_SOLVERS = [s for s in SOLVER_NAMES if s not in ("ilp", "exhaustive")]


def _cases():
    for name, lengths, etas, n in TINY:
        for solver in SOLVER_NAMES:
            yield pytest.param(solver, lengths, etas, n, id=f"{solver}-{name}")
    for name, lengths, etas, n in LARGER:
        for solver in FAST_SOLVERS:
            yield pytest.param(solver, lengths, etas, n, id=f"{solver}-{name}")


def _expected_time(solver: str, s: np.ndarray, e: np.ndarray, ranks: tuple[int, ...]) -> float:
    S, Q = float(s.sum()), float(((1 + e) * s * s).sum())
    if solver == "ulysses":  # its own documented all-to-all formula on §4 coefficients
        return float(ulysses_time(np.array([S]), np.array([Q]), [ranks], CM, num_heads=32, num_kv_heads=8)[0])
    d = len(ranks)
    v = CM.bandwidth_intra if len({r // CM.ranks_per_node for r in ranks}) == 1 else CM.bandwidth_inter
    A = CM.alpha1 * Q / d
    C = A + CM.alpha2 * S / d + CM.beta1
    X = 0.0 if d == 1 else CM.alpha3 * S * (d - 1) / d / v
    M = 0.0 if d == 1 else X + CM.beta2
    return C + M - min(A, X)


@pytest.mark.parametrize("solver,lengths,etas,num_ranks", list(_cases()))
def test_plan_invariants(solver, lengths, etas, num_ranks):
    if solver == "ilp":
        pytest.importorskip("cvxpy")
    lengths = np.asarray(lengths, dtype=np.int64)
    e = np.zeros(lengths.size) if etas is None else np.asarray(etas, dtype=float)
    try:
        plan = plan_batch(lengths, num_ranks=num_ranks, cost_model=CM, etas=etas, solver=solver,
                          micro_batches="auto" if lengths.size > 7 else 1)
    except ValueError as err:  # a baseline may be infeasible; FCP and the exact solvers never are here
        assert solver in ("megatron-dynamic", "static-cp", "ulysses"), f"{solver} failed: {err}"
        return
    assert isinstance(plan, Plan) and plan.solver == solver
    # every sequence exactly once
    assert sorted(plan.seq_ids) == list(range(lengths.size))
    for mb in plan.micro_batches:
        used = [r for g in mb.groups for r in g.ranks]
        # ranks disjoint and in range; Σ degree ≤ N
        assert len(used) == len(set(used)) and all(0 <= r < num_ranks for r in used)
        assert sum(mb.degrees) <= num_ranks
        for g in mb.groups:
            ids = np.asarray(g.seq_ids)
            # memory holds
            assert lengths[ids].sum() <= g.degree * CM.tokens_per_rank
            # reported time = §4 formula on the group's real ranks (rel. 1e-9)
            assert g.time == pytest.approx(_expected_time(solver, lengths[ids], e[ids], g.ranks), rel=1e-9)
        # makespan = max group time
        assert mb.makespan == pytest.approx(max(g.time for g in mb.groups), rel=1e-12)
    assert plan.makespan == pytest.approx(sum(mb.makespan for mb in plan.micro_batches), rel=1e-12)
    # plan JSON round-trips exactly
    assert Plan.from_dict(plan.to_dict()) == plan
    if solver in ("ilp", "exhaustive"):
        assert plan.optimal is not None


def test_solvers_registry_matches_plan_batch():
    """SOLVERS, SOLVER_NAMES and the registry list the same solvers in the same order, and every deterministic
    one is dispatched to its own function: SOLVERS[name] and plan_batch(solver=name) return exactly the
    micro-batch plan of the spec's ``solve`` called directly (not via plan_batch), and the built-in entries are
    the functions DESIGN §5 names. The instance separates the solvers (5 distinct makespans over 7 solvers), so
    a crossed or stale dispatch (e.g. fcp-pow2 running fcp, static-cp running ulysses) fails here."""
    from fcp_data.plan import solver_specs

    lengths = np.array([13598, 7910, 6627, 4927, 4783, 1112])  # on 6 ranks fcp uses a non-power-of-two degree
    specs = [s for s in solver_specs() if s.deterministic]
    assert tuple(SOLVERS) == tuple(SOLVER_NAMES) == tuple(s.name for s in solver_specs())
    assert {s.name for s in specs} >= set(FAST_SOLVERS) | {"exhaustive"}
    spans = set()
    for spec in specs:
        direct, _ = spec.solve(lengths, np.zeros(lengths.size), 6, CM, visual=None)
        a = SOLVERS[spec.name](lengths, num_ranks=6, cost_model=CM)
        b = plan_batch(lengths, num_ranks=6, cost_model=CM, solver=spec.name)
        assert a.solver == b.solver == spec.name
        assert a.micro_batches == b.micro_batches == (direct,), spec.name
        spans.add(round(direct.makespan, 12))
    assert len(spans) >= 5, spans
    # the built-in entries run the functions DESIGN §5 names (a registry typo, e.g. fcp-pow2 without pow2, fails)
    from fcp_data.plan.baselines import megatron_dynamic, static_cp, ulysses
    from fcp_data.plan.exhaustive import solve_exhaustive
    from fcp_data.plan.solvers import fcp_micro_batch

    e = np.zeros(lengths.size)
    reference = {"fcp": fcp_micro_batch(lengths, e, 6, CM), "fcp-dp": fcp_micro_batch(lengths, e, 6, CM, allocator="dp"),
                 "exhaustive": solve_exhaustive(lengths, e, 6, CM)[0], "static-cp": static_cp(lengths, e, 6, CM),
                 "ulysses": ulysses(lengths, e, 6, CM), "megatron-dynamic": megatron_dynamic(lengths, e, 6, CM),
                 "fcp-pow2": fcp_micro_batch(lengths, e, 6, CM, degrees="pow2", with_baselines=False)}
    for name, mb in reference.items():
        assert SOLVERS[name](lengths, num_ranks=6, cost_model=CM).micro_batches == (mb,), name


@pytest.mark.parametrize("solver", FAST_SOLVERS)
def test_deterministic(solver):
    """Identical input gives an identical plan (the sampler relies on it on every rank), except solve_ms."""
    lengths = np.random.default_rng(7).integers(20, 20000, size=200)
    p1 = plan_batch(lengths, num_ranks=32, cost_model=CM, solver=solver, micro_batches="auto")
    p2 = plan_batch(list(lengths), num_ranks=32, cost_model=CM, solver=solver, micro_batches="auto")
    d1, d2 = p1.to_dict(), p2.to_dict()
    d1.pop("solve_ms"), d2.pop("solve_ms")
    assert d1 == d2


def test_infeasible_input_names_the_sequence():
    """A sequence longer than N·E must be reported by index and length."""
    with pytest.raises(ValueError, match=r"sequence 2 has 40000 tokens"):
        plan_batch([10, 20, 40000], num_ranks=4, cost_model=CM)
    with pytest.raises(ValueError, match="must be > 0"):
        plan_batch([10, 0], num_ranks=4, cost_model=CM)
    with pytest.raises(ValueError, match="empty"):
        plan_batch([], num_ranks=4, cost_model=CM)
    with pytest.raises(ValueError, match="unknown solver"):
        plan_batch([10], num_ranks=4, cost_model=CM, solver="nope")
    with pytest.raises(ValueError, match="etas"):
        plan_batch([10, 20], num_ranks=4, cost_model=CM, etas=[0])


def test_micro_batches_auto_and_fixed():
    """'auto' splits a batch that exceeds N·E into the fewest feasible micro-batches (or a few more if
    cheaper); a fixed M that cannot hold the batch is a clear ValueError."""
    lengths = np.random.default_rng(3).integers(1000, 8000, size=40)  # ≈ 180K tokens > 8 × 8192
    plan = plan_batch(lengths, num_ranks=8, cost_model=CM, micro_batches="auto")
    lo = int(np.ceil(lengths.sum() / (8 * CM.tokens_per_rank)))
    assert lo <= len(plan.micro_batches) <= lo + 6
    assert sorted(plan.seq_ids) == list(range(40))
    for mb in plan.micro_batches:
        assert sum(lengths[list(mb.seq_ids)]) <= 8 * CM.tokens_per_rank
    fixed = plan_batch(lengths, num_ranks=8, cost_model=CM, micro_batches=len(plan.micro_batches) + 1)
    assert len(fixed.micro_batches) == len(plan.micro_batches) + 1
    assert plan.makespan <= fixed.makespan * (1 + 1e-9) or len(plan.micro_batches) + 1 > lo + 2
    with pytest.raises(ValueError, match="does not fit in 1 micro-batch"):
        plan_batch(lengths, num_ranks=8, cost_model=CM, micro_batches=1)


def test_ulysses_time_by_hand():
    """Ulysses all-to-all traffic: X_u = alpha3·(H+G)/G·S·(d−1)/d²/v, not overlapped with attention."""
    S, Q, ranks = 40000.0, 40000.0 ** 2, (0, 1, 2, 3)
    d, H, G = 4, 32, 8
    X = CM.alpha3 * (H + G) / G * S * (d - 1) / d**2 / CM.bandwidth_intra
    expect = CM.alpha1 * Q / d + CM.alpha2 * S / d + CM.beta1 + X + CM.beta2
    got = ulysses_time(np.array([S]), np.array([Q]), [ranks], CM, num_heads=H, num_kv_heads=G)[0]
    assert got == pytest.approx(expect, rel=1e-12)
    one = ulysses_time(np.array([S]), np.array([Q]), [(5,)], CM, num_heads=H, num_kv_heads=G)[0]
    assert one == pytest.approx(CM.alpha1 * Q + CM.alpha2 * S + CM.beta1, rel=1e-12)


def test_refine_moves_never_hurts():
    """The local search keeps every sequence once, keeps ranks, and never increases the makespan."""
    from fcp_data.plan.baselines import static_cp
    from fcp_data.plan.solvers import refine_moves

    rng = np.random.default_rng(9)
    for _ in range(30):
        L = rng.integers(50, 6000, size=int(rng.integers(2, 50)))
        N = int(rng.integers(2, 17))
        L = np.maximum(1, L * min(1.0, N * CM.tokens_per_rank / L.sum())).astype(np.int64)
        e = (rng.random(L.size) < 0.3).astype(float)
        mb = static_cp(L, e, N, CM)
        out = refine_moves(mb, L, e, CM)
        assert sorted(out.seq_ids) == list(range(L.size))
        assert out.makespan <= mb.makespan
        assert {g.ranks for g in out.groups} <= {g.ranks for g in mb.groups}
        for g in out.groups:
            assert L[list(g.seq_ids)].sum() <= g.degree * CM.tokens_per_rank


def test_refine_first_distinct_matches_numpy_unique():
    """refine's member dedupe (one lexsort) keeps exactly the first member of every distinct ``(s, q[, v])``
    row, in order — what ``np.unique(rows, axis=0, return_index=True)`` gives; a failure means refinement
    evaluates different moves than before (plans would change)."""
    from fcp_data.plan.refine import _first_distinct

    rng = np.random.default_rng(4)
    for _ in range(200):
        n = int(rng.integers(1, 80))
        s = rng.integers(1, 6, size=120).astype(float)
        q = s * s * (1 + rng.integers(0, 2, size=120))
        v = rng.integers(0, 3, size=120).astype(float)
        members = np.sort(rng.choice(120, size=n, replace=False))
        for vis in (None, v):
            cols = (s[members], q[members]) if vis is None else (s[members], q[members], v[members])
            first = np.unique(np.stack(cols, axis=1), axis=0, return_index=True)[1]
            assert _first_distinct(members, s, q, vis).tolist() == members[np.sort(first)].tolist()
