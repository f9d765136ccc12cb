"""The robust mode's choice (fcp_data.plan.robust, issue 12) against a hand-computed regret table and a
brute-force reference: every plan of tiny micro-batches (all set partitions × exact degrees), each group timed
term by term (tests/plan/_reference.py) under every scenario model, the rule written out in plain Python."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from fcp_data.cost import CostModel
from fcp_data.plan import robust
from fcp_data.plan.exhaustive import set_partitions
from fcp_data.plan.placement import build_micro_batch
from fcp_data.plan.robust import ROBUST_DELTA, ROBUST_KEYS, robust_choice, scenario_models
from fcp_data.plan.solvers import fcp_micro_batch
from fcp_data.plan.types import CPGroup, MicroBatchPlan

from _reference import reference_time  # tests/plan/_reference.py: §4.1 term by term

# §4 with alpha3 = 0 (no ring traffic, so T = (alpha1·Q + alpha2·S)/d + beta1 + [d > 1]·beta2): times by hand
HAND = CostModel(alpha1=1.0, alpha2=1.0, alpha3=0.0, beta1=0.0, beta2=1.0, bandwidth_intra=1.0, bandwidth_inter=1.0,
                 ranks_per_node=2, tokens_per_rank=100)


def _hand_plans() -> list[MicroBatchPlan]:
    """Lengths [2, 1] on 2 ranks. P0: both on ranks (0, 1): (1·5 + 1·3)/2 + 1 = 5. P1: one rank each:
    max(4 + 2, 1 + 1) = 6."""
    p0 = MicroBatchPlan(groups=(CPGroup(ranks=(0, 1), seq_ids=(0, 1), time=5.0),), makespan=5.0)
    p1 = MicroBatchPlan(groups=(CPGroup(ranks=(0,), seq_ids=(0,), time=6.0), CPGroup(ranks=(1,), seq_ids=(1,), time=2.0)),
                        makespan=6.0)
    return [p0, p1]


def test_hand_computed_regret_table():
    """Scenarios: nominal, alpha1 = 2 (P0 (10+3)/2+1 = 7.5, P1 max(8+2, 2+1) = 10), beta2 = 3 (P0 7, P1 6).
    Best per scenario 5, 7.5, 6; mean regret P0 (0 + 0 + 1/6)/3 = 0.056, P1 (0.2 + 1/3 + 0)/3 = 0.178: P0.
    With beta2 = 10 as well (P0 14, P1 6): P0 (0 + 0 + 1/6 + 4/3)/4 = 0.375, P1 (0.2 + 1/3 + 0 + 0)/4 = 0.133: P1.
    A window of 10 % holds P0 alone: P0 whatever the scenarios. Mean, not worst case: with beta2 = 5 (P0 9, P1 6)
    instead, P0's regrets (0, 0, 0.5) average 0.167 < P1's (0.2, 0.333, 0) 0.178, though P0's worst is higher."""
    L, e = np.array([2, 1]), np.zeros(2)
    plans = _hand_plans()
    m1, m2, m3 = HAND.replace(alpha1=2.0), HAND.replace(beta2=3.0), HAND.replace(beta2=10.0)
    table = robust.scenario_table(plans, L, e, [HAND, m1, m2, m3])
    assert table.tolist() == [[5.0, 7.5, 7.0, 14.0], [6.0, 10.0, 6.0, 6.0]]
    assert robust_choice(plans, L, e, HAND, 0.25, models=[m1, m2]) == 0
    assert robust_choice(plans, L, e, HAND, 0.25, models=[m1, m2, m3]) == 1
    assert robust_choice(plans, L, e, HAND, 0.10, models=[m1, m2, m3]) == 0
    assert robust_choice(plans, L, e, HAND, 0.0, models=[m1, m2, m3]) == 0
    assert robust_choice(plans[::-1], L, e, HAND, 0.25, models=[m1, m2, m3]) == 0  # the same plan, not the index
    assert robust_choice(plans, L, e, HAND, 0.25, models=[m1, HAND.replace(beta2=5.0)]) == 0


