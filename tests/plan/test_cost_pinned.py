"""Behaviour a mutation review (stop 60) found unpinned in fcp_data/cost.py."""
from __future__ import annotations

import pytest

from fcp_data.cost import CostModel

CM = CostModel(alpha1=2e-9, alpha2=1e-4, alpha3=3e5, beta1=0.01, beta2=0.02, bandwidth_intra=1e11,
               bandwidth_inter=1.2e10, ranks_per_node=4, tokens_per_rank=8192, gamma=1e-3, alpha_blk=1e-7)


def _by_hand(cm, s, e, d, intra):
    """DESIGN §4/§4.1 written out (no visual tokens)."""
    v = cm.bandwidth_intra if intra else cm.bandwidth_inter
    A = cm.alpha1 * sum((1 + ek) * sk * sk for sk, ek in zip(s, e)) / d
    C = A + cm.alpha2 * sum(s) / d + cm.alpha_blk * sum((1 + ek) * sk for sk, ek in zip(s, e)) + cm.beta1
    X = 0.0 if d == 1 else cm.alpha3 * sum(s) * (d - 1) / d / v
    M = 0.0 if d == 1 else X + cm.beta2 + cm.gamma * (d - 1)
    return C + M - min(A, X)


@pytest.mark.parametrize("d", range(1, 9))
def test_group_time_with_an_int_degree_is_the_best_placement(d):
    """``group_time(..., ranks=d)`` is documented as the best placement: one node iff d <= ranks_per_node.
    The boundary d == ranks_per_node (a full node) must use the intra-node bandwidth, exactly like the
    explicit rank list 0..d-1 (mutant: ``intra = d < ranks_per_node`` survived the suite)."""
    s, e = [20000, 300], [0, 1]
    intra = d <= CM.ranks_per_node
    want = _by_hand(CM, s, e, d, intra)
    assert CM.group_time(s, e, ranks=d) == pytest.approx(want, rel=1e-12)
    assert CM.group_time(s, e, ranks=d) == pytest.approx(CM.group_time(s, e, ranks=list(range(d))), rel=1e-12)
