"""Exact reference: an ILP over sequence-to-group assignment and group degrees (DESIGN §5).

Variables (all binary unless said): ``z[k, g, d]`` — sequence ``k`` is in group ``g`` and ``g`` has degree
``d``; ``y[g, d]`` — group ``g`` is open with degree ``d``; continuous ``t[g]`` and the makespan ``m``.
A sequence is never split across groups. With ``c_d = beta1 + (beta2 + gamma·(d−1))·[d>1]``, ``v_d`` the
intra-node bandwidth for ``d ≤ ranks_per_node`` (the best placement), else inter-node, and the §4.1 per-rank
work of sequence ``k`` on ``d`` ranks ``e_kd = alpha_blk·(1+η_k)s_k + alpha_vis·v_k/d`` (0 under §4)::

    Σ_{g,d} z[k,g,d] = 1                    every sequence in exactly one group
    z[k,g,d] ≤ y[g,d],  Σ_d y[g,d] ≤ 1      a group has one degree
    Σ_{g,d} d·y[g,d] ≤ N                    ranks
    Σ_k s_k z[k,g,d] ≤ d·E·y[g,d]           memory
    t[g] ≥ Σ_d c_d y[g,d] + Σ_{k,d} z[k,g,d]·((alpha1 q_k + alpha2 s_k)/d + e_kd)
    t[g] ≥ Σ_d c_d y[g,d] + Σ_{k,d} z[k,g,d]·(alpha3 s_k (d−1)/d / v_d + alpha2 s_k/d + e_kd)
    m ≥ t[g];   minimise m

The two ``t`` rows are exact because ``T = C + M − min(A, X) = max(A, X) + alpha2·S/d + alpha_blk·B +
alpha_vis·V/d + beta1 + (beta2 + gamma·(d−1))·[d>1]``: for a fixed degree every term is linear in the
assignment (the v2 terms are, like alpha2, per-sequence sums).
Symmetry is broken by letting sequence ``k`` (in input order) use only groups ``g ≤ k``. The model is
exact for the §4 cost on a single node; across nodes the solution is placed on real ranks and ``optimal``
is reported only when HiGHS proved optimality and the placed makespan equals the ILP's bound.
cvxpy (HiGHS) is imported lazily: ``pip install 'fcp[ilp]'``.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings

import numpy as np

from fcp_data.cost import CostModel
from fcp_data.plan.bfd import group_terms_of
from fcp_data.plan.inputs import check_count_option, check_seconds_option
from fcp_data.plan.placement import build_micro_batch
from fcp_data.plan.types import MicroBatchPlan

__all__ = ["solve_ilp", "MAX_ILP_BINARIES"]

MAX_ILP_BINARIES = 200_000  # z[k, g, d] and y[g, d]: beyond this cvxpy alone takes minutes and GBs


def _import_cvxpy():
    try:
        import cvxpy as cp
    except ImportError:
        raise ValueError("the ILP needs cvxpy and highspy: pip install 'fcp[ilp]'") from None
    return cp


@contextlib.contextmanager
def _quiet_stdout():
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 1)
            yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def solve_ilp(lengths: np.ndarray, etas: np.ndarray, num_ranks: int, cost_model: CostModel, *,
              time_limit: float = 30.0, max_sequences: int = 40, visual: np.ndarray | None = None,
              **_: object) -> tuple[MicroBatchPlan, bool]:
    """Solve one micro-batch exactly (or best found within ``time_limit`` s); ``(plan, optimal)``."""
    n, N = int(lengths.size), int(num_ranks)
    max_sequences = check_count_option("max_sequences", max_sequences)
    time_limit = check_seconds_option("time_limit", time_limit)
    if n > max_sequences:
        raise ValueError(f"the ILP is a reference for small cases (≤ {max_sequences} sequences per micro-batch), got {n}")
    binaries = min(n, N) * (n + 1) * N
    if binaries > MAX_ILP_BINARIES:
        raise ValueError(f"the ILP for {n} sequences on {N} ranks has {binaries} binary variables (at most "
                         f"{MAX_ILP_BINARIES}); it is a reference for small cases — use fewer ranks or sequences")
    cp = _import_cvxpy()
    prob, z, y, m = _build(cp, lengths, etas, N, cost_model, visual)
    try:
        with _quiet_stdout(), warnings.catch_warnings():  # HiGHS prints a banner on the C-level stdout
            warnings.simplefilter("ignore")  # "solution may be inaccurate" after a time limit: reported below
            # integrality tolerance 1e-9 (HiGHS: 1e-6): with z = 1 − 1e-6 the bound m sits a few 1e-6 below the
            # placed makespan and a proved optimum would be reported as not optimal
            prob.solve(solver=cp.HIGHS, time_limit=float(time_limit), output_flag=False, mip_feasibility_tolerance=1e-9)
    except cp.error.SolverError as e:
        raise ValueError(f"the ILP solver failed: {e}") from None
    if prob.status in ("infeasible", "infeasible_inaccurate"):
        raise ValueError(f"no feasible plan for {n} sequences on {N} ranks at tokens_per_rank={cost_model.tokens_per_rank}")
    if y.value is None:
        raise ValueError(f"the ILP found no solution within {time_limit} s (status {prob.status}); raise --time-limit")
    groups, degrees = _incumbent(z, y, lengths, cost_model)
    if sum(degrees) > N:
        raise ValueError(f"the ILP found no usable solution within {time_limit} s (status {prob.status}); raise --time-limit")
    S, Q, B, V = group_terms_of(groups, lengths, etas, visual)
    mb = build_micro_batch(groups, degrees, S, Q, N, cost_model, B=B, V=V)
    proved = prob.status == "optimal"
    return mb, bool(proved and mb.makespan <= float(m.value) * (1 + 1e-6))


def _build(cp, lengths: np.ndarray, etas: np.ndarray, N: int, cm: CostModel, visual: np.ndarray | None):
    """The cvxpy problem of the module docstring: ``(problem, z per group, y, m)``."""
    n = int(lengths.size)
    s = lengths.astype(np.float64)
    G = min(n, N)
    d = np.arange(1, N + 1, dtype=np.float64)
    c, coef_a, coef_x = cm.linearized(lengths, etas, visual, N)  # n × N each, §4/§4.1 (the module docstring)
    scale = 1.0 / max(float(coef_a.max()), 1e-30)  # keep the objective near 1 for the solver's tolerances

    z = [cp.Variable((n, N), boolean=True) for _ in range(G)]
    y = cp.Variable((G, N), boolean=True)
    t = cp.Variable(G)
    m = cp.Variable()
    cons = [sum(cp.sum(z[g], axis=1) for g in range(G)) == 1]
    for g in range(G):
        cons.append(z[g] <= np.ones((n, 1)) @ cp.reshape(y[g], (1, N), order="C"))
        if g > 0:
            cons.append(z[g][:g, :] == 0)  # symmetry breaking: sequence k only in groups g ≤ k
        cons.append(s @ z[g] <= cm.tokens_per_rank * cp.multiply(d, y[g]))
        base = c @ y[g]
        cons.append(t[g] * scale >= (base + cp.sum(cp.multiply(coef_a, z[g]))) * scale)
        cons.append(t[g] * scale >= (base + cp.sum(cp.multiply(coef_x, z[g]))) * scale)
        cons.append(m >= t[g])
    cons.append(cp.sum(y, axis=1) <= 1)
    cons.append(cp.sum(y @ d) <= N)
    return cp.Problem(cp.Minimize(m * scale), cons), z, y, m


def _incumbent(z, y, lengths: np.ndarray, cm: CostModel) -> tuple[list[list[int]], list[int]]:
    """Read the incumbent robustly (a time-limited solve may leave values slightly off 0/1): each sequence goes
    to its largest z, each group takes its largest y, raised to its memory minimum."""
    s = lengths.astype(np.float64)
    G = len(z)
    Z = np.stack([np.asarray(z[g].value, dtype=np.float64).sum(axis=1) for g in range(G)], axis=1)  # n × G
    owner = Z.argmax(axis=1)
    Y = np.asarray(y.value, dtype=np.float64)
    groups, degrees = [], []
    for g in range(G):
        members = [int(k) for k in np.flatnonzero(owner == g)]
        if members:
            groups.append(members)
            degrees.append(max(int(Y[g].argmax()) + 1, cm.min_degree(float(s[members].sum()))))
    return groups, degrees