def test_ties_go_to_lower_makespan_then_lower_index():
    """Identical plans tie on everything: the lowest index wins; with no scenario besides the nominal model
    every regret is that of the nominal makespan, so the lowest makespan wins."""
    L, e = np.array([2, 1]), np.zeros(2)
    p0, p1 = _hand_plans()
    assert robust_choice([p1, p0, p0], L, e, HAND, 0.5, models=[]) == 1
    assert robust_choice([p0, p0, p1], L, e, HAND, 0.5, models=[HAND.replace(alpha1=3.0)]) == 0


def test_scenario_models_box_and_determinism():
    """Fixed-seed joint draws: each non-zero coefficient of ROBUST_KEYS in [1 − δ, 1 + δ] × nominal, with its own
    factor (not all equal), zeros and the memory/topology fields untouched, the same list on every call; a Latin
    hypercube: for each coefficient the draws fall one in each of the count equal slices of the box."""
    cm = CostModel.preset("Qwen3-8B", "ascend-910c")
    a, b = scenario_models(cm), scenario_models(cm)
    assert a == b and len(a) == robust.ROBUST_SCENARIOS
    for m in a:
        ratios = []
        for k in ROBUST_KEYS:
            if getattr(cm, k) == 0:
                assert getattr(m, k) == 0
            else:
                r = getattr(m, k) / getattr(cm, k)
                assert 1 - ROBUST_DELTA <= r <= 1 + ROBUST_DELTA
                ratios.append(r)
        assert len(set(ratios)) == len(ratios)
        assert (m.ranks_per_node, m.tokens_per_rank) == (cm.ranks_per_node, cm.tokens_per_rank)
    for k in ROBUST_KEYS:
        if getattr(cm, k):
            u = [(getattr(m, k) / getattr(cm, k) - (1 - ROBUST_DELTA)) / (2 * ROBUST_DELTA) for m in a]
            assert sorted(int(x * len(a)) for x in u) == list(range(len(a)))
    assert scenario_models(cm, 0.0, 3) == [cm] * 3 and scenario_models(cm, 0.2, 0) == []
    for bad in ((1.0, 4), (-0.1, 4), (0.2, -1)):
        with pytest.raises(ValueError, match="robust box"):
            scenario_models(cm, *bad)


def _all_plans(L: np.ndarray, e: np.ndarray, N: int, cm: CostModel) -> list[MicroBatchPlan]:
    """Every set partition of the sequences × every memory-feasible degree vector (Σ d ≤ N), placed on real
    ranks: optimal and suboptimal plans alike, so that the window holds plans that trade makespan for regret."""
    out = []
    for labels, k in set_partitions(L.size, N):
        groups = [[int(i) for i in np.flatnonzero(labels == g)] for g in range(k)]
        S = np.array([float(L[g].sum()) for g in groups])
        Q = np.array([float(((1 + e[g]) * L[g].astype(float) ** 2).sum()) for g in groups])
        B = np.array([float(((1 + e[g]) * L[g]).sum()) for g in groups])
        for deg in itertools.product(range(1, N + 1), repeat=k):
            if sum(deg) <= N and all(S[i] <= deg[i] * cm.tokens_per_rank for i in range(k)):
                out.append(build_micro_batch(groups, np.array(deg), S, Q, N, cm, B=B, V=np.zeros(k)))
    return out


def _reference_table(plans, L, e, models) -> tuple[list[float], list[float]]:
    """Every plan's makespan under each of ``models`` (term by term), reduced to ``(nominal spans under models[0],
    mean regret over ``models``)`` (regret against the best of all plans per model). It does not depend on the
    window, so the test computes it once per scenario list and applies every window to it."""
    T = [[max(reference_time(m, L[list(g.seq_ids)], e[list(g.seq_ids)], [0] * len(g.seq_ids), g.ranks) for g in p.groups)
          for m in models] for p in plans]
    best = [min(T[i][c] for i in range(len(plans))) for c in range(len(models))]
    regret = [sum(T[i][c] / best[c] - 1 for c in range(len(models))) / len(models) for i in range(len(plans))]
    return [T[i][0] for i in range(len(plans))], regret


def _reference_choice(spans, regret, tol) -> int:
    """The rule written out: nominal makespans → window → the least mean regret (:func:`_reference_table`), ties
    by makespan then index."""
    window = [i for i in range(len(spans)) if spans[i] <= min(spans) * (1 + tol)]
    return min(window, key=lambda i: (regret[i], spans[i], i))


