"""Behaviour a mutation review (stop 60) found unpinned in fcp_data/plan/robust.py and simulate.py."""
from __future__ import annotations

import numpy as np
import pytest

from fcp_data.cost import CostModel
from fcp_data.plan import plan_batch
from fcp_data.plan.robust import retime

CM = CostModel(alpha1=2e-9, alpha2=1e-4, alpha3=3e5, beta1=0.01, beta2=0.02, bandwidth_intra=1e11,
               bandwidth_inter=1.2e10, ranks_per_node=4, tokens_per_rank=8192)


def _by_hand(cm, s, e, ranks):
    d = len(ranks)
    v = cm.bandwidth_intra if len({r // cm.ranks_per_node for r in ranks}) == 1 else cm.bandwidth_inter
    A = cm.alpha1 * sum((1 + ek) * sk * sk for sk, ek in zip(s, e)) / d
    C = A + cm.alpha2 * sum(s) / d + cm.beta1
    X = 0.0 if d == 1 else cm.alpha3 * sum(s) * (d - 1) / d / v
    M = 0.0 if d == 1 else X + cm.beta2
    return C + M - min(A, X)


def test_retime_gives_the_other_models_times_and_the_slowest_as_makespan():
    """retime (the robust mode's judge of a plan made under a scenario model) recomputes every group's §4 time under
    the given model on the same ranks; the makespan is the slowest group (mutant: ``times.min()`` survived)."""
    lengths = np.array([20000, 9000, 3000, 700, 300, 60])
    etas = np.array([0, 1, 0, 0, 1, 0], dtype=float)
    mb = plan_batch(lengths, num_ranks=8, cost_model=CM, etas=etas).micro_batches[0]
    assert len(mb.groups) > 1
    other = CM.replace(alpha1=4e-9, bandwidth_inter=6e9)
    out = retime(mb, lengths, etas, other)
    want = [_by_hand(other, lengths[list(g.seq_ids)].tolist(), etas[list(g.seq_ids)].tolist(), g.ranks) for g in mb.groups]
    assert [g.ranks for g in out.groups] == [g.ranks for g in mb.groups]
    assert [g.time for g in out.groups] == pytest.approx(want, rel=1e-12)
    assert out.makespan == pytest.approx(max(want), rel=1e-12)


def test_simulate_returns_the_plan_of_the_first_step():
    """simulate's second result is each solver's plan of the *first* drawn batch (mutant: the last plan survived)."""
    from fcp_data.plan.simulate import simulate
    from fcp_data.workloads import draw_batches

    rng = np.random.default_rng(3)
    workload = rng.integers(50, 12000, 40)
    times, first, _ = simulate(workload, num_ranks=8, cost_model=CM, global_batch_size=8, steps=3, seed=5, solvers=["fcp"])
    batch0 = draw_batches(len(workload), 8, 3, 5)[0]
    want = plan_batch(workload[batch0], num_ranks=8, cost_model=CM, solver="fcp", micro_batches="auto")
    assert first["fcp"].makespan == pytest.approx(times["fcp"][0], rel=1e-12)
    assert first["fcp"].makespan == pytest.approx(want.makespan, rel=1e-12)
    assert [mb.to_dict()["groups"] for mb in first["fcp"].micro_batches] == \
        [[{**g, "time": pytest.approx(g["time"])} for g in mb.to_dict()["groups"]] for mb in want.micro_batches]
