"""The robust mode of FCP (``robust_tol > 0``, issue 12): plan also under scenario cost models and pick, among
plans near the best predicted makespan, the one least sensitive to a coefficient error (:func:`robust_choice`)."""

from __future__ import annotations

import numpy as np

from fcp_data.cost import CostModel, sequence_terms
from fcp_data.plan.types import CPGroup, MicroBatchPlan

__all__ = ["robust_choice", "scenario_models", "retime", "ROBUST_DELTA", "ROBUST_SCENARIOS"]

ROBUST_DELTA = 0.2  # relative coefficient error the robust choice guards against
# scenario models the robust mode also plans with: attention compute and ring traffic off by ±ROBUST_DELTA
ROBUST_SCENARIOS = (("alpha1", 1 - ROBUST_DELTA), ("alpha1", 1 + ROBUST_DELTA), ("alpha3", 1 - ROBUST_DELTA),
                    ("alpha3", 1 + ROBUST_DELTA))
_ROBUST_KEYS = ("alpha1", "alpha2", "alpha3", "beta1", "beta2", "bandwidth_intra", "bandwidth_inter", "gamma",
                "alpha_blk", "alpha_vis")


def robust_choice(plans: list, lengths: np.ndarray, etas: np.ndarray, cost_model: CostModel, tol: float,
                  visual: np.ndarray | None = None) -> int:
    """Index of the plan to run among candidate :class:`MicroBatchPlan` s of one micro-batch.

    Rule: among the plans whose predicted makespan is within ``(1 + tol)`` of the best, take the one of
    least worst-case regret when one coefficient is off by ``±ROBUST_DELTA`` (each §4/§4.1 coefficient
    and bandwidth in turn, both signs): regret of a plan under a perturbed model = its makespan there /
    the best window plan's makespan there − 1. Ties (and ``tol = 0``, or a single plan in the window) go to
    the lowest predicted makespan, then the lowest index. Why: a plan whose advantage rests on one
    coefficient (say the bandwidth making a wide ring just worth it) loses when the profile is off, while
    one that is near-best under every single-coefficient error keeps its step time."""
    spans = np.array([p.makespan for p in plans])
    order = np.lexsort((np.arange(spans.size), spans))
    window = [int(i) for i in order if spans[i] <= spans[order[0]] * (1 + tol)]
    if len(window) == 1:
        return window[0]
    s, q, b, v = sequence_terms(lengths, etas, visual)
    models = [cost_model.replace(**{k: getattr(cost_model, k) * f})
              for k in _ROBUST_KEYS if getattr(cost_model, k) for f in (1 - ROBUST_DELTA, 1 + ROBUST_DELTA)]
    table = np.empty((len(window), len(models)))
    for r, i in enumerate(window):
        ids = [list(g.seq_ids) for g in plans[i].groups]
        S, Q, B, V = (np.array([x[g].sum() for g in ids]) for x in (s, q, b, v))
        d = np.array([g.degree for g in plans[i].groups], dtype=np.float64)
        intra = np.array([cost_model.is_intra_node(g.ranks) for g in plans[i].groups])
        for c, m in enumerate(models):
            table[r, c] = float(np.max(m.time(S, Q, d, intra, B=B, V=V)))
    regret = (table / table.min(axis=0) - 1).max(axis=1)
    return window[int(np.lexsort((np.arange(len(window)), regret))[0])]


def scenario_models(cost_model: CostModel) -> list[CostModel]:
    """The cost models of :data:`ROBUST_SCENARIOS` (one coefficient scaled each)."""
    return [cost_model.replace(**{k: getattr(cost_model, k) * f}) for k, f in ROBUST_SCENARIOS]


def retime(plan, lengths: np.ndarray, etas: np.ndarray, cost_model: CostModel, visual: np.ndarray | None = None):
    """``plan`` (a :class:`MicroBatchPlan`) with its group times and makespan recomputed under ``cost_model``
    on the same ranks (a plan made with another model, judged by this one)."""
    s, q, b, v = sequence_terms(lengths, etas, visual)
    ids = [list(g.seq_ids) for g in plan.groups]
    S, Q, B, V = (np.array([x[g].sum() for g in ids]) for x in (s, q, b, v))
    d = np.array([g.degree for g in plan.groups], dtype=np.float64)
    intra = np.array([cost_model.is_intra_node(g.ranks) for g in plan.groups])
    times = np.atleast_1d(cost_model.time(S, Q, d, intra, B=B, V=V))
    groups = tuple(CPGroup(ranks=g.ranks, seq_ids=g.seq_ids, time=float(x)) for g, x in zip(plan.groups, times))
    return MicroBatchPlan(groups=groups, makespan=float(times.max()))