def test_choice_equals_brute_force_on_every_plan():
    """14 tiny instances (4-5 sequences, 4 ranks on 2-rank nodes, random v2 coefficients, alpha1/alpha2 over
    three/two decades so that attention- and linear-bound groups trade): the candidates are all plans (every
    partition × every degree vector); robust_choice's pick has the reference's least mean regret (the same index
    unless two regrets tie within 1e-9) for several windows, with the default scenarios and a ±50 % list. The
    rule must matter: on at least 4 instances it picks another plan than the best nominal makespan."""
    differs = 0
    for seed in range(14):
        rng = np.random.default_rng(seed)
        cm = CostModel(alpha1=float(10 ** rng.uniform(-10, -7)), alpha2=float(10 ** rng.uniform(-6, -4)),
                       alpha3=float(rng.uniform(1e3, 1e5)), beta1=float(rng.uniform(0, 0.05)), beta2=float(rng.uniform(0, 0.05)),
                       bandwidth_intra=1e9, bandwidth_inter=float(rng.uniform(1e8, 1e9)), ranks_per_node=2,
                       tokens_per_rank=4096, gamma=float(rng.uniform(0, 0.01)), alpha_blk=float(rng.uniform(0, 1e-6)))
        n = int(rng.integers(4, 6))
        L = rng.integers(200, 4096, size=n)
        e = (rng.random(n) < 0.3).astype(np.float64)
        plans = _all_plans(L, e, 4, cm)
        nominal_best = int(np.argmin([p.makespan for p in plans]))
        hit = False
        for models in (scenario_models(cm), scenario_models(cm, 0.5, 7)):
            spans, regret = _reference_table(plans, L, e, [cm] + models)
            for tol in (0.0, 0.02, 0.1, 10.0):
                got = robust_choice(plans, L, e, cm, tol, models=models)
                want = _reference_choice(spans, regret, tol)
                assert regret[got] == pytest.approx(regret[want], rel=1e-9, abs=1e-12), (seed, tol)
                if sum(abs(r - regret[want]) <= 1e-9 for r in regret) == 1:
                    assert got == want, (seed, tol)
                hit |= got != nominal_best
        differs += hit
        assert robust_choice(plans, L, e, cm, 0.05) == robust_choice(plans, L, e, cm, 0.05, models=scenario_models(cm))
    assert differs >= 4


def test_default_mode_never_reaches_the_robust_module(monkeypatch):
    """robust_tol = 0 costs nothing: with the robust module's entry points broken the default plan is unchanged."""
    cm = CostModel.preset("Qwen3-8B", "ascend-910c")
    L = np.random.default_rng(3).integers(1000, 30000, size=30)
    e = np.zeros(L.size)
    before = fcp_micro_batch(L, e, 16, cm)

    def broken(*_a, **_k):
        raise AssertionError("robust mode reached with robust_tol = 0")

    import fcp_data.plan.solvers as solvers
    for name in ("robust_choice", "scenario_models", "retime"):
        monkeypatch.setattr(solvers, name, broken)
    assert fcp_micro_batch(L, e, 16, cm) == before
    with pytest.raises(AssertionError, match="robust mode reached"):
        fcp_micro_batch(L, e, 16, cm, robust_tol=0.01)


def test_robust_plan_is_a_window_plan_and_deterministic():
    """fcp with robust_tol: every sequence once, its nominal makespan within (1 + tol) of the default plan's (the
    default plan is a candidate), and the same plan twice."""
    cm = CostModel.preset("Qwen3-8B", "ascend-910c", v2=True)
    rng = np.random.default_rng(11)
    for _ in range(2):
        L = np.minimum(rng.pareto(1.2, size=48) * 4000 + 500, 131072).astype(np.int64)
        e = np.zeros(L.size)
        base = fcp_micro_batch(L, e, 32, cm)
        a = fcp_micro_batch(L, e, 32, cm, robust_tol=0.01)
        assert sorted(i for g in a.groups for i in g.seq_ids) == list(range(L.size))
        assert sum(g.degree for g in a.groups) <= 32
        assert a.makespan <= base.makespan * 1.01 * (1 + 1e-12)
        assert a == fcp_micro_batch(L, e, 32, cm, robust_tol=0.01)
