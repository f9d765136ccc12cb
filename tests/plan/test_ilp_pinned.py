"""Behaviour a mutation review (stop 60) found unpinned in the exact references (fcp_data/plan/ilp.py)."""
from __future__ import annotations

import pytest

from fcp_data.cost import CostModel
from fcp_data.plan import plan_batch

pytest.importorskip("cvxpy")

# ring traffic dominates (X > A): a group that crosses nodes is clearly slower than inside one
CM = CostModel(alpha1=1e-11, alpha2=1e-6, alpha3=2e5, beta1=1e-3, beta2=1e-3, bandwidth_intra=1e11,
               bandwidth_inter=1e9, ranks_per_node=4, tokens_per_rank=4096)


def test_ilp_optimal_flag_is_false_when_placement_cannot_reach_its_bound():
    """6 ranks on nodes of 4 + 2, two sequences of 3·E tokens: each needs a 3-rank group, and only one of the two
    fits inside a node. The ILP's bound assumes the best (intra-node) bandwidth for every group of <= 4 ranks, so
    the placed makespan is above it and ``optimal`` must be False (DESIGN §5/ilp docstring: optimal only when the
    placed makespan equals the bound). Mutant: ``optimal = proved`` (ignoring the placed makespan) survived."""
    lengths = [3 * 4096, 3 * 4096]
    plan = plan_batch(lengths, num_ranks=6, cost_model=CM, solver="ilp")
    assert sorted(g.degree for g in plan.micro_batches[0].groups) == [3, 3]
    ideal = CM.group_time([3 * 4096], ranks=3)  # one node
    assert plan.makespan > ideal * (1 + 1e-6)  # one group had to cross nodes
    assert plan.optimal is False
    ex = plan_batch(lengths, num_ranks=6, cost_model=CM, solver="exhaustive")
    assert ex.optimal is False and ex.makespan == pytest.approx(plan.makespan, rel=1e-9)
