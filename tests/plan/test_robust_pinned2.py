"""Mutation review (robust.py), second pass: behaviour the suite left unpinned (hand-computed, as in
tests/plan/test_robust.py)."""
from __future__ import annotations

import numpy as np

from fcp_data.cost import CostModel
from fcp_data.plan.robust import robust_choice
from fcp_data.plan.types import CPGroup, MicroBatchPlan

HAND = CostModel(alpha1=1.0, alpha2=1.0, alpha3=0.0, beta1=0.0, beta2=1.0, bandwidth_intra=1.0, bandwidth_inter=1.0,
                 ranks_per_node=2, tokens_per_rank=100)


def _hand_plans():
    p0 = MicroBatchPlan(groups=(CPGroup(ranks=(0, 1), seq_ids=(0, 1), time=5.0),), makespan=5.0)
    p1 = MicroBatchPlan(groups=(CPGroup(ranks=(0,), seq_ids=(0,), time=6.0), CPGroup(ranks=(1,), seq_ids=(1,), time=2.0)),
                        makespan=6.0)
    return [p0, p1]


def test_a_scenario_of_zero_times_adds_no_regret():
    """robust_choice: "the best plan has no regret, even 0/0": a scenario whose every time is 0 (all coefficients 0)
    gives every plan regret 0 there, so it only dilutes the others. Hand values (test_robust's table): with
    alpha1 = 2, beta2 = 3, beta2 = 10 and the zero model, mean regrets P0 (0+0+1/6+4/3+0)/5 = 0.30, P1
    (0.2+1/3+0+0+0)/5 = 0.107: P1 — as without the zero model (a 0/0 = nan regret would hand the choice to the lower
    makespan, P0)."""
    L, e = np.array([2, 1]), np.zeros(2)
    zero = HAND.replace(alpha1=0.0, alpha2=0.0, beta2=0.0)
    assert zero.time(3.0, 5.0, 2, True) == 0.0
    models = [HAND.replace(alpha1=2.0), HAND.replace(beta2=3.0), HAND.replace(beta2=10.0)]
    assert robust_choice(_hand_plans(), L, e, HAND, 0.25, models=models) == 1
    assert robust_choice(_hand_plans(), L, e, HAND, 0.25, models=models + [zero]) == 1


def test_equal_mean_regret_goes_to_the_lower_makespan_before_the_lower_index():
    """Tie rule: "ties: lower nominal makespan, then lower index". Scenario alpha1 = 1, alpha2 = 0.5, beta2 = 2.75:
    P0 = (5 + 1.5)/2 + 2.75 = 6, P1 = max(4 + 1, 1 + 0.5) = 5 — the nominal 5 / 6 mirrored, so both mean regrets are
    (0 + 0.2)/2 exactly. P0 (makespan 5) wins even when listed second."""
    L, e = np.array([2, 1]), np.zeros(2)
    p0, p1 = _hand_plans()
    mirror = HAND.replace(alpha2=0.5, beta2=2.75)
    from fcp_data.plan.robust import scenario_table
    assert scenario_table([p0, p1], L, e, [HAND, mirror]).tolist() == [[5.0, 6.0], [6.0, 5.0]]
    assert robust_choice([p1, p0], L, e, HAND, 0.5, models=[mirror]) == 1
    assert robust_choice([p0, p1], L, e, HAND, 0.5, models=[mirror]) == 0


def test_retime_makespan_is_the_slowest_group_wherever_it_is_listed():
    """retime: group times under the other model, makespan = their max — here the slowest group is listed last."""
    from fcp_data.plan.robust import retime

    L, e = np.array([2, 1]), np.zeros(2)
    plan = MicroBatchPlan(groups=(CPGroup(ranks=(1,), seq_ids=(1,), time=0.0), CPGroup(ranks=(0,), seq_ids=(0,), time=0.0)),
                          makespan=0.0)
    got = retime(plan, L, e, HAND)
    assert [g.time for g in got.groups] == [2.0, 6.0] and got.makespan == 6.0


