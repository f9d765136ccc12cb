"""The robust mode of FCP (``robust_tol > 0``, issue 12): plan also under scenario cost models and pick, among
plans near the best predicted makespan, the one of least expected regret over those scenarios
(:func:`robust_choice`).

Why (measured, BENCHMARKS.md "Robustness to profiling error"): on Wikipedia batches on 64 ranks the loss under
coefficient noise does not come from the micro-batch count (``auto`` keeps the true plan's ``M`` in 574 of the
benchmark's 576 perturbed plans) but from the balance inside one micro-batch. FCP equalises the group times, and a
group holding one long sequence is attention-bound (``alpha1``) while a group of many short ones is linear-bound (``alpha2``, ``beta1``, ``alpha_blk``):
an error in their ratio moves ranks between the two kinds and, in the true model, the slowest group is then
several % slower (one coefficient off by 16-19 % alone costs up to +6.8 %). A second part is the heuristic's
own variance: plans made for nearby models are sometimes better in the nominal model than the plan made for it.

Rule. The uncertainty set is a box ``[1 − δ, 1 + δ]`` around every non-zero coefficient (alpha1-3, beta1-2, both
bandwidths, gamma, alpha_blk, alpha_vis), jointly — not one coefficient at a time: the measured losses come from
combinations. It is represented by the nominal model and :data:`ROBUST_SCENARIOS` fixed joint draws
(:func:`scenario_models`: a Latin hypercube from a fixed seed, so every rank computes the same plan).
Candidates: FCP's own plans plus the plan FCP makes under each scenario model. Regret of a candidate in a
scenario = its makespan there / the best candidate's makespan there − 1; the choice is the plan of least *mean*
regret over the scenarios among those whose nominal makespan is within ``(1 + tol)`` of the best (ties: lower
nominal makespan, then lower index).
Mean (the sample-average of the regret under a uniform prior on the box) rather than worst-case: on the
benchmark the minimax-regret choice lost more (+1.8-2.0 % against +1.4 % at ±20 %, +11.8-11.9 % against +10.9 % at
±50 %, window 1 %): the worst corner of a ±δ box is rarely the truth, and guarding it gives up the common case.

Cost: one FCP call per scenario (``ROBUST_SCENARIOS`` + 1 solves), and a plans × scenarios table of group times.
``robust_tol = 0`` (the default) never reaches this module.
"""

from __future__ import annotations

import copy

import numpy as np

from fcp_data.cost import CostModel, sequence_terms
from fcp_data.plan.types import CPGroup, MicroBatchPlan

__all__ = ["robust_choice", "scenario_models", "scenario_table", "retime", "ROBUST_DELTA", "ROBUST_SCENARIOS",
           "ROBUST_KEYS"]

ROBUST_DELTA = 0.2  # half-width of the relative box of coefficient error the robust choice guards against
ROBUST_SCENARIOS = 32  # joint draws from the box (besides the nominal model)
_ROBUST_SEED = 20261201  # fixed: the scenarios, hence the plan, are the same on every rank and every run
ROBUST_KEYS = ("alpha1", "alpha2", "alpha3", "beta1", "beta2", "bandwidth_intra", "bandwidth_inter", "gamma",
               "alpha_blk", "alpha_vis")


def scenario_models(cost_model: CostModel, delta: float = ROBUST_DELTA, count: int = ROBUST_SCENARIOS
                    ) -> list[CostModel]:
    """``count`` cost models, each non-zero coefficient of :data:`ROBUST_KEYS` times its own factor in
    ``[1 − delta, 1 + delta]``: a Latin hypercube (for every coefficient each of the ``count`` equal slices of the
    box holds exactly one draw) from a fixed-seed generator — deterministic; zeros stay zero; the factors depend
    only on ``delta`` and ``count``. Why a Latin hypercube: with plain random draws the choice depended on the
    sample (three seeds, Wikipedia v2 ±20 %: +2.05 / +1.47 / +1.44 % true loss); stratified, +1.51 / +1.57 / +1.44 %.
    The nominal model is not included."""
    if not 0 <= delta < 1 or count < 0:
        raise ValueError(f"the robust box needs 0 <= delta < 1 and count >= 0, got delta={delta!r}, count={count!r}")
    rng = np.random.default_rng(_ROBUST_SEED)
    width = len(ROBUST_KEYS)
    slices = np.stack([rng.permutation(count) for _ in ROBUST_KEYS], axis=1) if count else np.zeros((0, width))
    factors = 1 - delta + 2 * delta * (slices + rng.uniform(size=slices.shape)) / max(count, 1)
    keys = [k for k in ROBUST_KEYS if getattr(cost_model, k)]
    return [_scenario(cost_model, {k: getattr(cost_model, k) * float(row[ROBUST_KEYS.index(k)]) for k in keys})
            for row in factors]


