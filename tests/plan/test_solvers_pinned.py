"""Behaviour a mutation review (stop 60) found unpinned in fcp_data/plan/solvers.py.

FCP promises to be never slower than a ring baseline whose configuration lies in its search space (solvers.py module
docstring, tests/plan/test_plan_properties.py). The suite's instances never need the megatron-dynamic candidate:
removing it (``if False and with_baselines ...``) survived. This instance (found by a seeded random search: 135
sequences on 32 ranks, nodes of 4) is one where every other FCP candidate is ~4.9 % slower than megatron-dynamic."""
from __future__ import annotations

import numpy as np
import pytest

from fcp_data.cost import CostModel
from fcp_data.plan import plan_batch

CM = CostModel(alpha1=8.015265122022897e-09, alpha2=1.1535482173663078e-06, alpha3=113673.5345577629,
               beta1=0.0007177515058409522, beta2=0.009668009992843899, bandwidth_intra=53096381716.65957,
               bandwidth_inter=13152817340.737495, ranks_per_node=4, tokens_per_rank=2048)
L = [311, 169, 316, 67, 1135, 114, 357, 50, 890, 326, 1057, 144, 513, 207, 228, 627, 120, 412, 1021, 883, 528, 305, 115,
     702, 143, 591, 187, 242, 240, 379, 173, 275, 162, 358, 298, 332, 127, 307, 248, 373, 250, 116, 415, 145, 297, 50, 350,
     394, 120, 372, 181, 675, 394, 94, 206, 64, 188, 361, 446, 221, 200, 271, 153, 307, 557, 279, 460, 135, 167, 312, 1103,
     519, 875, 253, 619, 69, 363, 51, 618, 353, 590, 334, 171, 142, 286, 761, 398, 166, 163, 147, 213, 233, 174, 251, 77,
     801, 300, 781, 310, 216, 267, 296, 153, 189, 1045, 507, 171, 372, 135, 718, 119, 492, 258, 260, 138, 209, 143, 133,
     357, 1645, 196, 533, 251, 149, 687, 406, 591, 276, 282, 138, 208, 885, 46, 339, 757]
FULL = {5, 10, 14, 16, 18, 19, 23, 24, 31, 34, 37, 39, 46, 49, 50, 52, 57, 59, 61, 70, 72, 79, 81, 83, 88, 89, 94, 98,
        99, 106, 109, 115, 118, 120, 121, 122, 123, 130, 131, 133, 134}
ETAS = [1.0 if i in FULL else 0.0 for i in range(len(L))]


def test_fcp_is_never_slower_than_megatron_dynamic_where_only_that_candidate_wins():
    fcp = plan_batch(L, num_ranks=32, cost_model=CM, etas=ETAS, solver="fcp")
    meg = plan_batch(L, num_ranks=32, cost_model=CM, etas=ETAS, solver="megatron-dynamic")
    assert fcp.makespan <= meg.makespan * (1 + 1e-9)


def test_megatron_dynamic_stops_when_a_doubling_does_not_improve():
    """megatron-dynamic's greedy (baselines.py docstring): the heaviest sequence of the slowest group doubles its
    degree *while the makespan improves*. Two equal sequences of 2·E tokens on 8 ranks start at degrees 2 + 2;
    doubling one leaves the other as slow, so the greedy stops at 2 + 2 (mutant: continuing on equal makespans,
    which ends at 4 + 4, survived the suite)."""
    from fcp_data.plan.baselines import megatron_dynamic

    cm = CostModel(alpha1=2e-9, alpha2=1e-4, alpha3=3e5, beta1=0.01, beta2=0.02, bandwidth_intra=1e11,
                   bandwidth_inter=1.2e10, ranks_per_node=8, tokens_per_rank=4096)
    L = np.array([8192, 8192])
    mb = megatron_dynamic(L, np.zeros(2), 8, cm)
    assert sorted(g.degree for g in mb.groups) == [2, 2]
    assert mb.makespan == pytest.approx(cm.group_time([8192], ranks=2), rel=1e-12)