def test_regret_is_against_the_best_of_all_candidates_not_only_the_window():
    """robust_choice docstring: regret of p in scenario m = T_m(p) / (min over *all candidates* T_m) − 1, though only
    the window's plans can be chosen. Every plan of [3099, 239, 3721] on 3 ranks (set partitions × memory-feasible
    degrees), two extreme scenario models, window 20 %: the rule written out (scenario_table is pinned by hand in
    test_robust) picks another plan than it would with the best taken over the window only (found by search)."""
    import itertools

    from fcp_data.plan.exhaustive import set_partitions
    from fcp_data.plan.placement import build_micro_batch
    from fcp_data.plan.robust import scenario_table

    cm = CostModel(alpha1=1.2393918883649545e-08, alpha2=4.242565386974708e-06, alpha3=12998.512787301106,
                   beta1=0.016179576080706384, beta2=0.04656059326878169, bandwidth_intra=1e9,
                   bandwidth_inter=810700581.9392117, ranks_per_node=2, tokens_per_rank=4096)
    models = [cm.replace(alpha1=2.9685866478223765e-09, alpha2=9.075606956545441e-05, alpha3=6671.213374486605,
                         beta1=0.001796451216512737, beta2=0.5612834572734567),
              cm.replace(alpha1=2.0626193613393775e-07, alpha2=1.0786299393338009e-06, alpha3=4780.661328091246,
                         beta1=0.09324472383282768, beta2=0.009398203513531723)]
    L, e, N, tol = np.array([3099, 239, 3721]), np.zeros(3), 3, 0.2
    plans = []
    for labels, k in set_partitions(L.size, N):
        groups = [[int(i) for i in np.flatnonzero(labels == g)] for g in range(k)]
        S = np.array([float(L[g].sum()) for g in groups])
        Q = np.array([float((L[g].astype(float) ** 2).sum()) for g in groups])
        for deg in itertools.product(range(1, N + 1), repeat=k):
            if sum(deg) <= N and all(S[i] <= deg[i] * cm.tokens_per_rank for i in range(k)):
                plans.append(build_micro_batch(groups, np.array(deg), S, Q, N, cm, B=S.copy(), V=np.zeros(k)))
    T = scenario_table(plans, L, e, [cm] + models)
    spans = np.array([p.makespan for p in plans])
    win = [i for i in range(len(plans)) if spans[i] <= spans.min() * (1 + tol)]

    def pick(best):
        reg = (T[win] / best - 1).mean(axis=1)
        return win[min(range(len(win)), key=lambda j: (reg[j], spans[win[j]], win[j]))]

    want, windowed = pick(T.min(axis=0)), pick(T[win].min(axis=0))
    assert want != windowed  # the premise: the rule matters here
    assert robust_choice(plans, L, e, cm, tol, models=models) == want


def test_scenarios_of_a_model_near_the_range_limit_still_perturb_it():
    """_scenario: a valid model whose slowest possible group takes 0.95 MAX_GROUP_SECONDS leaves the range only by
    the perturbation (factor up to 1 + δ); such a scenario keeps its perturbed values (without the check) — so every
    scenario's alpha1 is its own Latin-hypercube draw in the box, none stays at the nominal value."""
    from fcp_data.cost import MAX_GROUP_SECONDS, MAX_RANKS
    from fcp_data.plan.robust import ROBUST_DELTA, scenario_models

    E = 1000
    cm = CostModel(alpha1=0.95 * MAX_GROUP_SECONDS / (2.0 * MAX_RANKS * E * E), alpha2=1e-6, alpha3=1e3, beta1=1e-3,
                   beta2=1e-3, bandwidth_intra=1e11, bandwidth_inter=1e10, ranks_per_node=8, tokens_per_rank=E)
    models = scenario_models(cm)
    r = np.array([m.alpha1 / cm.alpha1 for m in models])
    assert np.all((r >= 1 - ROBUST_DELTA) & (r <= 1 + ROBUST_DELTA))
    assert (r > 1 / 0.95).sum() >= 3  # the premise: several scenarios leave the range
    assert len(set(r.tolist())) == len(models) and not np.any(r == 1.0)