def _scenario(cost_model: CostModel, changes: dict[str, float]) -> CostModel:
    """``cost_model`` with ``changes``. A user's model near the range limit (:meth:`CostModel._check_range`,
    ``MAX_GROUP_SECONDS``) can leave it only by the perturbation (at most ``1 + delta`` times its times, so nothing
    overflows): that scenario keeps its values without the check rather than failing a model the user gave validly."""
    try:
        return cost_model.replace(**changes)
    except ValueError:
        model = copy.copy(cost_model)
        for k, v in changes.items():  # finite, >= 0 (or > 0 for a bandwidth): factors of valid values
            object.__setattr__(model, k, float(v))
        return model


def _plan_terms(plan: MicroBatchPlan, s, q, b, v, cost_model: CostModel) -> tuple:
    """``(S, Q, B, V, d, intra)`` of each group of ``plan`` (the arguments of :meth:`CostModel.time`)."""
    ids = [list(g.seq_ids) for g in plan.groups]
    S, Q, B, V = (np.array([x[g].sum() for g in ids]) for x in (s, q, b, v))
    d = np.array([g.degree for g in plan.groups], dtype=np.float64)
    intra = np.array([cost_model.is_intra_node(g.ranks) for g in plan.groups])
    return S, Q, B, V, d, intra


def scenario_table(plans: list, lengths: np.ndarray, etas: np.ndarray, models: list[CostModel],
                   visual: np.ndarray | None = None) -> np.ndarray:
    """Makespan of each plan (rows, on its real ranks) under each cost model (columns)."""
    s, q, b, v = sequence_terms(lengths, etas, visual)
    table = np.empty((len(plans), len(models)))
    if not plans:
        return table
    # every group of every plan in one array (times are elementwise, so each entry is what a per-plan call gives);
    # one CostModel.time call per model, then the max over each plan's groups
    terms = [_plan_terms(plan, s, q, b, v, models[0]) for plan in plans]
    S, Q, B, V, d, intra = (np.concatenate([t[j] for t in terms]) for j in range(6))
    owner = np.repeat(np.arange(len(plans)), [len(plan.groups) for plan in plans])
    for c, m in enumerate(models):
        column = np.zeros(len(plans))
        np.maximum.at(column, owner, np.atleast_1d(m.time(S, Q, d, intra, B=B, V=V)))
        table[:, c] = column
    return table


def robust_choice(plans: list, lengths: np.ndarray, etas: np.ndarray, cost_model: CostModel, tol: float,
                  visual: np.ndarray | None = None, models: list[CostModel] | None = None) -> int:
    """Index of the plan to run among candidate :class:`MicroBatchPlan` s of one micro-batch (their
    ``makespan`` is the nominal one, under ``cost_model``).

    Window: plans whose makespan is within ``(1 + tol)`` of the best. Scenarios: ``cost_model`` and ``models``
    (default :func:`scenario_models` of ``cost_model``). Regret of plan ``p`` in scenario ``m``:
    ``T_m(p) / min over all candidates T_m − 1``. The choice: least mean regret over the scenarios among the
    window; ties to the lower makespan, then the lower index. A window of one plan (``tol = 0`` without exact
    ties): that plan, with no table built."""
    spans = np.array([p.makespan for p in plans], dtype=np.float64)
    order = np.lexsort((np.arange(spans.size), spans))
    window = np.array([int(i) for i in order if spans[i] <= spans[order[0]] * (1 + tol)], dtype=np.int64)
    if window.size == 1:
        return int(window[0])
    scen = [cost_model] + (scenario_models(cost_model) if models is None else list(models))
    table = scenario_table(plans, lengths, etas, scen, visual)
    best = table.min(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):  # a scenario whose best time is 0 (all-zero coefficients)
        ratio = np.where(table[window] == best, 1.0, table[window] / best)  # the best plan has no regret, even 0/0
    regret = (ratio - 1).mean(axis=1)
    return int(window[np.lexsort((window, spans[window], regret))[0]])


def retime(plan, lengths: np.ndarray, etas: np.ndarray, cost_model: CostModel, visual: np.ndarray | None = None):
    """``plan`` (a :class:`MicroBatchPlan`) with its group times and makespan recomputed under ``cost_model``
    on the same ranks (a plan made with another model, judged by this one)."""
    s, q, b, v = sequence_terms(lengths, etas, visual)
    S, Q, B, V, d, intra = _plan_terms(plan, s, q, b, v, cost_model)
    times = np.atleast_1d(cost_model.time(S, Q, d, intra, B=B, V=V))
    groups = tuple(CPGroup(ranks=g.ranks, seq_ids=g.seq_ids, time=float(x)) for g, x in zip(plan.groups, times))
    return MicroBatchPlan(groups=groups, makespan=float(times.max()))
